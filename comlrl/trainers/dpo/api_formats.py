"""The ``api`` comparator's formats: what one request to the endpoint holds and where its
answers are, for each ``comparator_api_format`` comlrl 1.4.3 accepted.

    comparator_api_format   one request asks for          the answers are read from
    generic                 num_return_sequences          comparator_api_response_field (a dotted
                            (<= max_n_per_request)        path), else completions/responses/
                                                          outputs/choices
    openai_chat             n (<= max_n_per_request)      choices[].message.content (or .text)
    anthropic_messages      one                           content[].text, one answer per response
    openai_responses        one                           output[].content[].text, one per response

Apart from the client (``api_comparator.py``) because these are pure functions of JSON, one
builder and one parser per provider: a provider's shape changes here, and the client's
requests, retries and key handling do not. An answer without the expected shape is a
``ComparatorApiError``, defined here so that the parsers that raise it and the client that
passes it on (``api_comparator`` re-exports it) share one class.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header 1.4.3 sent (``comparator_api_headers`` may set another)."""

EXCERPT = 300
"""Characters of a response body an error message quotes."""


class ComparatorApiError(RuntimeError):
    """The comparator's endpoint failed or answered something unusable (the message names the
    agent, the prompt and what came back, the key scrubbed out)."""


def excerpt(text: str) -> str:
    """The start of a response body, on one line, for an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT else flat[:EXCERPT] + "..."


def api_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The run's sampling settings (Hugging Face ``generate`` keyword arguments) as the
    payloads name them: ``top_k`` 0 (Hugging Face's "no top-k filter") becomes None, and
    greedy decoding temperature 0. ``generation_kwargs`` extras are not sent (the endpoint
    has its own names: put them in ``comparator_api_extra_body``)."""
    sampled = sampling.get("do_sample", True)
    return {
        "max_new_tokens": sampling["max_new_tokens"],
        "temperature": sampling.get("temperature") if sampled else 0.0,
        "top_p": sampling.get("top_p") if sampled else None,
        "top_k": (sampling.get("top_k") or None) if sampled else None,
    }


def without_none(payload: dict[str, Any]) -> dict[str, Any]:
    """The fields that have a value: the hosted APIs refuse nulls where 1.4.3's generic format sent them."""
    return {name: value for name, value in payload.items() if value is not None}


def generic_payload(prompt: str, agent: int, count: int, settings: dict[str, Any], model: str | None) -> dict:
    """1.4.3's generic request, without ``batch_item``: a generation backend is given the
    prompts, not the dataset rows they came from."""
    payload = {"prompt": prompt, "agent_idx": agent, "num_return_sequences": count, **settings}
    return payload if model is None else {**payload, "model": model}


def openai_chat_payload(prompt: str, agent: int, count: int, settings: dict[str, Any], model: str | None) -> dict:
    """An OpenAI chat completion of ``count`` choices (1.4.3 sent no ``top_k``: the API has none)."""
    return without_none(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "n": count,
            "max_tokens": settings["max_new_tokens"],
            "temperature": settings["temperature"],
            "top_p": settings["top_p"],
        }
    )


def anthropic_payload(prompt: str, agent: int, count: int, settings: dict[str, Any], model: str | None) -> dict:
    """An Anthropic message (one answer; 1.4.3 sent no ``top_p`` or ``top_k``)."""
    return without_none(
        {
            "model": model,
            "max_tokens": settings["max_new_tokens"],
            "messages": [{"role": "user", "content": prompt}],
            "temperature": settings["temperature"],
        }
    )


def openai_responses_payload(prompt: str, agent: int, count: int, settings: dict[str, Any], model: str | None) -> dict:
    """An OpenAI Responses request (one answer; 1.4.3 sent no sampling settings but the length)."""
    return without_none({"model": model, "input": prompt, "max_output_tokens": settings["max_new_tokens"]})


MISSING = object()
"""A field a response does not have (None may be a value)."""


def dotted(data: Any, path: str) -> Any:
    """``data["a"]["b"]`` for the path ``"a.b"``, or ``MISSING``."""
    for part in path.split("."):
        if not (isinstance(data, dict) and part in data):
            return MISSING
        data = data[part]
    return data


def list_field(answer: Any, path: str) -> list[Any]:
    """``answer``'s list at ``path``; its absence is an error naming the path and quoting the response."""
    value = dotted(answer, path)
    if not isinstance(value, list):
        problem = "no field" if value is MISSING else "a non-list field"
        raise ComparatorApiError(f"the response has {problem} {path!r}: {excerpt(json.dumps(answer))}")
    return value


def item_text(item: Any) -> str | None:
    """One answer of a generic response: a string, or a dict's text/content/completion/response
    or message.content (1.4.3's rule)."""
    if isinstance(item, dict):
        for name in ("text", "content", "completion", "response"):
            if item.get(name):
                return str(item[name])
        message = item.get("message")
        return str(message["content"]) if isinstance(message, dict) and message.get("content") is not None else None
    return None if item is None else str(item)


GENERIC_FALLBACKS = ("completions", "responses", "outputs", "choices")
"""Where 1.4.3 looked for a generic response's answers when ``comparator_api_response_field`` was absent."""


def generic_texts(answer: Any, response_field: str) -> list[str]:
    """The answers at ``response_field``, else at 1.4.3's fallbacks; none of them present is an
    error naming the path."""
    value = dotted(answer, response_field)
    if value is MISSING and isinstance(answer, dict):
        value = next((answer[name] for name in GENERIC_FALLBACKS if answer.get(name)), MISSING)
    if value is MISSING:
        raise ComparatorApiError(
            f"the response has no field {response_field!r} (nor {list(GENERIC_FALLBACKS)}): set "
            f"comparator_api_response_field to the dotted path of its completions; the response: "
            f"{excerpt(json.dumps(answer))}"
        )
    items = value if isinstance(value, list) else [value]
    return [text for text in map(item_text, items) if text is not None]


def openai_chat_texts(answer: Any, response_field: str) -> list[str]:
    """One answer per choice: its ``message.content`` (or a completion's ``text``); choices
    without text (a refusal, a tool call) are skipped, as 1.4.3 skipped them."""
    texts = []
    for choice in list_field(answer, "choices"):
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and message.get("content") is not None:
            texts.append(str(message["content"]))
        elif isinstance(choice, dict) and choice.get("text") is not None:
            texts.append(str(choice["text"]))
    return texts


def joined_text(blocks: Any, kinds: Sequence[str]) -> list[str]:
    """One answer: the text of the ``blocks`` of the given kinds, joined (1.4.3 kept the first
    block, losing the rest of an answer split in several); none when no block has text."""
    texts = [
        str(b["text"]) for b in blocks if isinstance(b, dict) and b.get("type") in kinds and b.get("text") is not None
    ]
    return ["".join(texts)] if texts else []


def anthropic_texts(answer: Any, response_field: str) -> list[str]:
    """The message's text blocks (``content[].text``), as one answer."""
    return joined_text(list_field(answer, "content"), ("text",))


def openai_responses_texts(answer: Any, response_field: str) -> list[str]:
    """The output items' text blocks (``output[].content[].text``), as one answer."""
    blocks = [b for item in list_field(answer, "output") if isinstance(item, dict) for b in item.get("content") or []]
    return joined_text(blocks, ("output_text", "text"))


@dataclass(frozen=True)
class ApiFormat:
    """How one ``comparator_api_format`` asks and answers."""

    payload: Callable[[str, int, int, dict[str, Any], str | None], dict[str, Any]]
    """``(prompt, agent, count, sampling settings, model) -> the request's JSON body`` (before ``extra_body``)."""
    texts: Callable[[Any, str], list[str]]
    """``(the parsed response, comparator_api_response_field) -> its answers``."""
    one_per_request: bool
    """The API returns one answer per request (no ``n``)."""
    headers: dict[str, str]
    """Headers the format needs (``comparator_api_headers`` may set them otherwise)."""
    bare_key_header: str | None = None
    """Where the key goes, without a ``Bearer`` prefix, when ``comparator_api_key_header`` is
    ``Authorization`` (1.4.3's rule for Anthropic's ``x-api-key``)."""


API_FORMATS = {
    "generic": ApiFormat(generic_payload, generic_texts, False, {}),
    "openai_chat": ApiFormat(openai_chat_payload, openai_chat_texts, False, {}),
    "anthropic_messages": ApiFormat(
        anthropic_payload, anthropic_texts, True, {"anthropic-version": ANTHROPIC_VERSION}, bare_key_header="x-api-key"
    ),
    "openai_responses": ApiFormat(openai_responses_payload, openai_responses_texts, True, {}),
}
"""``comparator_api_format`` -> how it asks and answers."""
