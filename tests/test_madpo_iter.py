"""MADPOIter: pairs of the current policy against a comparator (ties dropped, 1.4.3's
comparator-reward order), the replay's choice of rounds and pairs, the comparators (a copy
frozen while the agents train, a history really k rounds old, models by name), a run of
rounds on tiny random models, resuming in the middle of a round, and bad inputs named."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import comlrl
from comlrl.trainers.dpo import MADPOIterConfig, MADPOIterTrainer, iterative, rounds
from comlrl.trainers.dpo.comparators import history_kept, history_source
from comlrl.trainers.dpo.pairs import comparison_pairs
from comlrl.trainers.dpo.replay import (
    distinct_draws,
    replay_choice,
    replay_sample_size,
    replay_weights,
    shard_counts,
)

from .helpers import (
    DATA,
    AfterTwo,
    assert_every_field_documented,
    char_tokenizer,
    content_score,
    load_example,
    log_lines,
    tiny_llama,
    unsplittable,
    weights,
)


def config(tmp_path, **overrides):
    values = dict(
        num_iterations=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        train_batch_size=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return MADPOIterConfig(**values)


def trainer(tmp_path, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("args", config(tmp_path))
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    return MADPOIterTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=content_score, **kwargs)


def flat(models):
    return [torch.cat([p.detach().reshape(-1) for p in model.parameters()]) for model in models]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------ config
def test_every_field_is_documented_and_the_defaults_are_1_4_3s():
    assert_every_field_documented(MADPOIterConfig)
    args = MADPOIterConfig()
    assert (args.num_iterations, args.num_train_epochs, args.preference_num_candidates) == (6, 1, 20)
    assert (args.preference_pairs_per_sample, args.pair_selection) == (4, "comparator_reward")
    assert (args.comparator_policy, args.preference_replay_mode, args.comparator_candidates) == (
        "current",
        "current",
        20,
    )
    assert MADPOIterConfig(comparator_policy="history").history_k == 1


@pytest.mark.parametrize(
    "field,value,canonical",
    [
        ("comparator_policy", "Self", "current"),
        ("comparator_policy", "copy", "current_copy"),
        ("comparator_policy", "previous", "history"),
        ("comparator_generation_mode", "multi-agent", "decentralized"),
        ("preference_replay_mode", "latest", "current"),
        ("preference_replay_mode", "all_history", "all_history"),
    ],
)
def test_1_4_3s_spellings_are_accepted(field, value, canonical):
    assert getattr(MADPOIterConfig(**{field: value}), field) == canonical


@pytest.mark.parametrize(
    "values,match",
    [
        ({"comparator_policy": "api"}, r"comparator_policy='api' needs comparator_api_url"),
        (
            {"comparator_policy": "oracle"},
            r"comparator_policy='oracle'; expected one of \['api', 'current', 'current_copy'",
        ),
        (
            {"comparator_centralized_agent_index": 1},
            r"comparator_centralized_agent_index=1 is only used with comparator_generation_mode='centralized'",
        ),
        ({"comparator_generation_mode": "solo"}, r"comparator_generation_mode='solo'; expected one of"),
        ({"preference_replay_mode": "best"}, r"preference_replay_mode='best'; expected one of \['all_history'"),
        ({"preference_replay_mode": "nearest_k"}, r"'nearest_k' needs preference_replay_k"),
        ({"preference_replay_k": 2}, r"preference_replay_k=2 is only used with preference_replay_mode='nearest_k'"),
        ({"preference_replay_mode": "lambda_decay"}, r"'lambda_decay' needs preference_replay_lambda, in \[0, 1\]"),
        (
            {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5},
            r"preference_replay_lambda must be in \[0, 1\], got 1.5",
        ),
        (
            {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": -0.1},
            r"preference_replay_lambda must be in \[0, 1\], got -0.1",
        ),
        ({"preference_replay_sample_size": 8}, r"preference_replay_sample_size=8: preference_replay_mode='current'"),
        ({"num_iterations": 0}, r"num_iterations must be an integer >= 1, got 0"),
        ({"comparator_num_candidates": 0}, r"comparator_num_candidates must be an integer >= 1 or None, got 0"),
        ({"comparator_policy": "model"}, r"comparator_policy='model' needs comparator_model_name"),
        ({"comparator_model_name": "m"}, r"comparator_model_name and comparator_agents are only used with .*'model'"),
        ({"comparator_history_k": 2}, r"comparator_history_k=2 is only used with comparator_policy='history'"),
        ({"comparator_devices": "cpu"}, r"comparator_devices='cpu': the 'current' comparator samples with the agents"),
        ({"comparator_devices": 3}, r"comparator_devices must be None, 'auto', a device name or a list"),
        ({"comparator_api_url": "http://x"}, r"comparator_api_url='http://x' is only used with comparator_policy='api"),
        ({"policy_checkpoint_dir": ""}, r"policy_checkpoint_dir must be None or a folder path, got ''"),
        ({"log_reward_distribution": 1}, r"log_reward_distribution must be True or False, got 1"),
        ({"pair_selection": "all"}, r"pair_selection='all' keeps every pair.*preference_pairs_per_sample=None"),
    ],
)
def test_bad_field_is_named_with_what_is_allowed(values, match):
    with pytest.raises(ValueError, match=match):
        MADPOIterConfig(**values)


def test_madpo_itself_has_no_comparator_order():
    with pytest.raises(ValueError, match=r"pair_selection='comparator_reward'; expected one of \['all', 'random'"):
        comlrl.MADPOConfig(pair_selection="comparator_reward")


# ------------------------------------------------------------------------------ pairs against a comparator
def test_comparison_pairs_by_hand():
    current, comparator = [3.0, 1.0, 2.0, 5.0], [1.0, 1.0, 4.0, 2.0, 9.0]  # comparator 4 is never met
    g = torch.Generator().manual_seed(0)
    # j=0: current wins by 2 (comparator 1); j=1 ties (dropped); j=2: comparator wins by 2 (4); j=3: current by 3 (2)
    expect = {
        "comparator_reward": [[2, 0], [3, 1], [0, 1]],
        "reward_gap": [[3, 1], [0, 1], [2, 0]],  # equal gaps keep index order
        "all": [[0, 1], [2, 0], [3, 1]],
    }
    for selection, rows in expect.items():
        assert comparison_pairs(current, comparator, selection, None, g).tolist() == rows
    assert comparison_pairs(current, comparator, "comparator_reward", 2, g).tolist() == [[2, 0], [3, 1]]
    assert sorted(comparison_pairs(current, comparator, "random", None, g).tolist()) == expect["all"]
    # equal comparator rewards: the larger gap first
    assert comparison_pairs([5.0, 0.0, 3.0], [2.0, 2.0, 2.0], "comparator_reward", None, g).tolist() == [
        [0, 1],
        [1, 0],
        [2, 1],
    ]
    assert comparison_pairs([1.0, 2.0], [1.0, 2.0], "comparator_reward", None, g).shape == (0, 2)


# ------------------------------------------------------------------------------ replay
def test_replay_weights_by_hand():
    def w(mode, n, k=None, decay=None):
        return replay_weights(mode, n, k, decay).tolist()

    assert w("current", 3) == [0, 0, 1]
    assert w("nearest_k", 5, k=2) == [0, 0, 0, 0.5, 0.5]
    assert w("nearest_k", 2, k=4) == [0.5, 0.5]
    assert w("all_history", 4) == [0.25] * 4
    assert w("lambda_decay", 3, decay=0.5) == pytest.approx([1 / 7, 2 / 7, 4 / 7])  # 0.5*0.25, 0.5*0.5, 0.5
    assert w("lambda_decay", 3, decay=1.0) == pytest.approx([1 / 3] * 3)
    assert w("lambda_decay", 3, decay=0.0) == [0, 0, 1]


def test_nearest_k_counts_rounds_not_rounds_with_pairs():
    g = torch.Generator().manual_seed(0)
    # the last 2 rounds made no pairs: nothing to replay (1.4.3 reached back to round 1)
    assert replay_choice("nearest_k", [5, 0, 0], None, g, k=2) == []
    assert {shard for shard, _ in replay_choice("nearest_k", [5, 0, 3], 6, g, k=2)} == {2}
    assert {shard for shard, _ in replay_choice("all_history", [5, 0, 3], 40, g)} == {0, 2}


def test_sample_size_and_counts():
    assert replay_sample_size(7, [3, 2]) == 7
    assert replay_sample_size(None, [3, 2]) == 2  # this round's pairs
    assert replay_sample_size(None, [3, 0]) == 3  # none this round: the newest round that made some
    assert replay_sample_size(None, [0, 0]) == 0
    g = torch.Generator().manual_seed(0)
    counts = shard_counts(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), [4, 0, 2], 1000, g)
    assert sum(counts) == 1000 and counts[1] == 0 and 600 < counts[0] < 740  # 2/3 of the draws
    assert shard_counts(torch.tensor([1.0]), [0], 5, g) == [0]


def test_sampling_is_without_replacement_and_cycles():
    g = torch.Generator().manual_seed(0)
    draws = distinct_draws(3, 7, g).tolist()
    assert sorted(draws[:3]) == sorted(draws[3:6]) == [0, 1, 2] and draws[6] in (0, 1, 2)
    assert len(set(distinct_draws(10, 6, g).tolist())) == 6
    chosen = replay_choice("current", [4, 5], None, g)  # every pair of the round, once
    assert sorted(chosen) == [(1, i) for i in range(5)]
    again = replay_choice("current", [4, 5], None, torch.Generator().manual_seed(0))
    assert replay_choice("current", [4, 5], None, torch.Generator().manual_seed(0)) == again  # seeded


def test_history_rounds_by_hand():
    assert [history_source(r, 2) for r in range(5)] == [0, 0, 0, 1, 2]
    assert history_kept(0, 2, 5) == {0, 1, 2}
    assert history_kept(2, 2, 5) == {1, 2}
    assert history_kept(4, 2, 5) == set()


# ------------------------------------------------------------------------------ the trainer's pairs
def test_pairs_meet_the_comparator_candidate_by_candidate(tmp_path, monkeypatch):
    madpo = trainer(tmp_path)
    turns, sample = [], rounds.candidates
    monkeypatch.setattr(rounds, "candidates", lambda *args: turns.append(sample(*args)) or turns[-1])
    metrics = madpo.prepare(None)
    expected = []  # current j against comparator j, as the pure function orders them
    for mine, theirs in zip(turns[::2], turns[1::2]):  # each batch of rows: current, then comparator candidates
        for m, row in enumerate(mine.rows):
            kept = comparison_pairs(mine.rewards[m, :, 0], theirs.rewards[m, :, 0], "comparator_reward", 2, None)
            for j, current_won in kept.tolist():
                ours, other = ([agent.texts[m * 4 + j] for agent in side.agents] for side in (mine, theirs))
                expected.append((row, ours, other) if current_won else (row, other, ours))
    assert sorted(expected) == sorted((p.row, p.chosen_texts, p.rejected_texts) for p in madpo.rounds.shards[0])
    pairs, tok = madpo.pairs, madpo.agents.tokenizers[0]
    assert (
        madpo.rounds.round == 0 and pairs and sorted(map(id, pairs)) == sorted(map(id, madpo.rounds.shards[0]))
    )  # all of them
    assert (
        metrics["iter/current_preference_pairs"]
        == len(madpo.rounds.shards[0])
        == metrics["iter/train_preference_pairs"]
    )
    assert metrics["iter/current_iteration"] == 1 and 0 <= metrics["iter/current_win_rate"] <= 1
    for pair in pairs:
        assert pair.chosen_reward > pair.rejected_reward
        assert content_score(*[[text] for text in pair.chosen_texts]) == [pair.chosen_reward]
        assert content_score(*[[text] for text in pair.rejected_texts]) == [pair.rejected_reward]
        for i in range(2):
            for ids, text in (
                (pair.chosen_ids[i], pair.chosen_texts[i]),
                (pair.rejected_ids[i], pair.rejected_texts[i]),
            ):
                assert tok.decode(ids, skip_special_tokens=True) == text
                assert ids[-1] == tok.eos_token_id or len(ids) == 5  # as sampled: the EOS kept
    shard = json.loads((tmp_path / "run" / "preference_replay" / "iteration_0001.json").read_text())
    assert shard["num_pairs"] == len(madpo.rounds.shards[0])
    assert shard["pairs"][0]["chosen_ids"][0] == madpo.rounds.shards[0][0].chosen_ids[0].tolist()  # token ids kept


def test_the_current_comparator_samples_from_its_own_stream(tmp_path):
    """The comparator's draws leave the training's random stream as it was, and differ from the current candidates'."""
    madpo = trainer(tmp_path)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with rounds.sampling_with(
        madpo.rollout, madpo.backend, rounds.round_generator(42, 0, rounds.Stream.COMPARATOR)
    ) as comparator:
        theirs = rounds.candidates(madpo.run, [0], 4, rollout=comparator)
    assert torch.equal(torch.get_rng_state(), before)
    mine = rounds.candidates(madpo.run, [0], 4)
    assert mine.agents[0].texts != theirs.agents[0].texts


# ------------------------------------------------------------------------------ comparators
def test_current_copy_stays_frozen_while_the_policy_trains(tmp_path):
    madpo = trainer(tmp_path, args=config(tmp_path, comparator_policy="current_copy"))
    madpo.prepare(None)
    start = flat(madpo.agents)
    copies = madpo.rounds.comparator.models
    assert same(flat(copies), start) and all(c is not a for c, a in zip(copies, madpo.agents))
    madpo.step(list(range(2)))
    assert not same(flat(madpo.agents), start) and same(flat(copies), start)
    trained = flat(madpo.agents)
    madpo.schedule.start_epoch(1)  # round 2: a new copy of the policy as it is now
    assert same(flat(madpo.rounds.comparator.models), trained)


def test_the_history_comparator_is_really_k_rounds_old(tmp_path):
    args = config(tmp_path, comparator_policy="history", comparator_history_k=1, num_iterations=3)
    madpo = trainer(tmp_path, args=args)
    madpo.prepare(None)
    initial = flat(madpo.agents)
    assert same(flat(madpo.rounds.comparator.models), initial)  # round 1 compares with the initial policy
    madpo.step(list(range(2)))
    madpo.schedule.start_epoch(1)
    round2 = flat(madpo.agents)
    assert same(flat(madpo.rounds.comparator.models), initial) and not same(round2, initial)  # not the current policy
    madpo.step(list(range(2)))
    madpo.schedule.start_epoch(2)
    assert same(flat(madpo.rounds.comparator.models), round2) and not same(flat(madpo.agents), round2)
    assert set(madpo.rounds.comparator.snapshots) == set()  # no later round needs any


def test_a_model_comparator_is_loaded_once_by_name(tmp_path):
    tok = char_tokenizer()
    tiny_llama(tok, seed=7).save_pretrained(tmp_path / "comparator")
    tok.save_pretrained(tmp_path / "comparator")
    madpo = trainer(
        tmp_path, args=config(tmp_path, comparator_policy="model", comparator_model_name=str(tmp_path / "comparator"))
    )
    models = madpo.rounds.comparator.models
    assert models[0] is models[1] and not models[0].training
    madpo.prepare(None)
    assert madpo.pairs


def test_a_model_comparator_with_another_vocabulary_is_refused(tmp_path):
    other = char_tokenizer(pad=False)
    other.add_tokens(["xyz"])
    tiny_llama(other).save_pretrained(tmp_path / "comparator")
    other.save_pretrained(tmp_path / "comparator")
    args = config(tmp_path, comparator_policy="model", comparator_agents=[str(tmp_path / "comparator")] * 2)
    with pytest.raises(ValueError, match=r"comparator_agents\[0\]=.* has another vocabulary than agent 0's tokenizer"):
        trainer(tmp_path, args=args)


def test_comparator_devices_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"comparator_devices lists 3 devices for 2 agents"):
        trainer(tmp_path, args=config(tmp_path, comparator_policy="current_copy", comparator_devices=["cpu"] * 3))


# ------------------------------------------------------------------------------ runs
def test_rounds_train_in_one_run_and_log_each_round(tmp_path):
    madpo = trainer(
        tmp_path, eval_dataset=DATA, args=config(tmp_path, num_train_epochs=2, preference_pairs_per_sample=1)
    )
    result = madpo.train(checkpoint_interval=1)
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    rounds = [line for line in lines if "iter/current_iteration" in line]
    assert [line["iter/current_iteration"] for line in rounds] == [1.0, 2.0]
    sizes = [int(line["iter/train_preference_pairs"]) for line in rounds]
    per_round = [2 * math.ceil(size / 2) for size in sizes]  # 2 epochs of ceil(pairs / 2) steps
    assert result.global_step == sum(per_round) == madpo.global_step
    assert rounds[0]["step"] == 0 and rounds[1]["step"] == per_round[0] + 1  # with the round's first step
    assert rounds[1]["iter/total_preference_pairs"] == sum(line["iter/current_preference_pairs"] for line in rounds)
    steps = [line["step"] for line in lines if "dpo/loss" in line]
    assert steps == list(range(1, result.global_step + 1))  # the global step carries across rounds
    assert "eval/turn_1/reward_mean" in lines[-1]
    # checkpoint_interval counts rounds: one checkpoint at the end of each
    found = sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*"))
    assert found == sorted(f"checkpoint-{step}" for step in (per_round[0], sum(per_round)))
    assert (tmp_path / "run" / "preference_replay" / "iteration_0002.json").is_file()
    with pytest.raises(RuntimeError, match=r"MADPOIterTrainer.train\(\) was already called.*larger num_iterations"):
        madpo.train()  # 1.4.3 started over from the trained policy; this run's rounds and schedules are spent
    assert log_lines(tmp_path / "run", "metrics.jsonl") == lines


def test_one_comparator_model_writes_every_agents_part(tmp_path, monkeypatch):
    args = config(tmp_path, comparator_generation_mode="centralized", comparator_centralized_agent_index=1)
    madpo = trainer(tmp_path, args=args, centralized_comparator_adapter=AfterTwo())
    joint = []  # (agent, prompts, answers) of every joint prompt
    generate = madpo.backend.generate

    def recording(agent, prompts, *rest):
        rollout = generate(agent, prompts, *rest)
        if " : " in prompts[0]:
            joint.append((agent, prompts, rollout.texts))
        return rollout

    monkeypatch.setattr(madpo.backend, "generate", recording)
    metrics = madpo.prepare(None)
    assert joint and {agent for agent, _, _ in joint} == {1}  # agent 1's model answers for both agents
    assert joint[0][1][0] == " : ".join([DATA[0]["prompt"]] * 2)  # the adapter's prompt from both agents' prompts
    answers = [answer for _, _, texts in joint for answer in texts]
    assert metrics["iter/comparator_parse_failure_frac"] == pytest.approx(
        sum(unsplittable(answer) for answer in answers) / len(answers)
    )
    eos = madpo.agents.tokenizers[0].eos_token_id
    for pair in madpo.rounds.shards[0]:
        comparator_won = pair.chosen_reward == pair.comparator_raw_reward  # rewards unprocessed here; ties dropped
        texts, ids = (
            (pair.chosen_texts, pair.chosen_ids) if comparator_won else (pair.rejected_texts, pair.rejected_ids)
        )
        assert "".join(texts) in answers or texts == ["", ""]  # an answer's two parts, or an unsplittable one's
        assert all(agent_ids[-1] == eos or len(agent_ids) == args.max_new_tokens for agent_ids in ids)


def test_an_adapter_without_a_joint_answer_to_split_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"centralized_comparator_adapter is given, but collaboration_mode='decentralized'"
    ):
        trainer(tmp_path, centralized_comparator_adapter=AfterTwo())
    args = config(tmp_path, comparator_generation_mode="centralized", comparator_centralized_agent_index=2)
    with pytest.raises(ValueError, match=r"comparator_centralized_agent_index=2, but there are 2 agents"):
        trainer(tmp_path, args=args)


def test_each_rounds_policy_is_written_where_policy_checkpoint_dir_says(tmp_path):
    folder = tmp_path / "policies"
    madpo = trainer(tmp_path, args=config(tmp_path, policy_checkpoint_dir=str(folder)))
    initial = flat(madpo.agents)
    round_1_end = []
    start_round = madpo.objective.start_round
    madpo.objective.start_round = lambda tr, r: (
        (round_1_end.append(flat(madpo.agents)) if r == 1 else None) or (start_round(tr, r))
    )
    madpo.train()
    assert sorted(p.name for p in folder.iterdir()) == ["initial", "iteration_0000", "iteration_0001"]  # 1.4.3's names

    def saved(label):
        return flat([AutoModelForCausalLM.from_pretrained(folder / label / f"agent_{i}") for i in range(2)])

    assert same(saved("initial"), initial)
    assert same(saved("iteration_0000"), round_1_end[0]) and not same(round_1_end[0], initial)
    assert same(saved("iteration_0001"), flat(madpo.agents))


def test_resume_in_the_middle_of_a_round_continues_exactly(tmp_path):
    def run_config():
        return config(
            tmp_path,
            num_iterations=3,
            save_steps=1,
            comparator_policy="history",
            preference_replay_mode="lambda_decay",
            preference_replay_lambda=0.5,
            preference_replay_sample_size=3,
            lr_scheduler_type="linear",
            dpo_reference="initial",
        )

    straight = trainer(tmp_path, args=run_config())
    straight.train()
    logs = {name: log_lines(tmp_path / "run", name) for name in ("metrics.jsonl", "samples.jsonl")}
    round_steps = [line["step"] for line in logs["metrics.jsonl"] if "iter/current_iteration" in line]
    mid_round = round_steps[1]  # the first step of round 2 (each round has 2 steps: 3 pairs, 2 per step)
    kept = torch.load(tmp_path / "run" / f"checkpoint-{mid_round}" / rounds.ROUNDS_FILE, weights_only=True)
    assert [r for r, _ in kept["comparator"]["snapshots"]] == [1]  # round 3 compares with round 2's start
    for checkpoint in (mid_round, mid_round - 1):  # then the last step of round 1
        resumed = trainer(tmp_path, args=run_config())  # fresh agents; the same folder
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{checkpoint}"))
        assert resumed.global_step == straight.global_step and resumed.rounds.round == 2
        for a, b in zip(weights(straight), weights(resumed)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        for straight_shard, resumed_shard in zip(straight.rounds.shards, resumed.rounds.shards, strict=True):
            assert [p.chosen_texts for p in straight_shard] == [p.chosen_texts for p in resumed_shard]
        for name, lines in logs.items():
            assert log_lines(tmp_path / "run", name) == lines


def test_importable_from_1_4_3s_paths():
    import comlrl.trainers.preference.iterative

    assert comlrl.MADPOIterTrainer is MADPOIterTrainer is comlrl.trainers.preference.iterative.MADPOIterTrainer
    assert comlrl.trainers.preference.MADPOIterConfig is iterative.MADPOIterConfig


# ------------------------------------------------------------------------------ the example
def test_the_example_runs_on_a_tiny_model_with_the_w_and_b_flags(tmp_path, fake_wandb, capsys):
    example = load_example("madpo-iter-story-len-ratio.py")
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    flags = ["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--rounds", "2", "--num-candidates", "2",
             "--max-new-tokens", "4", "--samples-per-prompt", "1", "--comparator", "history",
             "--wandb", "--wandb-project", "proj", "--wandb-entity", "team"]  # fmt: skip
    example.main(flags)
    summary = capsys.readouterr().out
    assert "round 2:" in summary and "before" in summary and "after" in summary
    assert f"run folder {out}: metrics.jsonl; curves in metrics.png;" in summary and (out / "metrics.png").is_file()
    assert (fake_wandb["init"]["project"], fake_wandb["init"]["entity"]) == ("proj", "team") and fake_wandb["finished"]
    assert (out / "models" / "agent_1" / "model.safetensors").exists()
    assert (out / "preference_replay" / "iteration_0002.json").exists()
    defaults = example.parse_args([])
    assert (defaults.rounds, defaults.num_candidates, defaults.comparator) == (3, 4, "current")
