"""The rollout: dataset rows played out into a rollout tree by the agents, through a
generation backend, scored by a joint reward, with a transition writing the next turns'
prompts. One object holds these collaborators for a run; each call says what differs from the
training settings (evaluation's one greedy path, a preference round's aligned candidates, a
comparator's backend)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from comlrl.environments.base import Environment, TreeEnvironment
from comlrl.environments.functions import RewardAndTransition
from comlrl.environments.played import EnvironmentOnRows
from comlrl.rewards.joint_reward import JointReward
from comlrl.rollout.backends import GenerationBackend, generate_agents
from comlrl.rollout.generation import AgentRollout
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import RolloutTree, build_tree


@dataclass(frozen=True)
class Rollout:
    """Plays dataset rows out into rollout trees: one ``generate`` call per agent per turn."""

    backend: GenerationBackend
    """What samples the completions."""
    agents: Sequence[torch.nn.Module]
    """The agents (the backend's agent indices are theirs)."""
    device_of: Callable[[int], torch.device]
    """Where agent i's generator lives."""
    sampling: SamplingSpec
    """The training sampling settings."""
    reward: JointReward | None
    """What scores the joint actions unless a call says otherwise (the task reward); None with an environment."""
    num_generations: int
    """G: samples per agent per node."""
    joint_indices: torch.Tensor
    """``(J, N)`` sample of each agent in each joint action (the config's ``joint_mode``)."""
    num_turns: int = 1
    """Depth of the tree."""
    transition: Transition | None = None
    """Writes the next turn's prompts (required when ``num_turns > 1``)."""
    prompt_passthrough: bool = False
    """Use the transition's prompts as written, without the formatters."""
    early_termination_threshold: float | None = None
    """A node whose mean reward is above it is not expanded."""
    written_prompts: bool = False
    """Rewards and transition see later turns' prompts as the transition wrote them
    (:class:`~comlrl.environments.functions.RewardAndTransition`)."""
    environment: Environment | None = None
    """The user's environment, which scores and goes on in place of the reward and the transition."""

    def with_backend(self, backend: GenerationBackend) -> Rollout:
        """The same rollout, sampled by ``backend`` (a comparator's, answers prepared beforehand)."""
        return dataclasses.replace(self, backend=backend)

    def __call__(
        self,
        prompts: PromptTable,
        row_ids: list[int],
        num_generations: int | None = None,
        joint_indices: torch.Tensor | None = None,
        sampling: SamplingSpec | None = None,
        reward: JointReward | None = None,
    ) -> RolloutTree:
        """Generate, score and expand the rollout tree of ``row_ids`` (training settings unless given)."""
        group = self.num_generations if num_generations is None else num_generations
        kwargs = (self.sampling if sampling is None else sampling).generate_kwargs()
        # One generator per agent, seeded from torch's (whose state checkpoints keep), so that
        # agents sampling in parallel threads draw the same tokens in every run.
        seeds = torch.randint(0, 2**63 - 1, (len(self.agents),), dtype=torch.int64).tolist()
        generators = [torch.Generator(self.device_of(i)).manual_seed(seed) for i, seed in enumerate(seeds)]

        def generate(turn_prompts: list[list[str]]) -> list[AgentRollout]:
            return generate_agents(self.backend, self.agents, turn_prompts, group, kwargs, generators)

        environment: TreeEnvironment
        if self.environment is not None:
            environment = EnvironmentOnRows(self.environment, prompts.rows, prompts.renderers, prompts.name)
        else:
            environment = RewardAndTransition(
                prompts,
                self.reward if reward is None else reward,
                len(self.agents),
                transition=self.transition,
                prompt_passthrough=self.prompt_passthrough,
                early_termination_threshold=self.early_termination_threshold,
                written_prompts=self.written_prompts,
            )

        def proceed(agent: int, prompts: list[list[int]]) -> AgentRollout:
            return self.backend.generate(agent, prompts, 1, kwargs, generators[agent])

        joint = self.joint_indices if joint_indices is None else joint_indices
        return build_tree(environment, row_ids, generate, joint, group, num_turns=self.num_turns, proceed=proceed)
