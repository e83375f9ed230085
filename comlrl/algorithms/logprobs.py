"""Log-probabilities of chosen tokens."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def selective_log_softmax(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``(S, L, V)`` logits, ``(S, T)`` ids with ``T <= L`` -> ``(S, T)`` float32
    ``log softmax(logits[:, t] / temperature)[token_ids[:, t]]``; positions ``T..L-1`` are
    unused (they get a zero gradient).

    Equal to ``log_softmax(logits[:, :T] / temperature).gather(token_ids)``, computed one
    sequence at a time in both directions, so that no ``(S, T, V)`` temporary (tempered copy,
    log-softmax, softmax, one-hot gradient) is ever materialised: for a 50k vocabulary each
    would be hundreds of MB, and the ~10 passes over them cost as much as a tenth of the
    update. The backward writes ``(onehot - softmax) / temperature`` straight into the one
    gradient tensor the LM head's backward needs, for the whole ``L`` positions (so slicing
    them off costs no second copy).
    """
    return _SelectiveLogSoftmax.apply(logits, token_ids, temperature)


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, token_ids: Tensor, temperature: float) -> Tensor:
        num_tokens = token_ids.shape[1]
        normalisers = torch.empty(token_ids.shape, dtype=torch.float32, device=logits.device)
        for s in range(logits.shape[0]):
            normalisers[s] = torch.logsumexp(logits[s, :num_tokens].float() / temperature, dim=-1)
        chosen = logits[:, :num_tokens].gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).float() / temperature
        ctx.save_for_backward(logits, token_ids, normalisers)
        ctx.temperature = temperature
        return chosen - normalisers

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None, None]:
        logits, token_ids, normalisers = ctx.saved_tensors
        temperature, num_tokens = ctx.temperature, token_ids.shape[1]
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_logits[:, num_tokens:] = 0
        scale = grad_output.float() / temperature
        for s in range(logits.shape[0]):
            # d/dz_v of (z_chosen - logsumexp(z)) / T-scaled: (onehot_v - softmax_v) / T
            row = logits[s, :num_tokens].float() / temperature
            row.sub_(normalisers[s].unsqueeze(-1)).exp_().mul_(-scale[s].unsqueeze(-1))
            row.scatter_add_(-1, token_ids[s].unsqueeze(-1), scale[s].unsqueeze(-1))
            grad_logits[s, :num_tokens] = row
        return grad_logits, None, None


def token_entropy(logits: Tensor) -> Tensor:
    """``(S, T, V)`` logits -> ``(S, T)`` entropy of each position's token distribution,
    ``logsumexp(z) - sum(softmax(z) * z)``, without a ``(S, T, V)`` log-softmax."""
    logits = logits.float()
    probabilities = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probabilities * logits).sum(dim=-1)
