"""Multi-agent RLHF: MARLHF (a joint reward model fitted to preference pairs of the agents'
own joint actions, then online RL on its scores) and MARLHFIter (the same in rounds, a fresh
reward model each round)."""

from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.rlhf.marlhf import MARLHFConfig, MARLHFTrainer
from comlrl.trainers.rlhf.marlhf_iter import MARLHFIterConfig, MARLHFIterTrainer

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFIterConfig", "MARLHFIterTrainer", "MARLHFTrainer"]
