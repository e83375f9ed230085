"""The vllm backend's requests: Hugging Face ``generate`` arguments as vLLM ``SamplingParams``
(:mod:`comlrl.rollout.vllm_backend`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from comlrl.rollout.generation import eos_token_ids

SUPPORTED_SAMPLING = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "min_new_tokens",
    "repetition_penalty",
    "eos_token_id",
    "pad_token_id",
)
"""The Hugging Face ``generate`` arguments this backend can reproduce with vLLM."""


def vllm_sampling_kwargs(
    sampling: dict[str, Any], num_generations: int, eos_ids: Sequence[int], logprobs: bool = False
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments equivalent to Hugging Face ``generate``'s
    ``sampling`` (a trainer's ``SamplingSpec.generate_kwargs()``), for ``num_generations``
    samples; with ``logprobs``, the log-prob of each drawn token is returned too.

    Greedy decoding asks for one completion (vLLM refuses ``n > 1`` without sampling; the G
    greedy completions are identical anyway). Completions stop at exactly ``eos_ids``
    (``ignore_eos`` keeps vLLM from also stopping at the tokenizer's EOS when the caller
    chose others), and ``min_tokens`` holds those same ids back, as Hugging Face does. No
    seed: the engine's worker is seeded once per call (:meth:`VLLMBackend.generate_agents`).
    """
    unsupported = sorted(set(sampling) - set(SUPPORTED_SAMPLING))
    if unsupported:
        raise ValueError(
            f"generation_backend='vllm' cannot apply the generation arguments {unsupported}; "
            f"supported: {list(SUPPORTED_SAMPLING)}. Remove them from generation_kwargs or use "
            "generation_backend='hf'"
        )
    if "max_new_tokens" not in sampling:
        raise ValueError("generation_backend='vllm' needs max_new_tokens in the sampling arguments")
    greedy = not sampling.get("do_sample", False)
    kwargs = {
        "n": 1 if greedy else num_generations,
        "temperature": 0.0 if greedy else float(sampling.get("temperature", 1.0)),
        "top_p": 1.0 if greedy else float(sampling.get("top_p", 1.0)),
        # Hugging Face and vLLM 0.33 both turn top-k off with 0.
        "top_k": 0 if greedy or not sampling.get("top_k") else int(sampling["top_k"]),
        "max_tokens": int(sampling["max_new_tokens"]),
        "min_tokens": int(sampling.get("min_new_tokens", 0)),
        "repetition_penalty": float(sampling.get("repetition_penalty", 1.0)),
        "stop_token_ids": list(eos_ids),
        "ignore_eos": True,
        # Texts are decoded here with the agent's tokenizer, as the hf backend decodes them.
        "detokenize": False,
    }
    if logprobs:
        kwargs["logprobs"] = 0  # the drawn token's own log-prob, no alternatives
    return kwargs


def min_tokens_banned_ids(stop_ids: Sequence[int], model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """The ids vLLM holds back until ``min_tokens``: the request's ``stop_token_ids`` and, even
    with ``ignore_eos``, the tokenizer's and the generation config's EOS ids (its
    ``all_stop_token_ids``), so that the support-mass correction bans the same ones."""
    return sorted(set(stop_ids) | set(eos_token_ids(model, tokenizer)))


def prompt_token_ids(encoded: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each prompt's token ids without the left padding: what vLLM is given."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]
