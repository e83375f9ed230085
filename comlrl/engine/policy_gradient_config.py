"""What the policy-gradient trainers' configs add to the shared fields
(:class:`~comlrl.engine.config.TrainerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.algorithms import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    SAMPLER_CORRECTIONS,
    TURN_WEIGHTINGS,
)
from comlrl.engine.config import TrainerConfig
from comlrl.engine.config_checks import (
    MAX_COEFFICIENT,
    check_bool,
    check_choice,
    check_coefficient,
    check_devices,
    check_int,
    check_scalar,
)
from comlrl.utils.checks import field_default, is_real

TRL_LOSS_TYPES = {
    "cispo": "here the surrogate is policy_loss='cispo', and loss_type the token normalisation "
    "(TRL's cispo normalises as loss_type='dapo')",
    "sapo": "here the surrogate is policy_loss='sapo', and loss_type the token normalisation "
    "(TRL's sapo normalises as loss_type='grpo')",
    "bnpo": "write loss_type='dapo', the mean over the tokens of the batch (of every process: TRL's bnpo "
    "takes it per device)",
}
"""TRL's ``loss_type`` values that name something else here, and what to write instead."""


@dataclass
class PolicyGradientConfig(TrainerConfig):
    """What the policy-gradient trainers (the MAGRPO family, IAC and MAAC, MARLHF's RL phase)
    add to the shared fields: the surrogate and its ratio, the KL to a reference, the entropy
    bonus and quantile, the loss's token normalisation and the sampler correction. The guide
    "Choosing an objective" (docs/guides/objectives.md) compares them."""

    policy_loss: str = "clip"
    """Per-token surrogate: ``clip`` (PPO / GRPO's clipped ratio), ``cispo`` (MiniMax-M1's
    clipped, stop-gradient weight on every token's log-prob: TRL's ``loss_type="cispo"``, whose
    normalisation is ``loss_type="dapo"`` here) or ``sapo`` (a soft gate in place of the clip: TRL's
    ``loss_type="sapo"``, normalised as ``grpo``)."""
    importance_sampling_level: str = "token"
    """The ratio of ``policy_loss``: ``token`` (one per token) or ``sequence`` (GSPO: the
    geometric mean of the sequence's token ratios, one per sequence; as TRL's setting of this name)."""
    epsilon: float = 0.2
    """Clip range of the ratio: ``[1 - epsilon, 1 + epsilon_high]``."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO's clip-higher); ``None`` uses ``epsilon``. With ``cispo`` the
    weight's cap is ``1 + epsilon_high`` (TRL's ``epsilon_high`` for CISPO is the cap itself)."""
    delta: float | None = None
    """Two-sided clipping (``clip`` only): the unclipped ratio is capped at ``delta`` (> 1 +
    epsilon_high), which bounds a negative advantage's loss as the ratio grows (TRL's ``delta``)."""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature on tokens of positive advantage (``sapo`` only)."""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature on tokens of negative advantage (``sapo`` only; larger: a
    negative token's gradient fades faster as its ratio leaves 1)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to a frozen copy of each agent, in the loss (per token, as
    GRPO); 0 creates no reference model for it."""
    reference_kl_enabled: bool = False
    """KL as reward shaping (comlrl 1.4.3's reference KL): each agent's reward of a joint action
    becomes ``r - reference_kl_coef * KL``, KL the sum over its completion's tokens of k3 against
    a frozen copy of the agent, at sampling time; advantages are computed from the shaped rewards."""
    reference_kl_coef: float = 0.1
    """Weight of the shaping KL (only with ``reference_kl_enabled``)."""
    overlong_buffer: int | None = None
    """DAPO's soft overlong punishment as reward shaping: each agent's reward of a joint action
    loses ``overlong_penalty_factor`` times a penalty rising linearly from 0 at
    ``max_new_tokens - overlong_buffer`` generated tokens to 1 at ``max_new_tokens`` (None: off)."""
    overlong_penalty_factor: float = 1.0
    """The overlong penalty of a completion cut at ``max_new_tokens``, in the reward's unit."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus on each agent's token distributions (0: off; above 0 the
    update computes a softmax over the whole vocabulary at every completion token)."""
    loss_type: str = "dapo"
    """Token normalisation of the loss: ``dapo`` (mean over all tokens of the batch, the
    default: no length bias), ``grpo`` (per-sequence mean, then mean), ``dr_grpo`` (sum over
    ``num_sequences * max_new_tokens``). TRL's ``bnpo`` (the mean over each device's tokens) is
    ``dapo`` here, whose mean is over every process's tokens."""
    mask_truncated_completions: bool = False
    """A completion cut at ``max_new_tokens`` without an EOS gets no loss, KL or entropy term and
    no share of the normalisation (TRL's setting of this name); its reward still counts in its
    group's baseline."""
    top_entropy_quantile: float = 1.0
    """In (0, 1]: only this share of each micro-batch's completion tokens, those where the
    policy's entropy is highest, keep their policy-gradient term ("forking tokens"; TRL's
    setting of this name). Below 1 the update computes each token's entropy (a softmax over the
    vocabulary)."""
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
    """When the sampler is not the learner (``precision="bf16"``, the vllm backend): the upper
    bound of the importance weight pi_learner / pi_sampler that corrects each token's
    policy-gradient term (``None``: no correction; the log-prob gap is logged either way)."""
    sampler_correction: str = "token_truncate"
    """How that weight applies: ``token_truncate`` (per token, ``min(w, cap)``),
    ``token_mask`` (per token, ``w`` inside ``[sampler_ratio_floor, cap]``, else 0),
    ``sequence_truncate`` / ``sequence_mask`` (one weight per sequence, the PRODUCT of its
    token weights, as TRL's ``vllm_importance_sampling_mode``; TRL's default is ``sequence_mask``)."""
    sampler_ratio_floor: float = 0.0
    """Lower bound of the ``*_mask`` corrections (TRL's ``vllm_importance_sampling_clip_min``)."""

    def __post_init__(self):
        super().__post_init__()
        if not (is_real(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {self.epsilon!r}")
        if self.epsilon_high is not None and not (is_real(self.epsilon_high) and self.epsilon_high > 0):
            raise ValueError(f"epsilon_high must be > 0 or None, got {self.epsilon_high!r}")
        self._check_objective()
        for name in ("beta", "entropy_coef", "reference_kl_coef"):
            check_coefficient(self, name)
        check_bool(self, "reference_kl_enabled")
        if self.sampler_ratio_cap is not None:
            why = " or None (no correction)"
            check_scalar(self.sampler_ratio_cap, "sampler_ratio_cap", 1, MAX_COEFFICIENT, why=why)
        check_devices(self, "reference_devices")
        if self.loss_type in TRL_LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r} is TRL's: {TRL_LOSS_TYPES[self.loss_type]}")
        check_choice(self, "loss_type", LOSS_AGGREGATIONS)
        check_choice(self, "turn_weighting", TURN_WEIGHTINGS)
        check_bool(self, "mask_truncated_completions")
        self._check_overlong()
        check_scalar(self.top_entropy_quantile, "top_entropy_quantile", 0, 1, low_open=True)
        self._check_sampler_correction()

    def _check_objective(self) -> None:
        check_choice(self, "policy_loss", POLICY_LOSSES)
        check_choice(self, "importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            check_scalar(getattr(self, name), name, 0, MAX_COEFFICIENT, low_open=True)
            if self.policy_loss != "sapo" and getattr(self, name) != field_default(self, name):
                raise ValueError(f"{name} is the temperature of policy_loss='sapo'; policy_loss={self.policy_loss!r}")
        if self.delta is None:
            return
        if self.policy_loss != "clip":
            raise ValueError(
                f"delta caps the unclipped ratio of policy_loss='clip'; policy_loss={self.policy_loss!r} has none"
            )
        upper = 1 + (self.epsilon if self.epsilon_high is None else self.epsilon_high)
        why = " (above 1 + epsilon_high, the clip's upper bound)"
        check_scalar(self.delta, "delta", upper, MAX_COEFFICIENT, low_open=True, why=why)

    def _check_overlong(self) -> None:
        check_coefficient(self, "overlong_penalty_factor")
        if self.overlong_buffer is None:
            if self.overlong_penalty_factor != field_default(self, "overlong_penalty_factor"):
                raise ValueError("overlong_penalty_factor weighs the overlong penalty: set overlong_buffer too")
            return
        check_int(self, "overlong_buffer")
        if self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"overlong_buffer={self.overlong_buffer} is more than max_new_tokens={self.max_new_tokens}: "
                "the penalty would start before the first token"
            )

    def _check_sampler_correction(self) -> None:
        check_choice(self, "sampler_correction", SAMPLER_CORRECTIONS)
        if self.sampler_ratio_cap is None and self.sampler_correction != field_default(self, "sampler_correction"):
            raise ValueError(
                f"sampler_correction={self.sampler_correction!r} needs a sampler_ratio_cap "
                "(None turns the correction off)"
            )
        check_scalar(self.sampler_ratio_floor, "sampler_ratio_floor", 0, 1, why=" (1: the weight of an exact sampler)")
        if self.sampler_ratio_floor and not self.sampler_correction.endswith("_mask"):
            raise ValueError(
                f"sampler_ratio_floor is the lower bound of a *_mask sampler_correction; "
                f"sampler_correction={self.sampler_correction!r} truncates"
            )
