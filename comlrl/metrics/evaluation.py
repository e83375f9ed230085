"""Evaluation metrics of rollout trees with one sample per agent and turn (one path per row),
and the user's evaluation hooks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl.algorithms.returns import tree_returns
from comlrl.metrics.hooks import checked_metrics
from comlrl.rollout.tree import RolloutTree
from comlrl.utils.signatures import describe, keyword_arguments

EVAL_LOGGER_ARGUMENTS = ("agent_completions_turns", "batch_items", "prompts", "rows", "test_cases", "entry_points")
"""Keyword arguments ``eval_logger`` receives when its signature names them (all with
``**kwargs``); ``batch_items`` is comlrl 1.4.3's name of ``rows``."""


class EvalHooks:
    """The original library's ``eval_logger`` / ``eval_aggregator`` pair, or a logger alone
    that returns its metrics as a dict."""

    def __init__(self, logger: Callable[..., Any] | None, aggregator: Callable[..., dict[str, float]] | None):
        for name, hook in (("eval_logger", logger), ("eval_aggregator", aggregator)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
        if aggregator is not None and logger is None:
            raise ValueError("eval_aggregator needs an eval_logger whose output it aggregates")
        self.logger = logger
        self.aggregator = aggregator
        # With **kwargs, the logger gets every argument.
        names = EVAL_LOGGER_ARGUMENTS
        self.arguments = () if logger is None else keyword_arguments(logger, names, if_any_keyword=names)

    def __call__(
        self,
        agent_completions_turns: list[list[list[str]]],
        rows: list[dict[str, Any]],
        prompts: list[str],
        num_turns: int,
    ) -> dict[str, float]:
        if self.logger is None:
            return {}
        values = {
            "agent_completions_turns": agent_completions_turns,
            "batch_items": rows,
            "prompts": prompts,
            "rows": rows,
            "test_cases": [row.get("test", "") for row in rows],
            "entry_points": [row.get("entry_point", "") for row in rows],
        }
        source = f"eval_logger {describe(self.logger)}"
        try:
            output = self.logger(**{name: values[name] for name in self.arguments})
            if self.aggregator is not None:
                source = f"eval_aggregator {describe(self.aggregator)}"
                output = self.aggregator(output, num_turns=num_turns)
        except Exception as error:
            raise RuntimeError(f"{source} raised {type(error).__name__}: {error}") from error
        hint = "" if self.aggregator else " (or pass an eval_aggregator that makes one)"
        return checked_metrics(output, source, prefix="eval/", hint=hint)


def evaluation_metrics(
    trees: Sequence[RolloutTree], discount: float, num_turns: int
) -> tuple[dict[str, float], list[list[list[str]]]]:
    """Reward and expected return per turn over single-path trees (one joint action per node).

    Returns the metrics and each agent's completions ``[agent][row][turn]`` (a row whose
    episode ended early has fewer turns), rows in the order of the trees.
    """
    rewards: list[list[torch.Tensor]] = [[] for _ in range(num_turns)]
    raw: list[torch.Tensor] = []
    returns: list[list[torch.Tensor]] = [[] for _ in range(num_turns)]
    num_agents = len(trees[0].turns[0].agents)
    paths: list[list[list[str]]] = [[] for _ in range(num_agents)]
    for tree in trees:
        tree_return = tree_returns([t.rewards for t in tree.turns], [t.children for t in tree.turns], discount)
        # Node m of turn t+1 continues the path of the node whose joint action points at it.
        first = tree.turns[0]
        position = list(range(first.num_nodes))  # path index of each node of the current turn
        offset = len(paths[0])
        for i in range(num_agents):
            paths[i].extend([] for _ in range(first.num_nodes))
        for t, turn in enumerate(tree.turns):
            rewards[t].append(turn.rewards.mean(dim=(1, 2)))
            raw.append(turn.raw_rewards.mean(dim=(1, 2)))
            returns[t].append(tree_return[t].mean(dim=(1, 2)))
            for m, path in enumerate(position):
                for i in range(num_agents):
                    paths[i][offset + path].append(turn.agents[i].texts[m])
            child = turn.children[:, 0].tolist()
            next_position = [0] * sum(c >= 0 for c in child)
            for m, c in enumerate(child):
                if c >= 0:
                    next_position[c] = position[m]
            position = next_position
    all_rewards = torch.cat([torch.cat(r) for r in rewards if r])
    metrics = {"eval/reward_mean": all_rewards.mean().item(), "eval/raw_reward_mean": torch.cat(raw).mean().item()}
    for t in range(num_turns):
        if rewards[t]:
            # the names dashboards key on (the original library's)
            metrics[f"eval/turn_{t + 1}/reward_mean"] = torch.cat(rewards[t]).mean().item()
            metrics[f"eval/turn_{t + 1}/expected_return"] = torch.cat(returns[t]).mean().item()
    return metrics, paths
