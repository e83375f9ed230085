"""MAGRPO: several LLM agents trained together with group-relative policy gradients on a
shared (joint) reward.

One training step, as the code reads (:meth:`comlrl.engine.policy_gradient.PolicyGradient.step`;
the advantages are :class:`GroupAdvantages`'):

    rows ─formatters─▶ prompts per agent ─generate─▶ G completions per prompt and agent
    ─joint actions─▶ reward_func ─reward_processor─▶ joint rewards (nodes, J)
    [multi-turn: ─external_transition─▶ next turn's prompts, one child node per joint action;
     the same again one turn (tree level) at a time]
    ─returns (r + discount * mean of the child's returns)─▶ credit per agent (N, nodes, G)
    ─group baseline per node─▶ advantages
    ─masked batched forwards (micro-batches)─▶ policy-gradient loss ─▶ one optimizer step per agent
"""

from __future__ import annotations

from typing import Any

from comlrl.algorithms.returns import TreeAdvantages, tree_advantages
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import Parts, Schedule, TaskReward
from comlrl.engine.policy_gradient import PolicyGradient
from comlrl.rollout.tree import RolloutTree
from comlrl.trainers.reinforce.config import MAGRPOConfig

__all__ = ["GroupAdvantages", "MAGRPOTrainer"]


class GroupAdvantages(PolicyGradient):
    """Each agent's sample is scored against the other samples of its group (same prompt,
    same agent): the MAGRPO family's objective, its baseline the config's ``advantage_mode``."""

    config: MAGRPOConfig

    @property
    def discount(self) -> float:
        return self.config.discount

    @property
    def passes(self) -> int:
        return self.config.num_iterations

    def estimate(self, tree: RolloutTree) -> TreeAdvantages:
        config = self.config
        return tree_advantages(
            [turn.rewards for turn in tree.turns],
            [turn.children for turn in tree.turns],
            tree.joint_indices,
            config.num_generations,
            config.discount,
            config.advantage_mode,
            config.advantage_normalization,
            std_floor=config.advantage_std_floor,
        )


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-Agent Group Relative Policy Optimization: each agent's sample is scored against
    the other samples of its group (same prompt, same agent). Arguments: see
    :class:`~comlrl.engine.inputs.TrainerInputs`; ``args`` is a :class:`MAGRPOConfig`."""

    config_class = MAGRPOConfig
    """The config built when ``args`` is not given; variants only change this."""
    algorithm_name = "MAGRPO"
    optional_inputs = frozenset({"train_reward_func"})

    args: MAGRPOConfig

    def parts(self, args: Any, inputs: TrainerInputs) -> Parts:
        return Parts(GroupAdvantages(args), TaskReward(), Schedule(), inputs)
