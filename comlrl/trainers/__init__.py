"""Every trainer and its config: MAGRPO and its REINFORCE variants, centralized MAGRPO, IAC and
MAAC, MADPO and MADPOIter, MARLHF and MARLHFIter (and comlrl 1.4.3's ``ActorCriticTrainerBase``,
for ``isinstance`` only)."""

from comlrl.compat.moved import moved_name
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.engine.config import TrainerConfig
from comlrl.engine.loop import TrainResult
from comlrl.trainers.actor_critic import (
    ActorCriticConfig,
    ActorCriticTrainer,
    ActorCriticTrainerBase,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
)
from comlrl.trainers.dpo import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer
from comlrl.trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)
from comlrl.trainers.rlhf import JointRewardModel, MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer

__all__ = [
    "ActorCriticConfig",
    "ActorCriticTrainer",
    "ActorCriticTrainerBase",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "IACConfig",
    "IACTrainer",
    "JointRewardModel",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MultiAgentTrainer",
    "TaggedCentralizedComparatorAdapter",
    "TrainResult",
    "TrainerConfig",
]


def __getattr__(name: str):  # comlrl 1.4.3's names: an error naming what to use instead
    moved_name(__name__, name)
