"""From dataset rows to one prompt per agent, formatted and checked once before training."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.rollout.chat import ChatRenderer, is_chat
from comlrl.rollout.prompt_fit import check_encodable
from comlrl.utils.per_agent import per_agent
from comlrl.utils.signatures import describe, keyword_arguments

Formatter = Callable[[dict[str, Any]], str]


def prompt_column(row: dict[str, Any]) -> str:
    """The default formatter: the row's ``prompt`` column."""
    return row["prompt"]


def prompt_source(formatter: Formatter) -> str:
    """Where an agent's prompts come from, for errors: its formatter, or the ``prompt`` column."""
    return "the row's 'prompt' column" if formatter is prompt_column else f"written by formatter {describe(formatter)}"


class PromptTable:
    """Every agent's prompt for every row of a dataset.

    All rows are formatted up front, so a formatter that fails, or a row it cannot handle,
    is reported before any training, naming the agent and the row. An environment's runs give
    the first prompts (``prompts``, ``[agent][row]``: its first observations) instead of
    formatters; their later prompts are the environment's too.
    """

    def __init__(
        self,
        dataset: Any,
        formatters: Formatter | Sequence[Formatter] | None,
        num_agents: int,
        name: str = "dataset",
        prompts: Sequence[Sequence[str]] | None = None,
        renderers: Sequence[ChatRenderer] | None = None,
    ):
        rows = list(dataset)
        for r, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"{name} row {r} is a {type(row).__name__}; rows must be mappings such as dicts")
        if not rows:
            raise ValueError(f"{name} is empty: it needs at least one row")
        self.rows = rows
        self.name = name
        self.renderers = list(renderers or [])
        if prompts is not None:  # an environment's first observations, checked where they were made
            self.formatters: list[Formatter] = []
            self.prompts = [list(agent_prompts) for agent_prompts in prompts]
            self._row_prompts = [row["prompt"] for row in rows] if self._has_prompts(rows) else self.prompts[0]
            return
        if formatters is None:
            missing = next((r for r, row in enumerate(rows) if "prompt" not in row), None)
            if missing is not None:
                raise ValueError(
                    f"{name} row {missing} has no 'prompt' column (columns: {sorted(rows[missing])}) "
                    "and no formatters were given: add a 'prompt' column or pass formatters="
                )
            formatters = prompt_column
        formatters = per_agent(formatters, num_agents, "formatters")
        for agent, formatter in enumerate(formatters):
            if not callable(formatter):
                raise TypeError(f"formatters[{agent}] must be callable, got {type(formatter).__name__}")
        self.formatters = formatters
        self.prompts = [
            [self._format(agent, row, f"{name} row {r}") for r, row in enumerate(rows)]
            for agent, f in enumerate(formatters)
        ]
        self._row_prompts = [row["prompt"] for row in rows] if self._has_prompts(rows) else self.prompts[0]

    @staticmethod
    def _has_prompts(rows: list[Mapping[str, Any]]) -> bool:
        return all(isinstance(row.get("prompt"), str) for row in rows)

    def _format(self, agent: int, row: dict[str, Any], where: str, **kwargs: str) -> str:
        formatter = self.formatters[agent]
        try:
            prompt = formatter(row, **kwargs)
        except Exception as error:
            raise RuntimeError(
                f"formatter {describe(formatter)} of agent {agent} raised {type(error).__name__}: {error} on {where}"
            ) from error
        if not (isinstance(prompt, str) or is_chat(prompt)):
            raise TypeError(
                f"formatter {describe(formatter)} of agent {agent} returned {type(prompt).__name__} "
                f"for {where}; expected a string (or a list of chat messages)"
            )
        return self.render(agent, prompt, f"agent {agent}'s prompt for {where} ({prompt_source(formatter)})")

    def render(self, agent: int, prompt: Any, what: str) -> str:
        """``prompt`` (``what`` in errors) as agent ``agent`` reads it: a string as it is, chat
        messages rendered by the agent's chat template (:mod:`comlrl.rollout.chat`)."""
        if is_chat(prompt) and self.renderers:
            prompt = self.renderers[agent](prompt, what)
        if not isinstance(prompt, str):
            raise TypeError(f"{what} is a {type(prompt).__name__}; expected a string or a list of chat messages")
        check_encodable(prompt, what)
        return prompt

    def format_turn(self, agent: int, row_id: int, text: str, turn: int) -> str:
        """Agent ``agent``'s prompt at a later turn: its formatter applied to the row with the
        ``prompt`` column replaced by ``text`` (what ``external_transition`` returned); a
        formatter that names ``external_prompts`` also gets ``text`` there, as in comlrl 1.4.3."""
        row = {**self.rows[row_id], "prompt": text}
        wants_text = keyword_arguments(self.formatters[agent], ("external_prompts",))
        kwargs = {"external_prompts": text} if wants_text else {}
        return self._format(agent, row, f"{self.name} row {row_id} at turn {turn}", **kwargs)

    def __len__(self) -> int:
        return len(self._row_prompts)

    def agent_prompts(self, agent: int, row_ids: Sequence[int]) -> list[str]:
        """Agent ``agent``'s prompts for ``row_ids``."""
        return [self.prompts[agent][r] for r in row_ids]

    def row_prompts(self, row_ids: Sequence[int]) -> list[str]:
        """The rows' ``prompt`` column, or agent 0's formatted prompts when the rows have no
        such column: the samples' and ``eval_logger``'s prompts, as comlrl 1.4.3 gave them the
        row's prompt. Reward functions get each turn's prompts instead (see
        ``comlrl.rewards.joint_reward``), and the transition the ``prompt`` column ("" without it)."""
        return [self._row_prompts[r] for r in row_ids]
