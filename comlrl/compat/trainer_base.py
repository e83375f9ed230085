"""comlrl 1.4.3's ``ActorCriticTrainerBase``: the abstract base of its IAC and MAAC trainers,
whose hooks (``_collect_rollouts``, ``_update``, ``_ac_step``, ...) this library does not have.
It stays a name to test against, ``isinstance(trainer, ActorCriticTrainerBase)`` holding for our
IAC and MAAC trainers (registered by :mod:`comlrl.trainers.actor_critic`); subclassing it or
making one is an error that names what to write instead, since its hooks would never be called.
"""

from __future__ import annotations

import abc
from typing import Any, NoReturn

_INSTEAD = (
    "comlrl 1.4.3's ActorCriticTrainerBase hooks (_collect_rollouts, _update, _ac_step) do not exist here: "
    "use IACTrainer or MAACTrainer (comlrl.trainers.actor_critic), or subclass ActorCriticTrainer, whose "
    "steps are its objective's (comlrl.trainers.actor_critic.objective.ActorCritic)"
)


class ActorCriticTrainerBase(abc.ABC):  # noqa: B024 (no hooks: registered trainers only)
    """comlrl 1.4.3's actor-critic base class: only ``isinstance`` checks work (see the module)."""

    def __init_subclass__(cls, **kwargs: Any) -> NoReturn:
        raise TypeError(f"class {cls.__name__} subclasses ActorCriticTrainerBase: {_INSTEAD}")

    def __new__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"ActorCriticTrainerBase cannot be made: {_INSTEAD}")
