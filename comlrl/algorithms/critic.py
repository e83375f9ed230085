"""Actor-critic pieces: the clipped value loss and per-agent advantage whitening. Tensors
in, tensors out. GAE's lambda-returns over the rollout tree live with the Monte-Carlo returns
in :mod:`comlrl.algorithms.returns` (one backward loop for both); the critics' explained
variance is a metric (:func:`comlrl.utils.stats.explained_variance`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

WHITEN_STD_FLOOR = 1e-6
"""The smallest std advantages are divided by (comlrl 1.4.3's ``clamp(min=1e-6)``)."""


def whiten(
    values: Tensor, floor: float = WHITEN_STD_FLOOR, reduce: Callable[[list[float]], list[float]] | None = None
) -> Tensor:
    """``(values - mean) / max(std, floor)`` over all elements, the std the population one:
    advantages normalised per agent as comlrl 1.4.3 did. A single value has no spread to scale
    by and is returned as it is (1.4.3 too left a lone advantage ``r - V`` unwhitened; centring
    it would make it 0 and take the step's policy gradient away).

    ``reduce`` sums a list of numbers over the processes of a data-parallel run, so the count,
    mean and std are those of every process's values together.
    """
    totals = [values.numel(), values.sum().item(), (values.double() ** 2).sum().item()]
    count, total, squares = reduce(totals) if reduce is not None else totals
    if count < 2:
        return values
    mean = total / count
    std = max(squares / count - mean**2, 0.0) ** 0.5
    return (values - mean) / max(std, floor)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, targets: Tensor, clip_range: float | None
) -> tuple[Tensor, Tensor]:
    """PPO's value loss per element, ``max((v - G)^2, (v_clip - G)^2)`` with
    ``v_clip = old + clip(v - old, -clip_range, clip_range)``: the critic cannot move further
    than ``clip_range`` from the values the advantages were computed with and gain from it.
    ``clip_range=None`` gives the plain ``(v - G)^2``. No factor 1/2: ``value_loss_coef``
    weighs the squared error itself, as in comlrl 1.4.3 (``value_loss_coef * (G - v)^2``).

    Returns the per-element loss and a bool tensor of where the clipped term was the larger.
    """
    squared = (values - targets) ** 2
    if clip_range is None:
        return squared, torch.zeros_like(squared, dtype=torch.bool)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    clipped_squared = (clipped_values - targets) ** 2
    return torch.maximum(squared, clipped_squared), clipped_squared > squared
