"""Settings given once for all agents or once per agent."""

from __future__ import annotations

from typing import Any


def per_agent(value: Any, num_agents: int, what: str) -> list[Any]:
    """``[value] * num_agents``, or ``value`` itself as a list when it is a list or tuple with
    exactly one entry per agent; ``what`` names the setting in the error."""
    if isinstance(value, list | tuple):
        if len(value) != num_agents:
            raise ValueError(f"got {len(value)} {what} for {num_agents} agents; pass one, or one per agent")
        return list(value)
    return [value] * num_agents
