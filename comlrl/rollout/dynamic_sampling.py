"""DAPO's dynamic sampling, in the rollout: rows whose groups are all flat (one return in every
group: :func:`~comlrl.algorithms.filtering.flat_rows`) are dropped from a step's rollout tree
and the batch is refilled with other rows of the training set, played out the same way.

Where the refill rows come from, and what a step stays:
- Refill rows are EXTRA draws from the training set, outside the epoch's order: the step's
  rows come from the data order as without dynamic sampling, so the data position, the step
  count and the learning-rate schedule do not change. Round r of step s on rank k draws, from
  a generator seeded by (seed, s, r, k), rows this rank has not played in this step (any rows
  once none is left).
- Each round plays as many rows as the batch misses, with the training sampling (its seeds
  drawn from torch's generator, which checkpoints keep): a resumed run refills as the
  uninterrupted one did.
- The ranks agree on the rounds: each round starts with one all-reduce of the rows every rank
  misses, and continues while one misses any, up to ``max_rounds``; a full rank plays nothing.
- Rows still flat after the last round are trained on (zero advantage: they add nothing but
  their KL and entropy terms), so the batch keeps its rows, and a warning says so.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from comlrl.rollout.tree import RolloutTree, join_trees
from comlrl.utils import stats

BOUND_WARNING = (
    "dynamic sampling: max_resample_rounds={rounds} refill rounds left flat rows in a step's batch; "
    "they are trained on with zero advantage (dynamic_sampling/flat_rows_trained counts them). Raise "
    "max_resample_rounds, or look at the reward: most of its groups give every sample the same score"
)


def refill_rows(num_rows: int, count: int, played: set[int], rng: random.Random) -> list[int]:
    """``count`` rows of a dataset of ``num_rows`` drawn by ``rng``: rows not in ``played``
    first (without repeats), then, when those run out, any rows."""
    fresh = [row for row in range(num_rows) if row not in played]
    drawn = rng.sample(fresh, min(count, len(fresh)))
    return drawn + rng.choices(range(num_rows), k=count - len(drawn))


@dataclass(frozen=True)
class DynamicSampling:
    """Keeps a step's batch free of flat rows by playing more rows, at most ``max_rounds`` times."""

    play: Callable[[list[int]], RolloutTree]
    """Plays dataset rows out with the training settings (the step's rollout)."""
    is_flat: Callable[[RolloutTree], Tensor]
    """``(M_1,)`` bool: which rows of a tree are flat."""
    num_rows: int
    """Rows in the training set."""
    max_rounds: int
    """Refill rounds per step at most."""
    seed: int
    """The run's seed (refill draws are seeded by it, the step, the round and the rank)."""
    rank: int
    """This process's rank."""
    most: Callable[[int], int]
    """The largest of every rank's value (one all-reduce; the value itself with one process)."""

    def __call__(self, tree: RolloutTree, step: int) -> tuple[RolloutTree, dict[str, stats.Stat]]:
        """``tree`` (the step's rollout) with its flat rows replaced, and the refill's metrics."""
        batch = tree.turns[0].num_nodes
        flat = self.is_flat(tree).tolist()
        kept = [tree.select_roots([m for m, is_flat in enumerate(flat) if not is_flat])]
        played, trees = set(tree.turns[0].rows), [tree]
        missing, rounds, flat_count = flat.count(True), 0, flat.count(True)
        while rounds < self.max_rounds and self.most(missing) > 0:
            rounds += 1
            if missing == 0:
                continue
            rng = random.Random(f"{self.seed}/{step}/{rounds}/{self.rank}")
            rows = refill_rows(self.num_rows, missing, played, rng)
            played.update(rows)
            extra = self.play(rows)
            extra_flat = self.is_flat(extra).tolist()
            kept.append(extra.select_roots([m for m, is_flat in enumerate(extra_flat) if not is_flat]))
            trees.append(extra)
            flat_count += extra_flat.count(True)
            missing -= extra_flat.count(False)
        if missing > 0:  # the bound: the first flat rows of the step's own batch fill it
            kept.append(tree.select_roots([m for m, is_flat in enumerate(flat) if is_flat][:missing]))
            warnings.warn(BOUND_WARNING.format(rounds=self.max_rounds), stacklevel=2)
        parts = [part for part in kept if part.turns]
        calls = sum(played_tree.transition_calls for played_tree in trees)
        played_rows = batch + sum(extra.turns[0].num_nodes for extra in trees[1:])
        own_rewards = torch.cat([turn.rewards.reshape(-1) for turn in tree.turns])
        metrics = {
            # the step's own rows, before the refill: what a run without it would log as reward/mean
            "dynamic_sampling/batch_reward_mean": stats.mean_of(own_rewards),
            "dynamic_sampling/rounds": stats.same(rounds),
            "dynamic_sampling/flat_row_frac": stats.mean(flat_count, played_rows),
            "dynamic_sampling/refill_rows": stats.total(played_rows - batch),
            "dynamic_sampling/flat_rows_trained": stats.total(missing),
        }
        return replace(join_trees(parts), transition_calls=calls), metrics
