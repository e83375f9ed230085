"""What the policy-gradient trainers' configs add to the shared fields
(:class:`~comlrl.engine.config.TrainerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.algorithms import LOSS_AGGREGATIONS, TURN_WEIGHTINGS
from comlrl.engine.config import TrainerConfig
from comlrl.engine.config_checks import (
    MAX_COEFFICIENT,
    check_bool,
    check_choice,
    check_coefficient,
    check_devices,
    check_scalar,
)
from comlrl.utils.checks import is_real


@dataclass
class PolicyGradientConfig(TrainerConfig):
    """What the policy-gradient trainers (the MAGRPO family, IAC and MAAC, MARLHF's RL phase)
    add to the shared fields: the clipped ratio, the KL to a reference, the entropy bonus, the
    loss's token normalisation and the sampler correction."""

    epsilon: float = 0.2
    """Clip range of the ratio: ``[1 - epsilon, 1 + epsilon_high]``."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO's clip-higher); ``None`` uses ``epsilon``."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to a frozen copy of each agent, in the loss (per token, as
    GRPO); 0 creates no reference model for it."""
    reference_kl_enabled: bool = False
    """KL as reward shaping (comlrl 1.4.3's reference KL): each agent's reward of a joint action
    becomes ``r - reference_kl_coef * KL``, KL the sum over its completion's tokens of k3 against
    a frozen copy of the agent, at sampling time; advantages are computed from the shaped rewards."""
    reference_kl_coef: float = 0.1
    """Weight of the shaping KL (only with ``reference_kl_enabled``)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on each agent's token distributions (0: off; above 0 the
    update computes a softmax over the whole vocabulary at every completion token)."""
    loss_type: str = "dapo"
    """Token normalisation of the loss: ``dapo`` (mean over all tokens of the batch, the
    default: no length bias), ``grpo`` (per-sequence mean, then mean), ``dr_grpo`` (sum over
    ``num_sequences * max_new_tokens``)."""
    turn_weighting: str = "episode"
    """How a multi-turn loss weighs its turns: ``episode`` (each turn normalised over its own
    sequences, scaled by the share of its possible nodes played, averaged over turns, as an
    episode's policy gradient) or ``sequence`` (all turns' sequences pooled: wider turns weigh more)."""
    reference_devices: str | list[str] | None = None
    """Where each agent's frozen reference (for ``beta`` and ``reference_kl_enabled``) lives, as
    comlrl 1.4.3 had it: ``None`` beside its agent, or a device of its own to spare the agent's
    memory, read as ``agent_devices`` is (one for all, ``"cpu"`` or ``"cuda:1"``, a list with one
    per agent, or ``"auto"``); its log-probs are computed there. An adapter's reference is its
    own base model, so with LoRA only the agent's device is allowed."""
    sampler_ratio_cap: float | None = 2.0
    """When the sampler is not the learner (``precision="bf16"``): weight each token's
    policy-gradient term by min(pi_learner / pi_sampler, cap), truncated importance sampling
    (``None``: no correction; the log-prob gap is logged either way)."""

    def __post_init__(self):
        super().__post_init__()
        if not (is_real(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {self.epsilon!r}")
        if self.epsilon_high is not None and not (is_real(self.epsilon_high) and self.epsilon_high > 0):
            raise ValueError(f"epsilon_high must be > 0 or None, got {self.epsilon_high!r}")
        for name in ("beta", "entropy_coef", "reference_kl_coef"):
            check_coefficient(self, name)
        check_bool(self, "reference_kl_enabled")
        if self.sampler_ratio_cap is not None:
            why = " or None (no correction)"
            check_scalar(self.sampler_ratio_cap, "sampler_ratio_cap", 1, MAX_COEFFICIENT, why=why)
        check_devices(self, "reference_devices")
        check_choice(self, "loss_type", LOSS_AGGREGATIONS)
        check_choice(self, "turn_weighting", TURN_WEIGHTINGS)
