"""Chat-format prompts: a prompt may be a string, or a list of chat messages (``{"role": ...,
"content": ...}`` dicts) that the agent's own chat template renders, so agents with different
tokenizers each read the conversation in their own format.

The rendered text is what the agent is given, tokenized the way every prompt is (with the
tokenizer's special tokens): where the tokenizer itself adds a BOS token and the template
writes one too, the template's is dropped from the text, so the ids the model reads are
exactly ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.rollout.generation import TOKENIZER_LOCK

Prompt = str | Sequence[Mapping[str, Any]]
"""A prompt: text, or chat messages."""

TOOL_MARK = "TOOLCALLSMARK"
"""Stands for an assistant message in a probe conversation, to find what follows it."""


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


TOOL_INSTRUCTIONS = (
    "You can call these tools, each described in JSON:\n{schemas}\n"
    'To call one, write <tool_call>{{"name": "<the tool>", "arguments": {{...}}}}</tool_call> and end your '
    "message; its result comes back in a message from the tool."
)
"""The tools' description for a chat template that ignores ``tools=`` (``{schemas}``: one JSON per line)."""


def with_instructions(
    messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], instructions: str = TOOL_INSTRUCTIONS
) -> list[dict[str, Any]]:
    """``messages`` with ``instructions`` for ``tools`` (``{schemas}``: their JSON, one per
    line) at the end of the system message (a new first message where there is none)."""
    text = instructions.format(schemas="\n".join(json.dumps(schema) for schema in tools))
    if messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content'] or ''}\n\n{text}".strip()}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


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
        self.template_takes_tools: bool | None = None
        """Whether the chat template renders ``tools=`` (None: not yet asked)."""

    def __call__(
        self,
        prompt: Prompt,
        what: str,
        tools: Sequence[dict[str, Any]] = (),
        instructions: str = TOOL_INSTRUCTIONS,
    ) -> str:
        """``prompt`` as the text agent ``agent`` reads (``what`` names it in errors), with
        the JSON schemas of its ``tools`` (chat messages only): through the template where it
        takes ``tools=``, else as ``instructions`` (:data:`TOOL_INSTRUCTIONS`) in the system message."""
        if not is_chat(prompt):
            if tools:
                raise TypeError(f"{what} is text, but agent {self.agent} has tools: give it chat messages")
            return prompt
        messages = check_messages(prompt, what)
        self.check_template(what)
        if tools and not self.takes_tools(tools[0]):
            return self.render(with_instructions(messages, tools, instructions))
        return self.render(messages, tools)

    def check_template(self, what: str) -> None:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{what} is a list of chat messages, but agent {self.agent}'s tokenizer has no chat template: "
                "set one (tokenizer.chat_template) or give that agent text prompts"
            )

    def render(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> str:
        """``messages`` rendered with the generation prompt (the tools' schemas given to the
        template), less a BOS the tokenizer adds by itself."""
        with TOKENIZER_LOCK:
            text = self.tokenizer.apply_chat_template(
                messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=False
            )
        if self.leading_bos is not None and text.startswith(self.leading_bos):
            text = text[len(self.leading_bos) :]
        return text

    def takes_tools(self, schema: dict[str, Any]) -> bool:
        """Whether the template writes ``tools=`` into the prompt (SmolLM2's does not); found
        once, with the first tool's schema."""
        if self.template_takes_tools is None:
            probe = [{"role": "user", "content": "hello"}]
            self.template_takes_tools = self.render(probe, [schema]) != self.render(probe)
        return self.template_takes_tools

    def tool_turn_ids(self, results: Sequence[str], closed: bool = True) -> list[int]:
        """The ids that follow an assistant message ending in tool calls: the template's end of
        that message (less the end-of-turn token the agent wrote, where ``closed``; a message cut
        at ``max_new_tokens`` is not), one ``tool`` message per result, and the generation
        prompt of the agent's next message. Taken from a rendered conversation after a marker,
        so no earlier turn is rendered again."""
        conversation = [{"role": "user", "content": "x"}, {"role": "assistant", "content": TOOL_MARK}]
        results_turn = [{"role": "tool", "content": result} for result in results]
        text = self.render(conversation + results_turn)
        tail = text[text.index(TOOL_MARK) + len(TOOL_MARK) :]
        eos = getattr(self.tokenizer, "eos_token", None)
        if closed and eos and tail.startswith(eos):
            tail = tail[len(eos) :]
        with TOKENIZER_LOCK:
            return self.tokenizer(tail, add_special_tokens=False)["input_ids"]
