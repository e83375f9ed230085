"""Actor-critic trainers with PPO-style updates: IAC (one critic per agent) and MAAC (one
centralized critic); their objective, with the critics, is :mod:`comlrl.trainers.actor_critic.objective`."""

from __future__ import annotations

from typing import Any

from comlrl.compat.arguments import ACTOR_CRITIC_ORDER
from comlrl.compat.entry import OriginalCalls
from comlrl.compat.trainer_attributes import IACAttributes, MAACAttributes
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.inputs import CRITIC_INPUTS, TrainerInputs
from comlrl.engine.parts import Parts, Schedule, TaskReward
from comlrl.models.value import Critic
from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.critics import CriticEstimate, joint_critic_text
from comlrl.trainers.actor_critic.objective import ActorCritic, actor_critic_parts


class ActorCriticTrainer(OriginalCalls, MultiAgentTrainer):
    """What IAC and MAAC share. Arguments: :class:`~comlrl.engine.inputs.TrainerInputs`,
    with ``critic_model``, ``critics`` and ``critic_tokenizer``, positionally in the order of
    :data:`~comlrl.compat.arguments.ACTOR_CRITIC_ORDER`; ``args`` is the trainer's config.

    A critic given as a folder that holds a value head starts from that head. The critic
    folders and value heads (``value_head.pt``) 1.4.3 saved load too, and ``model_config`` may
    hold its critic keys (``critic_model_kwargs``; MAAC's ``critic_value_head_hidden_dim``),
    with the meaning they had there (:mod:`comlrl.compat.actor_critic`).
    """

    config_class: type[ActorCriticConfig] = ActorCriticConfig
    positional_order = ACTOR_CRITIC_ORDER
    takes_value_heads = True
    optional_inputs = CRITIC_INPUTS | {"train_reward_func", "environment"}
    args: ActorCriticConfig
    objective: ActorCritic
    centralized_critic = False
    """One critic for all agents (MAAC) instead of one per agent (IAC)."""

    def parts(self, args: Any, inputs: TrainerInputs) -> Parts:
        objective, inputs = actor_critic_parts(args, inputs, self.centralized_critic, type(self).__name__)
        return Parts(objective, TaskReward(), Schedule(), inputs)

    @property
    def critics(self) -> list[Critic]:
        """The critics, in the order of their learners (after the agents')."""
        return self.objective.critics


class IACTrainer(IACAttributes, ActorCriticTrainer):
    """Independent actor-critic: each agent has its own critic, a value head on the agent's
    model (the default) or a separate critic model (``critic_model`` / ``critics``), that
    reads only that agent's prompt (and, with ``critic_type="q"``, its completion)."""

    config_class = IACConfig
    algorithm_name = "IAC"


class MAACTrainer(MAACAttributes, ActorCriticTrainer):
    """Multi-agent actor-critic with one centralized critic (``critic_model`` / ``critics``)
    that reads every agent's prompt (and, with ``critic_type="q"``, the joint action) and
    gives one value per agent."""

    config_class = MAACConfig
    algorithm_name = "MAAC"
    centralized_critic = True


__all__ = ["ActorCriticTrainer", "CriticEstimate", "IACTrainer", "MAACTrainer", "joint_critic_text"]
