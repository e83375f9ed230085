"""The user's metric hooks: ``metrics_callback`` (comlrl 1.4.3's: metrics of their own from
every agent sample of a training rollout), and the check every hook's output goes through."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl.algorithms import per_agent_returns
from comlrl.algorithms.returns import tree_returns
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree
from comlrl.utils.signatures import describe


@dataclass(frozen=True)
class RolloutSample:
    """One agent's completion at one node of a rollout tree, as comlrl 1.4.3's callback saw it."""

    agent_idx: int
    prompt: str
    """The prompt the agent saw."""
    completion: str
    reward: torch.Tensor
    """``(1,)`` the agent's reward (the mean over the joint actions its completion took part
    in); one-element tensors, as 1.4.3 gave them, so ``.item()`` and ``float()`` both work."""
    returns: torch.Tensor
    """``(1,)`` the return credited to the completion (what the advantage was computed from)."""
    advantage: torch.Tensor
    """``(1,)``."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """``turn_idx`` (0-based), ``generation_idx`` (the sample's index in its group), ``batch_item`` (the row)."""


def rollout_samples(
    tree: RolloutTree,
    credits: Sequence[torch.Tensor],
    advantages: Sequence[Sequence[torch.Tensor]],
    prompts: PromptTable,
) -> list[RolloutSample]:
    """Every agent sample of ``tree``, turn by turn, node by node, agent by agent."""
    samples = []
    group = tree.num_generations
    for t, turn in enumerate(tree.turns):
        rewards = per_agent_returns(turn.rewards, tree.joint_indices, group)  # (N, M, G)
        for m in range(turn.num_nodes):
            for i, agent in enumerate(turn.agents):
                for g in range(group):
                    samples.append(
                        RolloutSample(
                            agent_idx=i,
                            prompt=turn.prompts[i][m],
                            completion=agent.texts[m * group + g],
                            reward=rewards[i, m, g].reshape(1).float(),
                            returns=credits[t][i, m, g].reshape(1).float(),
                            advantage=advantages[i][t][m * group + g].reshape(1).float().cpu(),
                            metadata={"turn_idx": t, "generation_idx": g, "batch_item": prompts.rows[turn.rows[m]]},
                        )
                    )
    return samples


def evaluation_samples(tree: RolloutTree, discount: float, prompts: PromptTable) -> list[list[RolloutSample]]:
    """The samples of an evaluation tree (one sample per agent and turn), row by row; their
    ``returns`` are the episode's from that turn on, their ``advantage`` NaN (no baseline)."""
    returns = tree_returns([t.rewards for t in tree.turns], [t.children for t in tree.turns], discount)
    credits = [per_agent_returns(r, tree.joint_indices, tree.num_generations) for r in returns]
    nan = [torch.full((turn.num_nodes * tree.num_generations,), math.nan) for turn in tree.turns]
    by_row: dict[int, list[RolloutSample]] = {}
    for sample in rollout_samples(tree, credits, [nan] * len(tree.turns[0].agents), prompts):
        by_row.setdefault(id(sample.metadata["batch_item"]), []).append(sample)
    return list(by_row.values())


class MetricsCallback:
    """Calls the user's ``metrics_callback(samples) -> dict`` and checks what it returns."""

    def __init__(self, callback: Callable[[list[RolloutSample]], dict[str, float]] | None):
        if callback is not None and not callable(callback):
            raise TypeError(f"metrics_callback must be callable, got {type(callback).__name__}")
        self.callback = callback

    def __call__(self, samples: list[RolloutSample]) -> dict[str, float]:
        if self.callback is None:
            return {}
        source = f"metrics_callback {describe(self.callback)}"
        try:
            output = self.callback(samples)
        except Exception as error:
            raise RuntimeError(f"{source} raised {type(error).__name__}: {error}") from error
        return {} if output is None else checked_metrics(output, source)

    def evaluation(self, trees: list[RolloutTree], discount: float, prompts: PromptTable) -> dict[str, float]:
        """The callback on every evaluated row's samples, each metric averaged over the rows
        and logged as ``eval/<key>`` (as comlrl 1.4.3's actor-critic evaluation did)."""
        values: dict[str, list[float]] = {}
        for tree in trees:
            for samples in evaluation_samples(tree, discount, prompts):
                for key, value in self(samples).items():
                    values.setdefault(key, []).append(value)
        return {f"eval/{key}": sum(v) / len(v) for key, v in values.items()}


def checked_metrics(output: object, source: str, prefix: str = "", hint: str = "") -> dict[str, float]:
    """A hook's ``{name: number}`` output as floats under ``prefix``; anything else is an error
    that names the hook (``source``) and the metric, followed by ``hint``."""
    if not isinstance(output, dict):
        raise TypeError(f"{source} returned {type(output).__name__}; expected a dict of metric name -> number{hint}")
    metrics = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"{source} returned {value!r} for metric {key!r}; expected a finite number")
        metrics[f"{prefix}{key}"] = float(value)
    return metrics
