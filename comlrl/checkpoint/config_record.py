"""The run's config as a checkpoint stores it: JSON, whatever the config holds.

A config may hold values JSON cannot (a custom logits processor in ``generation_kwargs``, a
tokenizer, a tensor), and saving a checkpoint must never fail because of one. So the record
keeps what JSON can hold, puts a marker (type and repr) in place of anything else, and on
resume tells which of those values the resuming run has to pass again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from comlrl.utils.text import short_repr

MARKER = "__not_json__"
"""The key of the dict that stands in for a value JSON cannot hold."""
_REPR_CHARS = 200
_MISSING = object()
_PLAIN = ((bool, bool), (int, int.__int__), (float, float.__float__), (str, str.__str__))


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _marker(value: Any) -> dict[str, Any]:
    """What a record holds in place of ``value``; its repr is only for a person to read."""
    return {MARKER: {"type": _type_name(value), "repr": short_repr(value, _REPR_CHARS)}}


def _jsonable(value: Any, ancestors: frozenset[int] = frozenset()) -> Any:
    """``value`` if JSON can hold it (tuples as lists), else a marker, at any depth."""
    if value is None:
        return None
    # Subclasses (IntEnum, numpy.float64) become the plain value JSON would write anyway; the
    # base's own method, since a subclass may override __str__ or __float__.
    for base, plain in _PLAIN:
        if isinstance(value, base):
            return value if type(value) is base else plain(value)
    if id(value) in ancestors:  # a container that holds itself
        return _marker(value)
    inner = ancestors | {id(value)}
    # Containers only of the exact types: a subclass (LogitsProcessorList, a namedtuple) carries
    # behaviour JSON would drop. A user's dict keyed like a marker would be read back as one.
    if type(value) in (list, tuple):
        return [_jsonable(item, inner) for item in value]
    if type(value) is dict and all(isinstance(key, str) for key in value) and MARKER not in value:
        return {str.__str__(key): _jsonable(item, inner) for key, item in value.items()}
    return _marker(value)


def config_record(config: Any) -> dict[str, Any]:
    """One JSON-able entry per dataclass field of ``config``, read shallowly (never copied)."""
    record = {}
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        try:
            record[spec.name] = _jsonable(value)
        except RecursionError:  # nested too deep to walk: describe it whole
            record[spec.name] = _marker(value)
    return record


def _is_marker(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(MARKER), dict)


def _markers(value: Any, steps: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(steps from the config to it, type name) of every marker in ``value``."""
    if _is_marker(value):
        yield steps, str(value[MARKER].get("type", "?"))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _markers(item, (*steps, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _markers(item, (*steps, index))


def _path(steps: tuple[str | int, ...]) -> str:
    """``steps`` as Python would address the value from the config: ``generation_kwargs['x']``."""
    return str(steps[0]) + "".join(f"[{step!r}]" for step in steps[1:])


def not_json_values(record: dict[str, Any]) -> dict[str, str]:
    """Path -> type name of every value ``record`` could not store."""
    return {_path(steps): kind for name, value in record.items() for steps, kind in _markers(value, (name,))}


def _lookup(config: Any, steps: tuple[str | int, ...]) -> Any:
    value = getattr(config, str(steps[0]), _MISSING)
    for step in steps[1:]:
        try:
            value = value[step]
        except Exception:  # whatever this run holds there, it is not the stored value's container
            return _MISSING
    return value


def _hint(config: Any, steps: tuple[str | int, ...], kind: str) -> str:
    """The config call that passes the value again, e.g. ``C(generation_kwargs={'x': <a T>})``."""
    value = f"<a {kind.rsplit('.', 1)[-1]}>"
    for step in reversed(steps[1:]):
        value = f"{{{step!r}: {value}}}" if isinstance(step, str) else f"[..., {value}, ...]"
    return f"{type(config).__name__}({steps[0]}={value})"


def check_resumed_config(path: str, record: dict[str, Any], config: Any) -> list[str]:
    """Check that ``config`` holds again every value checkpoint ``path`` could not store in ``record``.

    Each must be of the stored type at the same path, else ``ValueError`` says what to pass.
    Returns one line per value found again, for the caller to print; records without
    markers (older checkpoints) give none.
    """
    notes, problems = [], []
    for name, stored in record.items():
        for steps, kind in _markers(stored, (name,)):
            current = _lookup(config, steps)
            where = f"{_path(steps)} (a {kind})"
            if current is not _MISSING and current is not None and _type_name(current) == kind:
                notes.append(f"{where} was not stored in checkpoint {path}; using this run's")
                continue
            found = "nothing" if current is _MISSING or current is None else f"a {_type_name(current)}"
            problems.append(
                f"{where} could not be stored in checkpoint {path}, and this run's config holds {found} "
                f"there; pass it again: {_hint(config, steps, kind)}"
            )
    if problems:
        raise ValueError("Cannot resume with this config:\n" + "\n".join(problems))
    return notes


KEPT_FROM_CHECKPOINT = {
    "agent_learning_rate": "its optimizer and schedule state hold it",
    "critic_learning_rate": "its optimizer and schedule state hold it",
    "weight_decay": "its optimizer state holds it",
    "seed": "its generator states continue",
}
"""Fields whose checkpointed value stays in effect on resume, and why; every other field of
the resuming run's config applies from the step it resumes at."""


def config_changes(path: str, record: dict[str, Any], config: Any) -> list[str]:
    """One line per field whose value in ``config`` differs from checkpoint ``path``'s
    ``record``, saying which of the two the resumed run uses. Values the record could not
    store are left to :func:`check_resumed_config`."""
    now = config_record(config)
    lines = []
    for name, saved in record.items():
        current = now.get(name, _MISSING)
        if current is _MISSING or current == saved or not_json_values({name: saved}):
            continue
        if name in KEPT_FROM_CHECKPOINT:
            effect = f"the checkpoint's value stays ({KEPT_FROM_CHECKPOINT[name]})"
        else:
            effect = "this run's value applies from here"
        lines.append(
            f"resuming {path} with {name}={short_repr(current, 80)} (checkpoint: {short_repr(saved, 80)}): {effect}"
        )
    return lines
