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


HEAD_CHUNK_ELEMENTS = 2**25
"""Logits one chunk of :func:`head_log_softmax` holds: 128 MB in fp32 (~680 tokens of a 49k vocabulary)."""


def head_log_softmax(hidden: Tensor, weight: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``(S, L, H)`` final hidden states, ``(V, H)`` LM-head weight, ``(S, T)`` ids with
    ``T <= L`` -> ``(S, T)`` float32 ``log softmax(hidden[:, t] @ weight.T / temperature)[token_ids[:, t]]``.

    The LM head and the log-softmax in one, chunk by chunk of tokens, in both directions: no
    ``(S, T, V)`` logits tensor is ever kept, and the backward recomputes each chunk's logits
    instead of storing them (a few % more compute, the largest activation of a small model
    gone). The products run in the weight's dtype (bf16 on the bf16 learner), the softmax in
    float32.
    """
    return _HeadLogSoftmax.apply(hidden, weight, token_ids, temperature)


class _HeadLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, token_ids: Tensor, temperature: float) -> Tensor:
        rows, num_tokens = token_ids.shape
        flat_hidden = hidden[:, :num_tokens].reshape(rows * num_tokens, hidden.shape[-1])
        flat_ids = token_ids.reshape(-1)
        normalisers = torch.empty(flat_ids.shape, dtype=torch.float32, device=hidden.device)
        chosen = torch.empty_like(normalisers)
        for piece in _chunks(len(flat_ids), weight.shape[0]):
            logits = (flat_hidden[piece] @ weight.T).float().div_(temperature)
            normalisers[piece] = torch.logsumexp(logits, dim=-1)
            chosen[piece] = logits.gather(-1, flat_ids[piece].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(flat_hidden, weight, flat_ids, normalisers)
        ctx.temperature, ctx.hidden_shape, ctx.num_tokens = temperature, hidden.shape, num_tokens
        return (chosen - normalisers).reshape(rows, num_tokens)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        flat_hidden, weight, flat_ids, normalisers = ctx.saved_tensors
        scale = grad_output.reshape(-1).float() / ctx.temperature
        flat_grad_hidden = torch.empty_like(flat_hidden)
        # Summed over chunks in float32; each chunk's product rounds as autograd's would.
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for piece in _chunks(len(flat_ids), weight.shape[0]):
            # d/dz_v of (z_chosen - logsumexp(z)), z = h W^T / T: (onehot_v - softmax_v) / T
            grad_logits = (flat_hidden[piece] @ weight.T).float().div_(ctx.temperature)
            grad_logits.sub_(normalisers[piece].unsqueeze(-1)).exp_().mul_(-scale[piece].unsqueeze(-1))
            grad_logits.scatter_add_(-1, flat_ids[piece].unsqueeze(-1), scale[piece].unsqueeze(-1))
            grad_logits = grad_logits.to(weight.dtype)
            flat_grad_hidden[piece] = grad_logits @ weight
            grad_weight += grad_logits.T @ flat_hidden[piece]
        (rows, length, width), num_tokens = ctx.hidden_shape, ctx.num_tokens
        grad_hidden = flat_grad_hidden.reshape(rows, num_tokens, width)
        if num_tokens < length:  # positions past the completion predict nothing
            grad_hidden = torch.nn.functional.pad(grad_hidden, (0, 0, 0, length - num_tokens))
        return grad_hidden, grad_weight.to(weight.dtype), None, None


def _chunks(num_tokens: int, vocabulary: int) -> list[slice]:
    size = max(1, HEAD_CHUNK_ELEMENTS // vocabulary)
    return [slice(start, start + size) for start in range(0, num_tokens, size)]


def token_entropy(logits: Tensor) -> Tensor:
    """``(S, T, V)`` logits -> ``(S, T)`` entropy of each position's token distribution,
    ``logsumexp(z) - sum(softmax(z) * z)``, without a ``(S, T, V)`` log-softmax."""
    logits = logits.float()
    probabilities = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probabilities * logits).sum(dim=-1)
