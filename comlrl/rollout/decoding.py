"""A lean sampling loop for causal LMs: the model's own forward with its KV cache, and a
sampler that draws among the top-k tokens only.

It samples from the same distribution as Hugging Face ``generate`` (temperature, then top-k,
then top-p, with ``min_new_tokens`` holding EOS back) for the settings it knows, and reads
the rest of the model's ``generation_config`` to tell when it does not know them: then
:func:`decoding_settings` returns None and the caller uses ``generate``. Why a loop of our
own: ``generate`` draws from the full vocabulary (an exponential per token of a 49k
vocabulary, and top-p sorts all of it), spends Python time on its generic machinery every
token, and cannot take a ``torch.Generator``, which agents decoding in parallel threads need
to stay reproducible.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from comlrl.models.forward import (
    Head,
    chunked_head_logits,
    distinct_prompts,
    gatherable,
    padded_forward_kwargs,
    split_head,
)

# Agents may share one tokenizer and generate in parallel threads; a fast tokenizer sets its
# padding state on every call and is not safe to call from two threads at once.
TOKENIZER_LOCK = threading.Lock()

# generation_config fields the loop implements, and fields that do not change which tokens
# are drawn; anything else that differs from transformers' defaults (repetition_penalty,
# num_beams, min_p, stop_strings, ...) is left to ``generate``.
_IMPLEMENTED = {
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "min_new_tokens",
    "max_length",  # superseded by max_new_tokens, which the loop requires
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "stop_strings",  # the caller gives the loop a ``stop`` check (see ``sampling_loop``)
}
_NO_EFFECT = {
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "transformers_version",
    "_from_model_config",
}
# transformers' documented defaults for the fields a generation config may leave unset.
_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_new_tokens": 0}


@dataclass(frozen=True)
class DecodingSettings:
    """What one sampling run draws: the model's generation config with the caller's arguments."""

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    """0: no top-k filter."""
    top_p: float = 1.0
    min_new_tokens: int = 0


def generation_default(model: torch.nn.Module, name: str) -> Any:
    """What ``generate`` uses for ``name`` when the call does not set it: the model's
    ``generation_config`` value, or transformers' default when that leaves it unset."""
    value = getattr(getattr(model, "generation_config", None), name, None)
    return _DEFAULTS.get(name) if value is None else value


def decoding_settings(model: torch.nn.Module, kwargs: dict[str, Any]) -> DecodingSettings | None:
    """The loop's settings for ``generate(**kwargs)`` on ``model``, or None when that call
    would do something the loop does not (an argument or a generation-config field outside
    what it implements, no ``max_new_tokens``, an encoder-decoder model)."""
    config = getattr(model, "generation_config", None)
    if config is None or getattr(model.config, "is_encoder_decoder", False):
        return None
    config = copy.deepcopy(config)
    unknown = config.update(**kwargs)
    if unknown or set(config.to_diff_dict()) - _IMPLEMENTED - _NO_EFFECT or config.max_new_tokens is None:
        return None
    values = {name: getattr(config, name) for name in _DEFAULTS}
    values = {name: _DEFAULTS[name] if value is None else value for name, value in values.items()}
    settings = DecodingSettings(max_new_tokens=config.max_new_tokens, **values)
    if settings.do_sample and not (settings.temperature > 0 and settings.top_p >= 0 and settings.top_k >= 0):
        return None  # generate names the bad value in its error
    return settings


def filtered_distribution(logits: Tensor, temperature: float, top_k: int, top_p: float) -> tuple[Tensor, Tensor]:
    """``(R, V)`` logits -> ``(R, K)`` probabilities and ``(R, K)`` token ids of the tokens
    that survive temperature, top-k and top-p (in that order, as ``generate`` applies them);
    filtered-out tokens among the K have probability 0.

    Only the top-k logits are softmaxed and sorted: the same distribution as masking the full
    vocabulary, at a fraction of the cost. Top-p keeps the most likely tokens whose mass
    before them is below ``top_p`` (at least one).
    """
    logits = logits.float() / temperature
    vocabulary = logits.shape[-1]
    if top_k <= 0 and top_p >= 1.0:  # nothing filtered: no need to sort
        return logits.softmax(dim=-1), torch.arange(vocabulary, device=logits.device).expand_as(logits)
    k = vocabulary if top_k <= 0 else min(top_k, vocabulary)
    values, token_ids = logits.topk(k, dim=-1)
    probabilities = values.softmax(dim=-1)
    if top_p < 1.0:
        mass_before = probabilities.cumsum(dim=-1) - probabilities
        dropped = mass_before >= top_p
        dropped[:, 0] = False
        probabilities = values.masked_fill(dropped, float("-inf")).softmax(dim=-1)
    return probabilities, token_ids


def next_tokens(logits: Tensor, settings: DecodingSettings, generator: torch.Generator | None) -> Tensor:
    """``(R, V)`` logits of the last position -> ``(R,)`` drawn token ids (argmax when not sampling)."""
    if not settings.do_sample:
        return logits.argmax(dim=-1)
    probabilities, token_ids = filtered_distribution(logits, settings.temperature, settings.top_k, settings.top_p)
    choice = torch.multinomial(probabilities, 1, generator=generator)
    return token_ids.gather(-1, choice).squeeze(-1)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """``(R, V)`` logits, ``(R,)`` drawn ids -> ``(R,)`` float32 ``log_softmax(logits / T)[token]``
    over the whole vocabulary: the policy's log-prob as the learner computes it (top-k and
    top-p shape what is drawn, not the policy being trained)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


class Decoded(NamedTuple):
    ids: Tensor
    """``(R, T)`` completion ids, padded after EOS."""
    logprobs: Tensor | None
    """``(R, T)`` float32 log-probs of the drawn tokens at the sampling temperature (see
    :func:`token_logprobs`; 0 after a row finished), when asked for."""


def decode(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    settings: DecodingSettings,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    with_logprobs: bool = False,
    share_prompts: bool = True,
    stop: Callable[[Tensor], Tensor] | None = None,
) -> Decoded:
    """The completions of left-padded prompts, one KV-cached forward per token (and, with
    ``with_logprobs``, the log-probs the sampler gave its tokens).

    Laid out as ``generate``'s output after the prompt: a finished row (it drew an EOS) is
    padded with ``pad_id``, and decoding stops when every row has finished or after
    ``max_new_tokens``; ``stop`` finishes rows too (see :func:`sampling_loop`). Rows that
    share a prompt compute it once (:func:`prefill`; False: every row runs its own, the
    baseline of ``benchmarks/bench_prefill.py``). Call under ``torch.inference_mode()`` with
    the model in eval mode.
    """
    if settings.max_new_tokens == 0:
        empty = prompt_ids.new_zeros(prompt_ids.shape[0], 0)
        return Decoded(empty, empty.float() if with_logprobs else None)
    mask = prompt_mask
    head = chunked_head(model)
    module = model if head is None else head.decoder
    cache_name, cache, last = (prefill if share_prompts else prefill_each)(module, prompt_ids, prompt_mask)
    kwargs = padded_forward_kwargs(module, mask, logits_to_keep=1)

    def logits_of(last: Tensor) -> Tensor:
        return last if head is None else chunked_head_logits(last, head.weight)

    def forward(tokens: Tensor) -> Tensor:
        nonlocal mask, cache
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if "position_ids" in kwargs:
            kwargs["position_ids"] = mask.sum(dim=1, keepdim=True) - 1
        kwargs[cache_name] = cache
        out = module(input_ids=tokens.unsqueeze(1), attention_mask=mask, use_cache=True, **kwargs)
        cache = getattr(out, cache_name)
        return logits_of(last_position(out))

    return sampling_loop(logits_of(last), forward, settings, eos_ids, pad_id, generator, with_logprobs, stop)


def prefill(module: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[str, Any, Tensor]:
    """One forward over ``(R, P)`` left-padded prompts -> the name of the cache argument, the
    KV cache of every row, and the ``(R, V)`` last-position logits (``(R, H)`` hidden states
    when ``module`` is a decoder without its head).

    Rows that share a prompt (the G samples of a prompt, evaluation rows that repeat a
    problem) compute it once: the distinct prompts run, and their cache and last position are
    gathered out to the rows, which then decode as if each had run its own (the same values
    up to float rounding). Where the cache cannot be gathered (a sliding window, linear
    attention), the whole rows run again.
    """
    unique_ids, unique_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    if len(unique_ids) < len(prompt_ids):
        cache_name, cache, last = prefill_each(module, unique_ids, unique_mask)
        if gatherable(cache):
            cache.batch_select_indices(inverse)
            return cache_name, cache, last[inverse]
    return prefill_each(module, prompt_ids, prompt_mask)


def prefill_each(module: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[str, Any, Tensor]:
    """:func:`prefill` with every row computing its own prompt."""
    kwargs = padded_forward_kwargs(module, prompt_mask, logits_to_keep=1)
    out = module(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, **kwargs)
    # transformers 5 names the cache ``cache`` (argument and output), 4.x ``past_key_values``.
    cache_name = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    return cache_name, getattr(out, cache_name), last_position(out)


def last_position(out: Any) -> Tensor:
    """A forward's ``(R, V)`` last-position logits, or ``(R, H)`` hidden states from a decoder
    without its head."""
    values = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return values[:, -1, :]


def chunked_head(model: torch.nn.Module) -> Head | None:
    """``model``'s decoder and head when decoding should apply the head in vocabulary slices
    (:func:`comlrl.models.forward.chunked_head_logits`: fp32 weights on the CPU), else None."""
    head = split_head(model)
    if head is None or head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return None
    return head


def sampling_loop(
    logits: Tensor,
    forward: Callable[[Tensor], Tensor],
    settings: DecodingSettings,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None,
    with_logprobs: bool,
    stop: Callable[[Tensor], Tensor] | None = None,
) -> Decoded:
    """Draw tokens one step at a time: ``logits`` are the ``(R, V)`` last-position logits of
    the prompts, ``forward(tokens)`` feeds the ``(R,)`` drawn tokens to the model and returns
    the next ``(R, V)`` logits. A row finishes when it draws an EOS id or when ``stop``, given
    the ``(r, t)`` ids the unfinished rows drew so far, marks it (``(r,)`` bool; see
    :func:`holds_stop_string`). Every decoding loop (:func:`decode`, the compiled one of
    :mod:`comlrl.rollout.compiled_decoding`) runs this one, so that for the same logits and
    generator they draw the same tokens, stop at the same step and pad alike."""
    eos = torch.tensor(eos_ids, dtype=torch.long, device=logits.device)
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    columns, logprob_columns = [], []
    temperature = settings.temperature if settings.do_sample else 1.0
    for step in range(settings.max_new_tokens):
        if with_logprobs:  # of the policy: before min_new_tokens holds EOS back
            policy_logits = logits
        if step < settings.min_new_tokens and eos_ids:
            logits = logits.index_fill(-1, eos, float("-inf"))
        tokens = next_tokens(logits, settings, generator).masked_fill(finished, pad_id)
        columns.append(tokens)
        if with_logprobs:
            logprob_columns.append(token_logprobs(policy_logits, tokens, temperature).masked_fill(finished, 0.0))
        running = ~finished
        finished |= torch.isin(tokens, eos)
        if stop is not None and running.any():
            finished[running] |= stop(torch.stack(columns, dim=1)[running])
        if finished.all() or step + 1 == settings.max_new_tokens:
            break
        logits = forward(tokens)
    return Decoded(torch.stack(columns, dim=1), torch.stack(logprob_columns, dim=1) if with_logprobs else None)


def holds_stop_string(tokenizer: Any, stop_strings: Sequence[str], ids: Tensor) -> Tensor:
    """``(r, t)`` ids -> ``(r,)`` bool: the text of each row (special tokens skipped) holds one
    of ``stop_strings``. Checked after every token, it finishes a row at the first token whose
    text completes a stop string, as ``generate``'s ``stop_strings`` do and as
    :func:`comlrl.rollout.generation.stop_length` counts the tokens a completion keeps."""
    with TOKENIZER_LOCK:
        texts = tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
    return torch.tensor([any(stop in text for stop in stop_strings) for text in texts], dtype=torch.bool)
