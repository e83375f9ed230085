"""Metrics as sums, so that data-parallel ranks combine them the way they were formed.

A mean over samples is kept as (total, count), a standard deviation as (count, sum, sum of
squares), and so on: summing those over the ranks and then finishing gives exactly the
value one process computes over the global batch, which averaging each rank's finished value
does not (a loss already normalised by the global token count, a mean over unequal shares,
a standard deviation). Minima and maxima are reduced with min and max.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Stat:
    """One metric as numbers that ``reduction`` combines over ranks, and the function that
    turns the combined numbers into the metric (None: undefined, not logged)."""

    parts: tuple[float, ...]
    finish: Callable[[Sequence[float]], float | None]
    reduction: str = "sum"

    def value(self) -> float | None:
        return self.finish(self.parts)


def _ratio(parts: Sequence[float]) -> float | None:
    return parts[0] / parts[1] if parts[1] else None


def _first(parts: Sequence[float]) -> float:
    return parts[0]


def mean(total: float, count: float) -> Stat:
    """``total / count``, with total and count summed over the ranks."""
    return Stat((float(total), float(count)), _ratio)


def mean_of(values: Tensor) -> Stat:
    """The mean of ``values``' elements."""
    return mean(values.double().sum().item(), values.numel())


def total(value: float) -> Stat:
    """A sum whose share each rank holds (a loss normalised over every rank's tokens, a count)."""
    return Stat((float(value),), _first)


def same(value: float) -> Stat:
    """A value every rank holds alike (a gradient norm after the all-reduce, a learning rate)."""
    return mean(value, 1)


def _std(parts: Sequence[float]) -> float:
    count, summed, squares = parts
    if count < 2:
        return 0.0
    return math.sqrt(max(squares - summed * summed / count, 0.0) / (count - 1))


def std_of(values: Tensor) -> Stat:
    """The unbiased standard deviation of ``values``' elements (0 for fewer than two)."""
    values = values.double()
    return Stat((values.numel(), values.sum().item(), (values * values).sum().item()), _std)


def minimum(values: Tensor) -> Stat:
    """The smallest element of ``values`` over every rank."""
    return Stat((values.min().item(),), _first, "min")


def maximum(values: Tensor | float) -> Stat:
    """The largest element of ``values`` (or the largest value) over every rank."""
    return Stat((float(values.max()) if isinstance(values, Tensor) else float(values),), _first, "max")


def _explained_variance(parts: Sequence[float]) -> float | None:
    count, target_sum, target_squares, error_sum, error_squares = parts
    target_variance = _std((count, target_sum, target_squares)) ** 2
    if target_variance == 0:
        return None
    return 1 - _std((count, error_sum, error_squares)) ** 2 / target_variance


def explained_variance(predictions: Tensor, targets: Tensor) -> Stat:
    """``1 - Var(targets - predictions) / Var(targets)``; undefined when the targets do not vary."""
    targets, errors = targets.double().reshape(-1), (targets - predictions).double().reshape(-1)
    parts = (targets.numel(), targets.sum().item(), (targets * targets).sum().item())
    return Stat(parts + (errors.sum().item(), (errors * errors).sum().item()), _explained_variance)


def finish(stats: dict[str, Stat]) -> dict[str, float]:
    """Each metric's value; undefined ones are left out."""
    values = {key: stat.value() for key, stat in stats.items()}
    return {key: value for key, value in values.items() if value is not None}


def average(history: Sequence[dict[str, Stat]]) -> dict[str, Stat]:
    """The mean of each metric's parts over several passes of an update (a key missing in a
    pass is averaged over the passes that have it); linear, so it commutes with the ranks' sum."""
    keys = list(dict.fromkeys(key for stats in history for key in stats))
    averaged = {}
    for key in keys:
        stats = [s[key] for s in history if key in s]
        parts = tuple(sum(column) / len(stats) for column in zip(*(s.parts for s in stats)))
        averaged[key] = Stat(parts, stats[0].finish, stats[0].reduction)
    return averaged


_COMBINE = {"sum": sum, "min": min, "max": max}


def combine(per_rank: Sequence[dict[str, Stat]]) -> dict[str, Stat]:
    """Every rank's metrics as one: each part reduced over the ranks that have the metric (a
    rank whose tree has fewer turns has no metrics for the missing ones)."""
    keys = list(dict.fromkeys(key for stats in per_rank for key in stats))
    combined = {}
    for key in keys:
        stats = [s[key] for s in per_rank if key in s]
        reduce = _COMBINE[stats[0].reduction]
        combined[key] = Stat(
            tuple(reduce(column) for column in zip(*(s.parts for s in stats))), stats[0].finish, stats[0].reduction
        )
    return combined
