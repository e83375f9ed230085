"""Config fields kept for the names and spellings users wrote before: a field that holds an
old name of another (:func:`renamed`), one accepted that does nothing (:func:`inert`), and
values spelled otherwise (:func:`respell`). The words for where an old name comes from are
registered by who knows them (``LINEAGES``; :mod:`comlrl.compat.fields` registers the
original library's), so these stay free of any one history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, field, fields
from typing import Any

from comlrl.utils.caller import warn_once
from comlrl.utils.checks import field_default

LINEAGES: dict[str, str] = {}
"""How a warning names where an old field name comes from, by lineage (``"original"``: the
original library's names; ``"docs"``: names its docs used), e.g. ``"<library> x.y's"``."""


def renamed(new_name: str, lineage: str = "original") -> Any:
    """A field that holds an old name (of ``lineage``) of ``new_name``: accepted, with a one-time
    warning, and moved to ``new_name`` by :func:`apply_renamed_fields` (then back to None)."""
    return field(default=None, repr=False, metadata={"renamed_to": new_name, "lineage": lineage})


def current_name(spec: Field) -> str:
    """The name field ``spec``'s value is read under: a :func:`renamed` field's new name, else
    its own; so a keyword close to an old name is suggested as the name it became."""
    return spec.metadata.get("renamed_to", spec.name)


def apply_renamed_fields(config: Any) -> None:
    """Move every value ``config`` holds under an old name (a :func:`renamed` field) to its new
    name, with a one-time FutureWarning that says what to write (``config.renamed_advice``).

    Both names set to different values is an error: which one the user meant is unknowable.
    """
    for spec in fields(config):
        new_name = spec.metadata.get("renamed_to")
        value = getattr(config, spec.name)
        if new_name is None or value is None:
            continue
        whose = LINEAGES.get(spec.metadata["lineage"], "an older")
        current = getattr(config, new_name)
        if current != value and current != field_default(config, new_name):
            raise ValueError(
                f"{spec.name}={value!r} ({whose} name for {new_name}) and {new_name}={current!r} disagree: "
                f"set only {new_name}"
            )
        advice = config.renamed_advice(spec.name, value) or f"write {new_name}={value!r}"
        warn_once(
            (type(config).__name__, spec.name),
            f"{type(config).__name__}: {spec.name} is {whose} name for {new_name}; {advice}",
            FutureWarning,
        )
        setattr(config, new_name, value)
        setattr(config, spec.name, None)


def inert() -> object:
    """A field accepted but that has no effect (it had none where it comes from either): any
    value but None gets a one-time warning from the config that declares it."""
    return field(default=None, repr=False, metadata={"inert": True})


def is_inert(spec: Field) -> bool:
    """Whether ``spec`` is an :func:`inert` field, where anything is accepted: no check may
    refuse its value."""
    return bool(spec.metadata.get("inert"))


def respell(config: Any, name: str, spellings: Mapping[str | None, str], strip: bool = False) -> None:
    """Replace ``config.<name>`` by the value it means when it is one of the ``spellings``: a
    string looked up in lower case (and, with ``strip``, without the blanks around it), or None
    where None was read as a default. Anything else, a non-string too, is left as written, for
    the check of the field's choices to name."""
    value = getattr(config, name)
    if isinstance(value, str):
        key = (value.strip() if strip else value).lower()
    elif value is None:
        key = None
    else:
        return
    setattr(config, name, spellings.get(key, value))
