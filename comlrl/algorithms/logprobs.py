"""Log-probabilities of chosen tokens."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx


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
    def forward(ctx: FunctionCtx, logits: Tensor, token_ids: Tensor, temperature: float) -> Tensor:
        num_tokens = token_ids.shape[1]
        normalisers = torch.empty(token_ids.shape, dtype=torch.float32, device=logits.device)
        for s in range(logits.shape[0]):
            normalisers[s] = torch.logsumexp(logits[s, :num_tokens].float() / temperature, dim=-1)
        chosen = logits[:, :num_tokens].gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).float() / temperature
        ctx.save_for_backward(logits, token_ids, normalisers)
        ctx.temperature = temperature
        return chosen - normalisers

    @staticmethod
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor, None, None]:
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
"""Logits one chunk of :func:`head_log_softmax` computes at once: 128 MB in fp32 (~680 tokens
of a 49k vocabulary)."""

HEAD_KEPT_ELEMENTS = 2**26
"""The most fp32 probabilities :func:`head_log_softmax` keeps from its forward for its backward
(256 MB: ~1360 tokens of a 49k vocabulary); past it, the backward recomputes them."""


def head_log_softmax(hidden: Tensor, weight: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``(S, L, H)`` final hidden states, ``(V, H)`` LM-head weight, ``(S, T)`` ids with
    ``T <= L`` -> ``(S, T)`` float32 ``log softmax(hidden[:, t] @ weight.T / temperature)[token_ids[:, t]]``.

    The LM head and the log-softmax in one, chunk by chunk of tokens, in both directions: no
    ``(S, T, V)`` logits tensor beyond :data:`HEAD_KEPT_ELEMENTS`. Up to that size the forward
    keeps the probabilities for the backward, which turns them into the logits' gradient in
    place (a head product fewer, about 6% of a small model's update); past it, the backward
    recomputes each chunk's instead of storing them. The products run in the weight's dtype
    (bf16 on the bf16 learner), the softmax in float32.
    """
    keep = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _HeadLogSoftmax.apply(hidden, weight, token_ids, temperature, keep)


def _head_logits(hidden: Tensor, weight: Tensor, temperature: float, out: Tensor | None = None) -> Tensor:
    """``hidden @ weight.T / temperature`` in float32, written into ``out`` when given."""
    if out is None:
        return (hidden @ weight.T).float().div_(temperature)
    if weight.dtype == out.dtype:
        return torch.mm(hidden, weight.T, out=out).div_(temperature)
    return out.copy_(hidden @ weight.T).div_(temperature)


def _exp_in_place(logits: Tensor, normalise: bool) -> Tensor:
    """Each row's logsumexp, computed where ``logits`` lie: they become ``exp(logits - max)``,
    or with ``normalise`` the softmax. ``torch.logsumexp`` would write a whole shifted copy (a
    chunk's 128 MB of fresh pages) and a softmax after it a second exponential pass."""
    shift = logits.amax(dim=-1, keepdim=True)
    sums = logits.sub_(shift).exp_().sum(dim=-1, keepdim=True)
    if normalise:
        logits.div_(sums)
    return (shift + sums.log()).squeeze(-1)


class _HeadLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, hidden: Tensor, weight: Tensor, token_ids: Tensor, temperature: float, keep: bool
    ) -> Tensor:
        rows, num_tokens = token_ids.shape
        flat_hidden = hidden[:, :num_tokens].reshape(rows * num_tokens, hidden.shape[-1])
        flat_ids = token_ids.reshape(-1)
        normalisers = torch.empty(flat_ids.shape, dtype=torch.float32, device=hidden.device)
        chosen = torch.empty_like(normalisers)
        kept = None
        if keep and len(flat_ids) * weight.shape[0] <= HEAD_KEPT_ELEMENTS:
            kept = torch.empty((len(flat_ids), weight.shape[0]), dtype=torch.float32, device=hidden.device)
        for piece in _chunks(len(flat_ids), weight.shape[0]):
            logits = _head_logits(flat_hidden[piece], weight, temperature, None if kept is None else kept[piece])
            chosen[piece] = logits.gather(-1, flat_ids[piece].unsqueeze(-1)).squeeze(-1)
            normalisers[piece] = _exp_in_place(logits, normalise=kept is not None)
        ctx.save_for_backward(flat_hidden, weight, flat_ids, normalisers)
        ctx.kept, ctx.temperature, ctx.hidden_shape, ctx.num_tokens = kept, temperature, hidden.shape, num_tokens
        return (chosen - normalisers).reshape(rows, num_tokens)

    @staticmethod
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        flat_hidden, weight, flat_ids, normalisers = ctx.saved_tensors
        kept, ctx.kept = ctx.kept, None
        scale = grad_output.reshape(-1).float() / ctx.temperature
        flat_grad_hidden = torch.empty_like(flat_hidden)
        grad_weight = None  # summed over chunks in float32
        for piece in _chunks(len(flat_ids), weight.shape[0]):
            # d/dz_v of (z_chosen - logsumexp(z)), z = h W^T / T: (onehot_v - softmax_v) / T
            if kept is None:
                probabilities = _head_logits(flat_hidden[piece], weight, ctx.temperature)
                probabilities.sub_(normalisers[piece].unsqueeze(-1)).exp_()
            else:
                probabilities = kept[piece]
            grad_logits = probabilities.mul_(-scale[piece].unsqueeze(-1))
            grad_logits.scatter_add_(-1, flat_ids[piece].unsqueeze(-1), scale[piece].unsqueeze(-1))
            grad_logits = grad_logits.to(weight.dtype)
            torch.mm(grad_logits, weight, out=flat_grad_hidden[piece])
            if grad_weight is None:
                grad_weight = (grad_logits.T @ flat_hidden[piece]).float()
            elif grad_weight.dtype == weight.dtype:
                grad_weight.addmm_(grad_logits.T, flat_hidden[piece])
            else:  # each chunk's product rounds to the weight's dtype, as autograd's would
                grad_weight += grad_logits.T @ flat_hidden[piece]
        (rows, length, width), num_tokens = ctx.hidden_shape, ctx.num_tokens
        grad_hidden = flat_grad_hidden.reshape(rows, num_tokens, width)
        if num_tokens < length:  # positions past the completion predict nothing
            grad_hidden = torch.nn.functional.pad(grad_hidden, (0, 0, 0, length - num_tokens))
        if grad_weight is None:  # no tokens
            grad_weight = torch.zeros_like(weight)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def _chunks(num_tokens: int, vocabulary: int) -> list[slice]:
    size = max(1, HEAD_CHUNK_ELEMENTS // vocabulary)
    return [slice(start, start + size) for start in range(0, num_tokens, size)]


def token_entropy(logits: Tensor) -> Tensor:
    """``(S, T, V)`` logits -> ``(S, T)`` entropy of each position's token distribution,
    ``logsumexp(z) - sum(softmax(z) * z)``, without a ``(S, T, V)`` log-softmax."""
    logits = logits.float()
    probabilities = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probabilities * logits).sum(dim=-1)
