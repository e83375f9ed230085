"""The checks the trainers' configs are built from: each takes a config (or a value and the
name the error gives it) and raises a ValueError or TypeError that names the field, the value
and what is allowed."""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from typing import Any

from comlrl.utils.checks import is_real, require_int
from comlrl.utils.config_fields import current_name, is_inert
from comlrl.utils.text import number_string_error


def check_int(config: Any, name: str, minimum: int = 1, allow_none: bool = False, note: str = "") -> None:
    """``config.<name>`` must be an integer >= ``minimum`` (or None when allowed)."""
    require_int(getattr(config, name), name, minimum, allow_none, note)


def check_fraction(config: Any, name: str) -> None:
    """``config.<name>`` must be a number in [0, 1]."""
    value = getattr(config, name)
    if not (is_real(value) and 0 <= value <= 1):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


PRECISIONS = ("fp32", "bf16")
MAX_LEARNING_RATE = 1.0
"""AdamW moves every weight by about the learning rate per step: above 1 a model is destroyed."""
MAX_COEFFICIENT = 1e3
"""A loss coefficient above this leaves the other terms no weight in the gradient."""
MAX_NEW_TOKENS = 2**20
"""No model has positions (or a KV cache the memory) for more tokens per completion."""


def check_scalar(value: Any, name: str, low: float, high: float, low_open: bool = False, why: str = "") -> None:
    """``value`` (called ``name`` in the error) must be a finite number in [low, high]
    ((low, high] with ``low_open``); ``why`` explains the upper bound."""
    # The type first: comparing a non-number with the bounds would raise a TypeError naming nothing.
    finite = is_real(value) and math.isfinite(value)
    if not (finite and (low < value if low_open else low <= value) and value <= high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a finite number in {interval}{why}, got {value!r}")


def check_learning_rate(value: Any, name: str) -> None:
    """``value`` (called ``name`` in the error) must be an AdamW learning rate in (0, MAX_LEARNING_RATE]."""
    why = " (AdamW moves each weight by about it per step)"
    check_scalar(value, name, 0, MAX_LEARNING_RATE, low_open=True, why=why)


def check_coefficient(config: Any, name: str, positive: bool = False) -> None:
    """``config.<name>``, a loss coefficient, must be finite, >= 0 (> 0 when ``positive``)
    and at most ``MAX_COEFFICIENT``."""
    check_scalar(
        getattr(config, name), name, 0, MAX_COEFFICIENT, low_open=positive, why=" (above it, it swamps the other terms)"
    )


UNIONS = (typing.Union, types.UnionType)
"""What ``typing.get_origin`` gives for ``Optional[int]`` and for ``int | None``."""


class NumericField(typing.NamedTuple):
    """What a numeric config field holds, for the error that refuses a string there."""

    integer: bool
    """Integers only (no ``float`` in the annotation)."""
    optional: bool
    """None is allowed too."""


@functools.cache
def numeric_fields(config_class: type) -> dict[str, NumericField]:
    """The fields of ``config_class`` that hold numbers: annotated ``int`` or ``float`` (alone,
    in a list, or with None) and never ``str``. Inert fields (:func:`~comlrl.utils.config_fields.inert`:
    anything is accepted) are left out."""
    try:
        hints = typing.get_type_hints(config_class)
    except NameError:  # a user's subclass annotated with names its module lacks: its bases' fields still count
        base = config_class.__base__
        return numeric_fields(base) if is_dataclass(base) else {}
    numeric = {}
    for spec in fields(config_class):
        hint = hints[spec.name]
        arms = typing.get_args(hint) if typing.get_origin(hint) in UNIONS else (hint,)
        scalars = {typing.get_args(arm)[0] if typing.get_origin(arm) is list else arm for arm in arms}
        if str not in scalars and scalars & {int, float} and not is_inert(spec):
            numeric[spec.name] = NumericField(float not in scalars, type(None) in scalars)
    return numeric


def refuse_number_strings(config: Any) -> None:
    """No numeric field of ``config`` (nor an entry of a list of numbers) may hold a string,
    as a command line or a YAML file gives numbers: the checks' comparisons would raise a
    ``TypeError`` naming nothing, and a string is not silently converted either (the
    decision recorded in docs/migrating-from-comlrl.md). The error names the field and says
    how to write the number."""
    for name, kind in numeric_fields(type(config)).items():
        value = getattr(config, name)
        if isinstance(value, str):
            raise number_string_error(name, value, kind.integer, kind.optional)
        for i, entry in enumerate(value) if isinstance(value, list | tuple) else ():
            if isinstance(entry, str):
                raise number_string_error(f"{name}[{i}]", entry, kind.integer)


def check_bool(config: Any, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(config, name)!r}")


def check_devices(config: Any, name: str) -> None:
    """``config.<name>`` must be None, a device name or a non-empty list of them; whether each
    names a device this machine has is checked where the models are placed."""
    devices = getattr(config, name)
    listed = isinstance(devices, list | tuple) and devices and all(isinstance(d, str) for d in devices)
    if not (devices is None or isinstance(devices, str) or listed):
        raise ValueError(
            f"{name} must be None, 'auto', a device name or a list of device names (one per model), got {devices!r}"
        )


def check_choice(config: Any, name: str, allowed: Any) -> None:
    if getattr(config, name) not in allowed:
        raise ValueError(f"{name}={getattr(config, name)!r}; expected one of {sorted(allowed)}")


def unknown_fields_error(config_class: type, names: Sequence[str]) -> TypeError:
    """The error for keyword arguments ``names`` that ``config_class`` has no field for: each
    with the closest field's name when one is close (a typo, a dropped prefix), and where the
    fields are documented."""
    known = {spec.name: current_name(spec) for spec in fields(config_class) if spec.init}
    problems = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or [k for k in known if name in k][:1]
        problems.append(f"{name!r}" + (f" (did you mean {known[close[0]]!r}?)" if close else ""))
    return TypeError(
        f"{config_class.__name__} has no field {', '.join(problems)}; its fields, each with a line of doc, are in "
        f"help({config_class.__name__}) and in the API reference ({config_class.reference_page})"
    )
