"""IAC and MAAC: advantages from the critics as the formulas say, multi-turn, checkpoints
and saved models that carry the critics, clear errors for bad input (learning: test_learning.py)."""

import json
import os

import pytest
import torch

from comlrl.algorithms.returns import tree_returns
from comlrl.models.value import VALUE_HEAD_FILE, ValueHead
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig

from .helpers import (
    DATA,
    MIXED,
    assert_every_field_documented,
    char_tokenizer,
    interrupting_reward,
    length_sum,
    log_lines,
    lora,
    revise,
    tiny_gpt2,
    tiny_llama,
)

CRITIC_TOKENIZER = char_tokenizer(MIXED + "[]|\n")  # encodes the joint inputs "[Agent 0] ..." and revisions "a | b"


def ac_config(config_class, tmp_path, **overrides):
    values = dict(
        num_train_epochs=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=6,
        logging_steps=1,
        agent_learning_rate=1e-3,
        critic_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return config_class(**values)


def separate_critics(count, seed=10):
    return [tiny_gpt2(CRITIC_TOKENIZER, seed=seed + c) for c in range(count)]


def make_ac_trainer(tmp_path, trainer_class=IACTrainer, layout="head", tokenizer=None, **kwargs):
    """``layout``: "head" (value heads on the agents, IAC only) or "separate" critic models."""
    tok = tokenizer or char_tokenizer()
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    kwargs.setdefault("args", ac_config(config_class, tmp_path))
    kwargs.setdefault("train_dataset", DATA)
    kwargs.setdefault("reward_func", length_sum)
    if layout == "separate":
        kwargs.setdefault("critics", separate_critics(1 if trainer_class is MAACTrainer else 2))
        kwargs.setdefault("critic_tokenizer", CRITIC_TOKENIZER)
    return trainer_class(agents=[tiny_llama(tok, seed=i) for i in range(2)], tokenizer=tok, **kwargs)


def all_weights(trainer):
    """Every trained tensor: agents, separate critic models, value heads."""
    modules = list(trainer.agents) + [c.backbone for c in trainer.critics if c.agent is None]
    modules += [c.head for c in trainer.critics]
    return [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in modules]


LAYOUTS = [
    (IACTrainer, "head", "v"),
    (IACTrainer, "separate", "q"),
    (MAACTrainer, "separate", "v"),
    (MAACTrainer, "separate", "q"),
]


@pytest.mark.parametrize("trainer_class,critics,critic_type", LAYOUTS)
def test_single_turn_advantage_is_the_reward_minus_the_critics_value(tmp_path, trainer_class, critics, critic_type):
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    args = ac_config(config_class, tmp_path, critic_type=critic_type, advantage_normalization=False)
    trainer = make_ac_trainer(tmp_path, trainer_class, critics, args=args)
    trainer.train()  # the critics move away from 0, so the baseline below is not trivially 0
    tree = trainer.rollout(trainer.train_prompts, [0, 1])
    estimate = trainer.objective.estimate(tree)
    rewards = tree.turns[0].rewards  # (M=2, J=2, N=2), aligned: joint action k holds sample k
    values = [v[0] for v in estimate.old_values]
    assert any(v.abs().max() > 1e-3 for v in values)
    for i in range(2):
        if trainer_class is IACTrainer:
            node_value = values[i][:, 0].reshape(2, -1).mean(dim=1)  # V: one per node; Q: mean of G
        else:
            node_value = values[0][:, i].reshape(2, -1).mean(dim=1)
        expected = rewards[:, :, i] - node_value.unsqueeze(1)
        torch.testing.assert_close(estimate.advantages[i][0], expected.reshape(-1))
    # The targets: a V-critic learns each node's mean reward, a Q-critic each action's reward.
    targets = estimate.targets
    if critic_type == "v":
        node_means = rewards.mean(dim=1)
        if trainer_class is IACTrainer:
            torch.testing.assert_close(targets[1][0][:, 0], node_means[:, 1])
        else:
            torch.testing.assert_close(targets[0][0], node_means)
    else:
        if trainer_class is IACTrainer:
            torch.testing.assert_close(targets[1][0][:, 0], rewards[:, :, 1].reshape(-1))
        else:
            torch.testing.assert_close(targets[0][0], rewards.reshape(-1, 2))


def test_advantages_are_whitened_per_agent(tmp_path):
    trainer = make_ac_trainer(tmp_path, args=ac_config(IACConfig, tmp_path, num_generations=3))
    estimate = trainer.objective.estimate(trainer.rollout(trainer.train_prompts, [0, 1]))
    for advantages in estimate.advantages:
        values = torch.cat(advantages)
        assert abs(values.mean().item()) < 1e-5 and abs(values.std(unbiased=False).item() - 1) < 1e-4


def test_two_turn_estimate_bootstraps_from_the_next_turns_value(tmp_path):
    args = ac_config(IACConfig, tmp_path, num_turns=2, gamma=0.9, gae_lambda=0.0, advantage_normalization=False)
    trainer = make_ac_trainer(tmp_path, args=args, external_transition=revise)
    trainer.train()
    tree = trainer.rollout(trainer.train_prompts, [0])
    estimate = trainer.objective.estimate(tree)
    first, second = tree.turns
    # lambda = 0: agent 0's sample k at turn 1 is credited r + 0.9 * V(the node it started).
    next_values = estimate.old_values[0][1][:, 0]  # agent 0's critic, turn 2: one value per node
    expected = first.rewards[0, :, 0] + 0.9 * next_values[first.children[0]]
    torch.testing.assert_close(estimate.credits[0][0, 0], expected)
    assert second.num_nodes == 2
    torch.testing.assert_close(
        estimate.returns[0], tree_returns([first.rewards, second.rewards], [first.children, second.children], 0.9)[0]
    )


@pytest.mark.parametrize("clip_range", [0.2, None])
def test_the_value_loss_gradient_is_value_loss_coef_times_the_squared_errors(tmp_path, clip_range):
    """By hand: a new head predicts v = 0 from zero weights, so the value loss
    ``coef * mean((v - G)^2)`` (comlrl 1.4.3's, no factor 1/2) gives its bias the gradient
    ``coef * mean(2 (v - G)) = -2 * coef * mean(G)``; clipping changes nothing at v = old."""
    args = ac_config(IACConfig, tmp_path, value_loss_coef=0.6, value_clip_range=clip_range)
    trainer = make_ac_trainer(tmp_path, args=args)
    estimate = trainer.objective.estimate(tree := trainer.rollout(trainer.train_prompts, [0, 1]))
    trainer.learners.zero_grad()
    critic_loss = trainer.objective.update.auxiliary[-1]
    metrics = critic_loss.backward(tree, estimate)
    for c, critic in enumerate(trainer.critics):
        targets = torch.cat([t.reshape(-1) for t in estimate.targets[c]])
        assert targets.abs().sum() > 0
        expected = -2 * 0.6 * targets.mean()
        torch.testing.assert_close(critic.head.layers[-1].bias.grad, expected.reshape(1))
        assert metrics[f"critic{c}/value_loss"].value() == pytest.approx((targets**2).mean().item())


def test_metrics_name_every_critic_and_the_ppo_terms(tmp_path):
    args = ac_config(IACConfig, tmp_path, ppo_epochs=2, entropy_coef=0.01, epsilon=0.01)
    trainer = make_ac_trainer(tmp_path, layout="separate", args=args)
    trainer.train()
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("critic0/value_loss", "critic1/value_mean", "critic1/grad_norm", "critic0/learning_rate"):
        assert key in line
    assert line["agent0/entropy"] > 0 and "agent1/clip_fraction" in line


@pytest.mark.parametrize(
    "trainer_class,critics", [(IACTrainer, "head"), (IACTrainer, "separate"), (MAACTrainer, "separate")]
)
def test_stop_and_resume_carries_the_critics(tmp_path, trainer_class, critics):
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig

    def build(run, **kwargs):
        args = ac_config(config_class, run, num_train_epochs=2, ppo_epochs=2, lr_scheduler_type="linear")
        return make_ac_trainer(run, trainer_class, critics, args=args, **kwargs)

    straight = build(tmp_path / "a")
    straight.train()
    first = build(tmp_path / "b", reward_func=interrupting_reward(1))
    assert first.train().interrupted
    checkpoint = tmp_path / "b" / "run" / "checkpoint-1"
    if critics == "head":
        assert (checkpoint / "agent_0" / VALUE_HEAD_FILE).is_file()
    else:
        assert (checkpoint / "critic_0" / VALUE_HEAD_FILE).is_file() and (
            checkpoint / "critic_0" / "config.json"
        ).is_file()
    second = build(tmp_path / "b")
    second.train(resume_from_checkpoint=True)
    for a, b in zip(all_weights(straight), all_weights(second)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert log_lines(tmp_path / "b" / "run", "metrics.jsonl") == log_lines(tmp_path / "a" / "run", "metrics.jsonl")


def test_resuming_without_the_critics_is_refused(tmp_path):
    trainer = make_ac_trainer(tmp_path, layout="separate", reward_func=interrupting_reward(1))
    assert trainer.train().interrupted
    heads_on_agents = make_ac_trainer(tmp_path)
    with pytest.raises(
        ValueError, match=r"agent_0 holds no value head \(value_head.safetensors, or comlrl 1.4.3's value_head.pt\)"
    ):
        heads_on_agents.train(resume_from_checkpoint=True)


@pytest.mark.parametrize("critics", ["head", "separate"])
def test_save_model_writes_value_heads_beside_agents_or_critic_folders(tmp_path, critics):
    trainer = make_ac_trainer(tmp_path, layout=critics)
    folders = [os.path.basename(f) for f in trainer.save_model(str(tmp_path / "saved"))]
    expected = ["agent_0", "agent_1"] + (["critic_0", "critic_1"] if critics == "separate" else [])
    assert folders == expected
    owner = "agent_1" if critics == "head" else "critic_1"
    head = ValueHead(32)
    head.load(str(tmp_path / "saved" / owner))
    for a, b in zip(head.parameters(), trainer.critics[1].head.parameters()):
        assert torch.equal(a, b)


def test_centralized_critic_that_cannot_encode_the_joint_input_is_named_at_start_up(tmp_path):
    tok = char_tokenizer()  # no "[", "]" or newline
    with pytest.raises(
        ValueError, match=r"critic 0's input for dataset row 0 \(turn 1\) holds characters its tokenizer"
    ):
        make_ac_trainer(tmp_path, MAACTrainer, critics=[tiny_gpt2(tok, seed=9)], critic_tokenizer=tok)


@pytest.mark.parametrize(
    "trainer_class,kwargs,error,match",
    [
        (IACTrainer, {"critics": "one"}, ValueError, r"critics holds 1 models; IAC \(one critic per agent\) needs 2"),
        (MAACTrainer, {"critics": "two"}, ValueError, "critics holds 2 models; MAAC's centralized critic needs 1"),
        (MAACTrainer, {}, ValueError, "MAAC needs a centralized critic model"),
        (IACTrainer, {"critic_model": "instance"}, ValueError, "critic_model is one model instance but IAC"),
        (IACTrainer, {"critics": "agents"}, ValueError, r"critics\[0\] is an agent's model"),
        (IACTrainer, {"critics": "two", "critic_model": "x"}, ValueError, "whether they name the same model cannot"),
        (IACTrainer, {"args": MAGRPOConfig()}, TypeError, "args must be a IACConfig, got MAGRPOConfig"),
    ],
)
def test_bad_critic_arguments(tmp_path, trainer_class, kwargs, error, match):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    models = {"one": separate_critics(1), "two": separate_critics(2), "agents": agents, "instance": tiny_gpt2(tok)}
    kwargs = {k: models.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    kwargs.setdefault("args", ac_config(config_class, tmp_path))
    with pytest.raises(error, match=match):
        trainer_class(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=length_sum, **kwargs)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("gae_lambda", 1.5, r"gae_lambda must be in \[0, 1\]"),
        ("gae_lambda", -0.1, r"gae_lambda must be in \[0, 1\]"),
        ("gamma", 2, r"gamma must be in \[0, 1\]"),
        ("ppo_epochs", 0, "ppo_epochs must be an integer >= 1"),
        ("critic_type", "a", r"critic_type='a'; expected one of \['q', 'v'\]"),
        ("value_clip_range", 0, r"value_clip_range must be > 0 or None \(off\)"),
        ("value_loss_coef", -1, r"value_loss_coef must be a finite number in \(0, 1000\]"),
        ("critic_learning_rate", 0, r"critic_learning_rate must be a finite number in \(0, 1\]"),
        ("value_head_hidden_dim", 0, "value_head_hidden_dim must be an integer >= 1 or None"),
    ],
)
def test_bad_actor_critic_config_is_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        IACConfig(**{field: value})


@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
def test_every_actor_critic_field_is_documented(config_class):
    assert_every_field_documented(config_class)
    assert config_class().num_generations == 1


def test_value_heads_on_agents_sharing_one_lora_base(tmp_path):
    tok = char_tokenizer()
    base = tiny_llama(tok, seed=0)
    frozen = [p.detach().clone() for n, p in base.named_parameters()]
    trainer = IACTrainer(
        agents=[base, base],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        peft_config=lora(),
        args=ac_config(IACConfig, tmp_path),
    )
    trainer.train()
    assert all(c.head.layers[-1].weight.abs().sum() > 0 for c in trainer.critics)
    base_weights = [p for n, p in trainer.agents[0].named_parameters() if "lora_" not in n]
    assert all(torch.equal(a, b) for a, b in zip(frozen, base_weights))
    saved = trainer.save_model(str(tmp_path / "saved"))
    assert all(os.path.isfile(os.path.join(f, "adapter_model.safetensors")) for f in saved)
    assert all(os.path.isfile(os.path.join(f, VALUE_HEAD_FILE)) for f in saved)


@pytest.mark.parametrize("trainer_class", [IACTrainer, MAACTrainer])
@pytest.mark.parametrize("num_turns", [1, 2])
def test_one_generation_per_prompt_trains_single_and_multi_turn(tmp_path, trainer_class, num_turns):
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    args = ac_config(config_class, tmp_path, num_generations=1, num_turns=num_turns, critic_type="q")
    trainer = make_ac_trainer(
        tmp_path, trainer_class, "separate", args=args, external_transition=revise if num_turns > 1 else None
    )
    before = all_weights(trainer)
    result = trainer.train()
    assert result.global_step == 2
    assert all(not torch.equal(a, b) for a, b in zip(before, all_weights(trainer)))
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert (f"turn_{num_turns}/reward_mean" in line) and "critic0/value_loss" in line


def test_separate_critics_follow_their_agents_devices(tmp_path):
    args = ac_config(IACConfig, tmp_path, agent_devices="cpu")
    trainer = make_ac_trainer(tmp_path, layout="separate", args=args)
    assert trainer.agents.placed
    assert all(next(c.backbone.parameters()).device.type == "cpu" for c in trainer.critics)
