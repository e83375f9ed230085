"""The sampler's log-probs in the learner's convention.

The update compares the learner's log-prob of each completion token with the sampler's (the
``sampler_logprob_gap`` metric, and the truncated importance weights of
``sampler_ratio_cap``). Both must be taken in one convention, the learner's:
``log softmax(z / T)[token]`` over the whole vocabulary at the sampling temperature ``T``
(:func:`comlrl.rollout.decoding.token_logprobs`). Top-k, top-p and ``min_new_tokens`` shape
which tokens are drawn; they are not part of the policy being trained.

The hf backend reports that value itself. vLLM reports *processed* log-probs
(``logprobs_mode="processed_logprobs"``): after ``min_tokens``, temperature, top-k and
top-p, renormalised over the tokens that survive them, the support ``S``:
``log q(a) = log p(a) - log p(S)``. The engine does not report ``p(S)``, so
:func:`learner_support_log_mass` takes it from the learner's own distribution at the same
position, under the same filters, and the sampler's value becomes
``log q(a) + log p_learner(S)``. Its gap to the learner's ``log p_learner(a)`` is then
``log q_learner(a) - log q(a)``: both distributions renormalised over the same support, so
what remains is the difference between the two models' numbers (bf16 kernels, another
library), not the masking, which would otherwise add ``-log p(S)`` to every token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from comlrl.models.forward import padded_forward_kwargs
from comlrl.models.modes import frozen
from comlrl.rollout.decoding import filtered_distribution

ROWS_PER_FORWARD = 8
"""Rows per forward of :func:`learner_support_log_mass`: bounds its (rows, T, V) logits."""


def support_log_mass(
    logits: Tensor, temperature: float, top_k: int, top_p: float, banned: Tensor | None = None
) -> Tensor:
    """``(..., V)`` logits -> ``(...)`` float32 ``log p(S)``: the mass that ``softmax(logits / T)``
    over the whole vocabulary puts on the support ``S`` a sampler draws from, the tokens that
    survive top-k then top-p (as Hugging Face and vLLM apply them) once the tokens of
    ``banned`` (``(..., V)`` bool, e.g. EOS held back by ``min_new_tokens``) are removed.
    ``top_k <= 0`` and ``top_p >= 1`` turn each filter off."""
    scaled = logits.float() / temperature
    total = torch.logsumexp(scaled, dim=-1)
    if banned is not None:
        scaled = scaled.masked_fill(banned, float("-inf"))
    if top_k <= 0 and top_p >= 1.0:
        return torch.logsumexp(scaled, dim=-1) - total
    # The sampler's own filter (comlrl.rollout.decoding), on the already tempered logits.
    rows = scaled.reshape(-1, scaled.shape[-1])
    probabilities, token_ids = filtered_distribution(rows, 1.0, top_k, top_p)
    kept = rows.gather(-1, token_ids).masked_fill(probabilities == 0, float("-inf"))
    return torch.logsumexp(kept, dim=-1).reshape(total.shape) - total


@torch.no_grad()
def learner_support_log_mass(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_new_tokens: int = 0,
    eos_ids: Sequence[int] = (),
) -> Tensor:
    """``(S, T)`` :func:`support_log_mass` of the learner ``model`` at every completion position
    (0 at padding), the first ``min_new_tokens`` positions without ``eos_ids``: what turns
    a processed log-prob into the learner's convention."""
    width = completion_ids.shape[1]
    masses = torch.zeros(completion_ids.shape, dtype=torch.float32)
    if width == 0:
        return masses
    device = next(model.parameters()).device
    with frozen(model):
        for start in range(0, len(completion_ids), ROWS_PER_FORWARD):
            rows = slice(start, start + ROWS_PER_FORWARD)
            ids = torch.cat([prompt_ids[rows], completion_ids[rows]], dim=1).to(device)
            mask = torch.cat([prompt_mask[rows], completion_mask[rows].to(prompt_mask.dtype)], dim=1).to(device)
            kwargs = padded_forward_kwargs(model, mask, logits_to_keep=width + 1)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **kwargs).logits[:, -width - 1 : -1]
            banned = None
            if min_new_tokens > 0 and eos_ids:
                banned = torch.zeros(logits.shape, dtype=torch.bool, device=device)
                banned[:, :min_new_tokens, list(eos_ids)] = True
            mass = support_log_mass(logits, temperature, top_k, top_p, banned)
            masses[rows] = mass.cpu().masked_fill(~completion_mask[rows].cpu().bool(), 0.0)
    return masses
