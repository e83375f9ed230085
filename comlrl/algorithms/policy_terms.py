"""The loss terms of one micro-batch of an agent's policy update, in one pure function: the
clipped policy-gradient loss (:func:`~comlrl.algorithms.losses.policy_gradient_loss`) over the
tokens, weighted by the sampler correction when the sampler is not the learner
(:mod:`~comlrl.algorithms.sampler_correction`), and what the update logs of it."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from comlrl.algorithms.losses import PolicyLoss, policy_gradient_loss
from comlrl.algorithms.sampler_correction import sampler_logprob_gap, truncated_importance_weights


class PolicyTerms(NamedTuple):
    """One micro-batch's loss, and the sampler gap's sums (zeros without sampler log-probs)."""

    loss: PolicyLoss
    """The loss (backpropagate ``loss.loss``) and its clip fraction, KL and entropy."""
    sampler_gap: Tensor
    """Sum over completion tokens of ``|behaviour - sampler|`` log-probs."""
    sampler_tokens: Tensor
    """The tokens that sum is over (0: the sampler gave no log-probs)."""
    capped: Tensor
    """Tokens whose truncated importance weight reached ``sampler_ratio_cap``."""


def micro_batch_policy_terms(
    token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    sequence_weights: Tensor,
    *,
    old_logps: Tensor | None = None,
    sampler_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    entropy: Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    entropy_coef: float = 0.0,
    sampler_ratio_cap: float | None = None,
) -> PolicyTerms:
    """The loss terms of one micro-batch of ``S`` completions of one agent.

    The behaviour policy (what sampled the tokens, as the learner sees it) is ``old_logps``
    when the update takes several optimizer steps, else the learner now (``token_logps``,
    detached). Where the sampler reported its own log-probs (``sampler_logps``: bf16 decoding, an
    inference engine), the gap between the two is summed, and with ``sampler_ratio_cap`` each
    token's policy-gradient term is weighted by ``min(pi_behaviour / pi_sampler, cap)``.

    Args:
        token_logps: ``(S, T)`` log-probs of the completion tokens under the learner (with gradient).
        advantages: ``(S,)`` one advantage per completion.
        mask: ``(S, T)`` bool, True on completion tokens.
        sequence_weights: ``(S,)`` token weight of each completion (the loss normalisation).
        old_logps: ``(S, T)`` log-probs under the policy as it sampled (several optimizer steps).
        sampler_logps: ``(S, T)`` log-probs the sampler gave the tokens.
        ref_logps: ``(S, T)`` log-probs under the frozen reference (the KL term).
        entropy: ``(S, T)`` the learner's entropy at each token (the entropy bonus).
        epsilon, epsilon_high, beta, entropy_coef: see :func:`~comlrl.algorithms.losses.policy_gradient_loss`.
        sampler_ratio_cap: the truncation of the sampler correction (None: the gap is only measured).
    """
    zero = torch.zeros((), device=token_logps.device)
    gap, gap_tokens, capped, sampler_weights = zero, zero, zero, None
    if sampler_logps is not None:
        behaviour = token_logps if old_logps is None else old_logps
        gap, gap_tokens = sampler_logprob_gap(behaviour, sampler_logps, mask)
        if sampler_ratio_cap is not None:
            sampler_weights = truncated_importance_weights(behaviour, sampler_logps, sampler_ratio_cap)
            capped = ((sampler_weights >= sampler_ratio_cap) & mask).sum()
    loss = policy_gradient_loss(
        token_logps,
        advantages,
        mask,
        old_logps=old_logps,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        ref_logps=ref_logps,
        beta=beta,
        entropy=entropy,
        entropy_coef=entropy_coef,
        sequence_weights=sequence_weights,
        sampler_weights=sampler_weights,
    )
    return PolicyTerms(loss, gap, gap_tokens, capped)
