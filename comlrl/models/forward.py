"""The policy's log-probabilities of its own completions: one batched forward."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import Tensor

from comlrl.algorithms import selective_log_softmax
from comlrl.algorithms.logprobs import token_entropy


@functools.cache
def _accepts(model_class: type, argument: str) -> bool:
    return argument in inspect.signature(model_class.forward).parameters


def accepts(model: torch.nn.Module, argument: str) -> bool:
    """Whether ``model``'s forward takes keyword ``argument``. A PEFT wrapper's forward only
    names a few arguments and passes the rest to its base model: the base model decides."""
    get_base_model = getattr(model, "get_base_model", None)
    return _accepts(type(get_base_model() if callable(get_base_model) else model), argument)


def padded_forward_kwargs(model: torch.nn.Module, attention_mask: Tensor, logits_to_keep: int) -> dict[str, Any]:
    """Forward keyword arguments for left-padded inputs: positions counted from the attention
    mask (as ``generate`` does, so padding does not shift them), and logits computed for the
    last ``logits_to_keep`` positions only, where the model supports each."""
    kwargs: dict[str, Any] = {}
    if accepts(model, "position_ids"):
        kwargs["position_ids"] = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    if accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = logits_to_keep
    return kwargs


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``(S, T)`` log-probability of each completion token under ``model``; with
    ``with_entropy``, also the ``(S, T)`` entropy of the (tempered) distribution it was drawn from.

    Prompts are left-padded, so positions are computed from the attention mask (as
    ``generate`` does); otherwise a padded prompt would see shifted positions and the
    log-probs would not be those of the sampling distribution. Logits are divided by the
    sampling ``temperature`` for the same reason. Logits are only computed for the
    completion positions when the model supports ``logits_to_keep``.

    Columns that are padding in every row (a micro-batch of short prompts or completions
    cut from a wider batch) are dropped before the forward; their log-probs are 0.
    """
    width = completion_ids.shape[1]
    kept_prompt = prompt_mask.bool().any(dim=0).nonzero()
    kept_completion = completion_mask.any(dim=0).nonzero()
    first = kept_prompt[0].item() if len(kept_prompt) else prompt_ids.shape[1]
    last = kept_completion[-1].item() + 1 if len(kept_completion) else 0
    outputs = _completion_logprobs(
        model,
        prompt_ids[:, first:],
        prompt_mask[:, first:],
        completion_ids[:, :last],
        completion_mask[:, :last],
        temperature,
        with_entropy,
    )
    if last < width:
        outputs = tuple(torch.nn.functional.pad(out, (0, width - last)) for out in outputs)
    return outputs if with_entropy else outputs[0]


def _completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, ...]:
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    num_completion = completion_ids.shape[1]
    # +1: the logit that predicts the first completion token sits on the last prompt token.
    kwargs = padded_forward_kwargs(model, attention_mask, logits_to_keep=num_completion + 1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits
    # (S, T+1, V): position t predicts token t+1. Sliced only when the model computed more
    # positions: a slice's backward would copy the whole gradient into a new zero tensor.
    if logits.shape[1] != num_completion + 1:
        logits = logits[:, -num_completion - 1 :, :]
    # In float32 even when the model ran in bf16: log-probs and their differences (ratios,
    # KL) lose too much in 8 bits of mantissa.
    logps = selective_log_softmax(logits, completion_ids, temperature)
    if not with_entropy:
        return (logps,)
    return logps, token_entropy(logits[:, :-1].float() / temperature)
