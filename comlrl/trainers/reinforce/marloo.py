"""comlrl 1.4.3's module path of MARLOO; the code lives in :mod:`comlrl.trainers.reinforce.variants`."""

from comlrl.trainers.reinforce.variants import MARLOOConfig, MARLOOTrainer

__all__ = ["MARLOOConfig", "MARLOOTrainer"]
