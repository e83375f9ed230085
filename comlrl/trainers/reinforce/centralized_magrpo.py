"""comlrl 1.4.3's module path of centralized MAGRPO; the code lives in :mod:`comlrl.trainers.reinforce.centralized`."""

from comlrl.trainers.reinforce.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]
