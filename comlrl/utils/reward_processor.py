"""Reward processors: functions ``float -> float`` applied to each joint reward before
advantages are computed.

    RewardProcessors.scale(factor=100.0)
    RewardProcessors.compose(RewardProcessors.shift(-0.5), RewardProcessors.scale(2.0))

Note that with ``advantage_normalization=True`` a positive scale (and, for the
``mean``/``rloo``/``max`` baselines, any shift) cancels out of the advantages.
"""

from __future__ import annotations

from collections.abc import Callable

RewardProcessor = Callable[[float], float]


class _Processor:
    """A named processor, so errors and logs can say which one misbehaved."""

    def __init__(self, name: str, fn: RewardProcessor):
        self._name = name
        self._fn = fn

    def __call__(self, reward: float) -> float:
        return self._fn(reward)

    def __repr__(self) -> str:
        return self._name


class RewardProcessors:
    """Factories of reward processors."""

    @staticmethod
    def identity() -> RewardProcessor:
        """Leaves the reward unchanged."""
        return _Processor("identity()", lambda r: r)

    @staticmethod
    def scale(factor: float = 1.0) -> RewardProcessor:
        """Multiplies the reward by ``factor``."""
        factor = float(factor)
        return _Processor(f"scale(factor={factor})", lambda r: r * factor)

    @staticmethod
    def shift(value: float = 0.0) -> RewardProcessor:
        """Adds ``value`` to the reward."""
        value = float(value)
        return _Processor(f"shift(value={value})", lambda r: r + value)

    @staticmethod
    def clamp(min_value: float | None = None, max_value: float | None = None) -> RewardProcessor:
        """Limits the reward to ``[min_value, max_value]`` (either bound may be None)."""
        if min_value is not None and max_value is not None and min_value > max_value:
            raise ValueError(f"clamp: min_value ({min_value}) must be <= max_value ({max_value})")

        def clamp(r: float) -> float:
            if min_value is not None:
                r = max(r, min_value)
            if max_value is not None:
                r = min(r, max_value)
            return r

        return _Processor(f"clamp(min_value={min_value}, max_value={max_value})", clamp)

    @staticmethod
    def compose(*processors: RewardProcessor) -> RewardProcessor:
        """Applies ``processors`` left to right: ``compose(f, g)(r) == g(f(r))``."""
        for position, p in enumerate(processors):
            if not callable(p):
                raise TypeError(f"compose: processor {position} is not callable ({p!r})")

        def composed(r: float) -> float:
            for p in processors:
                r = p(r)
            return r

        name = "compose(" + ", ".join(repr(p) for p in processors) + ")"
        return _Processor(name, composed)
