"""Every trainer and its config: MAGRPO and its REINFORCE variants, IAC and MAAC."""

from comlrl.trainers.actor_critic import (
    ActorCriticConfig,
    ActorCriticTrainer,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
)
from comlrl.trainers.base import MultiAgentTrainer
from comlrl.trainers.config import TrainerConfig
from comlrl.trainers.loop import TrainResult
from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = [
    "ActorCriticConfig",
    "ActorCriticTrainer",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MultiAgentTrainer",
    "TrainResult",
    "TrainerConfig",
]
