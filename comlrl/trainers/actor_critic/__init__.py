"""Actor-critic multi-agent trainers with PPO-style updates: IAC and MAAC."""

from comlrl.compat.moved import moved_name
from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.trainer import ActorCriticTrainer, IACTrainer, MAACTrainer

__all__ = ["ActorCriticConfig", "ActorCriticTrainer", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]


def __getattr__(name: str):  # comlrl 1.4.3's names: an error naming what to use instead
    moved_name(__name__, name)
