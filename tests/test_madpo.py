"""MADPO on tiny random models: pairs are the policy's own aligned candidates, a step raises
the chosen completions' log-probs relative to the rejected ones with the joint loss's
gradient, the schedule spans the pairs, resuming continues exactly, metrics reach the sinks,
and bad inputs are named."""

import math
import os
import warnings

import pytest
import torch

import comlrl
import comlrl.utils.caller as trainer_config
from comlrl.algorithms import joint_preference, others_deltas, preference_deltas
from comlrl.trainers import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference import madpo

from .helpers import (
    DATA,
    assert_every_field_documented,
    char_tokenizer,
    content_score,
    load_example,
    log_lines,
    lora,
    make_trainer,
    small_config,
    tiny_llama,
    weights,
)


def config(tmp_path, **overrides):
    values = dict(
        num_train_epochs=2,
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
    return MADPOConfig(**values)


def trainer(tmp_path, reward=content_score, agents=None, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("args", config(tmp_path))
    agents = agents if agents is not None else [tiny_llama(tok, seed=i) for i in range(2)]
    return MADPOTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=reward, **kwargs)


def margins(madpo_trainer, pairs):
    """(agents, pairs) margins of the agents as they are now."""
    return torch.stack(
        [
            preference_deltas(*madpo_trainer.objective.frozen_logps(i, madpo_trainer.objective.batch(pairs, i)))
            for i in range(madpo_trainer.num_agents)
        ]
    )


# ------------------------------------------------------------------------------ config
def test_every_field_is_documented_and_the_defaults_are_1_4_3s():
    assert_every_field_documented(MADPOConfig)
    args = MADPOConfig()
    candidates = (args.preference_num_candidates, args.preference_pairs_per_sample, args.pair_selection)
    assert candidates == (80, 16, "reward_gap")
    assert (args.dpo_beta, args.dpo_reference) == (0.1, "none")
    assert (args.num_train_epochs, args.agent_learning_rate) == (20, 5e-6)
    assert args.pairs_per_step == 2  # 1.4.3: train_batch_size defaults to the rollout buffer size, 2
    assert MADPOConfig(train_batch_size=8, per_device_train_batch_size=2).pairs_per_step == 8


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("preference_num_candidates", 1, r"preference_num_candidates must be an integer >= 2, got 1"),
        ("preference_pairs_per_sample", 0, r"preference_pairs_per_sample must be an integer >= 1 or None, got 0"),
        ("pair_selection", "best", r"pair_selection='best'; expected one of \['all', 'random', 'reward_gap'\]"),
        ("pair_selection", "all", r"pair_selection='all' keeps every pair.*set preference_pairs_per_sample=None"),
        ("dpo_beta", 0, r"dpo_beta must be a finite number in \(0, 1000\], got 0"),
        ("dpo_beta", 1e30, r"dpo_beta must be a finite number in \(0, 1000\], got 1e\+30"),
        ("dpo_reference", "model", r"dpo_reference='model'; expected one of \['initial', 'none'\]"),
        ("train_batch_size", 0, r"train_batch_size must be an integer >= 1 or None, got 0"),
        ("collaboration_mode", "solo", r"mode='solo'; expected one of \['centralized', 'decentralized'\]"),
        ("num_turns", 2, r"MADPO is single-turn: num_turns must be 1, got 2"),
        ("joint_mode", "cross", r"joint_mode must be 'aligned', got 'cross'"),
        ("num_generations", 8, r"num_generations=8 has no effect in MADPO .*preference_num_candidates"),
        ("beta", 0.1, r"beta=0.1 has no effect in MADPO .*dpo_beta"),
        ("reference_kl_enabled", True, r"reference_kl_enabled=True has no effect in MADPO .*dpo_reference='initial'"),
    ],
)
def test_bad_field_is_named_with_what_is_allowed(field, value, match):
    with pytest.raises(ValueError, match=match):
        MADPOConfig(**{field: value})


def test_1_4_3_fields_without_effect_are_accepted_with_one_warning(monkeypatch):
    monkeypatch.setattr(trainer_config, "_WARNED", set())
    with pytest.warns(UserWarning) as said:
        MADPOConfig(discount=1.0, use_environment_step=True, environment_steps_per_pair=2)
    assert sorted(str(w.message).split(" has no effect in MADPO")[0] for w in said) == [
        "MADPOConfig: discount=1.0",
        "MADPOConfig: environment_steps_per_pair=2",
        "MADPOConfig: use_environment_step=True",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MADPOConfig(discount=0.9)  # said once
    assert MADPOConfig(train_batch_size=8).train_batch_size == 8  # pairs: not bounded by the rows per rollout


# ------------------------------------------------------------------------------ pairs
def test_pairs_are_the_policys_own_aligned_candidates(tmp_path):
    madpo_trainer = trainer(tmp_path)
    metrics = madpo_trainer.prepare(None)
    pairs, tok = madpo_trainer.pairs, madpo_trainer.agents.tokenizers[0]
    assert 0 < len(pairs) <= len(DATA) * 2 and metrics["preference/num_pairs"] == len(pairs)
    assert all(sum(p.row == row for p in pairs) <= 2 for row in range(len(DATA)))
    for pair in pairs:
        assert pair.chosen_reward > pair.rejected_reward and pair.reference_deltas is None
        # candidate j is every agent's sample j: the pair's texts score as its rewards say
        assert content_score(*[[text] for text in pair.chosen_texts]) == [pair.chosen_reward]
        assert content_score(*[[text] for text in pair.rejected_texts]) == [pair.rejected_reward]
        for i in range(2):
            assert pair.prompts[i] == DATA[pair.row]["prompt"] == tok.decode(pair.prompt_ids[i])
            for ids, text in (
                (pair.chosen_ids[i], pair.chosen_texts[i]),
                (pair.rejected_ids[i], pair.rejected_texts[i]),
            ):
                assert tok.decode(ids, skip_special_tokens=True) == text
                assert ids[-1] == tok.eos_token_id or len(ids) == 5  # as sampled: the EOS kept, no padding


def test_the_reference_margins_are_the_sampling_policys(tmp_path):
    madpo_trainer = trainer(tmp_path, args=config(tmp_path, dpo_reference="initial"))
    madpo_trainer.prepare(None)
    pairs = madpo_trainer.pairs
    stored = torch.tensor([pair.reference_deltas for pair in pairs]).T
    torch.testing.assert_close(stored, margins(madpo_trainer, pairs), atol=1e-4, rtol=0)


def hand_logp(model, prompt_ids, completion_ids):
    """By hand: the summed log-prob of every completion token after the prompt, from the raw
    logits (temperature 1, as 1.4.3's log_softmax and TRL's DPO)."""
    ids = torch.cat([prompt_ids, completion_ids]).unsqueeze(0)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, completion_ids.unsqueeze(1)).sum()


def hand_deltas(madpo_trainer, pairs):
    """(agents, pairs) chosen-minus-rejected log-probs of the agents as they are, by hand."""
    return torch.tensor(
        [
            [
                hand_logp(agent, p.prompt_ids[i], p.chosen_ids[i])
                - hand_logp(agent, p.prompt_ids[i], p.rejected_ids[i])
                for p in pairs
            ]
            for i, agent in enumerate(madpo_trainer.agents)
        ]
    )


@pytest.mark.parametrize("reference", ["none", "initial"])
def test_the_dpo_log_probs_are_the_raw_logits_whatever_the_sampling_temperature(tmp_path, reference):
    madpo_trainer = trainer(tmp_path, args=config(tmp_path, temperature=0.6, dpo_reference=reference))
    madpo_trainer.prepare(None)
    pairs = madpo_trainer.pairs[:2]
    by_hand = hand_deltas(madpo_trainer, pairs)
    if reference == "initial":  # the stored reference margins: the initial policy's, at temperature 1 too
        stored = torch.tensor([pair.reference_deltas for pair in pairs]).T
        torch.testing.assert_close(stored, by_hand, atol=1e-4, rtol=0)
        by_hand = by_hand - stored
    metrics = madpo_trainer.step([0, 1]).metrics  # before its update
    loss = -torch.nn.functional.logsigmoid(0.1 * by_hand.sum(dim=0)).mean()
    assert metrics["dpo/loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert metrics["dpo/margin"] == pytest.approx(by_hand.sum(dim=0).mean().item(), abs=1e-4)
    if reference == "none":  # margins at the sampling temperature would be another number
        assert abs(metrics["dpo/margin"]) > 1e-2


# ------------------------------------------------------------------------------ a step
@pytest.mark.parametrize("reference", ["none", "initial"])
def test_a_step_raises_the_chosen_log_probs_relative_to_the_rejected(tmp_path, reference):
    madpo_trainer = trainer(
        tmp_path, args=config(tmp_path, train_batch_size=4, preference_pairs_per_sample=3, dpo_reference=reference)
    )
    madpo_trainer.prepare(None)
    ids = list(range(min(4, len(madpo_trainer.pairs))))
    pairs = [madpo_trainer.pairs[k] for k in ids]
    before = margins(madpo_trainer, pairs)
    metrics = madpo_trainer.step(ids).metrics
    after = margins(madpo_trainer, pairs)
    assert (after.mean(dim=1) > before.mean(dim=1)).all()  # each agent's margin rose
    assert after.sum(dim=0).mean() > before.sum(dim=0).mean() + 0.1
    # the step's metrics are the batch's before its update (margins over the reference's, if any)
    offset = 0 if reference == "none" else torch.tensor([pair.reference_deltas for pair in pairs]).T
    joint = joint_preference(before - offset, beta=0.1)
    assert metrics["dpo/loss"] == pytest.approx(joint.loss.mean().item(), abs=1e-5)
    assert metrics["dpo/margin"] == pytest.approx(joint.margin.mean().item(), abs=1e-4)
    assert metrics["dpo/accuracy"] == pytest.approx(joint.correct.float().mean().item())
    assert metrics["agent0/loss"] == pytest.approx(metrics["dpo/loss"], abs=1e-5)
    assert {"dpo/chosen_logp", "dpo/rejected_logp", "agent1/delta_mean", "agent1/grad_norm"} <= set(metrics)


def test_each_agent_gets_the_joint_losss_gradient_micro_batch_by_micro_batch(tmp_path):
    madpo_trainer = trainer(tmp_path, args=config(tmp_path, micro_batch_size=2, preference_pairs_per_sample=3))
    madpo_trainer.prepare(None)
    pairs = madpo_trainer.pairs[:3]
    batches = [madpo_trainer.objective.batch(pairs, i) for i in range(2)]
    parameters = [p for agent in madpo_trainer.agents for p in agent.parameters()]
    # the joint loss, every agent's graph at once, no micro-batches
    logps = [
        madpo_trainer.objective.sequence_logps(madpo_trainer.agents.trainable(i), batches[i], slice(None))
        for i in range(2)
    ]
    deltas = torch.stack([preference_deltas(chosen, rejected) for chosen, rejected in logps])
    expected = torch.autograd.grad(joint_preference(deltas, beta=0.1).loss.mean(), parameters)
    # what the update does: one agent at a time, one pair per forward, the others' margins fixed
    madpo_trainer.learners.zero_grad()
    others = others_deltas(deltas.detach())
    for i in range(2):
        madpo_trainer.objective.agent_backward(i, batches[i], others[i], None, len(others[i]))
    for got, want in zip([p.grad for p in parameters], expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


def test_the_learning_rate_schedule_spans_the_pairs(tmp_path):
    madpo_trainer = trainer(tmp_path, args=config(tmp_path, lr_scheduler_type="linear"))
    result = madpo_trainer.train()
    assert result.global_step == 2 * math.ceil(len(madpo_trainer.pairs) / 2) == madpo_trainer.total_optimizer_steps
    assert [s.get_last_lr() for s in madpo_trainer.learners.schedulers] == [[0.0], [0.0]]
    assert result.epoch_reward_means == []  # the steps sample nothing


# ------------------------------------------------------------------------------ the run
def test_metrics_reach_the_log_and_wandb(tmp_path, fake_wandb):
    madpo_trainer = trainer(tmp_path, eval_dataset=DATA, wandb_config={"project": "p"})
    madpo_trainer.train()
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    assert lines[0]["step"] == 0 and lines[0]["preference/num_pairs"] == len(madpo_trainer.pairs)
    assert {"preference/rows_without_pairs", "preference/reward_gap_mean", "preference/candidate_reward_mean"} <= set(
        lines[0]
    )
    steps = [line for line in lines if "dpo/loss" in line]
    assert [line["step"] for line in steps] == list(range(1, madpo_trainer.global_step + 1))
    for key in ("dpo/accuracy", "dpo/margin", "dpo/chosen_logp", "agent0/delta_mean", "agent1/learning_rate"):
        assert key in steps[0]
    assert "eval/turn_1/reward_mean" in lines[-1]  # evaluated with the task reward after the last step
    samples = log_lines(tmp_path / "run", "samples.jsonl")
    assert samples[0]["chosen_reward"] > samples[0]["rejected_reward"] and "agent1_rejected" in samples[0]
    logged = {key for metrics, _ in fake_wandb["log"] for key in metrics}
    assert {"dpo/loss", "preference/num_pairs", "eval/turn_1/reward_mean"} <= logged


def test_resume_continues_exactly(tmp_path):
    def run_config():
        return config(tmp_path, save_steps=2, lr_scheduler_type="linear", dpo_reference="initial")

    straight = trainer(tmp_path, eval_dataset=DATA, args=run_config())
    straight.train()
    logs = {name: log_lines(tmp_path / "run", name) for name in ("metrics.jsonl", "samples.jsonl")}
    assert straight.global_step >= 4

    resumed = trainer(tmp_path, eval_dataset=DATA, args=run_config())  # fresh agents; the same folder
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.global_step == straight.global_step
    for a, b in zip(weights(straight), weights(resumed)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for straight_pair, resumed_pair in zip(straight.pairs, resumed.pairs):
        assert torch.equal(straight_pair.chosen_ids[1], resumed_pair.chosen_ids[1])
        assert straight_pair.reference_deltas == resumed_pair.reference_deltas
    for name, lines in logs.items():
        assert log_lines(tmp_path / "run", name) == lines


def test_a_second_train_is_refused_before_anything_is_cleared_and_resuming_still_works(tmp_path):
    # 1.4.3 sampled new pairs on every train(); training again on the first call's would mean something else
    args = config(tmp_path, num_train_epochs=1, save_steps=1, overwrite_output_dir=True)
    madpo_trainer = trainer(tmp_path, args=args)
    madpo_trainer.train()
    logged, step = log_lines(tmp_path / "run", "metrics.jsonl"), madpo_trainer.global_step
    with pytest.raises(
        RuntimeError,
        match=r"MADPOTrainer.train\(\) was already called on this trainer: its preference pairs came from the policy "
        r"as it was before that first call.* use MADPOIterTrainer .*a new MADPOTrainer.*resume_from_checkpoint",
    ):
        madpo_trainer.train()
    assert log_lines(tmp_path / "run", "metrics.jsonl") == logged  # overwrite_output_dir cleared nothing
    madpo_trainer.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{step - 1}"))
    assert madpo_trainer.global_step == step


def test_lora_agents_on_one_base_train_only_their_adapters(tmp_path):
    tok = char_tokenizer()
    base = tiny_llama(tok)
    before = [p.detach().clone() for p in base.parameters()]
    madpo_trainer = trainer(
        tmp_path, agents=[base, base], peft_config=lora(), args=config(tmp_path, dpo_reference="initial")
    )
    adapters = [torch.cat([p.detach().reshape(-1) for p in params]) for params in madpo_trainer.agents.parameters]
    madpo_trainer.train()
    after = [torch.cat([p.detach().reshape(-1) for p in params]) for params in madpo_trainer.agents.parameters]
    assert all(not torch.equal(a, b) for a, b in zip(adapters, after))
    base_weights = [p for name, p in madpo_trainer.agents[0].named_parameters() if "lora_" not in name]
    assert all(torch.equal(a, b) for a, b in zip(before, base_weights))


def test_importable_from_1_4_3s_paths_and_built_positionally(tmp_path):
    assert comlrl.MADPOTrainer is MADPOTrainer is madpo.MADPOTrainer and comlrl.MADPOConfig is madpo.MADPOConfig
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    # 1.4.3's order: agent_model, agents, num_agents, tokenizer, model_config, train_dataset, eval_dataset, reward_func
    positional = MADPOTrainer(None, agents, 2, tok, None, DATA, None, content_score, args=config(tmp_path))
    assert positional.train_prompts.rows == DATA and positional.num_agents == 2


# ------------------------------------------------------------------------------ bad inputs
def test_a_constant_reward_gives_no_pairs_and_says_why(tmp_path):
    madpo_trainer = trainer(tmp_path, reward=lambda a, b: [1.0] * len(a))
    with pytest.raises(ValueError, match=r"no preference pairs: .* all got the same reward \(e.g. 1\).*constant"):
        madpo_trainer.train()
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_rewards_that_differ_per_agent_are_refused(tmp_path):
    madpo_trainer = trainer(tmp_path, reward=lambda a, b: [[float(len(x)), float(len(y)) + 1] for x, y in zip(a, b)])
    with pytest.raises(ValueError, match=r"MADPO ranks joint actions by one reward shared by every agent"):
        madpo_trainer.train()


def test_the_pairs_exist_only_once_training_starts(tmp_path):
    with pytest.raises(RuntimeError, match=r"makes its preference pairs when train\(\) starts"):
        trainer(tmp_path).steps_per_epoch  # noqa: B018


def test_an_adapter_without_centralized_mode_and_big_candidate_sets_are_refused(tmp_path):
    # centralized MADPO itself: tests/test_centralized_madpo.py
    with pytest.raises(
        ValueError, match=r"adapter is given, but collaboration_mode='decentralized'.*set collaboration_mode"
    ):
        trainer(tmp_path, centralized_comparator_adapter=object())
    with pytest.raises(ValueError, match=r"samples 4000 completions at a time .* above max_generations_per_step=3000"):
        trainer(tmp_path, args=config(tmp_path, preference_num_candidates=1000, max_generations_per_step=3000))


def test_resuming_needs_a_madpo_checkpoint_with_the_same_pairs_per_step(tmp_path):
    magrpo = make_trainer(tmp_path / "g", args=small_config(tmp_path / "g", save_steps=1))
    magrpo.train()
    with pytest.raises(ValueError, match=r"holds no preference_pairs.pt: it was not written by MADPOTrainer"):
        trainer(tmp_path / "g", args=config(tmp_path / "g")).train(resume_from_checkpoint=True)
    trainer(tmp_path, args=config(tmp_path, save_steps=1, num_train_epochs=1)).train()
    with pytest.raises(ValueError, match=r"trained on 2 pairs per step; this config has 3 \(train_batch_size\)"):
        trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, train_batch_size=3)).train(
            resume_from_checkpoint=True
        )


# ------------------------------------------------------------------------------ the example
def test_the_example_runs_on_a_tiny_model_with_the_w_and_b_flags(tmp_path, fake_wandb, capsys):
    example = load_example("madpo-story-len-ratio.py")
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    flags = ["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--epochs", "1", "--num-candidates", "2",
             "--max-new-tokens", "4", "--wandb", "--wandb-project", "proj", "--wandb-entity", "team"]  # fmt: skip
    example.main(flags)
    summary = capsys.readouterr().out
    assert "preference pairs" in summary and "before" in summary and "after" in summary
    assert f"run folder {out}: metrics.jsonl; curves in metrics.png;" in summary and (out / "metrics.png").is_file()
    assert (fake_wandb["init"]["project"], fake_wandb["init"]["entity"]) == ("proj", "team") and fake_wandb["finished"]
    assert (out / "models" / "agent_1" / "model.safetensors").exists()
    defaults = example.parse_args([])
    assert (defaults.num_candidates, defaults.pairs_per_prompt, defaults.max_new_tokens) == (6, 2, 48)
    assert not defaults.wandb
