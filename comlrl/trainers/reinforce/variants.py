"""REINFORCE-family variants of MAGRPO: the same trainer, other default baselines.

Each variant only changes ``advantage_mode`` and turns the std normalisation off, so its
advantages are the textbook estimator's (normalising would rescale every group to unit
spread, as GRPO does). Any field can still be set on the config.
"""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.compat.arguments import variant_config
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """Multi-agent REINFORCE (Williams, 1992): no baseline, the advantage is the return."""

    advantage_mode: str = "raw"
    """No baseline."""
    advantage_normalization: bool = False
    """Returns are used as they are."""


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """Multi-agent RLOO (Ahmadian et al., 2024): each sample's baseline is the mean of the
    other G-1 samples of its group."""

    advantage_mode: str = "rloo"
    """Leave-one-out baseline."""
    advantage_normalization: bool = False
    """Advantages are not divided by the group's std."""


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """Multi-agent ReMax-style baseline (Li et al., 2023, with the group's best sample in
    place of the greedy one): only the best sample of a group is not pushed down."""

    advantage_mode: str = "max"
    """Group-max baseline."""
    advantage_normalization: bool = False
    """Advantages are not divided by the group's std."""


class VariantTrainer(MAGRPOTrainer):
    """A variant also takes a plain :class:`MAGRPOConfig`, as comlrl 1.4.3 documented
    (:func:`comlrl.compat.arguments.variant_config`)."""

    @classmethod
    def accept_config(cls, args: MAGRPOConfig | None) -> MAGRPOConfig:
        if type(args) is MAGRPOConfig:
            return variant_config(cls.config_class, cls.__name__, args)
        return super().accept_config(args)


class MAREINFORCETrainer(VariantTrainer):
    """MAGRPO with :class:`MAREINFORCEConfig` defaults."""

    config_class = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


class MARLOOTrainer(VariantTrainer):
    """MAGRPO with :class:`MARLOOConfig` defaults."""

    config_class = MARLOOConfig
    algorithm_name = "MARLOO"


class MAReMaxTrainer(VariantTrainer):
    """MAGRPO with :class:`MAReMaxConfig` defaults."""

    config_class = MAReMaxConfig
    algorithm_name = "MAReMax"
