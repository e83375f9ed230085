"""Policy-gradient loss (clipped, with an optional KL term) and the ways to normalise it
over tokens.

Every aggregation takes the completion lengths ``(S,)``, ``max_new_tokens`` and the batch's
totals (sequences and tokens, which may span several processes) and gives the weight of each
sequence's tokens, so ``loss_type`` is chosen through one table and the loss of a batch can
be computed in pieces.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def sequence_mean(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """GRPO (Shao et al., 2024): mean over each sequence's tokens, then over sequences.

    Each sequence weighs the same whatever its length, so a token of a long completion
    counts less than a token of a short one.
    """
    return 1.0 / (lengths.clamp(min=1) * num_sequences)


def token_mean(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """DAPO (Yu et al., 2025): mean over all completion tokens of the batch; every token
    weighs the same, which removes the length bias of the per-sequence mean."""
    return torch.full_like(lengths, 1.0 / max(num_tokens, 1))


def constant_normalizer(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """Dr. GRPO (Liu et al., 2025): sum over tokens divided by a constant,
    ``num_sequences * max_new_tokens``, so no length enters the normaliser."""
    return torch.full_like(lengths, 1.0 / (num_sequences * max_new_tokens))


LOSS_AGGREGATIONS = {
    "grpo": sequence_mean,
    "dapo": token_mean,
    "dr_grpo": constant_normalizer,
}


def token_weights(
    lengths: Tensor,
    loss_type: str,
    max_new_tokens: int,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """``(S,)`` weight of each token of each sequence, such that the loss is the weighted sum
    of the per-token losses.

    Computed once over all of an agent's sequences of a step, the weights let the loss be
    split into micro-batches (and turns) whose partial losses add up to the whole one.

    Args:
        lengths: ``(S,)`` completion tokens counted by the loss in each sequence.
        loss_type: key of ``LOSS_AGGREGATIONS``.
        max_new_tokens: the constant of ``dr_grpo``.
        num_sequences: sequences of the whole batch when ``lengths`` are a share of it (one
            process's, in data-parallel training); default ``S``.
        num_tokens: tokens of the whole batch; default ``lengths.sum()``.
    """
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_type={loss_type!r}; expected one of {sorted(LOSS_AGGREGATIONS)}")
    num_sequences = lengths.numel() if num_sequences is None else num_sequences
    num_tokens = lengths.sum().item() if num_tokens is None else num_tokens
    return LOSS_AGGREGATIONS[loss_type](lengths.double(), max_new_tokens, num_sequences, num_tokens).float()


class PolicyLoss(NamedTuple):
    """The loss of one agent's batch and what to log about it."""

    loss: Tensor
    """Scalar to minimise."""
    clip_fraction: Tensor
    """Fraction of completion tokens whose ratio was clipped (the clipped term was active)."""
    kl: Tensor
    """Mean k3 KL to the reference over completion tokens (0 without a reference)."""
    entropy: Tensor
    """Mean entropy of the policy over completion tokens (0 when not given)."""


def k3_kl(token_logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token KL(pi || ref) estimate ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's
    k3, http://joschu.net/blog/kl-approx.html): unbiased, and never negative."""
    log_ratio = ref_logps - token_logps
    return torch.exp(log_ratio) - log_ratio - 1


def policy_gradient_loss(
    token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    loss_type: str = "dapo",
    max_new_tokens: int = 1,
    old_logps: Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    sequence_weights: Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
) -> PolicyLoss:
    """Clipped policy-gradient loss over the completion tokens (PPO / GRPO surrogate).

    Per token: ``-min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A) + beta * KL
    - entropy_coef * H`` with ``r = exp(logp - old_logp)``. Without ``old_logps`` the ratio is taken against the
    detached current log-probs: r = 1, nothing is clipped, and the gradient is exactly that of
    REINFORCE, ``-A * grad log pi``.

    Args:
        token_logps: ``(S, T)`` log-probabilities of the generated tokens under the policy
            being trained (with gradient).
        advantages: ``(S,)`` one advantage per completion, shared by all its tokens.
        mask: ``(S, T)`` bool, True on tokens the policy generated (see ``completion_mask``).
        loss_type: key of ``LOSS_AGGREGATIONS``, unless ``sequence_weights`` are given.
        max_new_tokens: the constant of ``dr_grpo``.
        old_logps: ``(S, T)`` log-probs recorded when the completions were sampled.
        epsilon: lower clip range (and upper one unless ``epsilon_high`` is given).
        epsilon_high: upper clip range (DAPO's "clip-higher"); defaults to ``epsilon``.
        ref_logps: ``(S, T)`` log-probs under the frozen reference model, for the KL term.
        beta: weight of the KL term.
        sequence_weights: ``(S,)`` token weight of each sequence from :func:`token_weights`
            over a larger batch this one is a piece of; by default ``loss_type`` is applied
            to this batch alone.
        entropy: ``(S, T)`` entropy of the policy at each completion token (with gradient),
            for the entropy bonus.
        entropy_coef: weight of the entropy bonus.
    """
    weights = mask.to(token_logps.dtype)
    if sequence_weights is None:
        sequence_weights = token_weights(weights.sum(dim=1), loss_type, max_new_tokens)
    old_logps = token_logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(token_logps - old_logps)
    adv = advantages.unsqueeze(1)
    upper = epsilon if epsilon_high is None else epsilon_high
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + upper) * adv
    per_token_loss = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(token_logps) if ref_logps is None else k3_kl(token_logps, ref_logps)
    if beta:
        per_token_loss = per_token_loss + beta * kl
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy of each token")
        per_token_loss = per_token_loss - entropy_coef * entropy
    loss = (per_token_loss * weights * sequence_weights.to(weights.dtype).unsqueeze(1)).sum()
    tokens = weights.sum().clamp(min=1)
    clip_fraction = ((clipped < unclipped).to(weights.dtype) * weights).sum() / tokens
    mean_entropy = torch.zeros(()) if entropy is None else ((entropy * weights).sum() / tokens).detach()
    return PolicyLoss(loss, clip_fraction.detach(), ((kl * weights).sum() / tokens).detach(), mean_entropy)
