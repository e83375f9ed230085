"""Configuration of the actor-critic trainers (IAC and MAAC): the shared fields plus GAE,
the PPO updates and the critics."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.trainers.config import TrainerConfig, check_bool, check_choice, check_fraction, check_int, is_real

CRITIC_TYPES = ("v", "q")


@dataclass
class ActorCriticConfig(TrainerConfig):
    """Everything that shapes an IAC or MAAC run. Every field is checked in ``__post_init__``."""

    per_device_train_batch_size: int = 8
    """Dataset rows per training step (8, the original library's actor-critic rollout buffer):
    a critic needs no group of samples, so the batch is made of rows."""
    num_generations: int = 1
    """Completions sampled per prompt and agent: 1 is enough, the critic is the baseline."""
    critic_learning_rate: float = 1e-5
    """AdamW learning rate of the critics (a separate critic's whole model, or a value head)."""
    critic_type: str = "v"
    """``v``: the critic values a node from the prompts, V(h); ``q``: it values each action
    from the prompts and the completions, Q(h, a), and a node's value is the mean over the
    actions sampled there."""
    value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in the value head; ``None``: one linear map."""
    gamma: float = 1.0
    """Discount in [0, 1] of the next turn's value."""
    gae_lambda: float = 0.95
    """GAE's lambda in [0, 1]: 1 uses the Monte-Carlo return of the tree, 0 the one-step
    target ``r + gamma * V(next node)``; only matters with ``num_turns > 1``."""
    ppo_epochs: int = 2
    """Passes over each rollout, one optimizer step per actor and critic each; from the second
    pass on, the clipped ratio keeps each actor near the policy that sampled."""
    value_clip_range: float | None = 0.2
    """The critic's prediction may move at most this far from its rollout-time value before the
    loss stops rewarding it (PPO's value clipping); ``None`` turns it off."""
    value_loss_coef: float = 0.5
    """Weight of the value loss (matters where the critic shares the agent's model)."""
    advantage_normalization: bool = True
    """Whiten each agent's advantages over its samples of the step (mean 0, std 1); a step
    with one sample per agent (a short last batch) gives it advantage 0."""

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "critic_type", CRITIC_TYPES)
        check_int(self, "value_head_hidden_dim", allow_none=True)
        check_fraction(self, "gamma")
        check_fraction(self, "gae_lambda")
        check_int(self, "ppo_epochs")
        check_bool(self, "advantage_normalization")
        if not (is_real(self.critic_learning_rate) and self.critic_learning_rate > 0):
            raise ValueError(f"critic_learning_rate must be > 0, got {self.critic_learning_rate!r}")
        if self.value_clip_range is not None and not (is_real(self.value_clip_range) and self.value_clip_range > 0):
            raise ValueError(f"value_clip_range must be > 0 or None (off), got {self.value_clip_range!r}")
        if not (is_real(self.value_loss_coef) and self.value_loss_coef > 0):
            raise ValueError(f"value_loss_coef must be > 0, got {self.value_loss_coef!r}")
        if self.advantage_normalization and self.per_device_train_batch_size * self.num_generations < 2:
            raise ValueError(
                "advantage_normalization needs at least 2 samples per agent and step to whiten: "
                f"per_device_train_batch_size={self.per_device_train_batch_size} x num_generations="
                f"{self.num_generations}; raise one or set advantage_normalization=False"
            )


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: one critic per agent, reading that agent's prompt (and, for
    ``critic_type="q"``, its completion)."""


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic reading every agent's prompt (and,
    for ``critic_type="q"``, the joint action), with one value per agent."""
