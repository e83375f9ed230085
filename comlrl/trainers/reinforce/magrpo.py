"""comlrl 1.4.3's module path of MAGRPO; the code lives in :mod:`comlrl.trainers.reinforce`."""

from comlrl._moved import moved_name
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]


def __getattr__(name: str):  # comlrl 1.4.3's names: an error naming what to use instead
    moved_name(__name__, name)
