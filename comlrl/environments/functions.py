"""The trainer's ``reward_func`` and ``external_transition`` as one environment: the rows'
prompts (through the formatters) start each episode, the reward function scores each turn's
joint actions in one call, and the transition writes each branch's next prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.environments.base import Acted, JointActions, Played, Proceed, Start
from comlrl.rewards.joint_reward import JointReward
from comlrl.rollout.generation import AgentRollout
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.transition import Transition


@dataclass(frozen=True)
class RewardAndTransition:
    """A :class:`~comlrl.environments.base.TreeEnvironment` made of a reward and a transition.

    Its state at a node is, per agent, the prompts on the branch as the reward functions and
    the transition are given them: the formatted ones, or with ``written_prompts`` the later
    turns' prompts as the transition wrote them (before the formatters).
    """

    prompts: PromptTable
    """The dataset's rows and the agents' first-turn prompts (and the formatters of later turns)."""
    reward: JointReward
    """Scores joint actions, given agent 0's prompt of the turn and the dataset row of each;
    functions that ask for it get the turn and the histories."""
    num_agents: int
    transition: Transition | None = None
    """Writes the next turn's prompts; required for a tree deeper than one turn."""
    prompt_passthrough: bool = False
    """Use the transition's prompts as they are, instead of formatting them (the ``prompt``
    column of the row replaced by them) with each agent's formatter."""
    early_termination_threshold: float | None = None
    """A node whose mean reward is above it is not expanded (the transition is not called)."""
    written_prompts: bool = False
    """At later turns, give the reward functions' ``prompts`` and the transition's
    ``prompt_history_per_agent`` the prompts as the transition wrote them, before the
    formatters, as comlrl 1.4.3's MAGRPO did (its actor-critic trainers gave the formatted
    prompts: False). The agents always read the formatted ones, and so do the reward
    context's histories."""

    def start(self, row_ids: Sequence[int]) -> list[Start]:
        first = [self.prompts.agent_prompts(i, row_ids) for i in range(self.num_agents)]
        starts = []
        for m in range(len(row_ids)):
            observations = [first[i][m] for i in range(self.num_agents)]
            starts.append(Start(observations, state=[[prompt] for prompt in observations]))
        return starts

    def act(self, rollouts: list[AgentRollout], states: list[Any], group: int, proceed: Proceed) -> Acted:
        return Acted(rollouts)  # no tools

    def play(self, batch: JointActions) -> Played:
        # Agent 0's prompt of this turn, and the dataset row, of each joint action (the reward's ``prompts``).
        joint_prompts = [state[0][-1] for state in batch.states]
        batch_items = [self.prompts.rows[row] for row in batch.row_ids]
        context = {
            "turn": batch.turn,
            "prompt_history_per_agent": batch.prompt_history,
            "response_history_per_agent": batch.response_history,
        }
        completions = [[action[i] for action in batch.actions] for i in range(self.num_agents)]
        scored = self.reward(joint_prompts, completions, batch.row_ids, context, batch_items)
        next_starts: list[Start | None] = [None] * len(batch.actions)
        if batch.last:
            return Played(scored, next_starts)
        if self.transition is None:
            raise ValueError("num_turns > 1 needs an external_transition to write the next turns' prompts")
        shape = (-1, batch.num_joint, self.num_agents)
        node_means = scored.processed.reshape(shape).mean(dim=(1, 2)).tolist()
        written: list[tuple[int, list[str]]] = []
        calls = 0
        for k, (m, row) in enumerate(zip(batch.nodes, batch.row_ids)):
            if self.early_termination_threshold is not None and node_means[m] > self.early_termination_threshold:
                continue
            texts = self.transition(
                turn=batch.turn,
                row_id=row,
                dataset=self.prompts.name,
                row=self.prompts.rows[row],
                prompt=self.prompts.rows[row].get("prompt", ""),  # "" for a dataset without the column
                agent_completions=batch.actions[k],
                prompt_history_per_agent=batch.states[k],
                response_history_per_agent=batch.response_history[k],
            )
            calls += 1
            if texts is not None:
                written.append((k, texts))
        formatted = [
            [
                texts[i]
                if self.prompt_passthrough
                else self.prompts.format_turn(i, batch.row_ids[k], texts[i], batch.turn + 1)
                for k, texts in written
            ]
            for i in range(self.num_agents)
        ]
        for w, (k, texts) in enumerate(written):
            observations = [formatted[i][w] for i in range(self.num_agents)]
            stated = texts if self.written_prompts else observations
            history = batch.states[k]
            next_starts[k] = Start(observations, state=[history[i] + [stated[i]] for i in range(self.num_agents)])
        return Played(scored, next_starts, calls)
