"""The generic checks of a value that the trainers' configs, the tasks and the translations of
comlrl 1.4.3 (:mod:`comlrl.compat`) share: none of them knows a trainer."""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, fields
from typing import Any


def is_real(value: Any) -> bool:
    """A number that is not a bool and not NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def require_int(value: Any, name: str, minimum: int = 1, allow_none: bool = False, note: str = "") -> None:
    """``value`` (called ``name`` in the error) must be an integer >= ``minimum`` (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or None" if allow_none else "") + note
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def field_default(config: Any, name: str) -> Any:
    """The default of the dataclass field ``name`` of ``config``: what a value is compared with
    to know whether the user set it."""
    spec = next(f for f in fields(config) if f.name == name)
    return spec.default_factory() if spec.default is MISSING else spec.default
