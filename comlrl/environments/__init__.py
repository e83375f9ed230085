"""Environments for N agents (:mod:`comlrl.environments.base`): what a rollout tree plays. The
trainer's reward function and transition are one (:mod:`comlrl.environments.functions`); a
user's :class:`Environment` is another (:mod:`comlrl.environments.played`)."""

from comlrl.environments.base import Environment, Outcome, Start
from comlrl.environments.tools import ToolCall

__all__ = ["Environment", "Outcome", "Start", "ToolCall"]
