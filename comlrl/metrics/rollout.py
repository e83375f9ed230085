"""What a step's rollout tree looks like, as metrics and as samples to read."""

from __future__ import annotations

import re
from typing import Any

import torch

from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree
from comlrl.utils import stats
from comlrl.utils.stats import Stat

_AGENT_KEY = re.compile(r"^agent(\d+)/")
ZERO_SPREAD_KEY = "reward/zero_std_group_frac"
"""The fraction of every agent's groups (G samples of one history) whose returns are all equal."""


def zero_spread(groups: torch.Tensor) -> torch.Tensor:
    """``(num_groups, G)`` returns -> ``(num_groups,)`` bools: True where every return of the
    group is the same, so that no sample did better than another and a group baseline leaves
    each advantage at 0. Exact equality, not ``std == 0``: the std of three float64 0.1s is
    1.7e-17. A group of one sample has no spread."""
    return (groups == groups[:, :1]).all(dim=1)


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
        # the names dashboards key on (the original library's)
        metrics[f"turn_{turn.number}/reward_mean"] = stats.mean_of(turn.rewards)
        metrics[f"turn_{turn.number}/expected_return"] = stats.mean_of(turn_returns)
        metrics[f"turn_{turn.number}/nodes"] = stats.total(turn.num_nodes)
    if len(turns) > 1:  # a path from a row to a joint action that started no next turn: its length in turns
        ends = torch.cat([torch.full((int((t.children < 0).sum()),), float(t.number)) for t in turns])
        metrics["rollout/episode_turns"] = stats.mean_of(ends)
    flat_groups = []
    for i in range(rewards.shape[1]):
        lengths = torch.cat([t.agents[i].lengths for t in turns]).float()
        agent_advantages = torch.cat(advantages[i])
        metrics[f"agent{i}/reward_mean"] = stats.mean_of(rewards[:, i])
        metrics[f"agent{i}/advantage_mean"] = stats.mean_of(agent_advantages)
        metrics[f"agent{i}/advantage_std"] = stats.std_of(agent_advantages)
        flat_groups.append(zero_spread(torch.cat([c[i] for c in credits])))
        metrics[f"agent{i}/zero_std_group_frac"] = stats.mean_of(flat_groups[-1].float())
        metrics[f"agent{i}/completion_length"] = stats.mean_of(lengths)
        metrics[f"agent{i}/completion_length_min"] = stats.minimum(lengths)
        metrics[f"agent{i}/completion_length_max"] = stats.maximum(lengths)
        metrics[f"agent{i}/truncated_frac"] = stats.mean_of(torch.cat([t.agents[i].truncated for t in turns]).float())
    # TRL's frac_reward_zero_std, over every agent's groups: at 1 the step had nothing to learn from
    metrics[ZERO_SPREAD_KEY] = stats.mean_of(torch.cat(flat_groups).float())
    metrics.update(tool_metrics(tree))
    return metrics


def tool_metrics(tree: RolloutTree) -> dict[str, Stat]:
    """With an environment's tools: per agent, the tool calls and failed calls per completion
    (``agent{i}/tool_calls``, ``agent{i}/tool_errors``), the share of completions that called
    one (``agent{i}/tool_call_frac``), and per turn the calls per completion over the agents."""
    turns = [turn for turn in tree.turns if turn.tool_calls is not None]
    if not turns:
        return {}
    metrics = {f"turn_{turn.number}/tool_calls": stats.mean_of(turn.tool_calls) for turn in turns}
    for i in range(turns[0].tool_calls.shape[0]):
        calls = torch.cat([turn.tool_calls[i] for turn in turns])
        metrics[f"agent{i}/tool_calls"] = stats.mean_of(calls)
        metrics[f"agent{i}/tool_call_frac"] = stats.mean_of((calls > 0).float())
        metrics[f"agent{i}/tool_errors"] = stats.mean_of(torch.cat([turn.tool_errors[i] for turn in turns]))
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


def reward_was_processed(metrics: dict[str, float], key: str = "reward/mean", raw_key: str = "reward/raw_mean") -> bool:
    """Whether the reward processor changed the mean reward: ``key`` (after the processor,
    what the advantages come from) differs from ``raw_key`` (what ``reward_func`` returned)."""
    return key in metrics and raw_key in metrics and metrics[key] != metrics[raw_key]


def reward_fields(metrics: dict[str, float], digits: int) -> dict[str, str]:
    """The mean reward as the console line and the progress bar show it: ``reward/mean``,
    called processed when the reward processor changed it, and then the raw mean beside it,
    so that a x100 scale never passes for the 0..1 the summaries and the task speak."""
    shown = {"reward": f"{metrics['reward/mean']:.{digits}g}"}
    if reward_was_processed(metrics):
        shown["reward"] += " (processed)"
        shown["raw reward"] = f"{metrics['reward/raw_mean']:.{digits}g}"
    return shown


def _eval_field(key: str, metrics: dict[str, float]) -> str:
    processed = reward_was_processed(metrics, "eval/reward_mean", "eval/raw_reward_mean") and key == "eval/reward_mean"
    return f"{key} {metrics[key]:.4g}" + (" (processed)" if processed else "")


def format_metrics(step: int, metrics: dict[str, float]) -> str:
    """The console's line for a logging step: the step, the reward (see :func:`reward_fields`),
    each agent's loss and completion length, seconds per step; for an evaluation, its ``eval/``
    metrics (``eval/reward_mean`` called processed where it differs from the raw one). The
    full set is in ``metrics.jsonl``."""
    if any(key.startswith("eval/") for key in metrics):
        shown = [_eval_field(key, metrics) for key in metrics if key.startswith("eval/")]
        return " | ".join([f"step {step}"] + shown)
    shown = [f"step {step}"]
    if "reward/mean" in metrics:
        shown += [f"{name} {value}" for name, value in reward_fields(metrics, 4).items()]
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
