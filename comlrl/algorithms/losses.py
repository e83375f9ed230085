"""Policy-gradient loss and the ways to normalise it over tokens.

Every aggregation takes ``(per_token_loss, mask, max_new_tokens)`` with ``(S, T)`` tensors
and returns a scalar, so ``loss_type`` is chosen through one table.
"""

from __future__ import annotations

from torch import Tensor


def sequence_mean(per_token_loss: Tensor, mask: Tensor, max_new_tokens: int) -> Tensor:
    """GRPO (Shao et al., 2024): mean over each sequence's tokens, then over sequences.

    Each sequence weighs the same whatever its length, so a token of a long completion
    counts less than a token of a short one.
    """
    tokens_per_sequence = mask.sum(dim=1).clamp(min=1)
    return ((per_token_loss * mask).sum(dim=1) / tokens_per_sequence).mean()


def token_mean(per_token_loss: Tensor, mask: Tensor, max_new_tokens: int) -> Tensor:
    """DAPO (Yu et al., 2025): mean over all completion tokens of the batch; every token
    weighs the same, which removes the length bias of the per-sequence mean."""
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1)


def constant_normalizer(per_token_loss: Tensor, mask: Tensor, max_new_tokens: int) -> Tensor:
    """Dr. GRPO (Liu et al., 2025): sum over tokens divided by a constant,
    ``num_sequences * max_new_tokens``, so no length enters the normaliser."""
    return (per_token_loss * mask).sum() / (per_token_loss.shape[0] * max_new_tokens)


LOSS_AGGREGATIONS = {
    "grpo": sequence_mean,
    "dapo": token_mean,
    "dr_grpo": constant_normalizer,
}


def policy_gradient_loss(
    token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    loss_type: str = "dapo",
    max_new_tokens: int = 1,
) -> Tensor:
    """REINFORCE-style loss ``-A * log pi(token)`` over the completion tokens.

    Args:
        token_logps: ``(S, T)`` log-probabilities of the generated tokens under the policy
            being trained (with gradient).
        advantages: ``(S,)`` one advantage per completion, shared by all its tokens.
        mask: ``(S, T)`` bool, True on tokens the policy generated (see ``completion_mask``).
        loss_type: key of ``LOSS_AGGREGATIONS``.
        max_new_tokens: the constant of ``dr_grpo``.
    """
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_type={loss_type!r}; expected one of {sorted(LOSS_AGGREGATIONS)}")
    per_token_loss = -advantages.unsqueeze(1) * token_logps
    return LOSS_AGGREGATIONS[loss_type](per_token_loss, mask.to(token_logps.dtype), max_new_tokens)
