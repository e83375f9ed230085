"""The lean sampling loop with its one-token forward compiled: a static KV cache and
``torch.compile``, drawing the same tokens as :func:`comlrl.rollout.decoding.decode`.

Why: the eager loop pays Python and dispatch time for every operator of every layer at every
token, and its dynamic cache grows (reallocates) each step. Compiled, the step is one graph of
fused kernels over tensors of fixed shapes (inductor on the CPU; CUDA graphs on CUDA, which
replay the whole step in one launch). Fixed shapes need a cache allocated at its final
length, whose unwritten positions the attention mask hides (zeros over the whole cache
length, a 1 written at each position as it is filled).

Compiling costs seconds per shape, so the shapes are bucketed: rows to a power of two
(padding rows repeat the last prompt and are dropped before sampling), cache length to a power
of two of at least :data:`MIN_CACHE_LENGTH`. Each bucket compiles once per process and model
graph (models of one class, config and dtype share a graph); :func:`compile_seconds` says
which compiled and what it cost, and each compile logs one info line. One more compile each
can come later: the forward reads a transformers registry of model classes, so building a
model of a class not built before makes the graphs compiled earlier compile again, once.
Each model keeps one cache per shape bucket for its next call of that bucket (see ``_HELD``),
at most :data:`HELD_CACHES` of them, the least recently used dropped past that: memory of up to
that many KV caches per model between calls.

The prompt's prefill stays eager (prompt lengths vary call to call; one forward; rows that
share a prompt compute it once, as the eager loop's do). So does the
sampler, which is :func:`comlrl.rollout.decoding.sampling_loop` itself: ``torch.multinomial``
with a ``torch.Generator`` does not compile, and sharing it is what makes the two loops draw
the same tokens. Models the compiled loop cannot serve (:func:`supports_compiled`) use the
eager loop.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from transformers.cache_utils import StaticCache, get_layer_types_and_kwargs

from comlrl.models.forward import accepts, distinct_prompts, gatherable, padded_forward_kwargs
from comlrl.rollout.decoding import Decoded, DecodingSettings, decode, prefill_each, sampling_loop

logger = logging.getLogger(__name__)

MIN_CACHE_LENGTH = 64
"""The shortest cache (prompt + new tokens, rounded up to a power of two): shorter calls
share one compiled graph."""
RECOMPILE_LIMIT = 64
"""Graphs dynamo may keep for the compiled step (its default, 8, counts every model, dtype and
bucket of the process together; past the limit it would silently run the step eagerly)."""
HELD_CACHES = 2
"""Static caches kept per model between calls, one per shape bucket (two: training and evaluation
alternate two shapes); past it, the least recently used is dropped. Each is a whole KV cache of its
bucket, so a large model on long buckets holds that memory between calls."""
_ATTENTION = ("sdpa", "eager")
"""Attention implementations whose masks were checked with a static cache (a 2D mask over
the whole cache length, the causal part from the cache's own fill count)."""


class Bucket(NamedTuple):
    """One compiled shape of the step."""

    model: str
    """The model's class, adapter type and checkpoint, e.g. ``LlamaForCausalLM+LORA(path)``."""
    dtype: str
    device: str
    rows: int
    length: int
    """Cache positions."""


_COMPILES: dict[Bucket, list[float]] = {}
# Per model, one cache per shape (rows, length, dtype, device), reused by its next call of that
# shape: CUDA graphs replay on fixed addresses, and a fresh cache each call (or each alternation
# of two shapes) would make them record again. Least recently used first, at most HELD_CACHES.
# Taken out while in use, so a second thread decoding the same model and shape at once allocates its own.
_HELD: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple[Any, ...], StaticCache]] = (
    weakref.WeakKeyDictionary()
)
_HELD_LOCK = threading.Lock()


def compile_seconds() -> dict[Bucket, tuple[float, ...]]:
    """Every bucket the step was compiled for in this process, with the seconds each compile
    took (its first step, compile included); one entry per bucket unless dynamo recompiled."""
    return {bucket: tuple(seconds) for bucket, seconds in _COMPILES.items()}


def supports_compiled(model: torch.nn.Module) -> bool:
    """Whether :func:`decode_compiled` can serve ``model`` (see :func:`why_not_compiled`)."""
    return why_not_compiled(model) is None


def why_not_compiled(model: torch.nn.Module) -> str | None:
    """Why :func:`decode_compiled` cannot serve ``model``, or None when it can: it needs a
    transformers decoder that declares its forward compiles as one graph, with a checked
    attention implementation and only full attention layers (a sliding window's cache is a
    ring the mask does not describe), not quantized by a method that does not compile; under a
    PEFT adapter that changes weights (LoRA and its kin, checked), not one that learns prompts
    (its virtual tokens or prefix keys and values go into the cache its own way)."""
    base = _base_model(model)
    if base is None:
        return "a prompt-learning adapter writes its own keys and values into the cache"
    config = getattr(base, "config", None)
    if config is None or not getattr(base, "_can_compile_fullgraph", False):
        return "the model does not declare that its forward compiles as one graph"
    quantizer = getattr(base, "hf_quantizer", None)
    if quantizer is not None and not quantizer.is_compileable:
        return "its quantization method does not compile"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder"
    if config._attn_implementation not in _ATTENTION:
        return f"attention {config._attn_implementation!r} is not among the checked ones {sorted(_ATTENTION)}"
    if not accepts(base, "cache"):
        # Before transformers 5.2x the forward takes past_key_values, and the static cache differs.
        return "its forward takes no 'cache' argument (transformers older than this library's development pin)"
    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    if any(layer_type != "full_attention" for layer_type in layer_types):
        return "it has layers other than full attention (a sliding window's cache is a ring)"
    return None


_WARNED: set[str] = set()


def warn_eager_fallback(model: torch.nn.Module, reason: str) -> None:
    """Say once per model class that ``compiled_decoding=True`` falls back to the eager loop, and why."""
    name = type(model).__name__
    if name not in _WARNED:
        _WARNED.add(name)
        logger.warning("compiled_decoding=True: %s decodes with the eager loop: %s", name, reason)


def _base_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model under a PEFT wrapper (``model`` itself without one); None under a
    prompt-learning adapter."""
    get_base_model = getattr(model, "get_base_model", None)
    if not callable(get_base_model):
        return model
    return None if model.active_peft_config.is_prompt_learning else get_base_model()


def _model_name(model: torch.nn.Module) -> str:
    """How :class:`Bucket` names a model: its class, its adapter's type, its checkpoint."""
    base = _base_model(model)
    adapter = f"+{model.active_peft_config.peft_type.value}" if base is not model else ""
    return f"{type(base).__name__}{adapter}({base.config.name_or_path})"


def bucket_size(size: int, smallest: int) -> int:
    """``size`` rounded up to a power of two, at least ``smallest``: a log number of shapes."""
    return max(smallest, 1 << (size - 1).bit_length())


def _forward_step(model: torch.nn.Module, input_ids: Tensor, mask: Tensor, cache: StaticCache, kwargs: dict) -> Tensor:
    """The one-token forward that is compiled: ``(rows, V)`` logits of the fed tokens."""
    return model(input_ids=input_ids, attention_mask=mask, cache=cache, use_cache=True, **kwargs).logits[:, -1]


@functools.cache
def compiled_step(device_type: str) -> Callable[..., Tensor]:
    """:func:`_forward_step` compiled for ``device_type``, one function per device type.

    Static shapes (the buckets bound them), one graph. On CUDA, ``reduce-overhead`` (CUDA
    graphs: the step's hundreds of kernels in one launch). On the CPU, inductor's kernels read
    the thread count when they run, not when they compiled: agents decoding in parallel threads
    set one thread each, and a count baked in at compile time would oversubscribe the cores.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    if device_type == "cuda":
        return torch.compile(_forward_step, mode="reduce-overhead", dynamic=False, fullgraph=True)
    options = {"cpp.dynamic_threads": True} if device_type == "cpu" else None
    return torch.compile(_forward_step, options=options, dynamic=False, fullgraph=True)


def _compiled_graphs() -> int:
    """Graphs dynamo compiled in this process so far (its own counter)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _record(bucket: Bucket, seconds: float) -> None:
    _COMPILES.setdefault(bucket, []).append(seconds)
    logger.info(
        "compiled the decoding step of %s (%s, %s) for %d rows x %d cache positions in %.1f s",
        *bucket,
        seconds,
    )


def _take_cache(model: torch.nn.Module, shape: tuple[Any, ...]) -> StaticCache:
    """The model's held cache of ``shape`` (rows, length, dtype, device), taken out and
    emptied; without one, a new one (allocated at its final length by the prefill's first write)."""
    with _HELD_LOCK:
        held = _HELD.get(model)
        cache = held.pop(shape, None) if held is not None else None
    if cache is not None:
        cache.reset()
        return cache
    return StaticCache(config=model.config, max_cache_len=shape[1])


def _give_back(model: torch.nn.Module, shape: tuple[Any, ...], cache: StaticCache) -> None:
    """Hold ``cache`` as the model's most recently used one of ``shape``, dropping the least
    recently used past :data:`HELD_CACHES`."""
    with _HELD_LOCK:
        held = _HELD.setdefault(model, OrderedDict())
        held[shape] = cache
        held.move_to_end(shape)
        while len(held) > HELD_CACHES:
            held.popitem(last=False)


def _padded_rows(tensor: Tensor, rows: int) -> Tensor:
    """``tensor`` with its last row repeated up to ``rows`` rows: padding rows that compute a
    real prompt (no fully masked attention), whose results are dropped."""
    extra = rows - tensor.shape[0]
    return torch.cat([tensor, tensor[-1:].expand(extra, *tensor.shape[1:])]) if extra else tensor


def decode_compiled(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    settings: DecodingSettings,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    with_logprobs: bool = False,
    stop: Callable[[Tensor], Tensor] | None = None,
) -> Decoded:
    """:func:`comlrl.rollout.decoding.decode` (same arguments, same tokens for the same
    generator, log-probs equal up to float rounding) with a static cache and a compiled step,
    for a model :func:`supports_compiled` accepts. Call under ``torch.inference_mode()`` with
    the model in eval mode."""
    if settings.max_new_tokens == 0:
        return decode(model, prompt_ids, prompt_mask, settings, eos_ids, pad_id, generator, with_logprobs, stop=stop)
    rows, prompt_length = prompt_ids.shape
    device, dtype = prompt_ids.device, next(model.parameters()).dtype
    padded_rows = bucket_size(rows, 1)
    length = bucket_size(prompt_length + settings.max_new_tokens, MIN_CACHE_LENGTH)
    bucket = Bucket(_model_name(model), str(dtype), str(device), padded_rows, length)
    prompt_mask = _padded_rows(prompt_mask, padded_rows)
    mask = prompt_mask.new_zeros(padded_rows, length)
    mask[:, :prompt_length] = prompt_mask
    kwargs = padded_forward_kwargs(model, prompt_mask, logits_to_keep=1)
    shape = (padded_rows, length, dtype, device)
    cache = _take_cache(model, shape)
    try:
        logits = _shared_prefill(model, prompt_ids, prompt_mask[:rows], cache, padded_rows)
        if logits is None:
            ids = _padded_rows(prompt_ids, padded_rows)
            logits = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True, **kwargs).logits[:rows, -1]
        step = _stepper(model, mask, cache, kwargs, prompt_length, rows, bucket)
        return sampling_loop(logits, step, settings, eos_ids, pad_id, generator, with_logprobs, stop)
    finally:
        _give_back(model, shape, cache)


def _shared_prefill(
    model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, cache: StaticCache, padded_rows: int
) -> Tensor | None:
    """Where rows share prompts: the distinct prompts prefilled once (eagerly, as
    :func:`comlrl.rollout.decoding.prefill` does), their keys and values written to every row
    of the emptied static ``cache`` (``padded_rows``: padding rows repeat the last prompt), and
    the ``(rows, V)`` last-position logits; None (nothing written) when no two rows share a
    prompt or the prefill's cache cannot be gathered."""
    unique_ids, unique_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    if len(unique_ids) == len(prompt_ids):
        return None
    _, shared, last = prefill_each(model, unique_ids, unique_mask)
    if not gatherable(shared):
        return None
    index = _padded_rows(inverse, padded_rows)
    for layer, computed in zip(cache.layers, shared.layers, strict=True):
        layer.update(computed.keys[index], computed.values[index])
    return last[inverse]


def _stepper(
    model: torch.nn.Module, mask: Tensor, cache: StaticCache, kwargs: dict, column: int, rows: int, bucket: Bucket
) -> Callable[[Tensor], Tensor]:
    """The ``forward`` of :func:`sampling_loop`: writes the next cache position into ``mask``,
    advances the positions (counted from the mask, as the eager loop counts them), runs the
    compiled step on the padded rows and keeps the first ``rows`` logits. A step that made
    dynamo compile is recorded under ``bucket``."""
    step = compiled_step(mask.device.type)
    if "position_ids" in kwargs:
        kwargs["position_ids"] = mask.sum(dim=1, keepdim=True) - 1

    def forward(tokens: Tensor) -> Tensor:
        nonlocal column
        mask[:, column] = 1
        column += 1
        if "position_ids" in kwargs:
            kwargs["position_ids"] = kwargs["position_ids"] + 1
        graphs, started = _compiled_graphs(), time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are no longer read
        logits = step(model, _padded_rows(tokens, mask.shape[0]).unsqueeze(1), mask, cache, kwargs)
        if _compiled_graphs() > graphs:
            _record(bucket, time.perf_counter() - started)
        return logits[:rows]

    return forward
