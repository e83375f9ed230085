"""A user's :class:`~comlrl.environments.base.Environment` played on a dataset's rows: each
row's episode starts from ``reset``, each joint action is one ``step``, and whatever the
environment returns is checked, naming the environment, the row, the turn and the joint
action of anything wrong."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from comlrl.environments.base import Environment, JointActions, Outcome, Played, Start
from comlrl.rewards.calls import checked_number, to_float32
from comlrl.rewards.joint_reward import RewardBatch
from comlrl.rollout.chat import ChatRenderer, is_chat
from comlrl.rollout.transition import checked_prompts
from comlrl.utils.signatures import describe


@dataclass(frozen=True)
class EnvironmentOnRows:
    """A :class:`~comlrl.environments.base.TreeEnvironment`: ``environment`` on ``rows``."""

    environment: Environment
    rows: Sequence[dict[str, Any]]
    """The dataset's rows (dicts), indexed by row id."""
    renderers: Sequence[ChatRenderer]
    """Each agent's chat renderer: an observation may be chat messages (:mod:`comlrl.rollout.chat`)."""
    dataset: str = "dataset"
    """The dataset's name in errors."""

    @property
    def num_agents(self) -> int:
        return len(self.renderers)

    @property
    def source(self) -> str:
        return f"environment {describe(type(self.environment))}"

    def start(self, row_ids: Sequence[int]) -> list[Start]:
        starts = []
        for row in row_ids:
            at = f"{self.dataset} row {row}"
            try:
                start = self.environment.reset(self.rows[row])
            except Exception as error:
                raise RuntimeError(f"{self.source}.reset raised {type(error).__name__}: {error} on {at}") from error
            if not isinstance(start, Start) or start.observations is None:
                raise TypeError(
                    f"{self.source}.reset returned {start!r} for {at}; expected a Start with one prompt per agent"
                )
            starts.append(
                Start(
                    self.observations(start.observations, f"{self.source}.reset", f"for {at}"),
                    start.state,
                )
            )
        return starts

    def play(self, batch: JointActions) -> Played:
        rewards, next_starts = [], []
        for k, (row, state, actions) in enumerate(zip(batch.row_ids, batch.states, batch.actions)):
            at = f"joint action {k} ({self.dataset} row {row}, turn {batch.turn})"
            try:
                outcome = self.environment.step(state, list(actions), batch.turn)
            except Exception as error:
                raise RuntimeError(f"{self.source}.step raised {type(error).__name__}: {error} on {at}") from error
            if not isinstance(outcome, Outcome):
                raise TypeError(f"{self.source}.step returned {type(outcome).__name__} for {at}; expected an Outcome")
            rewards.append(self.rewards(outcome.reward, at))
            ended = batch.last or outcome.observations is None
            observations = (
                None if ended else self.observations(outcome.observations, f"{self.source}.step", f"for {at}")
            )
            next_starts.append(None if observations is None else Start(observations, outcome.state))
        raw = to_float32(rewards, (len(rewards), self.num_agents), batch.row_ids, self.source)
        scored = RewardBatch(
            per_function=raw.unsqueeze(0), raw=raw, processed=raw.clone(), names=[self.environment.reward_name]
        )
        return Played(scored, next_starts, 0 if batch.last else len(batch.actions))

    def observations(self, value: Any, source: str, where: str) -> list[str]:
        """The next prompts ``source`` returned ``where``: N strings or chat messages, rendered."""
        if is_chat(value) and len(value) == self.num_agents:
            value = [
                self.renderers[i](o, f"agent {i}'s observation from {source} {where}") if is_chat(o) else o
                for i, o in enumerate(value)
            ]
        return checked_prompts(value, self.num_agents, source, where)

    def rewards(self, reward: Any, at: str) -> list[float]:
        """One joint action's reward as N numbers: one shared by the agents, or one each."""
        several = reward.ndim > 0 if isinstance(reward, torch.Tensor) else isinstance(reward, Sequence)
        if several and not isinstance(reward, str):
            values = list(reward)
            if len(values) != self.num_agents:
                raise ValueError(
                    f"{self.source}.step returned {len(values)} rewards for {at}; expected one number, "
                    f"or {self.num_agents} (one per agent)"
                )
            return [checked_number(value, f"{self.source}.step", f"{at}, agent {i}") for i, value in enumerate(values)]
        return [checked_number(reward, f"{self.source}.step", at)] * self.num_agents
