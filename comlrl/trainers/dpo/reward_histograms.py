"""The per-round reward histograms of MADPOIter and MARLHFIter (comlrl 1.4.3's
``log_reward_distribution=True``): how the raw rewards (before ``reward_processor``) of the
current policy's candidates ("target") and the comparator's are spread, over every candidate
of a round and over the pairs the round trains on. Pure functions of rewards and the range
the reward function declares, and the writing of one round's record.

    reward_func.reward_range (min, max) ─NUM_BINS equal bins─▶ bin edges, fixed for the run
    the round's candidates' raw rewards, each side        ─▶ counts, mean  ┐
    the round's training pairs' raw rewards, each side    ─▶ counts, mean  ┴▶ reward_distributions/iteration_XXXX.json
                                                                              iter/reward_distribution/* metrics
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from comlrl.checkpoint import write_json
from comlrl.rewards import JointReward
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.utils.reward_range import resolve_reward_range

NUM_BINS = 16
"""Bins of each histogram (comlrl 1.4.3's)."""

FOLDER = "reward_distributions"
"""Where in ``output_dir`` each round's record is written (comlrl 1.4.3's)."""

SIDES = ("target", "comparator")
"""The two sides of a comparison, as comlrl 1.4.3 named them: the current policy, the comparator."""

Rewards = Sequence[float] | Tensor


def raw_reward_range(reward: JointReward) -> tuple[float, float]:
    """The range of ``reward``'s raw values (the weighted sum of its functions, before the
    processor), from the ``reward_range`` each function declares; an error naming the
    function that declares none or a bad one."""
    low = high = 0.0
    for name, func, weight in zip(reward.names, reward.funcs, reward.weights):
        declared = resolve_reward_range(func)
        if declared is None:
            raise ValueError(
                f"log_reward_distribution=True histograms each round's raw rewards over the range the reward "
                f"function declares, and reward_func {name} declares none: set {name}.reward_range = (0.0, 1.0) "
                f"(its minimum and maximum before reward_processor), or comlrl.utils.set_reward_range({name}, 0.0, 1.0)"
            )
        ends = sorted(weight * end for end in declared)  # a negative weight swaps the ends
        low, high = low + ends[0], high + ends[1]
    if not low < high:
        raise ValueError(
            f"reward_weights={list(reward.weights)} make the raw reward's range the single value {low}: "
            "log_reward_distribution=True needs a range to place its bins in"
        )
    return low, high


def bin_edges(reward_range: tuple[float, float]) -> np.ndarray:
    """The ``NUM_BINS + 1`` edges of equal bins spanning ``reward_range``."""
    return np.linspace(reward_range[0], reward_range[1], NUM_BINS + 1)


def bin_counts(rewards: Sequence[float], edges: np.ndarray) -> list[int]:
    """How many of ``rewards`` fall in each bin (the last bin includes its upper edge).
    Values outside the edges count in the nearest edge bin, as in comlrl 1.4.3, so the
    counts always add up to the sample count (``numpy.histogram`` alone would drop them)."""
    clipped = np.clip(np.asarray(rewards, dtype=np.float64), edges[0], edges[-1])
    return np.histogram(clipped, bins=edges)[0].tolist()


def reward_series(rewards: Sequence[float], edges: np.ndarray) -> dict[str, Any]:
    """One side's histogram as comlrl 1.4.3 wrote it: the sample count, the mean (None when
    empty), the counts and the rewards themselves (unclipped)."""
    return {
        "sample_count": len(rewards),
        "mean": float(np.mean(rewards)) if len(rewards) else None,
        "counts": bin_counts(rewards, edges),
        "raw_rewards": [float(value) for value in rewards],
    }


def pair_raw_rewards(pairs: Sequence[PreferencePair]) -> tuple[list[float], list[float]]:
    """The target and comparator raw rewards of ``pairs``; pairs without them (read from a
    checkpoint written before they were kept) are left out, as comlrl 1.4.3 did."""
    known = [p for p in pairs if p.target_raw_reward is not None and p.comparator_raw_reward is not None]
    return [p.target_raw_reward for p in known], [p.comparator_raw_reward for p in known]


def round_record(
    round_index: int,
    reward_range: tuple[float, float],
    candidates: tuple[Rewards, Rewards],
    selected: tuple[Rewards, Rewards],
) -> dict[str, Any]:
    """Round ``round_index``'s record in comlrl 1.4.3's layout (iteration numbered from 1):
    the bins, then the ``candidate`` and ``selected`` (training pairs') histograms, each of
    the ``target`` and ``comparator`` sides."""
    edges = bin_edges(reward_range)
    return {
        "iteration": round_index + 1,
        "reward_min": float(edges[0]),
        "reward_max": float(edges[-1]),
        "num_bins": NUM_BINS,
        "bin_edges": edges.tolist(),
        "bin_centers": ((edges[:-1] + edges[1:]) / 2).tolist(),
        "candidate": {side: reward_series(flat(rewards), edges) for side, rewards in zip(SIDES, candidates)},
        "selected": {side: reward_series(flat(rewards), edges) for side, rewards in zip(SIDES, selected)},
    }


def flat(rewards: Rewards) -> list[float]:
    """``rewards`` (a list, or a tensor of any shape) as one list of floats."""
    return np.asarray(rewards, dtype=np.float64).ravel().tolist()


def section_metrics(namespace: str, section: dict[str, Any], iteration: int) -> dict[str, float]:
    """A section's numbers under ``namespace`` (comlrl 1.4.3's names; a side without samples has no mean)."""
    metrics = {f"{namespace}/current_iteration": float(iteration)}
    for side in SIDES:
        metrics[f"{namespace}/{side}_sample_count"] = float(section[side]["sample_count"])
        if section[side]["mean"] is not None:
            metrics[f"{namespace}/{side}_mean"] = section[side]["mean"]
    return metrics


def round_metrics(record: dict[str, Any], pair_count: int) -> dict[str, float]:
    """The numbers logged with the round's other ``iter/*`` metrics (comlrl 1.4.3's; its W&B
    plots are not made: the metric sinks take numbers): ``iter/reward_distribution/*`` of the
    candidates and, when the round trains on ``pair_count`` > 0 pairs,
    ``iter/selected_reward_distribution/*`` of those pairs."""
    iteration = record["iteration"]
    metrics = section_metrics("iter/reward_distribution", record["candidate"], iteration)
    if pair_count:
        metrics["iter/selected_reward_distribution/pair_count"] = float(pair_count)
        metrics.update(section_metrics("iter/selected_reward_distribution", record["selected"], iteration))
    return metrics


def write_record(output_dir: str, record: dict[str, Any]) -> None:
    """``record`` to ``output_dir/reward_distributions/iteration_XXXX.json``, whole or not at
    all (written aside, then renamed)."""
    write_json(os.path.join(output_dir, FOLDER, f"iteration_{record['iteration']:04d}.json"), record, indent=2)


def log_reward_distribution(
    output_dir: str | None,
    round_index: int,
    reward_range: tuple[float, float],
    candidates: tuple[Rewards, Rewards],
    pairs: Sequence[PreferencePair],
) -> dict[str, float]:
    """Round ``round_index``'s histograms of its ``candidates``' raw rewards (target, comparator)
    and of the ``pairs`` it trains on, written to ``output_dir`` (None: not written, as on the
    data-parallel ranks other than rank 0, which every rank's metrics must still match);
    returns their metrics."""
    record = round_record(round_index, reward_range, candidates, pair_raw_rewards(pairs))
    if output_dir is not None:
        write_record(output_dir, record)
    return round_metrics(record, len(pairs))
