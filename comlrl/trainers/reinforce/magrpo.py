"""comlrl 1.4.3's module path of MAGRPO; the code lives in :mod:`comlrl.trainers.reinforce`."""

from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]
