"""When the sampler is not exactly the learner (bf16 decoding steps, which round apart from
the update's whole-sequence forward; an inference engine), the tokens were drawn from
pi_sampler while the update treats them as the learner's own: the two distributions differ
a little at every token. These measure the gap and correct for it with importance weights
``pi_behaviour / pi_sampler`` (pi_behaviour: the learner as it was when sampling), truncated
or masked, by token or by sequence, as large RL systems do for their inference engines
(truncated importance sampling, https://fengyao.notion.site/off-policy-rl; masking as
IcePop and TRL's ``vllm_importance_sampling_mode``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


def sampler_logprob_gap(learner_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(S, T)`` log-probs of the same tokens under the learner and the sampler, ``(S, T)``
    bool mask of completion tokens -> (sum of ``|learner - sampler|`` over them, their count)."""
    gap = (learner_logps.detach() - sampler_logps).abs() * mask
    return gap.sum(), mask.sum()


def token_log_weights(behaviour_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S, T)``: each token's own ``log pi_behaviour - log pi_sampler``."""
    return behaviour_logps - sampler_logps


def sequence_log_weights(behaviour_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S, T)``: one value per sequence, broadcast to its tokens: the SUM of its tokens'
    ``log pi_behaviour - log pi_sampler`` over ``mask``, the log of the sequence's importance
    weight, the product of its tokens' ratios (as TRL's ``sequence_*`` modes; GSPO's policy
    ratio is a geometric mean instead, see :mod:`~comlrl.algorithms.surrogates`)."""
    return ((behaviour_logps - sampler_logps) * mask).sum(dim=1, keepdim=True).expand_as(behaviour_logps)


SAMPLER_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_log_weights,
    "sequence": sequence_log_weights,
}


class SamplerCorrection(NamedTuple):
    """How the sampler's importance weights are applied (the config's ``sampler_*`` fields)."""

    mode: str = "token_truncate"
    """``{level}_{action}``: level a key of ``SAMPLER_LEVELS``, action ``truncate`` or ``mask``."""
    cap: float = 2.0
    """Truncate: weights above become ``cap``. Mask: weights above get weight 0."""
    floor: float = 0.0
    """Mask: weights below get weight 0 (unused by truncate)."""


SAMPLER_CORRECTIONS = tuple(f"{level}_{action}" for level in SAMPLER_LEVELS for action in ("truncate", "mask"))


class SamplerWeights(NamedTuple):
    """Per-token weights of the policy-gradient terms, and the tokens they changed."""

    weights: Tensor
    """``(S, T)`` weight of each token's policy-gradient term, without gradient."""
    corrected: Tensor
    """``(S, T)`` bool: tokens whose weight was truncated to the cap or masked to 0."""


def sampler_importance_weights(
    behaviour_logps: Tensor, sampler_logps: Tensor, mask: Tensor, correction: SamplerCorrection
) -> SamplerWeights:
    """``(S, T)`` importance weights ``w = pi_behaviour / pi_sampler`` per token or per
    sequence, then truncated, ``min(w, cap)`` (TIS), or masked, ``w`` where
    ``floor <= w <= cap`` and 0 elsewhere (IcePop; a masked sequence drops whole). Exactly 1
    where the two agree; a sequence weight that overflows to infinity is truncated or masked.

    Args:
        behaviour_logps: ``(S, T)`` the learner's log-probs as it sampled (detached here).
        sampler_logps: ``(S, T)`` the log-probs the sampler reported.
        mask: ``(S, T)`` bool, True on completion tokens (a sequence weight's sum).
        correction: the mode and bounds.
    """
    level, _, action = correction.mode.partition("_")
    if correction.mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"sampler_correction={correction.mode!r}; expected one of {list(SAMPLER_CORRECTIONS)}")
    weights = torch.exp(SAMPLER_LEVELS[level](behaviour_logps.detach(), sampler_logps, mask))
    if action == "truncate":
        return SamplerWeights(weights.clamp(max=correction.cap), weights >= correction.cap)
    keep = (weights <= correction.cap) & (weights >= correction.floor)
    return SamplerWeights(torch.where(keep, weights, torch.zeros_like(weights)), ~keep)
