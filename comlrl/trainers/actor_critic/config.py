"""Configuration of the actor-critic trainers (IAC and MAAC): the shared fields plus GAE,
the PPO updates and the critics."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.trainers.config import (
    TrainerConfig,
    check_bool,
    check_choice,
    check_coefficient,
    check_fraction,
    check_int,
    check_learning_rate,
    is_real,
    renamed,
)

CRITIC_TYPES = ("v", "q")


@dataclass
class ActorCriticConfig(TrainerConfig):
    """Everything that shapes an IAC or MAAC run. Every field is checked in ``__post_init__``."""

    num_train_epochs: int = 40
    """Passes over the training dataset (40, comlrl 1.4.3's IAC and MAAC default)."""
    per_device_train_batch_size: int = 8
    """Dataset rows per training step (8, the original library's actor-critic rollout buffer):
    a critic needs no group of samples, so the batch is made of rows."""
    num_generations: int = 1
    """Completions sampled per prompt and agent: 1 is enough, the critic is the baseline."""
    logging_steps: int = 1
    """Write averaged metrics every this many training steps (1, comlrl 1.4.3's IAC and MAAC default)."""
    critic_learning_rate: float | None = 5e-6
    """AdamW learning rate of the critics (a separate critic's whole model, or a value head);
    ``None``: ``agent_learning_rate`` (as comlrl 1.4.3's IAC)."""
    critic_type: str = "v"
    """``v``: the critic values a node from the prompts, V(h); ``q``: it values each action
    from the prompts and the completions, Q(h, a), and a node's value is the mean over the
    actions sampled there."""
    use_separate_critic: bool | None = None
    """Whether the critics are separate models: ``None`` decides by whether ``critic_model`` /
    ``critics`` is given; True requires one; False (IAC only) forbids one: value heads on the agents."""
    value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in the value heads on the agents' models (IAC without a
    separate critic); ``None``: one linear map."""
    critic_value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in the value head of each separate critic model (IAC's
    ``critic_model`` / ``critics``, MAAC's critic); ``None``: one linear map."""
    critic_devices: str | list[str] | None = None
    """comlrl 1.4.3's critic placement. A critic lives with its agent here (MAAC's with agent 0):
    ``None``, or devices equal to that placement, are accepted; anything else is an error."""
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
    value_loss_coef: float = 0.6
    """Weight of the value loss (matters where the critic shares the agent's model)."""
    advantage_normalization: bool = True
    """Whiten each agent's advantages over its samples of the step (mean 0, std 1); a step
    with one sample per agent (a short last batch) gives it advantage 0."""

    # --- comlrl 1.4.3's names (accepted with a one-time warning) ---------------------------
    discount: float | None = renamed("gamma")
    """comlrl 1.4.3's name of ``gamma``."""

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "critic_type", CRITIC_TYPES)
        check_int(self, "value_head_hidden_dim", allow_none=True)
        check_int(self, "critic_value_head_hidden_dim", allow_none=True)
        check_fraction(self, "gamma")
        check_fraction(self, "gae_lambda")
        check_int(self, "ppo_epochs")
        check_bool(self, "advantage_normalization")
        if self.use_separate_critic is not None:
            check_bool(self, "use_separate_critic")
        self._check_critic_devices()
        self._resolve_critic_learning_rate()
        if self.value_clip_range is not None and not (is_real(self.value_clip_range) and self.value_clip_range > 0):
            raise ValueError(f"value_clip_range must be > 0 or None (off), got {self.value_clip_range!r}")
        check_coefficient(self, "value_loss_coef", positive=True)
        if self.advantage_normalization and self.per_device_train_batch_size * self.num_generations < 2:
            raise ValueError(
                "advantage_normalization needs at least 2 samples per agent and step to whiten: "
                f"per_device_train_batch_size={self.per_device_train_batch_size} x num_generations="
                f"{self.num_generations}; raise one or set advantage_normalization=False"
            )

    def _resolve_critic_learning_rate(self) -> None:
        """``None`` takes ``agent_learning_rate`` (comlrl 1.4.3's IAC meaning), which must then be one number."""
        if self.critic_learning_rate is None:
            if isinstance(self.agent_learning_rate, list | tuple):
                raise ValueError(
                    "critic_learning_rate=None takes agent_learning_rate, which is a list (one per agent) here; "
                    "give critic_learning_rate a number"
                )
            self.critic_learning_rate = self.agent_learning_rate
        check_learning_rate(self.critic_learning_rate, "critic_learning_rate")

    def _check_critic_devices(self) -> None:
        """Only the form: whether the devices equal the critics' placement is known once the
        trainer has placed the agents."""
        devices = self.critic_devices
        listed = isinstance(devices, list | tuple) and devices and all(isinstance(d, str) for d in devices)
        if not (devices is None or isinstance(devices, str) or listed):
            raise ValueError(
                f"critic_devices must be None, 'auto', a device name or a list of device names, got {devices!r}"
            )

    def value_head_width(self, separate: bool) -> int | None:
        """Hidden width of the value heads of the critic layout in use: ``critic_value_head_hidden_dim``
        for separate critic models, ``value_head_hidden_dim`` for heads on the agents. The other
        one set to another value would be ignored (as comlrl 1.4.3 silently did): an error."""
        names = ("critic_value_head_hidden_dim", "value_head_hidden_dim")
        used, unused = names if separate else names[::-1]
        width, other = getattr(self, used), getattr(self, unused)
        if other is not None and other != width:
            layout = "the critics are separate models" if separate else "the value heads sit on the agents' models"
            fix = f"write {used}={other!r}, or drop {unused}" if width is None else f"drop {unused}"
            raise ValueError(f"{unused}={other!r} would be ignored: {layout}, sized by {used}={width!r}; {fix}")
        return width


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: one critic per agent, reading that agent's prompt (and, for
    ``critic_type="q"``, its completion)."""


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic reading every agent's prompt (and,
    for ``critic_type="q"``, the joint action), with one value per agent."""
