"""What a step's rollout tree looks like, as metrics and as samples to read."""

from __future__ import annotations

from typing import Any

import torch

from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree


def _std(values: torch.Tensor) -> float:
    return values.std().item() if values.numel() > 1 else 0.0


def rollout_metrics(
    tree: RolloutTree,
    returns: list[torch.Tensor],
    credits: list[torch.Tensor],
    advantages: list[list[torch.Tensor]],
) -> dict[str, float]:
    """What one step's samples look like: rewards (joint, per function, per agent, per turn),
    advantages, completion lengths, truncation and groups that carry no signal (all returns
    equal), over every turn of the tree.

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
        "reward/mean": rewards.mean().item(),
        "reward/std": _std(rewards),
        "reward/raw_mean": torch.cat([t.raw_rewards.reshape(-1) for t in turns]).mean().item(),
        "rollout/generate_calls": float(tree.generate_calls),
        "rollout/transition_calls": float(tree.transition_calls),
    }
    for name, values in zip(tree.reward_names, per_function):
        metrics[f"reward/{name}/mean"] = values.mean().item()
        metrics[f"reward/{name}/std"] = _std(values)
    for turn, turn_returns in zip(turns, returns):
        metrics[f"turn{turn.number}/reward_mean"] = turn.rewards.mean().item()
        metrics[f"turn{turn.number}/return_mean"] = turn_returns.mean().item()
        metrics[f"turn{turn.number}/nodes"] = float(turn.num_nodes)
    for i in range(rewards.shape[1]):
        lengths = torch.cat([t.agents[i].lengths for t in turns]).float()
        agent_advantages = torch.cat(advantages[i])
        metrics[f"agent{i}/reward_mean"] = rewards[:, i].mean().item()
        metrics[f"agent{i}/advantage_mean"] = agent_advantages.mean().item()
        metrics[f"agent{i}/advantage_std"] = _std(agent_advantages)
        group_std = torch.cat([c[i].std(dim=1) for c in credits]) if credits[0].shape[-1] > 1 else None
        metrics[f"agent{i}/zero_std_group_frac"] = 1.0 if group_std is None else (group_std == 0).float().mean().item()
        metrics[f"agent{i}/completion_length"] = lengths.mean().item()
        metrics[f"agent{i}/completion_length_min"] = lengths.min().item()
        metrics[f"agent{i}/completion_length_max"] = lengths.max().item()
        metrics[f"agent{i}/truncated_frac"] = torch.cat([t.agents[i].truncated for t in turns]).float().mean().item()
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
            sample["prompt"] = prompts.reward_prompts([turn.rows[node]])[0]
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
    """A compact one-line view of the logged metrics for the console."""
    shown = ", ".join(f"{key}={value:.4g}" for key, value in metrics.items() if not key.startswith("time/"))
    return f"step {step}: {shown}"
