"""comlrl 1.4.3's config fields that this library names otherwise or does not use, read with
the meaning they had there.

- Renamed fields (:func:`renamed`): 1.4.3's name is accepted, with a one-time FutureWarning,
  and its value moved to the new name (:func:`apply_renamed_fields`); a keyword close to
  1.4.3's name is suggested as the name it became (:func:`current_name`).
- Inert fields (:func:`inert`): fields 1.4.3's MADPO had that did nothing there either:
  accepted with a one-time warning (:func:`warn_inert_fields`), so 1.4.3 configs run unchanged.
- Settings 1.4.3 ignored in some layouts only (:func:`warn_ignored`): a critic's settings where
  the value heads sit on the agents, and the like; the code that knows the layout calls it.
"""

from __future__ import annotations

from dataclasses import Field, field, fields
from typing import Any

from comlrl.utils.caller import warn_once
from comlrl.utils.checks import field_default


def renamed(new_name: str, whose: str = "comlrl 1.4.3's") -> Any:
    """A field that holds comlrl 1.4.3's name of ``new_name`` (or, ``whose`` says, a name its
    docs used): accepted, with a one-time warning, and moved to ``new_name`` by
    :func:`apply_renamed_fields` (then back to None)."""
    return field(default=None, repr=False, metadata={"renamed_to": new_name, "whose": whose})


def current_name(spec: Field) -> str:
    """The name field ``spec``'s value is read under: a :func:`renamed` field's new name, else
    its own; so a keyword close to a 1.4.3 name is suggested as the name it became."""
    return spec.metadata.get("renamed_to", spec.name)


def apply_renamed_fields(config: Any) -> None:
    """Move every value set under an old name (a :func:`renamed` field) to its new name.

    Both names set to different values is an error: which one the user meant is unknowable.
    """
    for spec in fields(config):
        new_name = spec.metadata.get("renamed_to")
        value = getattr(config, spec.name)
        if new_name is None or value is None:
            continue
        current = getattr(config, new_name)
        if current != value and current != field_default(config, new_name):
            raise ValueError(
                f"{spec.name}={value!r} ({spec.metadata['whose']} name for {new_name}) and {new_name}={current!r} "
                f"disagree: set only {new_name}"
            )
        advice = config.renamed_advice(spec.name, value) or f"write {new_name}={value!r}"
        warn_once(
            (type(config).__name__, spec.name),
            f"{type(config).__name__}: {spec.name} is {spec.metadata['whose']} name for {new_name}; {advice}",
            FutureWarning,
        )
        setattr(config, new_name, value)
        setattr(config, spec.name, None)


def inert() -> object:
    """A comlrl 1.4.3 field accepted but that has no effect (it had none in 1.4.3 either):
    any value but None gets a one-time warning (:func:`warn_inert_fields`)."""
    return field(default=None, repr=False, metadata={"inert": True})


def is_inert(spec: Field) -> bool:
    """Whether ``spec`` is an :func:`inert` field, where anything is accepted, as in 1.4.3:
    no check may refuse its value."""
    return bool(spec.metadata.get("inert"))


def warn_inert_fields(config: Any, trainer_name: str) -> None:
    """Warn once for every :func:`inert` field of ``config`` set to something other than None,
    naming ``trainer_name`` and its config (``<trainer_name>Config``), which ignore it."""
    for spec in fields(config):
        value = getattr(config, spec.name)
        if is_inert(spec) and value is not None:
            warn_once(
                (f"{trainer_name}Config", spec.name),
                f"{trainer_name}Config: {spec.name}={value!r} has no effect in {trainer_name} (it had none in "
                "comlrl 1.4.3 either); remove it",
                UserWarning,
            )


def warn_ignored(owner: str, setting: str, message: str) -> None:
    """A setting comlrl 1.4.3 ignored without a word where it is used: accepted, so that its
    scripts run with the meaning they had, with a one-time warning for ``owner`` (a config
    class, or trainer argument's trainer) and ``setting``. ``message`` says why it has no
    effect and what to write instead."""
    warn_once(
        (owner, setting),
        f"{owner}: {message} (comlrl 1.4.3 ignored it without a word, and so does this run)",
        UserWarning,
    )
