"""Configuration of the MAGRPO trainer: the shared fields plus the group-relative objective."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from comlrl.algorithms import BASELINES
from comlrl.compat.config_advice import discount_meaning
from comlrl.engine.config_checks import check_bool, check_choice, check_fraction, check_int
from comlrl.engine.policy_gradient_config import PolicyGradientConfig
from comlrl.utils.caller import warn_once
from comlrl.utils.checks import field_default, is_real

SCALE_REWARDS = ("group", "batch")
"""Whose reward std normalised advantages are divided by."""

MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
"""With several reward functions: normalise their weighted sum, or each one before summing (GDPO)."""


@dataclass
class MAGRPOConfig(PolicyGradientConfig):
    """Everything that shapes a MAGRPO run. Every field is checked in ``__post_init__``."""

    reference_page: ClassVar[str] = "docs/reference/reinforce.md"

    discount: float = 1.0
    """Weight in [0, 1] of the next turn: a joint action's return is its reward plus
    ``discount`` times the mean return of the joint actions of the branch it started.
    comlrl 1.4.3 ignored it: below 1 with several turns, a one-time warning says so."""
    advantage_mode: str = "mean"
    """Group baseline: ``mean`` (GRPO), ``rloo`` (leave-one-out), ``max`` (ReMax-style), ``raw`` (none)."""
    advantage_normalization: bool = True
    """Divide advantages by the group's reward std (never re-centres)."""
    scale_rewards: str = "group"
    """With ``advantage_normalization``, whose std the advantages are divided by: each group's
    (``group``) or the whole step's, per agent and turn over every process (``batch``), as TRL's
    setting of this name; TRL's ``none`` is ``advantage_normalization=False`` here."""
    advantage_std_floor: float = 1e-2
    """Normalisation divides by ``max(group std, this)``, in the reward's unit: scale-up at most ``1 / this``."""
    num_iterations: int = 1
    """Optimisation passes (one optimizer step each) over every rollout; above 1 the PPO-style
    clipped ratio against the sampling-time log-probs keeps the policy near the sampler."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """With several reward functions, as TRL's setting of this name: ``sum_then_normalize``
    (the weighted sum's returns get the group baseline and std) or ``normalize_then_sum``
    (GDPO: each function's returns get their own group baseline and std, and the weighted sum
    of those is divided by its std over the step)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a row whose every group (each agent's, at each node of the
    row's tree) has the same return in all its samples teaches nothing; it is dropped and the
    batch refilled with rows drawn from the training set (:mod:`comlrl.rollout.dynamic_sampling`)."""
    max_resample_rounds: int = 3
    """Refill rounds per step at most with ``dynamic_sampling``; rows still flat after them are
    trained on (their advantages are zero) and a warning says so."""

    def __post_init__(self):
        super().__post_init__()
        check_fraction(self, "discount")
        if self.discount != 1 and self.num_turns > 1:
            warn_once(
                (type(self).__name__, "discount"),
                discount_meaning(type(self).__name__, self.discount),
                UserWarning,
            )
        if isinstance(self.advantage_mode, str):  # any letter case, as the original library took
            self.advantage_mode = self.advantage_mode.lower()
        check_choice(self, "advantage_mode", BASELINES)
        check_bool(self, "advantage_normalization")
        if self.scale_rewards in ("none", False):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is TRL's: write advantage_normalization=False (no std scaling)"
            )
        check_choice(self, "scale_rewards", SCALE_REWARDS)
        if self.scale_rewards != "group" and not self.advantage_normalization:
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} chooses the std that advantage_normalization divides by; "
                "advantage_normalization is False"
            )
        floor = self.advantage_std_floor
        if not (is_real(floor) and math.isfinite(floor) and floor > 0):
            raise ValueError(f"advantage_std_floor must be a finite number > 0 (reward units), got {floor!r}")
        check_int(self, "num_iterations")
        check_choice(self, "multi_objective_aggregation", MULTI_OBJECTIVE_AGGREGATIONS)
        check_bool(self, "dynamic_sampling")
        check_int(self, "max_resample_rounds")
        if self.dynamic_sampling and self.advantage_mode == "raw":
            raise ValueError(
                "dynamic_sampling=True drops rows whose groups' returns are all equal because a group "
                "baseline gives them zero advantage; advantage_mode='raw' has no baseline. Use another "
                "advantage_mode, or dynamic_sampling=False"
            )
        if not self.dynamic_sampling and self.max_resample_rounds != field_default(self, "max_resample_rounds"):
            raise ValueError(
                f"max_resample_rounds={self.max_resample_rounds} bounds dynamic sampling's refill rounds; "
                "set dynamic_sampling=True too"
            )
        needs_group = self.advantage_mode != "raw" or self.advantage_normalization
        if needs_group and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 with advantage_mode={self.advantage_mode!r} and "
                f"advantage_normalization={self.advantage_normalization} (a group of one has no "
                f"baseline or std), got {self.num_generations}"
            )
        self._check_aggregation()

    def _check_aggregation(self) -> None:
        """``normalize_then_sum`` (GDPO) only where each function's group normalisation means what
        it says; the reward processor and the number of functions are checked when the trainer
        knows its reward (:class:`~comlrl.trainers.reinforce.objective.GroupAdvantages`)."""
        if self.multi_objective_aggregation != "normalize_then_sum":
            return
        gdpo = "multi_objective_aggregation='normalize_then_sum' (GDPO)"
        if not self.advantage_normalization:
            raise ValueError(
                f"{gdpo} divides each reward function's group advantages by that group's std; "
                "advantage_normalization=False turns the division off: set advantage_normalization=True, "
                "or multi_objective_aggregation='sum_then_normalize'"
            )
        if self.advantage_mode == "raw":
            raise ValueError(
                f"{gdpo} centres each reward function's returns on its group baseline before scaling; "
                "advantage_mode='raw' has no baseline: choose 'mean', 'rloo' or 'max'"
            )
        if self.scale_rewards != field_default(self, "scale_rewards"):
            raise ValueError(
                f"{gdpo} divides each function's advantages by its group's std, then always divides their "
                f"weighted sum by the whole step's std; scale_rewards={self.scale_rewards!r} would say each "
                f"function is scaled by the step's std, which it is not: leave scale_rewards="
                f"{field_default(self, 'scale_rewards')!r}"
            )
        shaping = [
            name
            for name, on in (
                ("reference_kl_enabled", self.reference_kl_enabled),
                ("overlong_buffer", self.overlong_buffer is not None),
            )
            if on
        ]
        if shaping:
            raise ValueError(
                f"{gdpo} takes each reward function's own values; the penalties of {' and '.join(shaping)} "
                "change only the summed reward, so they would not reach the advantages: drop "
                f"{' and '.join(shaping)}, or use multi_objective_aggregation='sum_then_normalize'"
            )
