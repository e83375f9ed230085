"""Turning prompts into sampled completions."""

from comlrl.rollout.generation import AgentRollout, generate_group

__all__ = ["AgentRollout", "generate_group"]
