"""Actor-critic pieces: the clipped value loss and per-agent advantage whitening. Tensors
in, tensors out. GAE's lambda-returns over the rollout tree live with the Monte-Carlo returns
in :mod:`comlrl.algorithms.returns` (one backward loop for both); the critics' explained
variance is a metric (:func:`comlrl.metrics.stats.explained_variance`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


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
