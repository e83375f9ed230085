"""comlrl 1.4.3's config fields that this library names otherwise or does not use, read with
the meaning they had there (the mechanism: :mod:`comlrl.utils.config_fields`).

- Renamed fields (``renamed``): 1.4.3's name is accepted, with a one-time FutureWarning that
  calls it 1.4.3's (registered here, in ``LINEAGES``), and its value moved to the new name.
- Inert fields (``inert``): fields 1.4.3's MADPO had that did nothing there either:
  accepted with a one-time warning (:func:`warn_inert_fields`), so 1.4.3 configs run unchanged.
- Settings 1.4.3 ignored in some layouts only (:func:`warn_ignored`): a critic's settings where
  the value heads sit on the agents, and the like; the code that knows the layout calls it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from comlrl.utils.caller import warn_once
from comlrl.utils.config_fields import LINEAGES, is_inert

LINEAGES.update({"original": "comlrl 1.4.3's", "docs": "older comlrl docs'"})


def warn_inert_fields(config: Any, trainer_name: str) -> None:
    """Warn once for every ``inert`` field of ``config`` set to something other than None,
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
