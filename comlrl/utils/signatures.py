"""What a user's callable is named and which arguments its signature takes.

The library calls the user's callables (reward functions, formatters, transitions, loggers)
with only the keyword arguments they name, and names them in its errors and metrics; both
are read here, from the callable itself.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable, Sequence


def describe(func: Callable) -> str:
    """A readable name for a callable, ``partial`` objects included."""
    if isinstance(func, functools.partial):
        return f"partial({describe(func.func)})"
    return getattr(func, "__name__", None) or repr(func)


def signature_parameters(func: Callable) -> list[inspect.Parameter] | None:
    """``func``'s parameters, or None for builtins and C callables without a signature."""
    try:
        return list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None


def keyword_arguments(func: Callable, names: Sequence[str], if_any_keyword: Sequence[str] = ()) -> tuple[str, ...]:
    """The ``names`` that ``func`` takes by keyword, in the order of ``names``; a function that
    takes ``**kwargs`` (or whose signature cannot be read) also gets ``if_any_keyword``."""
    params = signature_parameters(func)
    named = {p.name for p in params or [] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if params is None or any(p.kind == p.VAR_KEYWORD for p in params):
        named |= set(if_any_keyword)
    return tuple(name for name in names if name in named)


def unique_names(names: Sequence[str]) -> list[str]:
    """``names`` made unique: every name that occurs more than once gets ``_1``, ``_2``... by position."""
    counts = Counter(names)
    taken = {name for name in names if counts[name] == 1}
    suffix: Counter[str] = Counter()
    out = []
    for name in names:
        if counts[name] > 1:
            while True:  # skip a suffixed name another function already has, e.g. [f, f, f_1]
                suffix[name] += 1
                candidate = f"{name}_{suffix[name]}"
                if candidate not in taken:
                    break
            name = candidate
            taken.add(name)
        out.append(name)
    return out
