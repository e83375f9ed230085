"""REINFORCE-family multi-agent trainers: MAGRPO and its variants, one implementation, and
centralized MAGRPO (one model writes every role)."""

from comlrl.engine.loop import TrainResult
from comlrl.trainers.reinforce.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer
from comlrl.trainers.reinforce.variants import (
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "TrainResult",
]
