"""Multi-turn rollout trees: their shape, the transition's arguments, branch ending, early
termination, returns and advantages by hand, batching of a level, and bad input."""

import dataclasses
import json

import pytest
import torch

import comlrl.rollout.backends as backends_module
from comlrl.algorithms import joint_action_indices, token_weights
from comlrl.algorithms.returns import tree_advantages
from comlrl.metrics.rollout import completion_samples
from comlrl.rollout.tree import tree_size

from .helpers import DATA, make_trainer, multi_turn_trainer, revise, small_config, snapshot, unchanged


# ------------------------------------------------------------------------------ tree shape
@pytest.mark.parametrize("num_agents", [2, 3])
@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_generate_and_transition_calls_match_the_tree(tmp_path, monkeypatch, num_agents, joint_mode):
    generate_calls = []  # (agent, number of prompts) of every generate call
    transition_calls = []

    def counting_transition(**kwargs):
        transition_calls.append(kwargs)
        return revise(**kwargs)

    trainer = multi_turn_trainer(tmp_path, num_agents, counting_transition, joint_mode=joint_mode)
    real = backends_module.generate_group

    def counting_generate(model, tokenizer, prompts, num_generations, sampling, generator=None, **options):
        generate_calls.append((trainer.agents.index(model), len(prompts)))
        return real(model, tokenizer, prompts, num_generations, sampling, generator, **options)

    monkeypatch.setattr(backends_module, "generate_group", counting_generate)
    rows = [0, 2]
    tree = trainer.rollout(trainer.train_prompts, rows)
    num_joint = 2 if joint_mode == "aligned" else 2**num_agents
    size = tree_size(len(rows), num_agents, 2, num_joint, 2)
    # ONE generate call per agent per turn (agents may run in parallel threads, so in any
    # order within a turn); turn 2 batches all B * J nodes together.
    first, second = sorted(generate_calls[:num_agents]), sorted(generate_calls[num_agents:])
    assert first + second == [(i, 2) for i in range(num_agents)] + [(i, 2 * num_joint) for i in range(num_agents)]
    assert len(transition_calls) == size.transition_calls == 2 * num_joint == tree.transition_calls
    assert tree.generate_calls == 2 * num_agents
    assert [t.num_nodes for t in tree.turns] == [2, 2 * num_joint]
    assert sum(t.num_nodes for t in tree.turns) == size.nodes
    assert sum(a.completion_ids.shape[0] for t in tree.turns for a in t.agents) == size.generations
    assert [t.rewards.shape for t in tree.turns] == [(2, num_joint, num_agents), (2 * num_joint, num_joint, num_agents)]
    assert tree.turns[0].children.flatten().tolist() == list(range(2 * num_joint))
    assert (tree.turns[1].children == -1).all()


def test_tree_size_by_hand():
    # 3 rows, 2 agents, G = 2, cross (J = 4), 3 turns: 1 + 4 + 16 = 21 nodes per row
    size = tree_size(3, 2, 2, 4, 3)
    assert (size.nodes, size.joint_actions, size.generations, size.transition_calls) == (63, 252, 252, 60)


def test_transition_gets_the_joint_action_and_histories_and_its_prompts_are_formatted(tmp_path):
    seen = []

    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent, row, turn
    ):
        seen.append(
            (prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent, row, turn)
        )
        return [f"next{i}" for i in range(num_agents)]

    formatters = [lambda r: "A:" + r["prompt"], lambda r: "B:" + r["prompt"]]
    trainer = multi_turn_trainer(tmp_path, transition=transition, formatters=formatters)
    tree = trainer.rollout(trainer.train_prompts, [1])
    first, second = tree.turns
    for j, (prompt, completions, num_agents, prompts, responses, row, turn) in enumerate(seen):
        texts = [first.agents[i].texts[j] for i in range(2)]  # aligned: joint action j = sample j of each agent
        assert (prompt, completions, num_agents, row, turn) == ("a cat", texts, 2, DATA[1], 1)
        assert prompts == [["A:a cat"], ["B:a cat"]] and first.prompts == [["A:a cat"], ["B:a cat"]]
        assert responses == [[texts[0]], [texts[1]]]  # the turn just played is included
    # Not passed through: each returned prompt replaced the row's prompt column and was formatted.
    assert second.prompts == [["A:next0", "A:next0"], ["B:next1", "B:next1"]]
    assert second.prompt_history[1] == [["A:a cat", "A:next0"], ["B:a cat", "B:next1"]]


def test_passthrough_uses_the_transition_prompts_verbatim(tmp_path):
    trainer = multi_turn_trainer(
        tmp_path,
        transition=lambda prompt: ["raw0", "raw1"],
        formatters=lambda r: "A:" + r["prompt"],
        external_prompt_passthrough=True,
    )
    tree = trainer.rollout(trainer.train_prompts, [0])
    assert tree.turns[1].prompts == [["raw0", "raw0"], ["raw1", "raw1"]]


def test_none_ends_a_branch(tmp_path):
    def transition(agent_completions, turn):
        return None if len(agent_completions[0]) % 2 else ["x", "y"]

    trainer = multi_turn_trainer(tmp_path, transition=transition, num_generations=4)
    tree = trainer.rollout(trainer.train_prompts, [0, 1, 2])
    first = tree.turns[0]
    ends = [len(first.agents[0].texts[k]) % 2 == 1 for k in range(12)]  # aligned: joint j = sample j
    assert 0 < sum(ends) < 12, "the test needs some branches to end and others to go on"
    assert first.children.reshape(-1).lt(0).tolist() == ends
    assert tree.turns[1].num_nodes == 12 - sum(ends) and tree.transition_calls == 12


def test_early_termination_skips_nodes_above_the_threshold(tmp_path):
    calls = []

    def reward(prompts, a, b, turn):  # row 1 ("a cat") scores 5 at turn 1, every other node 0
        return [5.0 if turn == 1 and p == "a cat" else 0.0 for p in prompts]

    trainer = multi_turn_trainer(
        tmp_path,
        transition=lambda prompt: calls.append(prompt) or ["p", "q"],
        reward=reward,
        early_termination_threshold=1.0,
    )
    tree = trainer.rollout(trainer.train_prompts, [0, 1, 2])
    first = tree.turns[0]
    expanded = torch.tensor([True, False, True])
    assert first.children.ge(0).all(dim=1).tolist() == expanded.tolist()
    assert first.children.lt(0).all(dim=1).tolist() == (~expanded).tolist()
    assert len(calls) == 4 and tree.turns[1].rows == [0, 0, 2, 2]


# ------------------------------------------------------------------------------ returns by hand
def test_two_turn_returns_and_advantages_by_hand_aligned():
    # 1 row, N = 2, G = 2, aligned (J = 2), discount 0.5. Turn 1 rewards [1, 3]; joint 0 started
    # node 0 (rewards [2, 4]), joint 1 ended early (early termination or the environment).
    # Returns turn 1: [1 + 0.5 * 3, 3] = [2.5, 3]. Aligned: sample k of each agent = joint k.
    # Advantages (mean baseline, not normalised): turn 1 [-0.25, 0.25]; turn 2 [-1, 1].
    # Normalised: / unbiased std: std([2.5, 3]) = 0.5 / sqrt(2); std([2, 4]) = sqrt(2).
    rewards = [torch.tensor([[[1.0, 1.0], [3.0, 3.0]]]), torch.tensor([[[2.0, 2.0], [4.0, 4.0]]])]
    children = [torch.tensor([[0, -1]]), torch.tensor([[-1, -1]])]
    indices = joint_action_indices(2, 2, "aligned")
    out = tree_advantages(rewards, children, indices, 2, 0.5, "mean", normalize=False)
    torch.testing.assert_close(out.returns[0], torch.tensor([[[2.5, 2.5], [3.0, 3.0]]]))
    for agent in range(2):
        torch.testing.assert_close(out.advantages[agent][0], torch.tensor([-0.25, 0.25]))
        torch.testing.assert_close(out.advantages[agent][1], torch.tensor([-1.0, 1.0]))
    normalized = tree_advantages(rewards, children, indices, 2, 0.5, "mean", normalize=True)
    s = 0.5 / 2**0.5
    torch.testing.assert_close(normalized.advantages[0][0], torch.tensor([-0.25, 0.25]) / (s + 1e-6))
    torch.testing.assert_close(normalized.advantages[1][1], torch.tensor([-1.0, 1.0]) / (2**0.5 + 1e-6))


def test_two_turn_returns_and_advantages_by_hand_cross():
    # N = 2, G = 2, cross: joint actions (0,0) (0,1) (1,0) (1,1) with turn-1 rewards [1, 2, 3, 4];
    # only joint 3 goes on, to a node with rewards [0, 0, 0, 8] (mean 2); discount 1.
    # Turn 1 returns [1, 2, 3, 6]. Credit = mean over the joint actions holding the sample:
    #   agent 0: sample 0 -> (1 + 2) / 2 = 1.5, sample 1 -> (3 + 6) / 2 = 4.5 -> advantages [-1.5, 1.5]
    #   agent 1: sample 0 -> (1 + 3) / 2 = 2,   sample 1 -> (2 + 6) / 2 = 4   -> advantages [-1, 1]
    # Turn 2 (leaves): agent 0: [0, 4] -> [-2, 2]; agent 1: [0, 4] -> [-2, 2].
    rewards = [torch.tensor([[1.0, 2.0, 3.0, 4.0]]).unsqueeze(-1).expand(1, 4, 2),
               torch.tensor([[0.0, 0.0, 0.0, 8.0]]).unsqueeze(-1).expand(1, 4, 2)]  # fmt: skip
    children = [torch.tensor([[-1, -1, -1, 0]]), torch.full((1, 4), -1)]
    out = tree_advantages(rewards, children, joint_action_indices(2, 2, "cross"), 2, 1.0, "mean", normalize=False)
    torch.testing.assert_close(out.returns[0][0, :, 0], torch.tensor([1.0, 2.0, 3.0, 6.0]))
    torch.testing.assert_close(out.credits[0][:, 0], torch.tensor([[1.5, 4.5], [2.0, 4.0]]))
    torch.testing.assert_close(out.advantages[0][0], torch.tensor([-1.5, 1.5]))
    torch.testing.assert_close(out.advantages[1][0], torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(out.advantages[0][1], torch.tensor([-2.0, 2.0]))
    torch.testing.assert_close(out.advantages[1][1], torch.tensor([-2.0, 2.0]))


def test_training_step_reports_discounted_returns_per_turn(tmp_path):
    def reward(a, b, turn):
        return [float(turn)] * len(a)  # 1 at turn 1, 2 at turn 2

    trainer = multi_turn_trainer(tmp_path, reward=reward, discount=0.25)
    metrics = trainer.training_step([0])
    assert metrics["turn_1/reward_mean"] == 1.0 and metrics["turn_2/reward_mean"] == 2.0
    assert metrics["turn_1/expected_return"] == 1.0 + 0.25 * 2.0 and metrics["turn_2/expected_return"] == 2.0
    assert (metrics["turn_1/nodes"], metrics["turn_2/nodes"]) == (1.0, 2.0)
    assert metrics["rollout/generate_calls"] == 4.0 and metrics["rollout/transition_calls"] == 2.0


def test_later_turns_are_trained(tmp_path):
    # Turn 1 rewards are constant and the discount is 0, so turn-1 advantages are all 0: any
    # weight change can only come from the turn-2 samples.
    def reward(a, b, turn):
        return [1.0 if turn == 1 else float(len(x) + 2 * len(y)) for x, y in zip(a, b)]

    trainer = multi_turn_trainer(tmp_path, reward=reward, discount=0.0, num_generations=4, max_new_tokens=6)
    before = snapshot(trainer.agents)
    metrics = trainer.training_step([0, 1])
    assert metrics["agent0/loss"] != 0.0 and not any(unchanged([b], [a]) for b, a in zip(before, trainer.agents)), (
        "both agents must learn from turn 2"
    )


# ------------------------------------------------------------------------------ bad input
def test_multi_turn_without_transition_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_turns=2 needs external_transition="):
        make_trainer(tmp_path, args=small_config(tmp_path, num_turns=2))


def test_tree_budget_names_the_numbers_and_the_knobs(tmp_path):
    with pytest.raises(ValueError) as error:
        multi_turn_trainer(tmp_path, joint_mode="cross", num_turns=3, num_generations=4, max_generations_per_step=1000)
    message = str(error.value)
    # 2 rows x (1 + 16 + 256) nodes x 2 agents x 4 generations
    for part in ("up to 4368 completions", "546 nodes", "max_generations_per_step=1000", "num_turns", "aligned"):
        assert part in message, message


@pytest.mark.parametrize(
    "transition,error,match",
    [
        (
            lambda prompt: 1 / 0,
            RuntimeError,
            r"raised ZeroDivisionError: division by zero \(after turn 1 on train_dataset row 1\)",
        ),
        (
            lambda prompt: ["only one"],
            ValueError,
            r"returned 1 prompts after turn 1 on train_dataset row 1; expected 2",
        ),
        (lambda prompt: ["ok", 7], TypeError, r"returned int for agent 1 after turn 1 on train_dataset row 1"),
        (lambda prompt: "one string", TypeError, r"returned str after turn 1 on train_dataset row 1"),
    ],
)
def test_bad_transition_is_named_with_turn_agent_and_row(tmp_path, transition, error, match):
    trainer = multi_turn_trainer(tmp_path, transition=transition)
    before = snapshot(trainer.agents)
    with pytest.raises(error, match=match):
        trainer.training_step([1])
    assert unchanged(before, trainer.agents), "no weight may change in a step that failed"


def test_transition_that_needs_unknown_arguments_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"requires \['mode'\].*functools.partial"):
        multi_turn_trainer(tmp_path, transition=lambda prompt, mode: [prompt, prompt])


def test_formatter_failing_on_a_later_turn_names_the_turn(tmp_path):
    # The formatter needs a non-empty prompt; the transition gives agent 0 an empty one.
    trainer = multi_turn_trainer(tmp_path, transition=lambda prompt: ["", "ok"], formatters=lambda r: r["prompt"][0])
    with pytest.raises(RuntimeError, match=r"of agent 0 raised IndexError.*train_dataset row 0 at turn 2"):
        trainer.rollout(trainer.train_prompts, [0])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_give_the_loss_and_gradient_of_one_pass(tmp_path, loss_type):
    trainer = multi_turn_trainer(tmp_path, loss_type=loss_type, num_generations=3, max_new_tokens=5)
    tree = trainer.rollout(trainer.train_prompts, [0, 2])
    rollouts = [turn.agents[0] for turn in tree.turns]
    lengths = torch.cat([r.lengths for r in rollouts])
    assert lengths.unique().numel() > 1, "the test needs completions of different lengths"
    advantages = [torch.linspace(-1, 1, r.lengths.numel()) for r in rollouts]
    weights = token_weights(lengths, loss_type, 5).split([r.lengths.numel() for r in rollouts])
    results = []
    for size in (None, 1, 4):
        trainer.objective.update.args = dataclasses.replace(trainer.args, micro_batch_size=size)
        trainer.learners.zero_grad()
        out = trainer.objective.update.agent_backward(0, rollouts, advantages, weights, None, None)
        gradient = torch.cat([p.grad.reshape(-1) for p in trainer.agents[0].parameters()])
        results.append((torch.tensor(out["agent0/loss"].value()), gradient))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------ logged samples
def test_samples_of_each_turn_are_logged_with_their_joint_action(tmp_path):
    trainer = multi_turn_trainer(tmp_path, joint_mode="cross", num_completions_to_log=3)
    # 3 rows, 2 per step: 2 steps, each a logging step (logging_steps=1)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(line["step"], line["turn"]) for line in lines] == [(1, 1)] * 3 + [(1, 2)] * 3 + [(2, 1)] * 3 + [(2, 2)] * 3
    keys = {"step", "turn", "row", "prompt", "agent0_prompt", "agent1_prompt", "agent0_completion",
            "agent1_completion", "reward", "return"}  # fmt: skip
    assert all(set(line) == keys for line in lines)
    # length_sum: the reward is the joint action's total length, in every turn
    assert all(line["reward"] == len(line["agent0_completion"]) + len(line["agent1_completion"]) for line in lines)
    assert all(line["return"] >= line["reward"] for line in lines if line["turn"] == 1)
    assert all(line["agent0_prompt"].startswith(line["prompt"] + " | others: ") for line in lines if line["turn"] == 2)


def test_completion_samples_pick_each_agents_part_of_the_joint_action(tmp_path):
    trainer = multi_turn_trainer(tmp_path, joint_mode="cross", num_turns=2, num_generations=2)
    tree = trainer.rollout(trainer.train_prompts, [0])
    samples = completion_samples(tree, [t.rewards for t in tree.turns], trainer.train_prompts, per_turn=4)
    samples = [s for s in samples if s["turn"] == 1]
    texts = [agent.texts for agent in tree.turns[0].agents]
    # cross, G = 2: joint actions (0, 0), (0, 1), (1, 0), (1, 1)
    pairs = [(s["agent0_completion"], s["agent1_completion"]) for s in samples]
    assert pairs == [(texts[0][a], texts[1][b]) for a in range(2) for b in range(2)]


def test_tensorboard_and_wandb_get_metrics_and_samples_from_training(tmp_path, fake_wandb):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = multi_turn_trainer(
        tmp_path, trainer_kwargs=dict(wandb_config={"project": "p"}), log_tensorboard=True, num_completions_to_log=1
    )
    trainer.train()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("turn_2/reward_mean")] == [1, 2]
    assert "samples/text_summary" in events.Tags()["tensors"]
    tables = [metrics["samples"] for metrics, _ in fake_wandb["log"] if "samples" in metrics]
    assert len(tables) == 2 and tables[0][0][:3] == ["turn", "row", "prompt"] and len(tables[0][1]) == 2
