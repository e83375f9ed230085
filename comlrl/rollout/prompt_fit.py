"""Checks, before the first step, that every agent's prompts fit its model.

Without them a mismatch surfaces deep inside torch in the middle of training: token ids past
the embedding table (agents with different vocabularies given one tokenizer) as an
``IndexError``, a prompt plus ``max_new_tokens`` past a model's learned positions as another
(or, with rotary positions, as silently worse text), an empty prompt as a reshape error.
Text no tokenizer can encode (a lone surrogate) is refused where it is made, by
:func:`check_encodable`: a formatter, the transition, a comparator's answers.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from comlrl.utils.caller import user_stacklevel


class PositionLimit(NamedTuple):
    """How many positions a model has, and whether they are learned (absolute) ones."""

    positions: int | None
    """The config's ``n_positions`` / ``max_position_embeddings``; None when it has neither."""
    absolute: bool
    """Learned position embeddings (GPT-2, OPT): a position past the table is an error, not
    merely text the model was never trained on (rotary positions)."""


_LIMITS: weakref.WeakKeyDictionary[torch.nn.Module, PositionLimit] = weakref.WeakKeyDictionary()


def position_limit(model: torch.nn.Module) -> PositionLimit:
    """The positions of ``model`` (found once per model)."""
    if model not in _LIMITS:
        config = getattr(model, "config", None)
        positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        absolute = any(
            isinstance(module, torch.nn.Embedding) and ("wpe" in name.split(".") or "position" in name)
            for name, module in model.named_modules()
        )
        _LIMITS[model] = PositionLimit(positions, absolute)
    return _LIMITS[model]


def check_length(
    model: torch.nn.Module, prompt_tokens: int, max_new_tokens: int, where: str, warn: bool = True
) -> None:
    """A prompt of ``prompt_tokens`` tokens plus ``max_new_tokens`` must fit ``model``'s
    learned positions (an error naming ``where``); past rotary positions' trained length it is
    a warning (when ``warn``)."""
    limit = position_limit(model)
    needed = prompt_tokens + max_new_tokens
    if limit.positions is None or needed <= limit.positions:
        return
    message = (
        f"{where}: a prompt of {prompt_tokens} tokens plus max_new_tokens={max_new_tokens} needs {needed} "
        f"positions; the model has {limit.positions}"
    )
    if limit.absolute:
        raise ValueError(f"{message} (learned position embeddings): shorten the prompt or lower max_new_tokens")
    if warn:
        warnings.warn(f"{message}, so it generates past the length it was trained on", stacklevel=user_stacklevel())


def check_vocabulary(model: torch.nn.Module, tokenizer: Any, agent: int) -> None:
    """Every id of agent ``agent``'s tokenizer must have a row in its model's input embeddings."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"agent {agent}'s tokenizer ({len(tokenizer)} tokens) has ids its model "
            f"cannot embed ({rows} rows): give each agent its own model's tokenizer (tokenizer=[...], one per "
            "agent), or resize the model's embeddings"
        )


def check_encodable(text: str, what: str) -> None:
    """``text`` (``what`` in the error: whose text, from where) must be encodable as UTF-8.

    A lone surrogate (``"\\ud800"``; bytes decoded with ``errors="surrogateescape"`` leave
    such characters, and so does half of a JSON escape pair) is a ``str`` every tokenizer
    refuses, with a ``TypeError`` or ``UnicodeEncodeError`` many frames down that names neither
    the text nor its source. Checked wherever text the user gave enters the trainer, before any
    of it is tokenized.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{what} cannot be tokenized: character {error.start} is {text[error.start]!r}, a lone surrogate, which "
            f"no tokenizer can encode (near {text[max(0, error.start - 30) : error.start + 30]!r}); fix the text "
            "where it is made: decode bytes with errors='replace', or clean a string with "
            "text.encode('utf-8', 'replace').decode('utf-8')"
        ) from None


def encode_each(tokenizer: Any, prompts: Sequence[str], describe_row: Any) -> list[list[int]]:
    """Every prompt's token ids (no padding); a prompt the tokenizer cannot encode is named."""
    try:
        return tokenizer(list(prompts))["input_ids"]
    except Exception:  # find the row, then say what is wrong with it
        for r, prompt in enumerate(prompts):
            try:
                tokenizer([prompt])
            except Exception as error:
                raise ValueError(f"{describe_row(r)} cannot be tokenized ({type(error).__name__}: {error})") from error
        raise


def check_prompts_fit(
    models: Sequence[torch.nn.Module],
    tokenizers: Sequence[Any],
    agent_prompts: Sequence[Sequence[str]],
    max_new_tokens: int,
    dataset: str,
) -> None:
    """Every agent's prompts (``agent_prompts[i]``, one per ``dataset`` row) against its
    model: encodable, not empty, ids within the embeddings, and room for ``max_new_tokens``."""
    for agent, (model, tokenizer, prompts) in enumerate(zip(models, tokenizers, agent_prompts)):
        check_vocabulary(model, tokenizer, agent)
        rows = model.get_input_embeddings().num_embeddings

        def describe_row(r: int, agent: int = agent) -> str:
            return f"agent {agent}'s prompt for {dataset} row {r}"

        ids = encode_each(tokenizer, prompts, describe_row)
        empty = [r for r, row_ids in enumerate(ids) if not row_ids]
        if empty:
            raise ValueError(
                f"{describe_row(empty[0])} is empty after tokenization ({len(empty)} such row(s): {empty[:10]}); "
                "a completion needs at least one prompt token to follow: fix the formatter or the data"
            )
        beyond = next(((r, max(row_ids)) for r, row_ids in enumerate(ids) if max(row_ids) >= rows), None)
        if beyond is not None:
            raise ValueError(
                f"{describe_row(beyond[0])} holds token id {beyond[1]}, past agent {agent}'s embeddings ({rows} "
                "rows): is this agent's tokenizer its model's?"
            )
        longest = max(range(len(ids)), key=lambda r: len(ids[r]))
        check_length(model, len(ids[longest]), max_new_tokens, describe_row(longest) + " (the longest)")
