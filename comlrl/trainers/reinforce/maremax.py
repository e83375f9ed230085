"""comlrl 1.4.3's module path of MAReMax; the code lives in :mod:`comlrl.trainers.reinforce.variants`."""

from comlrl.trainers.reinforce.variants import MAReMaxConfig, MAReMaxTrainer

__all__ = ["MAReMaxConfig", "MAReMaxTrainer"]
