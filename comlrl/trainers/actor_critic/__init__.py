"""Actor-critic multi-agent trainers with PPO-style updates: IAC and MAAC. ``RolloutSample`` is
what their ``metrics_callback`` gets (comlrl 1.4.3's name); ``ActorCriticTrainerBase``, 1.4.3's
base class, answers ``isinstance`` for them and refuses to be subclassed."""

from comlrl.compat.moved import moved_name
from comlrl.compat.trainer_base import ActorCriticTrainerBase
from comlrl.metrics.hooks import ActorCriticSample as RolloutSample
from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.trainer import ActorCriticTrainer, IACTrainer, MAACTrainer

ActorCriticTrainerBase.register(ActorCriticTrainer)

__all__ = [
    "ActorCriticConfig",
    "ActorCriticTrainer",
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "RolloutSample",
]


def __getattr__(name: str):  # comlrl 1.4.3's names: an error naming what to use instead
    moved_name(__name__, name)
