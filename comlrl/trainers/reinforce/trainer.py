"""MAGRPO: several LLM agents trained together with group-relative policy gradients on a
shared (joint) reward. Its objective and step: :mod:`comlrl.trainers.reinforce.objective`.
"""

from __future__ import annotations

from typing import Any

from comlrl.compat.entry import OriginalCalls
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import Parts, Schedule, TaskReward
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.objective import GroupAdvantages

__all__ = ["GroupAdvantages", "MAGRPOTrainer"]


class MAGRPOTrainer(OriginalCalls, MultiAgentTrainer):
    """Multi-Agent Group Relative Policy Optimization: each agent's sample is scored against
    the other samples of its group (same prompt, same agent). Arguments: see
    :class:`~comlrl.engine.inputs.TrainerInputs`; ``args`` is a :class:`MAGRPOConfig`."""

    config_class = MAGRPOConfig
    """The config built when ``args`` is not given; variants only change this."""
    algorithm_name = "MAGRPO"
    optional_inputs = frozenset({"train_reward_func", "environment"})

    args: MAGRPOConfig

    def parts(self, args: Any, inputs: TrainerInputs) -> Parts:
        return Parts(GroupAdvantages(args), TaskReward(), Schedule(), inputs)
