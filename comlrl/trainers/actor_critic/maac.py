"""comlrl 1.4.3's module path of MAAC; the code lives in :mod:`comlrl.trainers.actor_critic`."""

from comlrl.trainers.actor_critic.config import MAACConfig
from comlrl.trainers.actor_critic.trainer import MAACTrainer

__all__ = ["MAACConfig", "MAACTrainer"]
