"""The algorithm family on tiny models: variants, clipped passes, KL reference, several and
per-agent rewards, learning-rate schedules."""

import dataclasses

import pytest
import torch

from comlrl.algorithms import group_advantages, per_agent_returns, token_weights
from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

from .helpers import DATA, char_tokenizer, content_score, make_trainer, small_config, snapshot, tiny_llama

VARIANTS = [
    (MAGRPOTrainer, MAGRPOConfig, "mean", True),
    (MAREINFORCETrainer, MAREINFORCEConfig, "raw", False),
    (MARLOOTrainer, MARLOOConfig, "rloo", False),
    (MAReMaxTrainer, MAReMaxConfig, "max", False),
]


@pytest.mark.parametrize("trainer_class,config_class,mode,normalize", VARIANTS)
def test_each_variant_defaults_to_its_baseline(trainer_class, config_class, mode, normalize):
    config = config_class()
    assert (config.advantage_mode, config.advantage_normalization) == (mode, normalize)
    assert isinstance(config, MAGRPOConfig) and trainer_class.config_class is config_class
    tok = char_tokenizer()
    trainer = trainer_class(
        agents=[tiny_llama(tok, 0), tiny_llama(tok, 1)], tokenizer=tok, train_dataset=DATA, reward_func=content_score
    )
    assert type(trainer.args) is config_class


def test_variants_give_different_advantages_and_gradients_on_the_same_rollout(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, num_generations=4))
    rollout = trainer.rollout(trainer.train_prompts, [0, 1, 2]).turns[0]
    returns = per_agent_returns(rollout.rewards, trainer.joint_indices, 4)
    weights = token_weights(rollout.agents[0].lengths, trainer.args.loss_type, trainer.args.max_new_tokens)
    assert returns[0].std(dim=1).gt(0).all(), "every group needs distinct returns for the comparison"
    advantages, gradients = [], []
    for _, config_class, _, _ in VARIANTS:
        config = config_class(**{f.name: getattr(trainer.args, f.name) for f in dataclasses.fields(MAGRPOConfig)
                                 if f.name not in ("advantage_mode", "advantage_normalization")})  # fmt: skip
        adv = group_advantages(returns[0], config.advantage_mode, config.advantage_normalization).reshape(-1)
        trainer.learners.zero_grad()
        trainer.objective.update.agent_backward(0, [rollout.agents[0]], [adv], [weights], None, None)
        advantages.append(adv)
        gradients.append(torch.cat([p.grad.reshape(-1) for p in trainer.agents[0].parameters()]))
    for a in range(len(VARIANTS)):
        for b in range(a + 1, len(VARIANTS)):
            assert not torch.allclose(advantages[a], advantages[b]), (VARIANTS[a][2], VARIANTS[b][2])
            assert not torch.allclose(gradients[a], gradients[b]), (VARIANTS[a][2], VARIANTS[b][2])


def test_several_passes_record_old_logprobs_and_log_clipping(tmp_path):
    trainer = make_trainer(
        tmp_path,
        reward_func=content_score,
        args=small_config(tmp_path, num_iterations=3, epsilon=0.01, agent_learning_rate=5e-2),
    )
    metrics = trainer.training_step([0, 1])
    assert trainer.learners.optimizers[0].state[trainer.agents[0].lm_head.weight]["step"] == 3  # 3 optimizer steps
    assert 0 < metrics["agent0/clip_fraction"] <= 1  # a large step with a tiny clip range clips
    assert "agent0/kl" not in metrics and trainer.agents.references == [None, None]


def test_one_pass_logs_no_clip_fraction(tmp_path):
    metrics = make_trainer(tmp_path, reward_func=content_score).training_step([0])
    assert "agent0/clip_fraction" not in metrics and "agent1/loss" in metrics


def test_kl_reference_is_a_frozen_copy_made_only_when_beta_is_positive(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, beta=0.5))
    reference_before = snapshot(trainer.agents.references)
    agents_before = snapshot(trainer.agents)
    assert all(not p.requires_grad for ref in trainer.agents.references for p in ref.parameters())
    for ref, agent in zip(trainer.agents.references, trainer.agents):
        assert ref is not agent
    first = trainer.training_step([0, 1])
    second = trainer.training_step([0, 1])
    assert first["agent0/kl"] == pytest.approx(0.0, abs=1e-6)  # nothing has moved yet
    assert second["agent0/kl"] > 0
    assert all(torch.equal(b, p) for bs, r in zip(reference_before, trainer.agents.references)
               for b, p in zip(bs, r.parameters()))  # fmt: skip
    assert not all(torch.equal(b, p) for b, p in zip(agents_before[0], trainer.agents[0].parameters()))


def test_per_agent_rewards_give_each_agent_its_returns(tmp_path):
    def opposed(a, b):  # agent 0 rewarded for length, agent 1 for brevity
        return [[float(len(x)), -float(len(y))] for x, y in zip(a, b)]

    trainer = make_trainer(tmp_path, reward_func=opposed)
    rollout = trainer.rollout(trainer.train_prompts, [0]).turns[0]
    lengths0 = torch.tensor([float(len(t)) for t in rollout.agents[0].texts])
    lengths1 = torch.tensor([float(len(t)) for t in rollout.agents[1].texts])
    torch.testing.assert_close(rollout.rewards[0, :, 0], lengths0)
    torch.testing.assert_close(rollout.rewards[0, :, 1], -lengths1)


def test_weighted_reward_functions_are_summed_and_logged_separately(tmp_path):
    def ones(a, b):
        return [1.0] * len(a)

    def twos(a, b):
        return [2.0] * len(a)

    trainer = make_trainer(tmp_path, reward_func=[ones, twos], args=small_config(tmp_path, reward_weights=[0.5, 3.0]))
    metrics = trainer.training_step([0])
    assert metrics["reward/mean"] == pytest.approx(0.5 * 1 + 3.0 * 2)
    assert metrics["reward/ones/mean"] == 1.0 and metrics["reward/twos/mean"] == 2.0


def test_reward_weights_must_match_the_functions(tmp_path):
    with pytest.raises(ValueError, match="reward_weights has 3 values for 1 reward function"):
        make_trainer(tmp_path, args=small_config(tmp_path, reward_weights=[1.0, 2.0, 3.0]))


def test_per_agent_learning_rates_and_a_linear_schedule_with_warmup(tmp_path):
    # 3 rows, batch 1, 2 epochs, 1 pass: 6 optimizer steps; warmup ceil(0.34 * 6) = 3 steps
    # linear warmup: step s < 3 -> lr * s / 3; then linear decay to 0 at step 6: lr * (6 - s) / 3
    config = small_config(
        tmp_path,
        agent_learning_rate=[1e-3, 2e-3],
        lr_scheduler_type="linear",
        warmup_ratio=0.34,
        per_device_train_batch_size=1,
        num_train_epochs=2,
    )
    trainer = make_trainer(tmp_path, reward_func=content_score, args=config)
    seen = []
    for row in [0, 1, 2, 0, 1]:
        seen.append([opt.param_groups[0]["lr"] for opt in trainer.learners.optimizers])
        trainer.training_step([row])
    factors = [0, 1 / 3, 2 / 3, 1, 2 / 3]
    assert [lr for step in seen for lr in step] == pytest.approx([lr * f for f in factors for lr in (1e-3, 2e-3)])


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_other_schedules_end_where_expected(tmp_path, schedule):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, lr_scheduler_type=schedule))
    trainer.train()  # 3 rows, batch 2: 2 steps
    expected = 1e-3 if schedule == "constant" else 0.0
    assert trainer.learners.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected, abs=1e-12)


def test_learning_rate_list_of_the_wrong_length(tmp_path):
    with pytest.raises(
        ValueError, match="got 3 values of agent_learning_rate for 2 agents; pass one, or one per agent"
    ):
        make_trainer(tmp_path, args=small_config(tmp_path, agent_learning_rate=[1e-3] * 3))


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("epsilon", 0.0, "epsilon must be > 0"),
        ("epsilon_high", -0.1, "epsilon_high must be > 0 or None"),
        ("beta", -0.01, r"beta must be a finite number in \[0, 1000\]"),
        ("num_iterations", 0, "num_iterations must be an integer >= 1"),
        ("reward_weights", [], "reward_weights must be None or a non-empty list of finite numbers"),
        ("reward_weights", [1.0, float("inf")], "reward_weights must be None or a non-empty list"),
        ("agent_learning_rate", [1e-3, -1.0], r"agent_learning_rate\[1\] must be a finite number in \(0, 1\]"),
        ("lr_scheduler_type", "step", r"lr_scheduler_type='step'; expected one of \['constant', 'cosine', 'linear'\]"),
        ("warmup_ratio", 1.0, r"warmup_ratio must be in \[0, 1\)"),
    ],
)
def test_bad_objective_fields(field, value, match):
    with pytest.raises(ValueError, match=match):
        MAGRPOConfig(**{field: value})
