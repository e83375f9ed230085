"""Batched sampling: one call per agent per step, with the lean loop of
:mod:`comlrl.rollout.decoding` or, for settings it does not implement, Hugging Face ``generate``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from comlrl.algorithms import completion_mask
from comlrl.models.modes import frozen
from comlrl.rollout.compiled_decoding import decode_compiled, warn_eager_fallback, why_not_compiled
from comlrl.rollout.decoding import TOKENIZER_LOCK, decode, decoding_settings, generation_default, holds_stop_string
from comlrl.rollout.prompt_fit import check_length


@dataclass
class AgentRollout:
    """G completions for each of B prompts of one agent; rows ordered prompt-major
    (row ``b * G + k`` is sample k of prompt b)."""

    prompt_ids: Tensor
    """``(B*G, P)`` left-padded prompt token ids."""
    prompt_mask: Tensor
    """``(B*G, P)`` 1 on real prompt tokens, 0 on left padding."""
    completion_ids: Tensor
    """``(B*G, T)`` generated ids, padded after EOS."""
    completion_mask: Tensor
    """``(B*G, T)`` bool, True on every generated token up to and including EOS."""
    texts: list[str]
    """``B*G`` decoded completions, special tokens removed."""
    truncated: Tensor
    """``(B*G,)`` bool: the completion ended at ``max_new_tokens`` without an EOS."""
    sampler_logprobs: Tensor | None = None
    """``(B*G, T)`` float32 log-probs the sampler gave its tokens, when it may not be
    exactly the learner (bf16 decoding): the update measures and corrects the mismatch with them."""
    pad_id: int = 0
    """The id that left-pads the prompts (the tokenizer's pad id); :func:`join_rollouts` pads
    with it, so that one prompt reads the same ids in every rollout it joins."""
    action_mask: Tensor | None = None
    """``(B*G, T)`` bool, True on the tokens the agent wrote, where a completion also holds
    tokens it did not (a tool's results and the chat template's turns around them, which it
    read); None: every completion token is its own."""

    @property
    def lengths(self) -> Tensor:
        """``(B*G,)`` number of tokens of each completion (EOS included; tools' results too)."""
        return self.completion_mask.sum(dim=1)

    @property
    def own_mask(self) -> Tensor:
        """``(B*G, T)`` bool: the tokens the agent wrote, the only ones the loss, the KL and the
        entropy count (:attr:`action_mask`, else :attr:`completion_mask`)."""
        return self.completion_mask if self.action_mask is None else self.action_mask

    def select(self, prompts: Sequence[int], num_generations: int) -> AgentRollout:
        """The rollout of prompts ``prompts`` (indices, in that order), their G samples each."""
        index = torch.tensor([b * num_generations + k for b in prompts for k in range(num_generations)])
        index = index.to(self.prompt_ids.device, dtype=torch.long)
        return AgentRollout(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.completion_ids[index],
            self.completion_mask[index],
            [self.texts[i] for i in index.tolist()],
            self.truncated[index],
            None if self.sampler_logprobs is None else self.sampler_logprobs[index],
            self.pad_id,
            None if self.action_mask is None else self.action_mask[index],
        )


def join_rollouts(rollouts: Sequence[AgentRollout]) -> AgentRollout:
    """One agent's rollouts one after the other: prompts left-padded with the first's
    ``pad_id`` to the longest, completions right-padded to the longest (masks 0 there)."""
    first = rollouts[0]
    if len({r.sampler_logprobs is None for r in rollouts}) > 1:
        raise ValueError("rollouts to join must all have sampler log-probs, or none")
    width = max(r.prompt_ids.shape[1] for r in rollouts)
    length = max(r.completion_ids.shape[1] for r in rollouts)

    def left(tensor: Tensor, value: int | bool) -> Tensor:
        return torch.nn.functional.pad(tensor, (width - tensor.shape[1], 0), value=value)

    def right(tensor: Tensor, value: float | bool) -> Tensor:
        return torch.nn.functional.pad(tensor, (0, length - tensor.shape[1]), value=value)

    logprobs = None if first.sampler_logprobs is None else [right(r.sampler_logprobs, 0.0) for r in rollouts]
    with_actions = any(r.action_mask is not None for r in rollouts)
    actions = [right(r.own_mask, False) for r in rollouts] if with_actions else None
    return AgentRollout(
        torch.cat([left(r.prompt_ids, first.pad_id) for r in rollouts]),
        torch.cat([left(r.prompt_mask, 0) for r in rollouts]),
        torch.cat([right(r.completion_ids, first.pad_id) for r in rollouts]),
        torch.cat([right(r.completion_mask, False) for r in rollouts]),
        [text for r in rollouts for text in r.texts],
        torch.cat([r.truncated for r in rollouts]),
        None if logprobs is None else torch.cat(logprobs),
        first.pad_id,
        None if actions is None else torch.cat(actions),
    )


def eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """Every id that ends a completion: the model's generation EOS ids and the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_prompts(tokenizer: Any, prompts: Sequence[str | Sequence[int]]) -> Any:
    """The prompts tokenized and left-padded to the longest, as tensors. A prompt given as
    token ids (a conversation continued after a tool's result) is taken as it is."""
    if all(isinstance(prompt, str) for prompt in prompts):
        with TOKENIZER_LOCK:
            return tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")
    with TOKENIZER_LOCK:
        ids = [tokenizer(p)["input_ids"] if isinstance(p, str) else list(p) for p in prompts]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def stop_length(tokenizer: Any, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """How many of ``ids`` a completion keeps when ``stop_strings`` end it: up to and including
    the first token whose text completes a stop string (None when none does). ``generate``
    stops there and pads the rest, so the pad after it, which may be the EOS id, is not a token
    the model drew."""

    def stops(n: int) -> bool:
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        return any(stop in text for stop in stop_strings)

    if not ids or not stops(len(ids)):
        return None
    low, high = 1, len(ids)  # the shortest prefix that holds a stop string is in [low, high]
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if stops(middle) else (middle + 1, high)
    return low


def rollout_from_ids(
    tokenizer: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    eos_ids: Sequence[int],
    stop_strings: Sequence[str] = (),
) -> AgentRollout:
    """An :class:`AgentRollout` from the prompts and the generated ids (padded after EOS, or
    after the token that completed one of ``stop_strings``)."""
    mask = completion_mask(completion_ids, list(eos_ids))
    truncated = ~torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device)).any(dim=1)
    if stop_strings:
        with TOKENIZER_LOCK:
            for row, (ids, n) in enumerate(zip(completion_ids.tolist(), mask.sum(dim=1).tolist())):
                kept = stop_length(tokenizer, ids[:n], stop_strings)
                if kept is not None:
                    mask[row, kept:] = False
                    truncated[row] = False
    # Decode only the owned tokens: generation pads after EOS with pad_token_id, which need
    # not be a special token that skip_special_tokens would drop.
    owned = [ids[:n] for ids, n in zip(completion_ids.tolist(), mask.sum(dim=1).tolist())]
    with TOKENIZER_LOCK:
        texts = tokenizer.batch_decode(owned, skip_special_tokens=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return AgentRollout(prompt_ids, prompt_mask, completion_ids, mask, texts, truncated, pad_id=pad_id)


def generate_group(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    num_generations: int,
    sampling_kwargs: dict[str, Any],
    generator: torch.Generator | None = None,
    with_logprobs: bool = False,
    compiled: bool = False,
) -> AgentRollout:
    """Sample ``num_generations`` completions for every prompt in ONE batched call.

    ``sampling_kwargs`` are ``generate``'s keyword arguments. The lean loop draws from
    ``generator`` (torch's default generator when None); ``generate``, used when the settings
    are outside the loop's, always draws from the default generator. ``with_logprobs`` keeps
    the sampler's log-probs of its tokens (the lean loop only; ``generate`` keeps none).
    ``compiled`` runs the lean loop's compiled variant (:mod:`comlrl.rollout.compiled_decoding`,
    the same tokens) where the model supports it, else the eager loop.
    """
    device = next(model.parameters()).device
    encoded = encode_prompts(tokenizer, prompts)
    # Later turns' prompts are written during training (the first turn's were checked, with
    # their warnings, before it): past learned positions they would fail deep inside torch.
    max_new_tokens = sampling_kwargs.get("max_new_tokens", 0)
    check_length(model, encoded["input_ids"].shape[1], max_new_tokens, "a prompt being sampled", warn=False)
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0).to(device)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0).to(device)
    kwargs = dict(sampling_kwargs)
    # A caller's eos_token_id (from generation_kwargs) defines where completions stop, and so
    # which tokens the loss counts.
    eos = kwargs.pop("eos_token_id", None)
    eos_ids = eos_token_ids(model, tokenizer) if eos is None else [eos] if isinstance(eos, int) else list(eos)
    kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    stop_strings = kwargs.get("stop_strings") or generation_default(model, "stop_strings") or ()
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    settings = decoding_settings(model, kwargs)
    sampler_logprobs = None
    with frozen(model, inference=True):
        if settings is None:
            if stop_strings:
                kwargs.setdefault("tokenizer", tokenizer)  # generate reads stop strings with the agent's own tokenizer
            sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, eos_token_id=eos_ids, **kwargs)
            completion_ids = sequences[:, prompt_ids.shape[1] :]
        else:
            pad_id = kwargs["pad_token_id"]
            if pad_id is None:  # no row can finish without an EOS id, so no pad is written
                pad_id = eos_ids[0] if eos_ids else 0
            reason = why_not_compiled(model) if compiled else None
            if reason is not None:
                warn_eager_fallback(model, reason)
            loop = decode_compiled if compiled and reason is None else decode
            stop = functools.partial(holds_stop_string, tokenizer, stop_strings) if stop_strings else None
            decoded = loop(
                model, prompt_ids, prompt_mask, settings, eos_ids, pad_id, generator, with_logprobs, stop=stop
            )
            completion_ids, sampler_logprobs = decoded
    # Inference tensors cannot enter autograd; the ids are small, a copy is cheap.
    rollout = rollout_from_ids(tokenizer, prompt_ids, prompt_mask, completion_ids.clone(), eos_ids, stop_strings)
    if sampler_logprobs is not None:
        rollout = dataclasses.replace(rollout, sampler_logprobs=sampler_logprobs.clone())
    return rollout


def completion_eos_ids(sampling: dict[str, Any], model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the caller's ``eos_token_id`` if given, otherwise the
    model's and tokenizer's (the same rule as the hf backend)."""
    eos = sampling.get("eos_token_id")
    if eos is None:
        return eos_token_ids(model, tokenizer)
    return [eos] if isinstance(eos, int) else list(eos)


def build_rollout(
    tokenizer: Any,
    encoded: dict[str, torch.Tensor],
    completions: Sequence[Sequence[int]],
    num_generations: int,
    eos_ids: Sequence[int],
    pad_id: int,
    device: torch.device,
) -> AgentRollout:
    """An :class:`AgentRollout` from the tokenized prompts (``encoded``, left-padded, one row
    per prompt) and the generated ids of every completion, prompt-major (``b * G + k``):
    completions right-padded with ``pad_id`` to the longest, as ``generate`` pads them."""
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0).to(device)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0).to(device)
    completion_ids = torch.full((len(completions), max(map(len, completions))), pad_id, dtype=torch.long)
    for row, ids in enumerate(completions):
        completion_ids[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
    return rollout_from_ids(tokenizer, prompt_ids, prompt_mask, completion_ids.to(device), eos_ids)


def answer_ids(tokenizer: Any, texts: list[str], end: int | None, max_new_tokens: int) -> list[list[int]]:
    """Each answer's token ids as the agent's tokenizer writes them (no special tokens added),
    ``end`` appended, cut to ``max_new_tokens``: an answer that ends within the budget ends with
    an EOS, as a sampled one does, and a longer one is truncated, as a sampled one would be."""
    with TOKENIZER_LOCK:
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    ending = [] if end is None else [end]
    return [(list(ids) + ending)[:max_new_tokens] for ids in encoded]


def answer_end(tokenizer: Any, eos_ids: Sequence[int]) -> int | None:
    """The id an answer ends with: the tokenizer's EOS when it ends completions, else the first
    id that does; None when nothing ends them."""
    if tokenizer.eos_token_id in eos_ids:
        return tokenizer.eos_token_id
    return eos_ids[0] if eos_ids else None


def rollout_from_texts(
    agents: Any,
    agent: int,
    prompts: Sequence[str],
    texts: Sequence[str],
    num_generations: int,
    sampling: dict[str, Any],
) -> AgentRollout:
    """Agent ``agent``'s :class:`AgentRollout` of answers written elsewhere (an HTTP endpoint,
    another model writing every agent's part): ``num_generations`` ``texts`` per prompt,
    prompt-major, tokenized as :func:`answer_ids` says, so they are scored, masked and trained
    on as the agent's own sampled answers are."""
    tokenizer = agents.tokenizers[agent]
    eos_ids = completion_eos_ids(sampling, agents[agent], tokenizer)
    ids = answer_ids(tokenizer, list(texts), answer_end(tokenizer, eos_ids), sampling["max_new_tokens"])
    pad_id = sampling.get("pad_token_id", tokenizer.pad_token_id)
    pad_id = pad_id if pad_id is not None else (eos_ids[0] if eos_ids else 0)
    encoded = encode_prompts(tokenizer, prompts)
    return build_rollout(tokenizer, encoded, ids, num_generations, eos_ids, pad_id, agents.device(agent))
