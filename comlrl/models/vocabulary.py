"""A tokenizer grown by ``model_config["special_tokens"]``, and the models that read with it:
resized to it when the trainer loaded them, refused when they were passed in (the user's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch


class TokenizedModel(NamedTuple):
    """A model and the tokenizer it reads with, as :func:`fit_embeddings` checks them."""

    role: str
    """What it is, as errors name it: "agent", "critic"."""
    index: int
    model: torch.nn.Module
    tokenizer: Any
    loaded: bool
    """The trainer loaded it from a folder or hub id, so it may resize it; a model passed in
    as an object is the user's, and is left as it is."""


def embedding_rows(model: torch.nn.Module) -> int:
    return model.get_input_embeddings().weight.shape[0]


def models_to_resize(members: Sequence[TokenizedModel]) -> list[TokenizedModel]:
    """The members whose model has fewer embedding rows than its tokenizer has tokens (every
    one of them loaded by name), or a ValueError naming the culprit.

    Members sharing one tokenizer object are checked together: once it outgrows one of their
    models, their models must have the same number of rows (two vocabularies cannot both be
    one tokenizer's, and a new token id would land on a fresh row in one model and an old row
    in the other), and none of the models it outgrows may have been passed in.
    """
    groups: dict[int, list[TokenizedModel]] = {}
    for member in members:
        groups.setdefault(id(member.tokenizer), []).append(member)
    short: list[TokenizedModel] = []
    for group in groups.values():
        size = len(group[0].tokenizer)
        lacking = [m for m in group if embedding_rows(m.model) < size]
        if not lacking:
            continue
        rows = embedding_rows(lacking[0].model)
        other = next((m for m in group if embedding_rows(m.model) != rows), None)
        if other is not None:
            first, second = sorted((lacking[0], other), key=lambda m: m.index)
            role = first.role
            raise ValueError(
                f"{role}s {first.index} and {second.index} share a tokenizer but have {embedding_rows(first.model)} "
                f"and {embedding_rows(second.model)} embedding rows; model_config's special_tokens grow it to "
                f"{size} tokens, past {role} {lacking[0].index}'s rows, and one tokenizer cannot be grown into two "
                f"vocabularies: give each {role} its own tokenizer (a list with one per {role}, or None to load "
                "each one's own)"
            )
        given = next((m for m in lacking if not m.loaded), None)
        if given is not None:
            raise ValueError(
                f"{given.role} {given.index}'s tokenizer holds {size} tokens with model_config's special_tokens, "
                f"beyond its model's {rows} embedding rows, and that model was passed in as an object, which the "
                "trainer does not change: add the tokens and resize it first (tokenizer.add_special_tokens(...), "
                "then model.resize_token_embeddings(len(tokenizer))), or pass its folder or hub id to have the "
                "trainer load and resize it"
            )
        short += lacking
    return short


def resize_embeddings(model: torch.nn.Module, size: int) -> None:
    """``model.resize_token_embeddings(size)``, as transformers documents it: a tied output head
    grows with the input embeddings, and the new rows of both are drawn close to the mean of
    the old ones. They are drawn under seed 0, the caller's random state left as it was, so
    that every data-parallel rank adds the same rows (frozen ones, under LoRA adapters or in a
    reference, are never broadcast) and a run does not depend on when the tokens were added."""
    device = model.get_input_embeddings().weight.device  # a GPU only under a device_map
    on_gpu = device.type == "cuda"
    with torch.random.fork_rng(devices=[device.index] if on_gpu else []):
        torch.random.default_generator.manual_seed(0)
        if on_gpu:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(0)
        model.resize_token_embeddings(size)


def fit_embeddings(members: Sequence[TokenizedModel]) -> None:
    """Resize the models loaded by name that their tokenizers outgrew to ``len(tokenizer)``
    (:func:`resize_embeddings`). A model shared by several members (one base under adapters)
    is resized once, to the longest of their tokenizers. Everything is checked
    (:func:`models_to_resize`) before any model changes."""
    models: dict[int, torch.nn.Module] = {}
    sizes: dict[int, int] = {}
    for member in models_to_resize(members):
        key = id(member.model)
        models[key] = member.model
        sizes[key] = max(sizes.get(key, 0), len(member.tokenizer))
    for key, size in sizes.items():
        resize_embeddings(models[key], size)


def add_special_tokens(
    tokenizers: Sequence[Any],
    models: Sequence[torch.nn.Module],
    special_tokens: dict[str, Any],
    loaded: Sequence[bool],
) -> None:
    """``tokenizer.add_special_tokens(special_tokens)`` for each distinct tokenizer (as
    comlrl 1.4.3's ``model_config["special_tokens"]``), then the agents' models that
    the trainer loaded (``loaded[i]``) resized to their tokenizers (:func:`fit_embeddings`).
    1.4.3 resized nothing, and failed at the first new token; a model passed in is refused
    here rather than failing so. Call it before adapters are attached (a LoRA wrapper,
    ``modules_to_save`` included, then sees the grown vocabulary) and before references
    are copied."""
    if not special_tokens:
        return
    for tokenizer in {id(t): t for t in tokenizers}.values():
        tokenizer.add_special_tokens(special_tokens)
    fit_embeddings([TokenizedModel("agent", i, *member) for i, member in enumerate(zip(models, tokenizers, loaded))])
