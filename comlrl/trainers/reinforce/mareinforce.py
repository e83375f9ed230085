"""comlrl 1.4.3's module path of MAREINFORCE; the code lives in :mod:`comlrl.trainers.reinforce.variants`."""

from comlrl.trainers.reinforce.variants import MAREINFORCEConfig, MAREINFORCETrainer

__all__ = ["MAREINFORCEConfig", "MAREINFORCETrainer"]
