"""One comparator model writing every agent's part in one answer, against agents that each
write their own (comlrl 1.4.3's ``comparator_generation_mode="centralized"`` with one model
per agent):

    a batch of rows ─every agent's prompt─▶ adapter.build_prompt ─▶ one joint prompt per row
    ─the comparator's model of agent comparator_centralized_agent_index─▶ M joint answers per row
    ─adapter.parse_completion─▶ one text per agent (an answer it cannot split: every part empty)
    ─each agent's tokenizer, EOS appended (rollout_from_texts)─▶ one rollout per agent
    ─scored and expanded as the agents' own candidates are─▶ the comparator's M joint actions

The comparator's backend (the live agents, a copy, external models, an earlier policy, an
HTTP endpoint) is the round's, so every comparator policy can answer this way.
"""

from __future__ import annotations

from typing import Any

import torch

from comlrl.algorithms import joint_action_indices
from comlrl.engine.centralized import CentralizedComparatorAdapter, CentralizedComparatorParseError
from comlrl.engine.distributed import DataParallel
from comlrl.engine.run import Run
from comlrl.rewards import JointReward
from comlrl.rollout.episodes import Rollout
from comlrl.rollout.generation import AgentRollout, rollout_from_texts
from comlrl.rollout.prompt_fit import check_encodable
from comlrl.rollout.tree import Turn


class PrebuiltAnswers:
    """A generation backend that hands back each agent's rollout made beforehand."""

    def __init__(self, rollouts: list[AgentRollout]):
        self.rollouts = rollouts

    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        return self.rollouts[agent]

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        return True  # nothing is drawn: agents may be asked in parallel threads

    def sync_weights(self, agent: int) -> None:
        pass


def split_answer(
    adapter: CentralizedComparatorAdapter, answer: str, row: dict[str, Any], num_agents: int
) -> list[str] | None:
    """The agents' parts of one joint answer (None: the adapter cannot split it). A wrong
    count or a part that is not text is the adapter's error."""
    try:
        parts = list(adapter.parse_completion(answer, row, num_agents))
    except CentralizedComparatorParseError:
        return None
    if len(parts) != num_agents or not all(isinstance(part, str) for part in parts):
        raise ValueError(
            f"centralized_comparator_adapter.parse_completion must return {num_agents} strings (one per agent), "
            f"got {parts!r}"
        )
    for agent, part in enumerate(parts):
        check_encodable(part, f"agent {agent}'s part that centralized_comparator_adapter.parse_completion returned")
    return parts


class JointComparator:
    """Samples the comparator's candidates as one model's joint answers, split into the agents' parts.

    Arguments:
        adapter: builds the joint prompt from the agents' prompts and splits an answer.
        agent_index: whose model (of the round's comparator backend) answers the joint prompts.
    """

    def __init__(self, adapter: CentralizedComparatorAdapter, agent_index: int):
        self.adapter, self.agent_index = adapter, agent_index
        self.answers = self.unsplit = 0
        """Joint answers given and not split since :meth:`parse_failure_frac` was last asked."""

    def parse_failure_frac(self, parallel: DataParallel) -> float:
        """The share of the answers since the last call, on every data-parallel rank, that
        could not be split (then counted afresh)."""
        answers, unsplit = parallel.sum_values([self.answers, self.unsplit])
        self.answers = self.unsplit = 0
        return unsplit / answers if answers else 0.0

    def candidates(self, run: Run, rollout: Rollout, rows: list[int], count: int, reward: JointReward | None) -> Turn:
        """``count`` joint actions per row of ``run``'s training prompts, answered through
        ``rollout``'s backend (the round's comparator) and played out by ``rollout``, scored by
        ``reward`` (default: the task reward)."""
        table, num_agents = run.train_prompts, run.num_agents
        agent_prompts = [[table.prompts[agent][row] for row in rows] for agent in range(num_agents)]
        joint_prompts = [
            self.adapter.build_prompt(table.rows[row], [prompts[k] for prompts in agent_prompts])
            for k, row in enumerate(rows)
        ]
        for prompt, row in zip(joint_prompts, rows):
            check_encodable(
                prompt, f"the prompt centralized_comparator_adapter.build_prompt wrote for {table.name} row {row}"
            )
        sampling = run.sampling.generate_kwargs()
        device = run.agents.device(self.agent_index)
        generator = torch.Generator(device).manual_seed(int(torch.randint(0, 2**63 - 1, (1,))))
        answers = rollout.backend.generate(self.agent_index, joint_prompts, count, sampling, generator).texts
        split = [
            split_answer(self.adapter, answer, table.rows[rows[k // count]], num_agents)
            for k, answer in enumerate(answers)
        ]
        self.answers += len(split)
        self.unsplit += sum(parts is None for parts in split)
        parts = [[""] * num_agents if answer_parts is None else answer_parts for answer_parts in split]
        rollouts = [
            rollout_from_texts(run.agents, agent, agent_prompts[agent], [p[agent] for p in parts], count, sampling)
            for agent in range(num_agents)
        ]
        aligned = joint_action_indices(num_agents, count, "aligned")
        prebuilt = rollout.with_backend(PrebuiltAnswers(rollouts))
        tree = prebuilt(table, rows, num_generations=count, joint_indices=aligned, reward=reward)
        return tree.turns[0]
