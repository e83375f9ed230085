"""REINFORCE-family variants of MAGRPO: the same trainer, other default baselines.

Each variant only changes ``advantage_mode`` and turns the std normalisation off, so its
advantages are the textbook estimator's (normalising would rescale every group to unit
spread, as GRPO does). Any field can still be set on the config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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
    """A variant also takes a plain :class:`MAGRPOConfig`, as comlrl 1.4.3 documented: the
    variant's ``advantage_mode`` replaces the config's default ``"mean"``; every other field
    is kept as given (``advantage_normalization`` included)."""

    @classmethod
    def accept_config(cls, args: MAGRPOConfig | None) -> MAGRPOConfig:
        if type(args) is not MAGRPOConfig:
            return super().accept_config(args)
        mode = cls.config_class.advantage_mode
        if args.advantage_mode not in ("mean", mode):
            raise ValueError(
                f"{cls.__name__} uses advantage_mode={mode!r}, but its MAGRPOConfig says "
                f"advantage_mode={args.advantage_mode!r}: use MAGRPOTrainer for that baseline, "
                f"or a {cls.config_class.__name__}"
            )
        values = {spec.name: getattr(args, spec.name) for spec in fields(args) if spec.init}
        return cls.config_class(**{**values, "advantage_mode": mode})


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
