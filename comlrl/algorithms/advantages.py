"""Group-relative advantages.

Every baseline takes the same argument, the returns of a batch of groups with shape
``(num_groups, G)``, and gives a tensor of the same shape, so callers never special-case one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def mean_baseline(returns: Tensor) -> Tensor:
    """The group mean (GRPO)."""
    return returns.mean(dim=-1, keepdim=True).expand_as(returns)


def rloo_baseline(returns: Tensor) -> Tensor:
    """Leave-one-out: for each sample, the mean of the other G-1 samples of its group (RLOO)."""
    group_size = returns.shape[-1]
    total = returns.sum(dim=-1, keepdim=True)
    return (total - returns) / (group_size - 1)


def max_baseline(returns: Tensor) -> Tensor:
    """The group maximum (ReMax-style): the best sample gets advantage 0, the others less."""
    return returns.max(dim=-1, keepdim=True).values.expand_as(returns)


def zero_baseline(returns: Tensor) -> Tensor:
    """No baseline: the advantage is the return itself (plain REINFORCE)."""
    return torch.zeros_like(returns)


BASELINES = {
    "mean": mean_baseline,
    "rloo": rloo_baseline,
    "max": max_baseline,
    "raw": zero_baseline,
}


def group_advantages(returns: Tensor, mode: str = "mean", normalize: bool = True, std_floor: float = 1e-2) -> Tensor:
    """Advantages of each sample relative to its group.

    Args:
        returns: ``(num_groups, G)``; row g holds the returns of the G samples that share a
            history (same prompt, same agent).
        mode: which baseline to subtract, a key of ``BASELINES``.
        normalize: divide by ``max(std, std_floor)``, the group's standard deviation
            (unbiased, as ``torch.std``) floored. This only rescales: it never re-centres,
            because re-centring after a baseline would turn every mode into ``mean``.
        std_floor: the smallest std a group is divided by, in the unit of the returns: it
            bounds the scale-up at ``1 / std_floor``, so a near-constant group (std 5e-4 for
            returns [1, 1, 1, 1.001]) cannot blow an update up; 0 turns the floor off. A group
            whose returns are all equal is left unscaled (its advantages are then exactly 0
            for ``mean``/``rloo``/``max``, its returns for ``raw``).

    Returns:
        ``(num_groups, G)`` advantages.
    """
    if mode not in BASELINES:
        raise ValueError(f"advantage_mode={mode!r}; expected one of {sorted(BASELINES)}")
    if returns.dim() != 2:
        raise ValueError(f"returns must have shape (num_groups, G), got {tuple(returns.shape)}")
    if returns.shape[1] < 2 and (mode != "raw" or normalize):
        raise ValueError(
            f"advantage_mode={mode!r} with normalize={normalize} needs groups of at least 2 samples, "
            f"got {returns.shape[1]}"
        )
    # Shifting by the group's first return changes neither the std nor the advantages of a
    # baseline that moves with the returns (all but "raw"), and keeps a constant group at
    # exactly 0: otherwise the float rounding of its mean, divided by the std, reaches ~1.
    shifted = returns - returns[:, :1]
    advantages = returns if mode == "raw" else shifted - BASELINES[mode](shifted)
    if normalize:
        std = shifted.std(dim=-1, keepdim=True)
        # The floor alone would still multiply a constant group's raw-mode returns by
        # 1 / std_floor; with no spread at all there is nothing to normalise, so it stays unscaled.
        advantages = advantages / torch.where(std > 0, std.clamp(min=std_floor), torch.ones_like(std))
    return advantages


def batch_scaled(
    advantages: Sequence[Sequence[Tensor]],
    credits: Sequence[Tensor],
    std_floor: float = 1e-2,
    num_turns: int | None = None,
    totals: Callable[[list[float]], list[float]] | None = None,
) -> list[list[Tensor]]:
    """Advantages divided by the std of the whole batch's returns instead of each group's (TRL's
    ``scale_rewards="batch"``): per agent and turn, the unbiased std of every sample's return of
    the step (over every process, with ``totals``), floored at ``std_floor``; a batch whose
    returns are all equal is left unscaled. A group's spread then keeps its size next to the
    others', where group scaling makes every non-constant group's spread 1.

    Args:
        advantages: ``[agent][turn]`` ``(M_t * G,)`` advantages with a baseline and no scaling.
        credits: per turn, ``(N, M_t, G)`` each agent's sample's return.
        std_floor: the smallest std the advantages are divided by.
        num_turns: turns of the run; a turn this process never reached counts as empty, so
            every process passes ``totals`` a list of the same length (default: ``len(credits)``).
        totals: sums a list of numbers over the processes of a data-parallel run (None: this process only).
    """
    num_turns = len(credits) if num_turns is None else num_turns
    num_agents = len(advantages)
    local = []
    for i in range(num_agents):
        for t in range(num_turns):
            values = credits[t][i].double() if t < len(credits) else torch.zeros(0, dtype=torch.float64)
            local += [values.sum().item(), values.square().sum().item(), float(values.numel())]
    summed = list(totals(local)) if totals is not None else local
    scaled = []
    for i in range(num_agents):
        agent = []
        for t, turn_advantages in enumerate(advantages[i]):
            total, squares, count = summed[3 * (i * num_turns + t) : 3 * (i * num_turns + t) + 3]
            variance = (squares - total * total / count) / (count - 1) if count > 1 else 0.0
            std = math.sqrt(max(variance, 0.0))
            agent.append(turn_advantages / max(std, std_floor) if std > 0 else turn_advantages)
        scaled.append(agent)
    return scaled


def decoupled_advantages(
    credits: Sequence[Sequence[Tensor]],
    weights: Sequence[float],
    mode: str = "mean",
    std_floor: float = 1e-2,
    num_turns: int | None = None,
    totals: Callable[[list[float]], list[float]] | None = None,
) -> list[list[Tensor]]:
    """GDPO's advantages (Liu et al., 2026, "Group reward-Decoupled Normalization Policy
    Optimization", arXiv 2601.05242; TRL's ``multi_objective_aggregation="normalize_then_sum"``):
    each reward function's credits get their own group baseline and std
    (:func:`group_advantages` with ``normalize=True``), the results are summed with the reward
    weights, and the sum is divided by its std over the whole step, per agent and turn, over
    every process with ``totals`` (:func:`batch_scaled`: the unbiased std, floored at
    ``std_floor``, in units of those summed advantages; a step whose sum is all 0 is left so).

    A function whose group is flat adds 0 to that group (``mean``/``rloo``/``max``), one with a
    tiny spread is divided by ``std_floor`` in its own unit. The weights act after each
    function's normalisation, as in the paper and TRL: weighting before it would cancel in the
    group's z-score. The batch step only rescales, as :func:`batch_scaled` does, and does not
    re-centre (the paper and TRL subtract the batch mean): with ``mean`` and ``rloo`` every
    group's advantages sum to 0, so the batch mean is 0 and this is the paper's figure; with
    ``max`` (advantages <= 0) re-centring would shift every sample of the step by one amount and
    push up samples that the baseline puts below their group's best.

    Args:
        credits: ``[function][turn]`` ``(N, M_t, G)`` each agent's sample's return under that
            function alone (unweighted), as :func:`~comlrl.algorithms.joint.per_agent_returns` gives.
        weights: F weights, one per function (the config's ``reward_weights``).
        mode: the group baseline, a key of ``BASELINES`` (``raw`` has none to centre with).
        std_floor: the smallest std a group (in its function's unit) or the step's sum is divided by.
        num_turns: turns of the run, as for :func:`batch_scaled` (default: ``len(credits[0])``).
        totals: sums a list of numbers over the processes of a data-parallel run (None: this process only).

    Returns:
        ``[agent][turn]`` ``(M_t * G,)`` advantages, node-major.
    """
    if not credits or len(credits) != len(weights):
        raise ValueError(f"{len(credits)} reward functions' credits for {len(weights)} weights")
    num_agents = credits[0][0].shape[0]
    summed = [
        [
            sum(
                weight * group_advantages(function[t][i], mode, True, std_floor)
                for weight, function in zip(weights, credits)
            )
            for t in range(len(credits[0]))
        ]
        for i in range(num_agents)
    ]
    # The summed advantages are what the step's std is taken of: (N, M_t, G) per turn, as credits.
    as_credits = [torch.stack([summed[i][t] for i in range(num_agents)]) for t in range(len(credits[0]))]
    flat = [[turn.reshape(-1) for turn in agent] for agent in summed]
    return batch_scaled(flat, as_credits, std_floor, num_turns, totals)
