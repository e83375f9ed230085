"""comlrl 1.4.3's module path of IAC; the code lives in :mod:`comlrl.trainers.actor_critic`."""

from comlrl.trainers.actor_critic.config import IACConfig
from comlrl.trainers.actor_critic.trainer import IACTrainer

__all__ = ["IACConfig", "IACTrainer"]
