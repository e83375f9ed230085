"""The policy's log-probabilities of its own completions, batched over rows."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer

from comlrl.algorithms import selective_log_softmax
from comlrl.algorithms.logprobs import head_log_softmax, token_entropy
from comlrl.engine.sharding import is_sharded
from comlrl.models.modes import frozen

# The shortcut of ``_shared_prompt_outputs`` gives every parameter a second gradient, which
# autograd adds to the first: a fixed cost, set against the compute of the prompt tokens it
# saves. Below this saving (prompt tokens per micro-batch) it does not pay, per device type:
# - cpu: measured on a 2-core CPU as ~90 tokens (benchmarks/README.md, ``bench_update.py``).
# - any accelerator: NOT measured, chosen from the costs' ratio. The fixed cost reads and
#   writes each parameter's gradient once more (~12 bytes per parameter, bandwidth-bound); a
#   saved token costs ~6 FLOPs per parameter (forward and backward). A GPU that does 100-200
#   bf16 FLOPs per byte of memory bandwidth (A100, H100, H200) breaks even at ~200-400 tokens;
#   256. ``bench_update.py --prompt-tokens N`` measures the break-even on any device.
MIN_SAVED_PROMPT_TOKENS = {"cpu": 96}
ACCELERATOR_MIN_SAVED_PROMPT_TOKENS = 256


def min_saved_prompt_tokens(device: torch.device) -> int:
    """The fewest prompt tokens a micro-batch on ``device`` must save to share its prompts."""
    return MIN_SAVED_PROMPT_TOKENS.get(device.type, ACCELERATOR_MIN_SAVED_PROMPT_TOKENS)


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
    share_prompts: bool | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``(S, T)`` log-probability of each completion token under ``model``; with
    ``with_entropy``, also the ``(S, T)`` entropy of the (tempered) distribution it was drawn from.

    Prompts are left-padded, so positions are computed from the attention mask (as
    ``generate`` does); otherwise a padded prompt would see shifted positions and the
    log-probs would not be those of the sampling distribution. Logits are divided by the
    sampling ``temperature`` for the same reason. Logits are only computed for the
    completion positions when the model supports ``logits_to_keep``.

    Rows that share a prompt (the G samples of a prompt) compute it once where the model
    allows (see ``_shared_prompt_outputs``): by default when that saves at least
    :func:`min_saved_prompt_tokens` tokens on the model's device, always with ``share_prompts=True``, never with
    ``False`` (one forward over the whole rows). The values are the same.

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
        share_prompts,
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
    share_prompts: bool | None,
) -> tuple[Tensor, ...]:
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    # The entropy needs every position's whole distribution: there the logits are kept.
    head = None if with_entropy else split_head(model)
    forward = Forward(model, head)
    # Position t of the outputs predicts completion token t.
    outputs = (
        _shared_prompt_outputs(forward, prompt_ids, prompt_mask, completion_ids, attention_mask, share_prompts is True)
        if share_prompts is not False
        else None
    )
    if outputs is None:
        outputs = _outputs(
            forward, torch.cat([prompt_ids, completion_ids], dim=1), attention_mask, completion_ids.shape[1]
        )
    # In float32 even when the model ran in bf16: log-probs and their differences (ratios,
    # KL) lose too much in 8 bits of mantissa.
    if head is not None:
        return (head_log_softmax(outputs, head.weight, completion_ids, temperature),)
    logps = selective_log_softmax(outputs, completion_ids, temperature)
    if not with_entropy:
        return (logps,)
    return logps, token_entropy(outputs[:, : completion_ids.shape[1]].float() / temperature)


@dataclass(frozen=True)
class Head:
    """A causal LM cut before its LM head: ``lm_head(decoder(...).last_hidden_state)`` is its logits."""

    decoder: torch.nn.Module
    weight: Tensor


# Per model class: whether the split computes the model's own logits (checked once).
_SPLIT_CHECKED: dict[type, bool] = {}


def split_head(model: torch.nn.Module) -> Head | None:
    """``model``'s decoder and LM-head weight, when its logits are exactly ``hidden @ weight.T``
    (a plain bias-free linear head without hooks, no soft-capping or scaling after it:
    checked once per model class on a short input), else None. Then :func:`head_log_softmax` computes the
    log-probs without a logits tensor."""
    get_head, get_decoder = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    if get_head is None or get_decoder is None or is_sharded(model):  # FSDP gathers in the model's own forward
        return None
    peft_config = getattr(model, "active_peft_config", None)
    if getattr(peft_config, "is_prompt_learning", False):  # its virtual tokens come in the wrapper's forward
        return None
    head = get_head()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if head._forward_hooks or head._forward_pre_hooks:  # the split would not run them
        return None
    try:
        decoder = get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    if decoder is model or not isinstance(decoder, torch.nn.Module):
        return None
    split = Head(decoder, head.weight)
    get_base_model = getattr(model, "get_base_model", None)
    kind = type(get_base_model() if callable(get_base_model) else model)
    if kind not in _SPLIT_CHECKED:
        _SPLIT_CHECKED[kind] = _split_is_exact(model, split)
    return split if _SPLIT_CHECKED[kind] else None


HEAD_VOCABULARY_CHUNK = 2048
"""Rows of the LM-head weight per product in :func:`chunked_head_logits`."""


def chunked_head_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """``(R, H)`` hidden states, ``(V, H)`` head weight -> ``(R, V)`` logits ``hidden @ weight.T``,
    one product per :data:`HEAD_VOCABULARY_CHUNK` rows of the weight. Each logit is the same
    dot product: on the CPU the numbers equal one whole product's at real models' widths
    (checked at 576, 896 and 4096; a tiny test model's may round differently).

    Why: the CPU's BLAS copies (packs) a product's weight before multiplying, and a whole
    49k-row head packed at once goes through memory twice more; a slice's copy stays in the
    cache. Decoding 16 rows of SmolLM2-135M's fp32 head on a 2-core CPU, one thread per agent:
    22 ms against 30-36 ms a token. Not for bf16 weights, whose products measured no faster
    in slices.
    """
    logits = hidden.new_empty(hidden.shape[0], weight.shape[0])
    for start in range(0, weight.shape[0], HEAD_VOCABULARY_CHUNK):
        rows = slice(start, start + HEAD_VOCABULARY_CHUNK)
        torch.mm(hidden, weight[rows].T, out=logits[:, rows])
    return logits


def _split_is_exact(model: torch.nn.Module, split: Head) -> bool:
    ids = torch.arange(3, device=split.weight.device).unsqueeze(0)
    mask = torch.ones_like(ids)
    with frozen(model):
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        hidden = split.decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return logits.shape[:-1] == hidden.shape[:-1] and torch.allclose(
        logits.float(), (hidden @ split.weight.T).float(), rtol=1e-3, atol=1e-3
    )


@dataclass(frozen=True)
class Forward:
    """The forward the log-probs need: the model's logits, or (with ``head``) its decoder's
    final hidden states."""

    model: torch.nn.Module
    head: Head | None

    @property
    def module(self) -> torch.nn.Module:
        return self.model if self.head is None else self.head.decoder

    def __call__(self, **kwargs: Any) -> Any:
        return self.module(**kwargs)

    def values(self, output: Any) -> Tensor:
        return output.logits if self.head is None else output.last_hidden_state


def _outputs(forward: Forward, input_ids: Tensor, attention_mask: Tensor, num_completion: int) -> Tensor:
    """``(S, T+1, V)`` logits (or ``(S, T+1, H)`` hidden states) of the plain path, one forward
    over prompt and completion; the last position predicts nothing."""
    # +1: the logit that predicts the first completion token sits on the last prompt token.
    kwargs = padded_forward_kwargs(forward.module, attention_mask, logits_to_keep=num_completion + 1)
    outputs = forward.values(forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs))
    # Sliced only when the model computed more positions: a slice's backward would copy the
    # whole gradient into a new zero tensor.
    return outputs if outputs.shape[1] == num_completion + 1 else outputs[:, -num_completion - 1 :, :]


def _shared_prompt_outputs(
    forward: Forward,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    attention_mask: Tensor,
    force: bool,
) -> Tensor | None:
    """``(S, T, V)`` logits (or ``(S, T, H)`` hidden states) with each distinct prompt computed
    once, or None (-> one forward over the whole rows) when no two rows share a prompt, the
    model cannot take the shortcut, or (unless ``force``) it would save fewer than
    :func:`min_saved_prompt_tokens` tokens.

    The G samples of a prompt share it, so the plain path computes every prompt G times. Here
    the distinct prompts but their last token run once with a KV cache, the cache is gathered
    out to the rows, and each row's last prompt token and completion run on top of it, so one
    LM head covers every position that predicts a completion token. Gradients flow back
    through the gathered cache to the single prompt forward: loss and gradients are those of
    the plain path.
    """
    unique_ids, unique_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    saved_tokens = (len(prompt_ids) - len(unique_ids)) * (prompt_ids.shape[1] - 1)
    threshold = min_saved_prompt_tokens(prompt_ids.device)
    worth_it = saved_tokens > 0 and (force or saved_tokens >= threshold)
    model = forward.module
    # A sharded model: every rank must run as many forwards as the others (comlrl.engine.sharding).
    if not worth_it or completion_ids.shape[1] == 0 or _checkpointed(model) or is_sharded(model):
        return None
    cache_name = next((name for name in ("cache", "past_key_values") if accepts(model, name)), None)
    if cache_name is None:
        return None
    width = prompt_ids.shape[1]
    prefix_ids, prefix_mask = unique_ids[:, :-1], unique_mask[:, :-1]
    # The prefix's logits are not used: no gradient reaches the LM head from this forward.
    kwargs = padded_forward_kwargs(model, prefix_mask, logits_to_keep=1)
    cache = getattr(model(input_ids=prefix_ids, attention_mask=prefix_mask, use_cache=True, **kwargs), cache_name, None)
    if not gatherable(cache):
        return None
    cache.batch_select_indices(inverse)
    # The last completion token predicts nothing: it is not run.
    kwargs = padded_forward_kwargs(model, attention_mask[:, :-1], logits_to_keep=0)
    if "position_ids" in kwargs:
        kwargs["position_ids"] = kwargs["position_ids"][:, width - 1 :]
    output = model(
        input_ids=torch.cat([prompt_ids[:, -1:], completion_ids[:, :-1]], dim=1),
        attention_mask=attention_mask[:, :-1],
        use_cache=True,
        **{cache_name: cache},
        **kwargs,
    )
    return forward.values(output)


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(R, P)`` left-padded prompts -> the ``(U, P)`` distinct ones (ids and mask, U <= R) and
    the ``(R,)`` index of each row's among them: ``unique_ids[inverse]`` is ``prompt_ids``."""
    unique_rows, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    unique_ids, unique_mask = unique_rows.split(prompt_ids.shape[1], dim=1)
    return unique_ids, unique_mask.to(prompt_mask.dtype), inverse


def gatherable(cache: Any) -> bool:
    """Whether ``cache`` (a forward's KV cache) may be gathered out to other rows with
    ``batch_select_indices`` and keep every position: a cache of plain growing layers only (a
    sliding window drops positions, linear attention keeps a state instead)."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _checkpointed(model: torch.nn.Module) -> bool:
    """Whether activation checkpointing is on: its recomputation would append to the cache twice."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
