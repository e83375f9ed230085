"""Configuration of the actor-critic trainers (IAC and MAAC): the shared fields plus GAE,
the PPO updates and the critics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from comlrl.compat.config_advice import actor_critic_renamed_advice, heads_learning_rate_message
from comlrl.compat.fields import warn_ignored
from comlrl.compat.spellings import CRITIC_TYPE_SPELLINGS
from comlrl.engine.config_checks import (
    check_bool,
    check_choice,
    check_coefficient,
    check_devices,
    check_fraction,
    check_int,
    check_learning_rate,
)
from comlrl.engine.policy_gradient_config import PolicyGradientConfig
from comlrl.utils.checks import field_default, is_real
from comlrl.utils.config_fields import renamed, respell

CRITIC_TYPES = ("v", "q")


@dataclass
class ActorCriticConfig(PolicyGradientConfig):
    """Everything that shapes an IAC or MAAC run. Every field is checked in ``__post_init__``."""

    reference_page: ClassVar[str] = "docs/reference/actor-critic.md"

    num_train_epochs: int = 40
    """Passes over the training dataset (40, comlrl 1.4.3's IAC and MAAC default)."""
    per_device_train_batch_size: int = 8
    """Dataset rows per training step (8): a critic needs no group of samples, so the batch is
    made of rows. comlrl 1.4.3's ``rollout_buffer_size`` (8) counted samples per agent, which
    are rows only with one generation and one turn."""
    num_generations: int = 1
    """Completions sampled per prompt and agent: 1 is enough, the critic is the baseline."""
    logging_steps: int = 1
    """Write averaged metrics every this many training steps (1, comlrl 1.4.3's IAC and MAAC default)."""
    critic_learning_rate: float | None = 5e-6
    """AdamW learning rate of the separate critic models (and their value heads); ``None``:
    ``agent_learning_rate`` (as comlrl 1.4.3's IAC). Value heads on the agents train at their
    agent's rate and schedule, as 1.4.3 trained them in the agent's optimizer: another rate than
    the default or ``agent_learning_rate`` does nothing there, said by a one-time warning with
    ``use_separate_critic=False`` (1.4.3 ignored it so) and an error without it."""
    critic_type: str = "v"
    """``v``: the critic values a node from the prompts, V(h); ``q``: it values each action
    from the prompts and the completions, Q(h, a), and a node's value is the mean over the
    actions sampled there. comlrl 1.4.3's spellings are read as it read them: any letter case
    (``"Q"``), and ``None`` for ``v``."""
    use_separate_critic: bool | None = None
    """Whether the critics are separate models: ``None`` decides by whether ``critic_model`` /
    ``critics`` is given; True requires one; False (IAC only) forbids one: value heads on the agents."""
    value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in the value heads on the agents' models (IAC without a
    separate critic); ``None``: one linear map. With IAC's separate critics it has no effect
    (a one-time warning; comlrl 1.4.3 ignored it so)."""
    critic_value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in the value head of each separate critic model (IAC's
    ``critic_model`` / ``critics``, MAAC's critic); ``None``: one linear map. With IAC's
    ``use_separate_critic=False`` it has no effect (a one-time warning, as 1.4.3 ignored it)."""
    critic_devices: str | list[str] | None = None
    """comlrl 1.4.3's critic placement. A critic lives with its agent here (MAAC's with agent 0):
    ``None``, or devices equal to that placement, are accepted; anything else is an error,
    except for value heads on the agents, where 1.4.3 ignored it too (a one-time warning)."""
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
    """Weight of the value loss ``(v - G)^2`` (no factor 1/2, as comlrl 1.4.3); it matters
    where the critic shares the agent's model."""
    advantage_normalization: bool = True
    """Whiten each agent's advantages over its samples of the step, all turns together: minus
    their mean, divided by their population std (floored at 1e-6), as comlrl 1.4.3 did per
    turn. A step with one sample per agent (a short last batch) keeps its advantage ``r - V``,
    as in 1.4.3."""

    # --- older names (accepted with a one-time warning) ---------------------------------------
    discount: float | None = renamed("gamma")
    """comlrl 1.4.3's name of ``gamma``."""
    critic_model_name_or_path: str | None = None
    """The name comlrl's older docs gave the trainer's ``critic_model`` argument, as a config
    field (1.4.3 itself refused it): a folder or hub id of the separate critic, used as
    ``critic_model``, with a one-time warning; write ``critic_model=`` in the trainer call."""

    def __post_init__(self):
        super().__post_init__()
        respell(self, "critic_type", CRITIC_TYPE_SPELLINGS)
        check_choice(self, "critic_type", CRITIC_TYPES)
        check_int(self, "value_head_hidden_dim", allow_none=True)
        check_int(self, "critic_value_head_hidden_dim", allow_none=True)
        check_fraction(self, "gamma")
        check_fraction(self, "gae_lambda")
        check_int(self, "ppo_epochs")
        check_bool(self, "advantage_normalization")
        if self.use_separate_critic is not None:
            check_bool(self, "use_separate_critic")
        check_devices(self, "critic_devices")  # the form; the placement is checked once the agents are placed
        self._resolve_critic_learning_rate()
        if self.value_clip_range is not None and not (is_real(self.value_clip_range) and self.value_clip_range > 0):
            raise ValueError(f"value_clip_range must be > 0 or None (off), got {self.value_clip_range!r}")
        check_coefficient(self, "value_loss_coef", positive=True)
        if self.use_separate_critic is False:
            self.check_heads_learning_rate("use_separate_critic=False", as_in_original=True)
        if self.critic_model_name_or_path is not None and not isinstance(self.critic_model_name_or_path, str):
            raise ValueError(
                "critic_model_name_or_path must be a folder or hub id (a string), got "
                f"{type(self.critic_model_name_or_path).__name__}; pass a model as the trainer's critic_model="
            )

    def renamed_advice(self, old_name: str, value: object) -> str | None:
        """What the warning for an old field name tells the user to write where the plain
        rename would change its meaning (:func:`~comlrl.compat.config_advice.actor_critic_renamed_advice`)."""
        return actor_critic_renamed_advice(
            old_name, value, self.gae_lambda, self.num_generations, self.num_turns, self.train_batch_size
        )

    def _resolve_critic_learning_rate(self) -> None:
        """``None`` takes ``agent_learning_rate`` (comlrl 1.4.3's IAC meaning). A list of rates
        (one per agent) stays ``None``: value heads on the agents take their agent's rate, and
        separate critics need a number, which :meth:`separate_critic_learning_rate` asks for."""
        if self.critic_learning_rate is None:
            if not isinstance(self.agent_learning_rate, list | tuple):
                self.critic_learning_rate = self.agent_learning_rate
            elif self.use_separate_critic:
                self.separate_critic_learning_rate()
            return
        check_learning_rate(self.critic_learning_rate, "critic_learning_rate")

    def separate_critic_learning_rate(self) -> float:
        """The learning rate of separate critic models: a number, which ``None`` with one rate
        per agent does not give."""
        if self.critic_learning_rate is None:
            raise ValueError(
                "critic_learning_rate=None takes agent_learning_rate, which is a list (one per agent) here; "
                "give critic_learning_rate a number for the separate critics"
            )
        return self.critic_learning_rate

    def check_heads_learning_rate(self, layout: str, as_in_original: bool) -> None:
        """Value heads on the agents train with their agent, at ``agent_learning_rate`` (comlrl
        1.4.3 put them in the agent's optimizer): another rate there does nothing. In the layout
        where 1.4.3 ignored it so (``as_in_original``: ``use_separate_critic=False``), a one-time
        warning; else an error. ``layout`` says why the heads are on the agents."""
        rate = self.critic_learning_rate
        if rate is None or rate in (field_default(self, "critic_learning_rate"), self.agent_learning_rate):
            return
        message = heads_learning_rate_message(rate, layout)
        if not as_in_original:
            raise ValueError(message)
        warn_ignored(type(self).__name__, "critic_learning_rate", message)

    def value_head_width(self, separate: bool, as_in_original: bool = False) -> int | None:
        """Hidden width of the value heads of the critic layout in use: ``critic_value_head_hidden_dim``
        for separate critic models, ``value_head_hidden_dim`` for heads on the agents. The other
        one set to another value does nothing: in a layout where comlrl 1.4.3 had both fields
        and ignored it so (``as_in_original``: IAC's), a one-time warning; else an error."""
        names = ("critic_value_head_hidden_dim", "value_head_hidden_dim")
        used, unused = names if separate else names[::-1]
        width, other = getattr(self, used), getattr(self, unused)
        if other is not None and other != width:
            layout = "the critics are separate models" if separate else "the value heads sit on the agents' models"
            fix = f"write {used}={other!r}, or drop {unused}" if width is None else f"drop {unused}"
            if not as_in_original:
                raise ValueError(f"{unused}={other!r} would be ignored: {layout}, sized by {used}={width!r}; {fix}")
            warn_ignored(
                type(self).__name__,
                unused,
                f"{unused}={other!r} has no effect: {layout}, sized by {used}={width!r}; {fix}",
            )
        return width


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: one critic per agent, reading that agent's prompt (and, for
    ``critic_type="q"``, its completion)."""


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic reading every agent's prompt (and,
    for ``critic_type="q"``, the joint action), with one value per agent."""
