"""Actor-critic multi-agent trainers with PPO-style updates: IAC and MAAC."""

from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.trainer import ActorCriticTrainer, IACTrainer, MAACTrainer

__all__ = ["ActorCriticConfig", "ActorCriticTrainer", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]
