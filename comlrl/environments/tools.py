"""Tools per agent: Python functions an agent may call within its turn.

An :class:`~comlrl.environments.base.Environment` gives each agent its tools
(:meth:`~comlrl.environments.base.Environment.tools`). Their JSON schemas come from
transformers' ``get_json_schema`` (a docstring with ``Args:`` and type hints) and reach the
agent through its chat template (``apply_chat_template(tools=...)``); a template that ignores
``tools=`` (the embedded SmolLM2's does) gets :data:`~comlrl.rollout.chat.TOOL_INSTRUCTIONS` in its
system message.

A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the agent's text (the
Hermes format, which the Qwen2.5 templates also write); a tokenizer with a response schema is
read with its ``parse_response`` instead. Every call of a completion runs; its result comes
back as a ``tool`` message, appended as token ids after what the agent wrote (never
re-rendering the conversation, so the ids the loss sees are the ids the model read), and the
agent goes on. A tool that raises, runs past its time or returns anything but a string gives
the agent an error message as its result, counted in the metrics: never a crashed run.

Tool calls are private to the agent's turn: in ``joint_mode="cross"`` one sample meets G of
its partner's, so the shared state changes only at the environment's ``step``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as ToolTimeout
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from comlrl.utils.signatures import describe

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call an agent wrote: the tool's name and its arguments, or why it could not be read."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def tool_schemas(tools: Sequence[Callable], agent: int) -> list[dict[str, Any]]:
    """The JSON schema of each of agent ``agent``'s ``tools`` (errors name the tool)."""
    schemas = []
    for tool in tools:
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:
            raise ValueError(
                f"agent {agent}'s tool {describe(tool)} has no JSON schema ({type(error).__name__}: {error}); a "
                "tool needs type hints and a docstring with an Args: section describing every argument"
            ) from error
    return schemas


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in ``text``, in the Hermes format; a call that is not a JSON object with a
    ``name`` string and an ``arguments`` object is kept with its error."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as error:
            calls.append(ToolCall("", {}, f"the call is not valid JSON ({error.msg})"))
            continue
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append(ToolCall("", {}, 'a call is {"name": "<the tool>", "arguments": {...}}'))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


def parsed_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The calls of a message that a tokenizer's ``parse_response`` read (OpenAI's layout)."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(function.get("name"), str) or not isinstance(arguments, dict):
            calls.append(ToolCall("", {}, 'a call is {"name": "<the tool>", "arguments": {...}}'))
        else:
            calls.append(ToolCall(function["name"], arguments))
    return calls


class ToolRunner:
    """Runs agents' tool calls, each within ``timeout`` seconds, in a shared pool of threads.
    A call that runs past its time is abandoned (a thread cannot be stopped: a tool that may
    hang should bound itself, or run its work in a process, as the code sandbox does)."""

    def __init__(self, timeout: float = 10.0, workers: int = 4):
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="comlrl-tool")

    def run(self, tools: Sequence[Callable], calls: Sequence[ToolCall]) -> list[tuple[str, bool]]:
        """Each call's result text and whether it failed, in order; the calls run at once."""
        by_name = {tool.__name__: tool for tool in tools}
        futures = []
        for call in calls:
            tool = by_name.get(call.name)
            futures.append(None if call.error or tool is None else self.pool.submit(tool, **call.arguments))
        results = []
        for call, future in zip(calls, futures):
            if call.error:
                results.append((f"Error: {call.error}.", True))
            elif future is None:
                results.append((f"Error: there is no tool {call.name!r}; the tools are {sorted(by_name)}.", True))
            else:
                results.append(self.result(call, future))
        return results

    def close(self) -> None:
        """Stop the pool's threads (a call past its time is left to end on its own)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    def result(self, call: ToolCall, future: Any) -> tuple[str, bool]:
        try:
            value = future.result(timeout=self.timeout)
        except ToolTimeout:
            return f"Error: {call.name} took more than {self.timeout:g} s.", True
        except Exception as error:
            return f"Error: {call.name} raised {type(error).__name__}: {error}", True
        if not isinstance(value, str):
            return f"Error: {call.name} returned a {type(value).__name__}, not text.", True
        return value, False
