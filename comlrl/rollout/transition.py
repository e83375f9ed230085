"""The user's ``external_transition``: from the joint action just taken to the next turn's
prompts (the environment of a multi-turn episode)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.rollout.prompt_fit import check_encodable
from comlrl.utils.signatures import describe, keyword_arguments, signature_parameters

TRANSITION_ARGUMENTS = (
    "prompt",
    "agent_completions",
    "num_agents",
    "prompt_history_per_agent",
    "response_history_per_agent",
    "row",
    "turn",
)
"""Keyword arguments an ``external_transition`` can take; it receives those its signature names.
The first five are the original library's; ``row`` is the dataset row and ``turn`` the turn
just played (1 for the first)."""

_ORIGINAL_ARGUMENTS = TRANSITION_ARGUMENTS[:5]


class Transition:
    """Calls ``external_transition`` with the arguments it takes and checks what it returns.

    It must return one prompt string per agent, or ``None`` to end the branch (the
    environment is done): the joint action then has no next turn and its return is its reward.
    """

    def __init__(self, func: Callable[..., Sequence[str] | None], num_agents: int):
        if not callable(func):
            raise TypeError(f"external_transition must be callable, got {type(func).__name__}")
        self.func = func
        self.num_agents = num_agents
        self.name = f"external_transition {describe(func)}"
        # With **kwargs (or no readable signature) it gets the original five.
        self.arguments = keyword_arguments(func, TRANSITION_ARGUMENTS, if_any_keyword=_ORIGINAL_ARGUMENTS)
        unknown = [
            p.name
            for p in signature_parameters(func) or []
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in TRANSITION_ARGUMENTS
        ]
        if unknown:
            raise TypeError(
                f"{self.name} requires {unknown}, which the trainer cannot pass; it passes by keyword "
                f"any of {list(TRANSITION_ARGUMENTS)} (bind other values with functools.partial)"
            )

    def __call__(
        self,
        *,
        turn: int,
        row_id: int,
        dataset: str,
        row: Mapping[str, Any],
        prompt: str,
        agent_completions: Sequence[str],
        prompt_history_per_agent: Sequence[Sequence[str]],
        response_history_per_agent: Sequence[Sequence[str]],
    ) -> list[str] | None:
        """The next turn's N prompts after ``turn`` on one branch of ``row_id`` (a row of
        ``dataset``, named in errors), or None."""
        values = {
            "prompt": prompt,
            "agent_completions": list(agent_completions),
            "num_agents": self.num_agents,
            "prompt_history_per_agent": [list(h) for h in prompt_history_per_agent],
            "response_history_per_agent": [list(h) for h in response_history_per_agent],
            "row": copy.deepcopy(dict(row)),
            "turn": turn,
        }
        where = f"after turn {turn} on {dataset} row {row_id}"
        try:
            result = self.func(**{name: values[name] for name in self.arguments})
        except Exception as error:
            raise RuntimeError(f"{self.name} raised {type(error).__name__}: {error} ({where})") from error
        if result is None:
            return None
        return checked_prompts(result, self.num_agents, self.name, where)


def checked_prompts(result: Any, num_agents: int, source: str, where: str) -> list[str]:
    """``result``, which ``source`` returned ``where`` (for errors), as the next turn's prompts:
    one string per agent."""
    if isinstance(result, str) or not isinstance(result, Sequence):
        raise TypeError(
            f"{source} returned {type(result).__name__} {where}; expected a list of {num_agents} "
            "prompt strings (one per agent) or None to end the branch"
        )
    if len(result) != num_agents:
        raise ValueError(f"{source} returned {len(result)} prompts {where}; expected {num_agents} (one per agent)")
    for agent, text in enumerate(result):
        if not isinstance(text, str):
            raise TypeError(f"{source} returned {type(text).__name__} for agent {agent} {where}; expected a string")
        check_encodable(text, f"the prompt {source} returned for agent {agent} {where}")
    return list(result)
