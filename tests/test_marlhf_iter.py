"""MARLHFIter on tiny random models: the config (1.4.3's defaults, its spellings, what is
refused), the rounds (pairs against the comparator, a fresh reward model per round, what ranks
the candidates), one learning-rate schedule across the rounds, a round without pairs, and
resuming in the middle of a round and at a round's end."""

import warnings

import pytest
import torch

import comlrl
from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.dpo import rounds
from comlrl.trainers.dpo.schedule import Rounds
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig
from comlrl.trainers.rlhf import MARLHFIterConfig, MARLHFIterTrainer, marlhf_iter
from comlrl.trainers.rlhf import reward_model as reward_fit

from .helpers import (
    DATA,
    AfterTwo,
    assert_every_field_documented,
    char_tokenizer,
    content_score,
    load_example,
    log_lines,
    tiny_llama,
    weights,
)


def config(tmp_path, **overrides):
    values = dict(
        num_iterations=2,
        num_train_epochs=1,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        num_generations=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        reward_learning_rate=1e-3,
        reward_num_train_epochs=1,
        reward_eval_fraction=0.34,  # one of the three prompts
        reward_model_name=str(tmp_path / "model"),
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return MARLHFIterConfig(**values)


@pytest.fixture
def folder(tmp_path):
    """``tmp_path`` with the tiny reward model's transformer in ``model/``."""
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    return tmp_path


def trainer(tmp_path, reward=content_score, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("args", config(tmp_path))
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    return MARLHFIterTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=reward, **kwargs)


# ------------------------------------------------------------------------------ the config
def test_defaults_are_1_4_3s_marlhfiter_and_every_field_is_documented():
    assert_every_field_documented(MARLHFIterConfig)
    args = MARLHFIterConfig()
    assert (args.num_iterations, args.num_train_epochs, args.reward_num_train_epochs) == (6, 2, 2)
    assert (args.preference_num_candidates, args.preference_pairs_per_sample) == (20, 4)
    assert (args.pair_selection, args.comparator_policy, args.preference_replay_mode) == (
        "comparator_reward",
        "current",
        "current",
    )
    assert (args.preference_scoring_reward, args.rl_algorithm, args.reward_model_device) == ("task", "magrpo", None)


@pytest.mark.parametrize(
    "spelling, canonical", [("Oracle", "task"), ("env", "task"), ("learned", "reward_model"), ("MODEL", "reward_model")]
)
def test_1_4_3s_spellings_of_the_scoring_reward(spelling, canonical):
    assert MARLHFIterConfig(preference_scoring_reward=spelling).preference_scoring_reward == canonical


@pytest.mark.parametrize(
    "values, match",
    [
        ({"preference_scoring_reward": "both"}, r"preference_scoring_reward='both'; expected one of"),
        ({"comparator_policy": "api"}, r"comparator_policy='api' needs comparator_api_url"),
        (
            {"comparator_centralized_agent_index": 1},
            r"comparator_centralized_agent_index=1 is only used with comparator_generation_mode='centralized'",
        ),
        (
            {"collaboration_mode": "centralized", "rl_algorithm": "iac"},
            r"'centralized' trains one model with centralized",
        ),
        ({"dpo_beta": 0.5}, r"dpo_beta=0.5 has no effect in MARLHF"),
        ({"rl_algorithm": "magrpo", "num_generations": 1}, r"num_generations must be >= 2"),
        ({"preference_replay_mode": "nearest_k"}, r"needs preference_replay_k"),
    ],
)
def test_bad_fields_are_named(values, match):
    with pytest.raises(ValueError, match=match):
        MARLHFIterConfig(**values)


def test_importable_from_1_4_3s_paths():
    from comlrl.trainers.preference import MARLHFIterTrainer as from_preference

    assert comlrl.MARLHFIterTrainer is from_preference is marlhf_iter.MARLHFIterTrainer
    assert comlrl.trainers.MARLHFIterConfig is MARLHFIterConfig
    # 1.4.3 defined both in comlrl.trainers.preference.iterative
    from comlrl.trainers.preference.iterative import MARLHFIterConfig as config_1_4_3
    from comlrl.trainers.preference.iterative import MARLHFIterTrainer as trainer_1_4_3

    assert (config_1_4_3, trainer_1_4_3) == (MARLHFIterConfig, MARLHFIterTrainer)
    with pytest.raises(AttributeError, match=r"module 'comlrl.trainers.preference.iterative' has no attribute 'Nope'"):
        comlrl.trainers.preference.iterative.Nope  # noqa: B018


# ------------------------------------------------------------------------------ the rounds
def test_each_round_fits_a_fresh_reward_model_to_its_own_pairs(folder, monkeypatch):
    loaded, fitted = [], []
    load, fit = JointRewardModel.from_pretrained, reward_fit.fit_reward_model
    monkeypatch.setattr(JointRewardModel, "from_pretrained", lambda *a: loaded.append(load(*a)) or loaded[-1])
    monkeypatch.setattr(
        reward_fit, "fit_reward_model", lambda model, pairs, *a: fitted.append(pairs) or fit(model, pairs, *a)
    )
    run = trainer(folder)
    result = run.train()
    assert result.global_step == run.global_step == 2 * 2  # 2 rounds x 1 epoch x 2 steps (3 rows, 2 per step)
    assert len(loaded) == 2 and loaded[0] is not loaded[1]  # from the pretrained weights, not round 1's model
    assert (
        run.reward_model is loaded[1] and run.reward_source.function.model is loaded[1]
    )  # round 2 trains on round 2's
    for round_pairs, shard in zip(fitted, run.rounds.shards, strict=True):
        assert {id(pair) for pair in round_pairs} <= {id(pair) for pair in shard}  # its own pairs, less held-out
    lines = log_lines(folder / "run", "metrics.jsonl")
    starts = [line for line in lines if "iter/current_iteration" in line]
    assert [(line["step"], line["iter/current_iteration"]) for line in starts] == [(0, 1.0), (3, 2.0)]
    assert all("reward_model/accuracy" in line and "reward_model/eval_accuracy" in line for line in starts)
    steps = [line["step"] for line in lines if "reward/reward_model/mean" in line]
    assert steps == [1, 2, 3, 4]  # the global step carries across rounds, the reward model scores every step
    for name in ("iteration_0001.json", "iteration_0002.json"):
        assert (folder / "run" / "preference_replay" / name).is_file()
    with pytest.raises(
        RuntimeError, match=r"MARLHFIterTrainer.train\(\) was already called.*reward model.*larger num_iterations"
    ):
        run.train()


@pytest.mark.parametrize("scoring", ["task", "reward_model"])
def test_what_ranks_a_rounds_candidates(folder, monkeypatch, scoring):
    rewards = []
    sample = rounds.candidates
    monkeypatch.setattr(
        rounds,
        "candidates",
        lambda tr, rows, count, reward=None, rollout=None: (
            rewards.append(reward) or sample(tr, rows, count, reward, rollout)
        ),
    )
    run = trainer(folder, args=config(folder, preference_scoring_reward=scoring))
    run.train()
    per_round = len(rewards) // 2  # current and comparator candidates of every batch of rows
    assert rewards[:per_round] == [None] * per_round  # round 1: the task reward
    expected = run.train_reward if scoring == "reward_model" else None
    assert rewards[per_round:] == [expected] * per_round  # round 2: the previous round's reward model, or the task's


def test_one_learning_rate_schedule_spans_every_round(folder):
    run = trainer(folder, args=config(folder, num_iterations=3, lr_scheduler_type="linear"))
    assert run.total_optimizer_steps == 3 * 2
    run.train()
    rates = [
        line["agent0/learning_rate"]
        for line in log_lines(folder / "run", "metrics.jsonl")
        if "agent0/learning_rate" in line
    ]
    assert len(rates) == 6 and all(a > b for a, b in zip(rates, rates[1:]))  # never starts over at a round


def test_a_round_without_pairs_keeps_the_previous_reward_model(folder):
    tied = {"now": False}

    def reward(*completions):
        return [0.5] * len(completions[0]) if tied["now"] else content_score(*completions)

    run = trainer(folder, reward=reward)
    start_round = run.reward_source.start_round

    def tie_from_round_2(tr, round_index):
        tied["now"] = round_index > 0
        return start_round(tr, round_index)

    run.reward_source.start_round = tie_from_round_2
    with pytest.warns(
        UserWarning, match=r"MARLHFIter round 2: no preference pairs .*, so its RL epochs train on the previous round's"
    ):
        run.train()
    assert run.global_step == 4 and run.rounds.shards[1] == []


def test_round_1_without_pairs_is_an_error(folder):
    run = trainer(folder, reward=lambda *completions: [1.0] * len(completions[0]))
    with warnings.catch_warnings(), pytest.raises(ValueError, match=r"MARLHFIter round 1 found no preference pairs"):
        warnings.simplefilter("ignore")
        run.train()


def test_iac_goes_through_the_rounds_with_its_critics(folder):
    # 1.4.3's default use_separate_critic=True: separate critic models (here named by critic_model_name)
    args = config(folder, rl_algorithm="iac", num_generations=1, critic_model_name=str(folder / "model"))
    assert args.use_separate_critic is True
    run = trainer(folder, args=args)
    before = weights(run)
    run.train()
    assert run.global_step == 4 and [c.agent for c in run.objective.critics] == [None, None]
    assert all(not torch.equal(a, b) for a, b in zip(before, weights(run)))
    assert [
        line["iter/current_iteration"]
        for line in log_lines(folder / "run", "metrics.jsonl")
        if "iter/current_iteration" in line
    ] == [1.0, 2.0]


# ------------------------------------------------------------------------------ resume
def test_resume_in_a_round_and_at_its_end_continues_exactly(folder, monkeypatch):
    def run_config():
        return config(folder, num_iterations=3, save_steps=1, comparator_policy="history", lr_scheduler_type="linear")

    straight = trainer(folder, args=run_config())
    straight.train()
    metrics = log_lines(folder / "run", "metrics.jsonl")
    round_2 = [line["step"] for line in metrics if "iter/current_iteration" in line][1]  # its first step: 3
    fit = reward_fit.fit_reward_model
    fitted = []
    monkeypatch.setattr(reward_fit, "fit_reward_model", lambda *a: fitted.append(1) or fit(*a))
    for checkpoint, fits in ((round_2, 1), (round_2 - 1, 2)):  # inside round 2; the end of round 1
        fitted.clear()
        resumed = trainer(folder, args=run_config())  # fresh agents; the same folder
        resumed.train(resume_from_checkpoint=str(folder / "run" / f"checkpoint-{checkpoint}"))
        assert len(fitted) == fits  # round 3's; and round 2's again when resumed before it
        assert resumed.global_step == straight.global_step and resumed.rounds.round == 2
        for a, b in zip(weights(straight), weights(resumed)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(resumed.reward_model.head.weight, straight.reward_model.head.weight)
        assert log_lines(folder / "run", "metrics.jsonl") == metrics


# ------------------------------------------------------------------------------ the example
def test_the_example_runs_on_a_tiny_model(tmp_path, capsys):
    example = load_example("marlhf-iter-story-len-ratio.py")
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :\n0123456789")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    flags = ["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--rounds", "2", "--num-candidates", "2",
             "--max-new-tokens", "4", "--samples-per-prompt", "1"]  # fmt: skip
    example.main(flags)
    summary = capsys.readouterr().out
    assert "round 1:" in summary and "round 2:" in summary and "before" in summary and "after" in summary
    assert f"run folder {out}: metrics.jsonl; curves in metrics.png;" in summary and (out / "metrics.png").is_file()
    assert (out / "models" / "reward_model" / "reward_head.safetensors").exists()
    assert (out / "preference_replay" / "iteration_0002.json").exists()


# ------------------------------------------------------------------------------ centralized
def test_centralized_rounds_train_one_model_on_each_rounds_reward_model(folder):
    tok = char_tokenizer()
    args = config(folder, collaboration_mode="centralized", rl_algorithm="maremax")
    run = MARLHFIterTrainer(agents=[tiny_llama(tok)], tokenizer=tok, train_dataset=DATA, reward_func=content_score,
                            args=args, centralized_comparator_adapter=AfterTwo())  # fmt: skip
    assert isinstance(run.objective.config, CentralizedMAGRPOConfig) and isinstance(run.schedule, Rounds)
    assert run.objective.config.advantage_mode == "max" and run.num_roles == 2
    run.train()
    assert run.global_step == 4 and run.rounds.round == 1
    assert all(len(pair.prompts) == 1 for shard in run.rounds.shards for pair in shard)  # joint answers
    lines = log_lines(folder / "run", "metrics.jsonl")
    starts = [line for line in lines if "iter/current_iteration" in line]
    assert len(starts) == 2 and all("iter/comparator_parse_failure_frac" in line for line in starts)
    assert all("reward_model/accuracy" in line for line in starts)
    assert sum("reward/reward_model/mean" in line for line in lines) == 4


def test_a_comparator_writing_every_agents_part_uses_the_trainers_adapter(folder):
    args = config(folder, comparator_generation_mode="centralized", num_iterations=1)
    run = trainer(folder, args=args, centralized_comparator_adapter=AfterTwo())
    assert isinstance(run.rounds.joint.adapter, AfterTwo)
    run.train()
    pairs = run.rounds.shards[0]
    assert pairs and all(len(pair.chosen_texts) == 2 for pair in pairs)  # each agent's part, one model's answer
    starts = [line for line in log_lines(folder / "run", "metrics.jsonl") if "iter/current_iteration" in line]
    assert "iter/comparator_parse_failure_frac" in starts[0]
