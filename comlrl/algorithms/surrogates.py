"""The per-token policy-gradient surrogate: an importance ratio between the policy being
trained and the one that sampled (one per token, or one per sequence as GSPO), and what turns
it and the advantage into a loss (PPO's clip, CISPO's clipped stop-gradient weight, SAPO's
soft gate).

Every surrogate takes the same arguments and gives a per-token loss and the tokens it held
back, so a new one is a function and a line of ``POLICY_LOSSES``. At a ratio of exactly 1
(one optimizer step per rollout, and a sampler that is the learner) each one's gradient is
the plain policy gradient ``-A * grad log pi``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


class PolicyObjective(NamedTuple):
    """Which surrogate, at which level, with which ranges (the config's fields of the same names)."""

    policy_loss: str = "clip"
    """Key of ``POLICY_LOSSES``."""
    importance_sampling_level: str = "token"
    """Key of ``IMPORTANCE_SAMPLING_LEVELS``."""
    epsilon: float = 0.2
    """Lower clip range: the ratio is kept above ``1 - epsilon`` (``clip``)."""
    epsilon_high: float | None = None
    """Upper range: ``1 + epsilon_high`` bounds the ratio (``clip``) or the weight (``cispo``); None: ``epsilon``."""
    delta: float | None = None
    """Upper bound of the unclipped ratio for ``clip`` (two-sided clipping); None: none."""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature for tokens of positive advantage."""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature for tokens of negative advantage."""

    @property
    def upper(self) -> float:
        """The upper range, ``epsilon_high`` or else ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def token_log_ratio(token_logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S, T)``: each token's own ``log pi - log pi_old`` (PPO, GRPO)."""
    return token_logps - old_logps


def sequence_log_ratio(token_logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S, T)``: one value per sequence, broadcast to its tokens: the mean of its tokens'
    ``log pi - log pi_old`` over ``mask``, the log of the geometric mean of their ratios (GSPO,
    Zheng et al., 2025, eq. 7). The gradient reaches every token through the mean, so all
    tokens of a sequence are clipped or kept together. A sequence with no token gives 0."""
    weights = mask.to(token_logps.dtype)
    mean = ((token_logps - old_logps) * weights).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True).clamp(
        min=1
    )
    return mean.expand_as(token_logps)


IMPORTANCE_SAMPLING_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


class Surrogate(NamedTuple):
    """A surrogate's per-token loss and the tokens it held back."""

    loss: Tensor
    """``(S, T)`` per-token loss, before the token weights (the loss normalisation)."""
    held: Tensor
    """``(S, T)`` bool: tokens whose gradient the clip (or gate) removed or halved."""


def clipped_surrogate(ratio: Tensor, token_logps: Tensor, advantages: Tensor, objective: PolicyObjective) -> Surrogate:
    """PPO's clipped surrogate (Schulman et al., 2017) as GRPO uses it:
    ``-min(r' * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A)``, where ``r' = min(r, delta)``
    with ``delta`` (two-sided clipping: a negative advantage's unclipped term is otherwise
    unbounded as r grows) and ``r' = r`` without. Held: tokens whose clipped term was chosen
    (their gradient is 0) and tokens whose ratio passed ``delta``.

    Args:
        ratio: ``(S, T)`` importance ratio ``pi / pi_old`` (with gradient).
        token_logps: ``(S, T)`` log-probs of the tokens (unused: the ratio carries the gradient).
        advantages: ``(S, 1)`` advantage of each sequence.
        objective: the ranges.
    """
    bounded = ratio if objective.delta is None else ratio.clamp(max=objective.delta)
    unclipped = bounded * advantages
    clipped = torch.clamp(ratio, 1 - objective.epsilon, 1 + objective.upper) * advantages
    held = clipped < unclipped
    if objective.delta is not None:
        held = held | (ratio > objective.delta)
    return Surrogate(-torch.minimum(unclipped, clipped), held)


def cispo_surrogate(ratio: Tensor, token_logps: Tensor, advantages: Tensor, objective: PolicyObjective) -> Surrogate:
    """CISPO (MiniMax-M1, 2025, eq. 4): ``-sg(min(r, 1 + epsilon_high)) * A * log pi``. The
    importance weight is clipped and detached, and every token keeps its gradient, scaled by
    it (PPO's clip drops the gradient of the clipped tokens instead). Held: tokens whose
    weight was capped, whatever the advantage's sign."""
    weight = ratio.detach().clamp(max=1 + objective.upper)
    return Surrogate(-weight * advantages * token_logps, ratio.detach() > 1 + objective.upper)


def sapo_surrogate(ratio: Tensor, token_logps: Tensor, advantages: Tensor, objective: PolicyObjective) -> Surrogate:
    """SAPO (Gao et al., 2025, arXiv 2511.20347): a soft gate in place of the hard clip,
    ``-(4 / tau) * sigmoid(tau * (r - 1)) * A``, ``tau`` = ``sapo_temperature_pos`` where
    A > 0, else ``sapo_temperature_neg``. Its gradient, ``-4 s (1 - s) r * A * grad log pi``
    with ``s = sigmoid(tau * (r - 1))``, is the plain one at r = 1 and fades smoothly as r
    leaves 1. Held: tokens whose gradient weight ``4 s (1 - s) r`` is below 1/2."""
    tau = torch.where(
        advantages > 0,
        torch.full_like(advantages, objective.sapo_temperature_pos),
        torch.full_like(advantages, objective.sapo_temperature_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1))
    loss = -(4 / tau) * gate * advantages
    held = (4 * gate * (1 - gate) * ratio).detach() < 0.5
    return Surrogate(loss, held)


POLICY_LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor, PolicyObjective], Surrogate]] = {
    "clip": clipped_surrogate,
    "cispo": cispo_surrogate,
    "sapo": sapo_surrogate,
}


def policy_surrogate(
    token_logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, objective: PolicyObjective
) -> Surrogate:
    """The surrogate ``objective`` names, at its importance-sampling level.

    Args:
        token_logps: ``(S, T)`` log-probs under the policy being trained (with gradient).
        old_logps: ``(S, T)`` log-probs under the policy that sampled (``token_logps.detach()``
            when the update takes one optimizer step: the ratio is then exactly 1).
        advantages: ``(S,)`` one advantage per completion.
        mask: ``(S, T)`` bool, True on the completion's tokens (the sequence ratio's mean).
        objective: the surrogate and its ranges.
    """
    if objective.policy_loss not in POLICY_LOSSES:
        raise ValueError(f"policy_loss={objective.policy_loss!r}; expected one of {sorted(POLICY_LOSSES)}")
    if objective.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level={objective.importance_sampling_level!r}; "
            f"expected one of {sorted(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    log_ratio = IMPORTANCE_SAMPLING_LEVELS[objective.importance_sampling_level](token_logps, old_logps, mask)
    surrogate = POLICY_LOSSES[objective.policy_loss](
        torch.exp(log_ratio), token_logps, advantages.unsqueeze(1), objective
    )
    return Surrogate(surrogate.loss.expand_as(token_logps), surrogate.held.expand_as(token_logps))
