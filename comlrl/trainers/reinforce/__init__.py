"""REINFORCE-family multi-agent trainers."""

from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer, TrainResult

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "TrainResult"]
