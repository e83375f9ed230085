"""A reward function's declared range (comlrl 1.4.3's ``comlrl.utils.set_reward_range`` and
``resolve_reward_range``): the ``reward_range = (minimum, maximum)`` attribute of the
function, which only ``log_reward_distribution=True`` reads (its histograms' bins must be the
same every round, so they cannot follow the values seen).

    content_score.reward_range = (0.0, 1.0)
    set_reward_range(content_score, 0.0, 1.0)   # the same, checked at once
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

RewardFunction = TypeVar("RewardFunction", bound=Callable)


def function_name(reward_func: Callable) -> str:
    """How errors name ``reward_func``."""
    return getattr(reward_func, "__name__", None) or type(reward_func).__name__


def checked_range(declared: Any, name: str) -> tuple[float, float]:
    """``declared`` as ``(minimum, maximum)`` floats; an error naming the reward function
    ``name`` when it is not two finite numbers with minimum < maximum."""
    try:
        ends = tuple(declared)
    except TypeError:  # not a sequence
        ends = ()
    if not (
        len(ends) == 2
        and all(isinstance(end, numbers.Real) and not isinstance(end, bool) and math.isfinite(end) for end in ends)
        and ends[0] < ends[1]
    ):
        raise ValueError(
            f"reward_func {name} has reward_range={declared!r}: it must be (minimum, maximum), two finite numbers "
            f"with minimum < maximum, e.g. {name}.reward_range = (0.0, 1.0)"
        )
    return float(ends[0]), float(ends[1])


def resolve_reward_range(reward_func: Callable) -> tuple[float, float] | None:
    """``reward_func.reward_range`` as ``(minimum, maximum)`` floats, None when it declares
    none; an error naming the function when it is not two finite numbers with minimum < maximum."""
    declared = getattr(reward_func, "reward_range", None)
    return None if declared is None else checked_range(declared, function_name(reward_func))


def set_reward_range(reward_func: RewardFunction, minimum: float, maximum: float) -> RewardFunction:
    """Declare that ``reward_func`` returns values in ``[minimum, maximum]`` (before any
    ``reward_processor``), checked before it is set; returns ``reward_func``."""
    reward_range = checked_range((minimum, maximum), function_name(reward_func))
    try:
        reward_func.reward_range = reward_range
    except AttributeError:
        raise TypeError(
            f"reward_func {function_name(reward_func)} ({type(reward_func).__name__}) takes no attributes, so it "
            "cannot carry reward_range: wrap it in a plain function (def) and declare the range on that"
        ) from None
    return reward_func
