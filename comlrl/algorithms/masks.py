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
