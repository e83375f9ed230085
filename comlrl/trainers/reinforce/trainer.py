"""MAGRPO: several LLM agents trained together with group-relative policy gradients on a
shared (joint) reward.

One training step, as the code reads (``MultiAgentTrainer`` wires all but the advantages):

    rows ─formatters─▶ prompts per agent ─generate─▶ G completions per prompt and agent
    ─joint actions─▶ reward_func ─reward_processor─▶ joint rewards (nodes, J)
    [multi-turn: ─external_transition─▶ next turn's prompts, one child node per joint action;
     the same again one turn (tree level) at a time]
    ─returns (r + discount * mean of the child's returns)─▶ credit per agent (N, nodes, G)
    ─group baseline per node─▶ advantages
    ─masked batched forwards (micro-batches)─▶ policy-gradient loss ─▶ one optimizer step per agent
"""

from __future__ import annotations

from comlrl.algorithms.returns import TreeAdvantages, tree_advantages
from comlrl.rollout.tree import RolloutTree
from comlrl.trainers.base import MultiAgentTrainer
from comlrl.trainers.reinforce.config import MAGRPOConfig

__all__ = ["MAGRPOTrainer"]


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-Agent Group Relative Policy Optimization: each agent's sample is scored against
    the other samples of its group (same prompt, same agent). Arguments: see
    :class:`~comlrl.trainers.base.MultiAgentTrainer`; ``args`` is a :class:`MAGRPOConfig`."""

    config_class = MAGRPOConfig
    """The config built when ``args`` is not given; variants only change this."""
    algorithm_name = "MAGRPO"

    args: MAGRPOConfig

    @property
    def discount(self) -> float:
        return self.args.discount

    @property
    def passes(self) -> int:
        return self.args.num_iterations

    def estimate(self, tree: RolloutTree) -> TreeAdvantages:
        args = self.args
        return tree_advantages(
            [turn.rewards for turn in tree.turns],
            [turn.children for turn in tree.turns],
            self.joint_indices,
            args.num_generations,
            args.discount,
            args.advantage_mode,
            args.advantage_normalization,
            std_floor=args.advantage_std_floor,
        )
