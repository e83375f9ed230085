"""What a call of a reward function is made of, shared by :mod:`comlrl.rewards.joint_reward`
(one call with all the joint actions of a turn) and :mod:`comlrl.compat.rewards` (one call per
joint action): both import these from here, so neither imports the other's module to get them."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from torch import Tensor


@dataclass(frozen=True)
class JointActions:
    """K joint actions to score and what a reward function may be given about them."""

    completions: list[list[str]]
    """``[agent][k]`` agent's part of joint action k."""
    row_ids: list[int]
    """K dataset row indices, to name culprits in errors."""
    keywords: dict[str, object]
    """Values of ``REWARD_KEYWORDS`` and ``REWARD_CONTEXT`` names, by name (``prompts`` is
    always there: it may also go first positionally)."""


class RewardFunctionError(RuntimeError):
    """A reward function raised: the error names it, the call and the joint action."""


def real_number(value: object) -> float | None:
    """``value`` as a float when it is one real number (0-d tensors and arrays included), else None."""
    if isinstance(value, Tensor | np.ndarray):
        if value.ndim != 0:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def plural(count: int, word: str) -> str:
    """``count`` and ``word``, with an ``s`` unless the count is one: messages count values."""
    return f"{count} {word}{'' if count == 1 else 's'}"
