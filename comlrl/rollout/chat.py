"""Chat-format prompts: a prompt may be a string, or a list of chat messages (``{"role": ...,
"content": ...}`` dicts) that the agent's own chat template renders, so agents with different
tokenizers each read the conversation in their own format.

The rendered text is what the agent is given, tokenized the way every prompt is (with the
tokenizer's special tokens): where the tokenizer itself adds a BOS token and the template
writes one too, the template's is dropped from the text, so the ids the model reads are
exactly ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.rollout.generation import TOKENIZER_LOCK

Prompt = str | Sequence[Mapping[str, Any]]
"""A prompt: text, or chat messages."""


def is_chat(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of chat messages (not a string)."""
    return isinstance(prompt, Sequence) and not isinstance(prompt, str)


def check_messages(messages: Any, what: str) -> list[dict[str, Any]]:
    """``messages`` (``what`` in errors) as a list of dicts, each with a ``role`` string and a
    ``content`` string (or None, for an assistant message of tool calls only)."""
    checked = []
    for m, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TypeError(f"{what}: message {m} is {message!r}; expected a dict with a 'role' string and a 'content'")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError(f"{what}: message {m}'s content is a {type(content).__name__}; expected a string")
        checked.append(dict(message))
    if not checked:
        raise ValueError(f"{what} is an empty list of messages")
    return checked


class ChatRenderer:
    """Renders one agent's chat-format prompts with its tokenizer's chat template."""

    def __init__(self, tokenizer: Any, agent: int):
        self.tokenizer = tokenizer
        self.agent = agent
        bos = getattr(tokenizer, "bos_token", None)
        with TOKENIZER_LOCK:
            adds_bos = bos is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
        self.leading_bos = bos if adds_bos else None
        """The BOS text the tokenizer adds by itself, dropped from a rendered prompt that starts with it."""

    def __call__(self, prompt: Prompt, what: str) -> str:
        """``prompt`` as the text agent ``agent`` reads (``what`` names it in errors)."""
        if not is_chat(prompt):
            return prompt
        messages = check_messages(prompt, what)
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{what} is a list of chat messages, but agent {self.agent}'s tokenizer has no chat template: "
                "set one (tokenizer.chat_template) or give that agent text prompts"
            )
        with TOKENIZER_LOCK:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if self.leading_bos is not None and text.startswith(self.leading_bos):
            text = text[len(self.leading_bos) :]
        return text
