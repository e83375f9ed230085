"""Which generated tokens a completion owns."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def completion_mask(completion_ids: Tensor, eos_token_ids: Sequence[int]) -> Tensor:
    """``(S, T)`` ids -> ``(S, T)`` bool mask of the tokens the policy actually generated.

    Every token up to and including the first EOS counts (the EOS is a decision the policy
    made: stopping); everything after it is padding that ``generate`` appended and never
    counts. A completion with no EOS was truncated at ``max_new_tokens``: all its tokens count.
    """
    is_eos = torch.isin(completion_ids, torch.as_tensor(list(eos_token_ids), device=completion_ids.device))
    # Number of EOS tokens strictly before each position: 0 means "still inside the completion".
    eos_before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return eos_before == 0


def top_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> tuple[Tensor, Tensor]:
    """The "forking tokens" of Wang et al. (2025, "Beyond the 80/20 rule"): keep the share
    ``quantile`` of the completion tokens with the highest entropy (TRL's
    ``top_entropy_quantile``; 0.2 keeps the top 20%, 1 every token).

    Args:
        entropy: ``(S, T)`` the policy's entropy at each token (read without gradient).
        mask: ``(S, T)`` bool, True on completion tokens (the only ones ranked).
        quantile: in (0, 1].

    Returns:
        ``(S, T)`` bool, True on kept completion tokens (ties at the threshold are kept), and
        the threshold: the ``1 - quantile`` quantile of the masked entropies (0 with none).
    """
    values = entropy.detach()[mask].float()
    if values.numel() == 0:
        return mask.clone(), torch.zeros((), device=entropy.device)
    threshold = torch.quantile(values, 1 - quantile)
    return mask & (entropy.detach() >= threshold.to(entropy.dtype)), threshold
