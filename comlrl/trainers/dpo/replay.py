"""Preference replay across MADPOIter's rounds: which earlier rounds' pairs a round trains on,
and how many of each. Pure functions of the rounds' pair counts, seeded by a generator; no
pairs, no models.

    round r's own pairs: shard r (every round has one, empty when all its comparisons tied)
    ─preference_replay_mode: one weight per ROUND, oldest first─▶
    ─sample size draws, each picking a round ∝ its weight among the rounds that have pairs─▶
    ─per round: distinct pairs, a whole new pass over the shard each time the count exceeds it─▶
    (round, index) of every pair the round trains on
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def newest_only(num_rounds: int, k: int | None, decay: float | None) -> Tensor:
    """``current``: the round's own pairs only."""
    weights = torch.zeros(num_rounds, dtype=torch.float64)
    weights[-1] = 1.0
    return weights


def nearest_rounds(num_rounds: int, k: int | None, decay: float | None) -> Tensor:
    """``nearest_k``: the last ``k`` ROUNDS alike, whether or not they have pairs (comlrl 1.4.3
    counted only the rounds with pairs, reaching further back after rounds without any)."""
    weights = torch.zeros(num_rounds, dtype=torch.float64)
    weights[-k:] = 1.0
    return weights


def every_round(num_rounds: int, k: int | None, decay: float | None) -> Tensor:
    """``all_history``: every round so far alike."""
    return torch.ones(num_rounds, dtype=torch.float64)


def lambda_decay(num_rounds: int, k: int | None, decay: float | None) -> Tensor:
    """``lambda_decay``: ``(1 - λ) λ^age``, the newest round at age 0 (TD(λ)'s weights, cut at
    the first round); ``λ = 1`` weighs every round alike, ``λ = 0`` only the newest."""
    if decay == 1.0:
        return every_round(num_rounds, k, decay)
    ages = torch.arange(num_rounds - 1, -1, -1, dtype=torch.float64)
    return (1.0 - decay) * torch.pow(torch.tensor(decay, dtype=torch.float64), ages)


REPLAY_MODES: dict[str, Callable[[int, int | None, float | None], Tensor]] = {
    "current": newest_only,
    "nearest_k": nearest_rounds,
    "all_history": every_round,
    "lambda_decay": lambda_decay,
}
"""``preference_replay_mode`` -> ``(num_rounds, k, λ) -> (num_rounds,)`` unnormalised weight of
each round so far, oldest first."""


def replay_weights(mode: str, num_rounds: int, k: int | None = None, decay: float | None = None) -> Tensor:
    """``(num_rounds,)`` probability that a draw picks each round, oldest first, before rounds
    without pairs are left out (:func:`shard_counts`)."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"preference_replay_mode={mode!r}; expected one of {sorted(REPLAY_MODES)}")
    weights = REPLAY_MODES[mode](num_rounds, k, decay)
    return weights / weights.sum()


def replay_sample_size(configured: int | None, shard_sizes: Sequence[int]) -> int:
    """Pairs a round trains on: ``configured`` (``preference_replay_sample_size``); else as many
    as the round made; else, when it made none, as many as the newest round that made some
    (comlrl 1.4.3's rule); else 0. ``shard_sizes``: every round's pair count, this round last."""
    if configured is not None:
        return configured
    return next((size for size in reversed(shard_sizes) if size > 0), 0)


def shard_counts(weights: Tensor, shard_sizes: Sequence[int], total: int, generator: torch.Generator) -> list[int]:
    """How many of ``total`` draws each round gets: each draw picks one round with probability
    proportional to its weight among the rounds that have pairs (none when no weighted round has)."""
    eligible = weights * (torch.tensor(shard_sizes) > 0)
    if total == 0 or eligible.sum() == 0:
        return [0] * len(shard_sizes)
    draws = torch.multinomial(eligible, total, replacement=True, generator=generator)
    return torch.bincount(draws, minlength=len(shard_sizes)).tolist()


def distinct_draws(size: int, count: int, generator: torch.Generator) -> Tensor:
    """``(count,)`` indices into ``size`` items without replacement, cycling: a whole pass in a
    random order each time ``count`` exceeds what is left, then part of one more."""
    passes, rest = divmod(count, size)
    draws = [torch.randperm(size, generator=generator) for _ in range(passes)]
    draws.append(torch.randperm(size, generator=generator)[:rest])
    return torch.cat(draws)


def replay_choice(
    mode: str,
    shard_sizes: Sequence[int],
    sample_size: int | None,
    generator: torch.Generator,
    k: int | None = None,
    decay: float | None = None,
) -> list[tuple[int, int]]:
    """``(round, index)`` of each pair the newest round trains on, round by round.

    Args:
        mode: a key of ``REPLAY_MODES``.
        shard_sizes: the pair count of every round so far, oldest first (this round last).
        sample_size: ``preference_replay_sample_size`` (None: see :func:`replay_sample_size`).
        generator: draws the rounds and the pairs.
        k: ``preference_replay_k`` (``nearest_k``).
        decay: ``preference_replay_lambda`` (``lambda_decay``).
    """
    weights = replay_weights(mode, len(shard_sizes), k, decay)
    counts = shard_counts(weights, shard_sizes, replay_sample_size(sample_size, shard_sizes), generator)
    return [
        (shard, index)
        for shard, count in enumerate(counts)
        if count
        for index in distinct_draws(shard_sizes[shard], count, generator).tolist()
    ]
