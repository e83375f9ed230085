"""Actor-critic estimates over a rollout tree: lambda-returns (GAE), the value loss and
per-agent advantage whitening. Tensors in, tensors out.

Turn t of a step holds M_t nodes; a node's critic value V estimates the return of the joint
actions played there. Where a joint action started a child node (the next turn of its
branch), GAE bootstraps from that child; each node has J joint actions, so the child's
"next step" is the mean over its joint actions, as in :func:`comlrl.algorithms.returns.tree_returns`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def tree_lambda_returns(
    rewards: Sequence[Tensor], children: Sequence[Tensor], values: Sequence[Tensor], gamma: float, lam: float
) -> list[Tensor]:
    """GAE's lambda-return of every joint action, computed from the last turn back.

    ``G = r + gamma * ((1 - lam) * V(child) + lam * mean_j'(G of the child's j'))`` where the
    joint action started a child node, ``G = r`` where its branch stopped. ``G - V(node)`` is
    then exactly GAE's advantage, ``delta + gamma * lam * mean_j'(advantage of the child's j')``
    with ``delta = r + gamma * V(child) - V(node)``; ``lam = 1`` gives the Monte-Carlo return,
    ``lam = 0`` the one-step TD target.

    Args:
        rewards: per turn, ``(M_t, J, N)`` reward of each joint action, per agent.
        children: per turn, ``(M_t, J)`` index of the node at turn t+1 that the joint action
            started, -1 for none.
        values: per turn, ``(M_t, N)`` the critic's value of each node, per agent.
        gamma: discount of the next turn, in [0, 1].
        lam: GAE's lambda, in [0, 1].

    Returns:
        Per turn, ``(M_t, J, N)`` lambda-returns (the value targets).
    """
    if not (len(rewards) == len(children) == len(values)):
        raise ValueError(f"{len(rewards)} turns of rewards, {len(children)} of children, {len(values)} of values")
    returns: list[Tensor] = [None] * len(rewards)  # type: ignore[list-item]
    next_value = next_return = None  # (M_{t+1}, N)
    for t in reversed(range(len(rewards))):
        reward, child, value = rewards[t], children[t], values[t]
        if child.shape != reward.shape[:2] or value.shape != (reward.shape[0], reward.shape[2]):
            raise ValueError(
                f"turn {t + 1}: rewards {tuple(reward.shape)}, children {tuple(child.shape)} and values "
                f"{tuple(value.shape)} do not fit (M, J, N), (M, J), (M, N)"
            )
        turn_return = reward.clone()
        has_child = child >= 0
        if has_child.any():
            if next_value is None:
                raise ValueError(f"turn {t + 1} has children but it is the last turn")
            nodes = child[has_child]
            bootstrap = (1 - lam) * next_value[nodes] + lam * next_return[nodes]
            turn_return[has_child] += gamma * bootstrap
        returns[t] = turn_return
        next_value, next_return = value, turn_return.mean(dim=1)
    return returns


def whiten(values: Tensor, eps: float = 1e-8, reduce: Callable[[list[float]], list[float]] | None = None) -> Tensor:
    """``(values - mean) / (std + eps)`` over all elements: advantages normalised per agent.
    A single value has no spread to scale by: it is only centred, to 0.

    ``reduce`` sums a list of numbers over the processes of a data-parallel run, so the mean
    and the (unbiased) std are those of every process's values together.
    """
    totals = [values.numel(), values.sum().item(), (values.double() ** 2).sum().item()]
    count, total, squares = reduce(totals) if reduce is not None else totals
    mean = total / count
    centred = values - mean
    if count < 2:
        return centred
    std = max((squares - count * mean**2) / (count - 1), 0.0) ** 0.5
    return centred / (std + eps)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, targets: Tensor, clip_range: float | None
) -> tuple[Tensor, Tensor]:
    """PPO's value loss per element, ``0.5 * max((v - G)^2, (v_clip - G)^2)`` with
    ``v_clip = old + clip(v - old, -clip_range, clip_range)``: the critic cannot move further
    than ``clip_range`` from the values the advantages were computed with and gain from it.
    ``clip_range=None`` gives the plain ``0.5 * (v - G)^2``.

    Returns the per-element loss and a bool tensor of where the clipped term was the larger.
    """
    squared = (values - targets) ** 2
    if clip_range is None:
        return 0.5 * squared, torch.zeros_like(squared, dtype=torch.bool)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    clipped_squared = (clipped_values - targets) ** 2
    return 0.5 * torch.maximum(squared, clipped_squared), clipped_squared > squared


def explained_variance(predictions: Tensor, targets: Tensor) -> float:
    """``1 - Var(targets - predictions) / Var(targets)``: 1 for a perfect critic, 0 for one that
    predicts the mean, negative for worse; NaN when the targets do not vary."""
    variance = targets.var() if targets.numel() > 1 else targets.new_tensor(0.0)
    if variance == 0:
        return float("nan")
    return (1 - (targets - predictions).var() / variance).item()
