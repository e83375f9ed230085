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
from comlrl.utils.checks import is_real

SCALE_REWARDS = ("group", "batch")
"""Whose reward std normalised advantages are divided by."""


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
        needs_group = self.advantage_mode != "raw" or self.advantage_normalization
        if needs_group and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 with advantage_mode={self.advantage_mode!r} and "
                f"advantage_normalization={self.advantage_normalization} (a group of one has no "
                f"baseline or std), got {self.num_generations}"
            )
