"""One agent's turn with tools: its sampled completions, each continued after its tool calls'
results until it calls none, for at most ``max_rounds`` rounds (every call of a completion
runs in one round; the continuations of a round are one batched generate call).

A completion that used tools is, as token ids, what the agent read and wrote in order: its
first message, the tool results (as the chat template writes them), its next message, and so
on. Its ``completion_mask`` covers all of it (the model reads all of it: the forward passes
attend to every token); its ``action_mask`` only what the agent wrote, the only tokens the
loss, the KL and the entropy count. Its text is the agent's last message: its answer.

A message cut at ``max_new_tokens`` makes the whole calls it holds too (what it wrote after them
stays in it); the template's end of the message, which the agent did not write, is added
before the results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from comlrl.environments.tools import ToolCall, ToolRunner, parse_tool_calls, parsed_calls
from comlrl.rollout.chat import ChatRenderer
from comlrl.rollout.generation import TOKENIZER_LOCK, AgentRollout

Continue = Callable[[list[list[int]]], AgentRollout]
"""Samples one continuation of each prompt given as token ids (the agent's backend)."""


@dataclass
class Transcript:
    """One completion's ids so far, which of them the agent wrote, and its sampler log-probs."""

    prompt: list[int]
    ids: list[int]
    own: list[bool]
    logprobs: list[float] | None
    text: str
    truncated: bool
    segment_start: int = 0
    """Where the agent's last message starts in ``ids``."""
    calls: int = 0
    errors: int = 0

    def extend(self, ids: list[int], own: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.own += [own] * len(ids)
        if self.logprobs is not None:
            self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def called(self, failed: Sequence[bool], tool_ids: list[int]) -> None:
        """The agent's calls ran (``failed``: which gave an error); their results, ``tool_ids``, follow."""
        self.calls += len(failed)
        self.errors += sum(failed)
        self.extend(tool_ids, own=False)

    def answered(self, ids: list[int], logprobs: list[float] | None, text: str, truncated: bool) -> None:
        """The agent's next message after the results."""
        self.segment_start = len(self.ids)
        self.extend(ids, own=True, logprobs=logprobs)
        self.text, self.truncated = text, truncated


def transcripts(rollout: AgentRollout) -> list[Transcript]:
    lengths = rollout.completion_mask.sum(dim=1).tolist()
    out = []
    for s, length in enumerate(lengths):
        logprobs = None if rollout.sampler_logprobs is None else rollout.sampler_logprobs[s, :length].tolist()
        out.append(
            Transcript(
                prompt=rollout.prompt_ids[s][rollout.prompt_mask[s].bool()].tolist(),
                ids=rollout.completion_ids[s, :length].tolist(),
                own=rollout.own_mask[s, :length].tolist(),
                logprobs=logprobs,
                text=rollout.texts[s],
                truncated=bool(rollout.truncated[s]),
            )
        )
    return out


@dataclass(frozen=True)
class AgentTools:
    """What one agent's turn with tools needs: its tools per node, its chat renderer, the runner."""

    renderer: ChatRenderer
    runner: ToolRunner
    max_rounds: int
    parse: Callable[[str], Sequence[ToolCall] | None] = lambda text: None
    """The environment's own reading of a message's calls (None: the default reading)."""

    def calls(self, transcript: Transcript, schemas: Sequence[dict[str, Any]]) -> list[ToolCall]:
        """The calls in the agent's last message: as the environment reads them, else with its
        tokenizer's response parser where it has one (``response_template``), else in the
        Hermes format."""
        own = self.parse(transcript.text)
        if own is not None:
            if isinstance(own, str) or not all(isinstance(call, ToolCall) for call in own):
                raise TypeError(f"tool_calls returned {own!r}; expected a list of ToolCall, or None")
            return list(own)
        tokenizer = self.renderer.tokenizer
        if getattr(tokenizer, "response_template", None) is None:
            return parse_tool_calls(transcript.text)
        with TOKENIZER_LOCK:
            prefix = tokenizer.decode(transcript.prompt + transcript.ids[: transcript.segment_start])
            message = tokenizer.parse_response(transcript.text, prefix=prefix, tools=list(schemas))
        return parsed_calls(message)

    def __call__(
        self,
        rollout: AgentRollout,
        node_tools: Sequence[Sequence[Callable]],
        node_schemas: Sequence[Sequence[dict[str, Any]]],
        group: int,
        proceed: Continue,
    ) -> tuple[AgentRollout, Tensor, Tensor]:
        """``rollout`` (G samples per node, node-major) with every completion continued after
        its calls; and each completion's calls and failed calls."""
        done = transcripts(rollout)
        for _ in range(self.max_rounds):
            waiting = []
            for s, transcript in enumerate(done):
                tools = node_tools[s // group]
                if not tools:
                    continue
                found = self.calls(transcript, node_schemas[s // group])
                if not found:
                    continue
                results = self.runner.run(tools, found)
                tool_ids = self.renderer.tool_turn_ids([r for r, _ in results], closed=not transcript.truncated)
                transcript.called([failed for _, failed in results], tool_ids)
                waiting.append(s)
            if not waiting:
                break
            more = proceed([done[s].prompt + done[s].ids for s in waiting])
            for w, s in enumerate(waiting):
                length = int(more.completion_mask[w].sum())
                logprobs = None if more.sampler_logprobs is None else more.sampler_logprobs[w, :length].tolist()
                ids = more.completion_ids[w, :length].tolist()
                done[s].answered(ids, logprobs, more.texts[w], bool(more.truncated[w]))
        calls = torch.tensor([t.calls for t in done], dtype=torch.float32)
        errors = torch.tensor([t.errors for t in done], dtype=torch.float32)
        return assembled(rollout, done), calls, errors


def assembled(rollout: AgentRollout, done: Sequence[Transcript]) -> AgentRollout:
    """``rollout`` with its completions replaced by the transcripts (right-padded with ``pad_id``)."""
    width = max(len(t.ids) for t in done)
    device = rollout.completion_ids.device

    def padded(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> Tensor:
        return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype, device=device)

    logprobs = None
    if rollout.sampler_logprobs is not None:
        logprobs = padded([t.logprobs for t in done], 0.0, torch.float32).to(rollout.sampler_logprobs.device)
    return AgentRollout(
        rollout.prompt_ids,
        rollout.prompt_mask,
        padded([t.ids for t in done], rollout.pad_id, torch.long),
        padded([[True] * len(t.ids) for t in done], False, torch.bool),
        [t.text for t in done],
        torch.tensor([t.truncated for t in done], dtype=torch.bool, device=rollout.truncated.device),
        logprobs,
        rollout.pad_id,
        padded([t.own for t in done], False, torch.bool),
    )
