"""What a step's rollout tree looks like, as metrics and as samples to read."""

from __future__ import annotations

import re
from typing import Any

import torch

from comlrl.metrics import stats
from comlrl.metrics.stats import Stat
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree

_AGENT_KEY = re.compile(r"^agent(\d+)/")


def rollout_metrics(
    tree: RolloutTree,
    returns: list[torch.Tensor],
    credits: list[torch.Tensor],
    advantages: list[list[torch.Tensor]],
) -> dict[str, Stat]:
    """What one step's samples look like: rewards (joint, per function, per agent, per turn),
    advantages, completion lengths, truncation and groups that carry no signal (all returns
    equal), over every turn of the tree; as :class:`Stat` sums that add up over ranks.

    Args:
        tree: the step's rollout.
        returns: per turn, ``(nodes, J, N)`` returns of the joint actions.
        credits: per turn, ``(N, nodes, G)`` each agent's samples' returns.
        advantages: ``[agent][turn]`` advantages of the samples.
    """
    turns = tree.turns
    rewards = torch.cat([t.rewards.reshape(-1, t.rewards.shape[-1]) for t in turns])  # (joint actions, N)
    per_function = torch.cat([t.per_function_rewards.flatten(1, 2) for t in turns], dim=1)  # (F, joint actions, N)
    metrics = {
        "reward/mean": stats.mean_of(rewards),
        "reward/std": stats.std_of(rewards),
        "reward/raw_mean": stats.mean_of(torch.cat([t.raw_rewards.reshape(-1) for t in turns])),
        # every rank makes the same calls
        "rollout/generate_calls": stats.same(tree.generate_calls),
        "rollout/transition_calls": stats.total(tree.transition_calls),
    }
    for name, values in zip(tree.reward_names, per_function):
        metrics[f"reward/{name}/mean"] = stats.mean_of(values)
        metrics[f"reward/{name}/std"] = stats.std_of(values)
    for turn, turn_returns in zip(turns, returns):
        # comlrl 1.4.3's names, which dashboards key on
        metrics[f"turn_{turn.number}/reward_mean"] = stats.mean_of(turn.rewards)
        metrics[f"turn_{turn.number}/expected_return"] = stats.mean_of(turn_returns)
        metrics[f"turn_{turn.number}/nodes"] = stats.total(turn.num_nodes)
    for i in range(rewards.shape[1]):
        lengths = torch.cat([t.agents[i].lengths for t in turns]).float()
        agent_advantages = torch.cat(advantages[i])
        metrics[f"agent{i}/reward_mean"] = stats.mean_of(rewards[:, i])
        metrics[f"agent{i}/advantage_mean"] = stats.mean_of(agent_advantages)
        metrics[f"agent{i}/advantage_std"] = stats.std_of(agent_advantages)
        groups = torch.cat([c[i] for c in credits])  # (groups, G)
        flat = (groups.std(dim=1) == 0) if groups.shape[-1] > 1 else torch.ones(groups.shape[0], dtype=torch.bool)
        metrics[f"agent{i}/zero_std_group_frac"] = stats.mean_of(flat.float())
        metrics[f"agent{i}/completion_length"] = stats.mean_of(lengths)
        metrics[f"agent{i}/completion_length_min"] = stats.minimum(lengths)
        metrics[f"agent{i}/completion_length_max"] = stats.maximum(lengths)
        metrics[f"agent{i}/truncated_frac"] = stats.mean_of(torch.cat([t.agents[i].truncated for t in turns]).float())
    return metrics


def completion_samples(
    tree: RolloutTree, returns: list[torch.Tensor], prompts: PromptTable, per_turn: int
) -> list[dict[str, Any]]:
    """The first ``per_turn`` joint actions of each turn, for reading: the row's prompt, each
    agent's prompt and completion, the reward and the return (agent 0's, in a mixed setting)."""
    samples = []
    for turn, turn_returns in zip(tree.turns, returns):
        num_joint = turn.rewards.shape[1]
        for k in range(min(per_turn, turn.num_nodes * num_joint)):
            node, j = divmod(k, num_joint)
            sample: dict[str, Any] = {"turn": turn.number, "row": turn.rows[node]}
            sample["prompt"] = prompts.row_prompts([turn.rows[node]])[0]
            for i, agent in enumerate(turn.agents):
                sample[f"agent{i}_prompt"] = turn.prompts[i][node]
                sample[f"agent{i}_completion"] = agent.texts[
                    node * tree.num_generations + tree.joint_indices[j, i].item()
                ]
            sample["reward"] = turn.rewards[node, j, 0].item()
            sample["return"] = turn_returns[node, j, 0].item()
            samples.append(sample)
    return samples


def format_metrics(step: int, metrics: dict[str, float]) -> str:
    """The console's line for a logging step: the step, the reward, each agent's loss and
    completion length, seconds per step; for an evaluation, its ``eval/`` metrics. The full
    set is in ``metrics.jsonl``."""
    if any(key.startswith("eval/") for key in metrics):
        shown = [f"{key} {value:.4g}" for key, value in metrics.items() if key.startswith("eval/")]
        return " | ".join([f"step {step}"] + shown)
    shown = [f"step {step}"]
    if "reward/mean" in metrics:
        shown.append(f"reward {metrics['reward/mean']:.4g}")
    agents = sorted({int(match.group(1)) for key in metrics if (match := _AGENT_KEY.match(key))})
    for i in agents:
        loss, length = metrics.get(f"agent{i}/loss"), metrics.get(f"agent{i}/completion_length")
        described = ([f"loss {loss:.3g}"] if loss is not None else []) + (
            [f"length {length:.1f}"] if length is not None else []
        )
        shown.append(f"agent{i} " + " ".join(described))
    if "time/step_s" in metrics:
        shown.append(f"{metrics['time/step_s']:.1f} s/step")
    return " | ".join(shown)
