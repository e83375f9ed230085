"""A user's :class:`~comlrl.environments.base.Environment` played on a dataset's rows: each
row's episode starts from ``reset``, each joint action is one ``step``, and whatever the
environment returns is checked, naming the environment, the row, the turn and the joint
action of anything wrong."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from comlrl.environments.acting import AgentTools
from comlrl.environments.base import Acted, Environment, JointActions, Outcome, Played, Proceed, Start
from comlrl.environments.tools import ToolRunner, tool_schemas
from comlrl.rewards.calls import checked_number, to_float32
from comlrl.rewards.joint_reward import RewardBatch
from comlrl.rollout.chat import ChatRenderer, is_chat
from comlrl.rollout.generation import AgentRollout
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
            observations = self.observations(start.observations, start.state, f"{self.source}.reset", f"for {at}")
            starts.append(Start(observations, start.state))
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
            source = f"{self.source}.step"
            observations = (
                None if ended else self.observations(outcome.observations, outcome.state, source, f"for {at}")
            )
            next_starts.append(None if observations is None else Start(observations, outcome.state))
        raw = to_float32(rewards, (len(rewards), self.num_agents), batch.row_ids, self.source)
        scored = RewardBatch(
            per_function=raw.unsqueeze(0), raw=raw, processed=raw.clone(), names=[self.environment.reward_name]
        )
        return Played(scored, next_starts, 0 if batch.last else len(batch.actions))

    def observations(self, value: Any, state: Any, source: str, where: str) -> list[str]:
        """The prompts ``source`` returned ``where`` for a node of state ``state``: N strings or
        chat messages, rendered with each agent's tools there."""
        if is_chat(value) and len(value) == self.num_agents:
            rendered = []
            for i, observation in enumerate(value):
                schemas = tool_schemas(self.environment.tools(i, state), i)
                what = f"agent {i}'s observation from {source} {where}"
                instructions = self.environment.tool_instructions
                rendered.append(
                    self.renderers[i](observation, what, schemas, instructions)
                    if is_chat(observation) or schemas
                    else observation
                )
            value = rendered
        return checked_prompts(value, self.num_agents, source, where)

    def act(self, rollouts: list[AgentRollout], states: list[Any], group: int, proceed: Proceed) -> Acted:
        """Each agent's completions continued after its tool calls (:mod:`comlrl.environments.acting`)."""
        node_tools = [[self.environment.tools(i, state) for state in states] for i in range(self.num_agents)]
        if not any(tools for agent_tools in node_tools for tools in agent_tools):
            return Acted(rollouts)
        runner = ToolRunner(self.environment.tool_timeout)
        acted, calls, errors = [], [], []
        try:
            for i, rollout in enumerate(rollouts):
                if not any(node_tools[i]):  # this agent has none: its completions stay as sampled
                    acted.append(rollout)
                    calls.append(torch.zeros(len(rollout.texts)))
                    errors.append(torch.zeros(len(rollout.texts)))
                    continue
                schemas = [tool_schemas(tools, i) for tools in node_tools[i]]
                parse = functools.partial(self.environment.tool_calls, i)
                turn = AgentTools(self.renderers[i], runner, self.environment.max_tool_calls, parse)
                agent_rollout, agent_calls, agent_errors = turn(
                    rollout, node_tools[i], schemas, group, lambda prompts, i=i: proceed(i, prompts)
                )
                acted.append(agent_rollout)
                calls.append(agent_calls)
                errors.append(agent_errors)
        finally:
            runner.close()
        return Acted(acted, torch.stack(calls), torch.stack(errors))

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
