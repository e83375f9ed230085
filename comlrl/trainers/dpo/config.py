"""Configuration of MADPO: the shared fields plus how preference pairs are made and the DPO
loss's constants, with comlrl 1.4.3's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from comlrl.compat.config_advice import REFERENCE_KL_ON_PAIRS
from comlrl.compat.fields import warn_inert_fields
from comlrl.engine.config import TrainerConfig
from comlrl.engine.config_checks import MAX_COEFFICIENT, check_choice, check_int, check_scalar
from comlrl.trainers.dpo.pairs import PAIR_SELECTIONS
from comlrl.utils.checks import field_default
from comlrl.utils.config_fields import inert

DPO_REFERENCES = ("none", "initial")
"""The DPO loss's reference policy: none (reference-free, comlrl 1.4.3's loss), or the policy
that sampled the pairs."""

COLLABORATION_MODES = ("decentralized", "centralized")
"""How the agents act: one model per agent, or one model writing every agent's part (comlrl 1.4.3's modes)."""

UNUSED_SHARED_FIELDS = {
    "num_generations": "MADPO samples preference_num_candidates candidates per prompt and agent: set that",
}
"""Fields of :class:`TrainerConfig` that MADPO does not use, and why: a value other than the
default is an error (it would otherwise be silently ignored)."""

POLICY_GRADIENT_FIELDS = {
    "beta": "the DPO loss's temperature is dpo_beta, and its reference policy dpo_reference",
    "reference_kl_enabled": REFERENCE_KL_ON_PAIRS,
    "reference_kl_coef": "there are no rewards to shape while training on pairs; for a reference policy in "
    "the DPO loss set dpo_reference='initial'",
    "reference_devices": "MADPO keeps no reference model: dpo_reference='initial' takes the sampling policy's "
    "log-probs once, on the agents",
    "epsilon": "the DPO loss has no ratio to clip",
    "epsilon_high": "the DPO loss has no ratio to clip",
    "entropy_coef": "the DPO loss has no entropy bonus",
    "loss_type": "the DPO loss sums each completion's token log-probs",
    "turn_weighting": "MADPO is single-turn",
    "sampler_ratio_cap": "the DPO loss has no sampling ratio to correct",
    "sampler_correction": "the DPO loss has no sampling ratio to correct",
    "sampler_ratio_floor": "the DPO loss has no sampling ratio to correct",
    "policy_loss": "the DPO loss is a logistic loss of log-prob differences, not a policy-gradient surrogate",
    "importance_sampling_level": "the DPO loss has no importance ratio",
    "delta": "the DPO loss has no ratio to clip",
    "sapo_temperature_pos": "the DPO loss has no ratio to gate",
    "sapo_temperature_neg": "the DPO loss has no ratio to gate",
    "mask_truncated_completions": "MADPO's pairs are ranked by reward, truncated or not",
    "top_entropy_quantile": "the DPO loss sums each completion's token log-probs",
    "overlong_buffer": "MADPO's pairs are ranked by the task reward; put a length penalty in reward_func",
    "overlong_penalty_factor": "MADPO's pairs are ranked by the task reward; put a length penalty in reward_func",
}
"""The policy-gradient trainers' fields (:class:`~comlrl.engine.policy_gradient_config.PolicyGradientConfig`),
which MADPO's config does not have, and why."""


@dataclass
class MADPOConfig(TrainerConfig):
    """Everything that shapes a MADPO run. Every field is checked in ``__post_init__``."""

    reference_page: ClassVar[str] = "docs/reference/preference.md"

    per_device_train_batch_size: int = 2
    """Dataset rows whose candidates are sampled together (one ``generate`` call per agent)
    while pairs are built; also the default of ``train_batch_size``, as comlrl 1.4.3's
    ``rollout_buffer_size`` was."""
    train_batch_size: int | None = None
    """Preference pairs per optimizer step (comlrl 1.4.3's meaning); ``None``:
    ``per_device_train_batch_size``."""

    # --- preference pairs -----------------------------------------------------------------
    preference_num_candidates: int = 80
    """Candidates N sampled per prompt and agent when pairs are built; candidate j is the
    joint action of every agent's sample j (at least 2)."""
    preference_pairs_per_sample: int | None = 16
    """Most pairs kept per prompt, in ``pair_selection`` order (>= 1); ``None`` keeps all."""
    pair_selection: str = "reward_gap"
    """Which pairs a prompt keeps first: ``reward_gap`` (largest reward gap first, equal gaps in
    index order), ``random`` (shuffled, seeded by ``seed``), ``all`` (index order; needs
    ``preference_pairs_per_sample=None``)."""

    # --- the DPO loss ---------------------------------------------------------------------
    dpo_beta: float = 0.1
    """DPO's beta (> 0): the loss is ``-log sigmoid(dpo_beta * joint margin)``."""
    dpo_reference: str = "none"
    """``none``: reference-free, as comlrl 1.4.3 (margin = chosen minus rejected log-prob);
    ``initial``: DPO's reference is the policy that sampled the pairs (its log-probs are taken
    once, when the pairs are built; no model copy is kept)."""
    collaboration_mode: str = "decentralized"
    """``decentralized``: one model per agent; ``centralized``: ONE model writes every role in
    one response (the trainer's ``centralized_comparator_adapter`` joins the prompts and splits
    the response), and ``num_agents`` counts the roles (default 2)."""

    # --- older fields that have no effect here (accepted with a one-time warning) -------------
    use_environment_step: bool | None = inert()
    """comlrl 1.4.3's W&B x-axis switch; here every metric is logged against the optimizer step."""
    environment_steps_per_pair: int | None = inert()
    """comlrl 1.4.3's x-axis increment per pair trained on; no effect (see ``use_environment_step``)."""
    discount: float | None = inert()
    """1.4.3 MAGRPO's discount; no effect in single-turn preference training."""
    advantage_mode: str | None = inert()
    """1.4.3 MAGRPO's baseline; DPO has no advantages."""
    advantage_normalization: bool | None = inert()
    """1.4.3 MAGRPO's advantage scaling; DPO has no advantages."""

    train_batch_size_counts_rows = False  # it counts preference pairs
    unused_shared_fields: ClassVar[dict[str, str]] = UNUSED_SHARED_FIELDS
    """Shared fields this trainer does not use, and why (MARLHF's RL phase uses them)."""
    absent_fields: ClassVar[dict[str, str]] = POLICY_GRADIENT_FIELDS
    trainer_name: ClassVar[str] = "MADPO"
    """The trainer errors about those fields name."""
    pair_selections: ClassVar[dict[str, Any]] = PAIR_SELECTIONS
    """The ``pair_selection`` values this trainer's pairs can be ordered by."""

    def __post_init__(self):
        super().__post_init__()
        check_int(self, "preference_num_candidates", minimum=2)
        check_int(self, "preference_pairs_per_sample", allow_none=True)
        check_choice(self, "pair_selection", self.pair_selections)
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError(
                f"pair_selection='all' keeps every pair, but preference_pairs_per_sample="
                f"{self.preference_pairs_per_sample}: set preference_pairs_per_sample=None, or choose "
                "pair_selection='reward_gap' or 'random' to cap the pairs"
            )
        check_scalar(self.dpo_beta, "dpo_beta", 0, MAX_COEFFICIENT, low_open=True)
        check_choice(self, "dpo_reference", DPO_REFERENCES)
        check_choice(self, "collaboration_mode", COLLABORATION_MODES)
        if self.num_turns != 1:
            raise ValueError(f"MADPO is single-turn: num_turns must be 1, got {self.num_turns}")
        if self.joint_mode != "aligned":
            raise ValueError(
                f"MADPO pairs candidate j of every agent into joint action j: joint_mode must be 'aligned', "
                f"got {self.joint_mode!r}"
            )
        for name, why in self.unused_shared_fields.items():
            value, default = getattr(self, name), field_default(self, name)
            if value != default:
                raise ValueError(
                    f"{name}={value!r} has no effect in {self.trainer_name} ({why}); leave it at {default!r}"
                )
        warn_inert_fields(self, "MADPO")  # the inert fields are MADPO's: its subclasses' warnings name it too

    @property
    def centralized(self) -> bool:
        return self.collaboration_mode == "centralized"

    @property
    def uses_adapter(self) -> bool:
        """Whether a ``centralized_comparator_adapter`` has a joint answer to split."""
        return self.collaboration_mode == "centralized"

    @property
    def pairs_per_step(self) -> int:
        """Preference pairs per optimizer step: ``train_batch_size``, else ``per_device_train_batch_size``."""
        return self.per_device_train_batch_size if self.train_batch_size is None else self.train_batch_size
