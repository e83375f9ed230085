"""How the engine calls one reward function, and the one way it scores one.

:class:`BatchCall` is the engine's one calling convention: a function called once with all
the K joint actions of a turn (``reward_call="batch"``) and what it returns checked into
``(K, N)`` rewards. :class:`~comlrl.rewards.JointReward` scores every function through a
:class:`Scorer`: a ``BatchCall`` itself, or, for the other values of ``reward_call``
(``auto``, ``per_joint_action``: comlrl 1.4.3's one call per joint action), the scorer that
:mod:`comlrl.compat.rewards` builds around the function's ``BatchCall`` and installs here
with :func:`register_reward_call` (when ``comlrl`` is imported). The engine imports nothing
of ``compat/``: ``compat/`` translates those calls into this convention with the public names
below.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from comlrl.utils.text import short_repr


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


# How many distinct dataset rows an error lists before "...": a batch can hold hundreds.
_ROWS_SHOWN = 10


def where(row_ids: Sequence[int], k: int | None = None, agent: int | None = None) -> str:
    """How errors name joint action ``k`` and its dataset row (and ``agent``'s part of it); with
    ``k`` None, all the joint actions of one call and their distinct dataset rows."""
    if k is None and len(row_ids) == 1:
        k = 0
    if k is None:
        rows = list(dict.fromkeys(row_ids))  # a row's G samples share it: name it once
        shown = ", ".join(str(row) for row in rows[:_ROWS_SHOWN]) + (", ..." if len(rows) > _ROWS_SHOWN else "")
        return f"joint actions 0-{len(row_ids) - 1} (dataset row{'' if len(rows) == 1 else 's'} {shown})"
    named = f"joint action {k} (dataset row {row_ids[k]})"
    return named if agent is None else f"{named}, agent {agent}"


def checked_number(value: object, source: str, at: str) -> float:
    """``value``, which ``source`` returned for ``at`` (a :func:`where`), as a finite float;
    anything else is an error that names them."""
    number = real_number(value)
    if number is None:
        raise TypeError(f"{source} returned {value!r} ({type(value).__name__}) for {at}; expected a real number")
    if not math.isfinite(number):
        raise ValueError(f"{source} returned {number} for {at}; rewards must be finite")
    return number


def to_float32(rows: list[list[float]], shape: tuple[int, int], row_ids: Sequence[int], source: str) -> Tensor:
    """``rows`` that ``source`` gave as a float32 tensor; a finite value too large for float32
    is an error, not inf."""
    out = torch.tensor(rows, dtype=torch.float32).reshape(shape)
    bad = torch.nonzero(~torch.isfinite(out)).tolist()
    if bad:
        k, i = bad[0]
        raise ValueError(f"{source} returned {rows[k][i]} for {where(row_ids, k, i)}; rewards must fit in float32")
    return out


ERROR_HINTS: list[Callable[[int], str]] = []
"""What a batch call's error adds, from the count of joint actions of the call: registered by
who knows another way the function may have been meant to be called
(:mod:`comlrl.compat.rewards`: comlrl 1.4.3's one call per joint action)."""


def error_hint(count: int) -> str:
    """Every registered hint for a failed batch call of ``count`` joint actions."""
    return "".join(hint(count) for hint in ERROR_HINTS)


def _is_vector(value: object) -> bool:
    if isinstance(value, Tensor | np.ndarray):
        return value.ndim >= 1
    return isinstance(value, list | tuple)


@dataclass(frozen=True)
class BatchCall:
    """One reward function called the engine's way: once with K joint actions, its return
    checked into ``(K, N)`` rewards. A :class:`Scorer` (``reward_call`` ``"batch"``)."""

    func: Callable
    num_agents: int
    source: str
    """How errors name the function (``reward_func <name>``, with its position among several)."""
    pass_prompts: bool
    """Whether the prompts go first, before the N completion lists."""
    keyword_names: tuple[str, ...]
    """The keyword arguments it gets, from ``JointActions.keywords``."""

    reward_call: ClassVar[str] = "batch"

    def call(self, actions: JointActions, at: str = "", hint: str = "") -> object:
        """What the function returns for ``actions``; an error it raises becomes a
        :class:`RewardFunctionError` that names it, the call and ``at`` (one joint action's
        call, a :func:`where`), and adds ``hint``."""
        # Fresh lists for every call, so a function that edits its arguments cannot change the next one's.
        args = [list(c) for c in actions.completions]
        if self.pass_prompts:
            args.insert(0, list(actions.keywords["prompts"]))
        kwargs = {
            name: copy.deepcopy(actions.keywords[name]) for name in self.keyword_names if name in actions.keywords
        }
        try:
            return self.func(*args, **kwargs)
        except Exception as error:
            sizes = ", ".join(str(len(a)) for a in args)
            raise RewardFunctionError(
                f"{self.source} raised {type(error).__name__}: {error} "
                f"(called with {len(args)} lists of sizes [{sizes}]"
                f"{', prompts first' if self.pass_prompts else ''}{', for ' + at if at else ''}){hint}"
            ) from error

    def check(self, values: object, row_ids: Sequence[int], hint: str = "") -> Tensor:
        """What the function returned for the K joint actions of ``row_ids``, as a ``(K, N)``
        float32 tensor: K numbers (one per joint action, shared by the agents) or K rows of N
        (one per agent). The error for a single value adds ``hint``."""
        expected, num_agents, source = len(row_ids), self.num_agents, self.source
        returned = values  # kept as it came back, for the errors
        if isinstance(values, Tensor | np.ndarray):
            if isinstance(values, Tensor):
                values = values.detach().cpu()
            if values.ndim == 2 and values.shape[0] == expected and values.shape[1] != 1:
                values = values.tolist()  # (K, N): one row of per-agent rewards per joint action
            else:
                values = values.reshape(-1).tolist()  # any other shape with K elements: one value each
        try:
            # A string or a dict is iterable but is no list of rewards: list() would split it into
            # characters or keys and the error would then blame one of those.
            if isinstance(values, str | bytes | Mapping):
                raise TypeError
            values = list(values)
        except TypeError:
            raise TypeError(
                f"{source} returned {short_repr(returned)} ({type(returned).__name__}) for "
                f"{where(row_ids)}; expected a sequence of {plural(expected, 'number')} (one per joint "
                f"action), or of {expected} sequences of {plural(num_agents, 'number')} (one per agent)"
                + (hint if real_number(returned) is not None else "")
            ) from None
        if len(values) != expected:
            raise ValueError(
                f"{source} returned {plural(len(values), 'value')} ({short_repr(returned)}) for "
                f"{where(row_ids)}; expected {plural(expected, 'value')} (one per joint action)"
                + (hint if len(values) == 1 else "")
            )
        rows = []
        for k, value in enumerate(values):
            if not _is_vector(value):
                rows.append([checked_number(value, source, where(row_ids, k))] * num_agents)
                continue
            if isinstance(value, Tensor | np.ndarray) and value.ndim != 1:
                raise TypeError(
                    f"{source} returned a {type(value).__name__} of shape {tuple(value.shape)} for "
                    f"{where(row_ids, k)}; expected a real number or {num_agents} numbers (one per agent)"
                )
            items = list(value)
            if len(items) != num_agents:
                raise ValueError(
                    f"{source} returned {plural(len(items), 'value')} ({short_repr(value)}) for "
                    f"{where(row_ids, k)}; a per-agent reward needs {plural(num_agents, 'value')} (one per agent)"
                )
            rows.append([checked_number(item, source, where(row_ids, k, i)) for i, item in enumerate(items)])
        return to_float32(rows, (expected, num_agents), row_ids, source)

    def score(self, actions: JointActions) -> Tensor:
        """The ``(K, N)`` rewards of one call with all K joint actions."""
        hint = error_hint(len(actions.row_ids))
        return self.check(self.call(actions, hint=hint), actions.row_ids, hint)


class Scorer(Protocol):
    """How :class:`~comlrl.rewards.JointReward` scores one function: ``score`` gives the
    ``(K, N)`` float32 rewards of K joint actions; ``reward_call`` says how the function is
    called now (``auto`` until it settles on ``batch`` or ``per_joint_action``)."""

    reward_call: str

    def score(self, actions: JointActions) -> Tensor: ...


ScorerFactory = Callable[[BatchCall, str, bool], Scorer]
"""Builds the scorer of a function under a ``reward_call``: from its :class:`BatchCall`, the
``reward_call`` and whether per-joint-action calls are the actor-critic trainers'."""

REWARD_CALL_SCORERS: dict[str, ScorerFactory] = {}
"""The scorer factories of the ``reward_call`` values other than ``batch``, by value, as
:func:`register_reward_call` installed them (:mod:`comlrl.compat.rewards`: ``auto`` and
``per_joint_action``)."""


def register_reward_call(name: str, factory: ScorerFactory) -> None:
    """Have :class:`~comlrl.rewards.JointReward` score a function under ``reward_call=name``
    with the scorer ``factory`` builds (``batch`` is the engine's own and cannot be replaced)."""
    if name == BatchCall.reward_call:
        raise ValueError("reward_call 'batch' is the engine's own calling convention")
    REWARD_CALL_SCORERS[name] = factory
