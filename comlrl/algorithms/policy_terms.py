"""The loss terms of one micro-batch of an agent's policy update, in one pure function: the
policy-gradient loss (:func:`~comlrl.algorithms.losses.policy_gradient_loss`, with the
surrogate of :mod:`~comlrl.algorithms.surrogates`) over the tokens, its policy-gradient terms
weighted by the sampler correction when the sampler is not the learner
(:mod:`~comlrl.algorithms.sampler_correction`) and kept on the top-entropy tokens when asked
(:func:`~comlrl.algorithms.masks.top_entropy_mask`), and what the update logs of it."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from comlrl.algorithms.losses import PolicyLoss, policy_gradient_loss
from comlrl.algorithms.masks import top_entropy_mask
from comlrl.algorithms.sampler_correction import SamplerCorrection, sampler_importance_weights, sampler_logprob_gap
from comlrl.algorithms.surrogates import PolicyObjective


class PolicyTerms(NamedTuple):
    """One micro-batch's loss, and the sums the update logs of it (zeros where they do not apply)."""

    loss: PolicyLoss
    """The loss (backpropagate ``loss.loss``) and its clip fraction, KL and entropy."""
    sampler_gap: Tensor
    """Sum over completion tokens of ``|behaviour - sampler|`` log-probs."""
    sampler_tokens: Tensor
    """The tokens that sum is over (0: the sampler gave no log-probs)."""
    corrected: Tensor
    """Tokens whose sampler importance weight was truncated to the cap or masked to 0."""
    entropy_threshold: Tensor
    """The entropy below which tokens were left out of the policy gradient (0: none were)."""
    entropy_kept: Tensor
    """Tokens kept by the entropy quantile (all completion tokens without one)."""


def micro_batch_policy_terms(
    token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    sequence_weights: Tensor,
    *,
    objective: PolicyObjective | None = None,
    old_logps: Tensor | None = None,
    sampler_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    entropy: Tensor | None = None,
    beta: float = 0.0,
    entropy_coef: float = 0.0,
    sampler_correction: SamplerCorrection | None = None,
    top_entropy_quantile: float = 1.0,
) -> PolicyTerms:
    """The loss terms of one micro-batch of ``S`` completions of one agent.

    The behaviour policy (what sampled the tokens, as the learner sees it) is ``old_logps``
    when the update takes several optimizer steps, else the learner now (``token_logps``,
    detached). Where the sampler reported its own log-probs (``sampler_logps``: bf16 decoding, an
    inference engine), the gap between the two is summed, and with a ``sampler_correction``
    each token's policy-gradient term is weighted by its importance weight
    ``pi_behaviour / pi_sampler``, truncated or masked. With ``top_entropy_quantile`` below 1,
    only that share of the micro-batch's tokens, those of highest entropy, keeps its
    policy-gradient term (the KL and entropy terms, and the normalisation, keep every token).

    Args:
        token_logps: ``(S, T)`` log-probs of the completion tokens under the learner (with gradient).
        advantages: ``(S,)`` one advantage per completion.
        mask: ``(S, T)`` bool, True on completion tokens that the loss counts.
        sequence_weights: ``(S,)`` token weight of each completion (the loss normalisation).
        objective: the surrogate (see :func:`~comlrl.algorithms.losses.policy_gradient_loss`; None: PPO's clip).
        old_logps: ``(S, T)`` log-probs under the policy as it sampled (several optimizer steps).
        sampler_logps: ``(S, T)`` log-probs the sampler gave the tokens.
        ref_logps: ``(S, T)`` log-probs under the frozen reference (the KL term).
        entropy: ``(S, T)`` the learner's entropy at each token (the entropy bonus, the quantile).
        beta, entropy_coef: see :func:`~comlrl.algorithms.losses.policy_gradient_loss`.
        sampler_correction: the mode and bounds of the sampler correction (None: the gap is
            only measured).
        top_entropy_quantile: in (0, 1]; 1 keeps every token.
    """
    zero = torch.zeros((), device=token_logps.device)
    gap, gap_tokens, corrected, pg_weights = zero, zero, zero, None
    if sampler_logps is not None:
        behaviour = token_logps if old_logps is None else old_logps
        gap, gap_tokens = sampler_logprob_gap(behaviour, sampler_logps, mask)
        if sampler_correction is not None:
            correction = sampler_importance_weights(behaviour, sampler_logps, mask, sampler_correction)
            pg_weights = correction.weights
            corrected = (correction.corrected & mask).sum()
    threshold, kept = zero, mask.sum()
    if top_entropy_quantile < 1:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the entropy of each token")
        high, threshold = top_entropy_mask(entropy, mask, top_entropy_quantile)
        kept = high.sum()
        high = high.to(token_logps.dtype)
        pg_weights = high if pg_weights is None else pg_weights * high
    loss = policy_gradient_loss(
        token_logps,
        advantages,
        mask,
        old_logps=old_logps,
        objective=objective,
        ref_logps=ref_logps,
        beta=beta,
        entropy=entropy,
        entropy_coef=entropy_coef,
        sequence_weights=sequence_weights,
        pg_weights=pg_weights,
    )
    return PolicyTerms(loss, gap, gap_tokens, corrected, threshold, kept)
