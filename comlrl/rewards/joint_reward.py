"""The contract between the trainer and the user's reward functions.

A reward function receives one list of completion strings per agent (N positional
arguments), or the prompts first when it takes N+1 positional arguments, and returns, for
each joint action, either one number shared by all agents or N numbers, one per agent
(mixed cooperative settings). ``functools.partial`` objects and callables with extra
keyword arguments that have defaults work.

The prompts are what comlrl 1.4.3 passed: per joint action, agent 0's prompt of that turn
as that agent saw it (its formatted prompt; at later turns the prompt the transition
produced), not the row's ``prompt`` column. As in 1.4.3, a function that names
``batch_items`` gets the dataset rows (dicts) of the joint actions, and one that names
``prompts`` without taking them positionally gets them by keyword; one with ``**kwargs``
gets both (``REWARD_KEYWORDS``). Each is one item per joint action, aligned with the
completion lists.

A function may also name keyword parameters from ``REWARD_CONTEXT`` to receive where the
joint actions stand in a multi-turn episode: ``turn`` (1 for the first turn), and per joint
action the prompt and response histories of every agent up to and including this turn.
These are passed only to functions that name them: comlrl 1.4.3 never passed them, and its
``**kwargs`` functions may forward their keywords somewhere that does not expect them.

How a function is called is ``REWARD_CALLS``' choice (the config's ``reward_call``):
``batch`` calls it once with the K joint actions of a turn; ``per_joint_action`` once per
joint action with one-element lists, as comlrl 1.4.3 did, its users' functions reading
``[0]`` and returning ``[value]``; ``auto`` calls it in batch and, the first time it returns
a single value for K > 1 joint actions, takes it for a 1.4.3 one: it warns, scores that
batch again per joint action and keeps calling it so. K values for K > 1 joint actions are
checked once by calling per joint action too when they may mean something else (K = N
values, which a 1.4.3 function returns as one per agent of the first joint action; a
function that gets ``batch_items`` or ``prompts``, at the first call whose joint actions have
different rows or prompts, which a 1.4.3 function may read at ``[0]`` for all): the same
rewards make it a batch function, others a 1.4.3 one (warned, as above). A function settled
as a batch one is called so from then on (a single value is then an error, not a switch).
A callable with a ``reward_call`` attribute is called as it says, whatever the config's (the
library's own wrappers, such as a reward model, say ``batch``).

Several reward functions can be given with weights; the joint reward is their weighted
sum, then the optional processor is applied to each value.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from comlrl.utils.text import short_repr


def describe(func: Callable) -> str:
    """A readable name for a callable, ``partial`` objects included."""
    if isinstance(func, functools.partial):
        return f"partial({describe(func.func)})"
    return getattr(func, "__name__", None) or repr(func)


REWARD_CALLS = ("auto", "batch", "per_joint_action")
"""How reward functions are called (the config's ``reward_call``)."""

REWARD_KEYWORDS = ("batch_items", "prompts")
"""comlrl 1.4.3's keyword arguments, given to a function that names them or takes
``**kwargs``: ``batch_items`` (the dataset row, a dict, of each joint action) and ``prompts``
(the prompts, when not already passed positionally)."""

REWARD_CONTEXT = ("turn", "prompt_history_per_agent", "response_history_per_agent")
"""Keyword arguments a reward function receives when its signature names them:
``turn`` (int, 1-based), ``prompt_history_per_agent`` and ``response_history_per_agent``
(per joint action, one list per agent of its prompts / responses on that branch, from the
first turn up to and including the current one)."""

_PER_JOINT_ACTION = ("prompts", "batch_items", "prompt_history_per_agent", "response_history_per_agent")
"""The keyword values that hold one item per joint action: a per-joint-action call gets that
joint action's item alone (the others, such as ``turn``, are the same for every joint action)."""


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


def context_parameters(func: Callable) -> tuple[str, ...]:
    """The names of ``REWARD_CONTEXT`` that ``func`` names among its keyword parameters."""
    return keyword_arguments(func, REWARD_CONTEXT)


def reward_keywords(func: Callable, pass_prompts: bool) -> tuple[str, ...]:
    """The names of ``REWARD_KEYWORDS`` that ``func`` gets: those it names, both with
    ``**kwargs``, less ``prompts`` when they go first positionally. A callable without a
    readable signature gets none: nothing says it accepts them."""
    if signature_parameters(func) is None:
        return ()
    names = keyword_arguments(func, REWARD_KEYWORDS, if_any_keyword=REWARD_KEYWORDS)
    return tuple(name for name in names if not (pass_prompts and name == "prompts"))


def takes_prompts(func: Callable, num_agents: int) -> bool:
    """True when ``func`` wants the prompts before the N completion lists.

    Decided from the signature: N+1 positional parameters without defaults mean prompts
    come first; a function that can take N positional arguments gets only completions.
    Parameters named after ``REWARD_CONTEXT`` or ``batch_items``, and a ``prompts`` one that
    is not the first (``def r(c1, c2, prompts)``: it cannot be the slot before the
    completions), are passed by keyword and not counted.
    """
    params = signature_parameters(func)
    if params is None:
        return False
    params = [
        p
        for position, p in enumerate(params)
        if p.name not in (*REWARD_CONTEXT, "batch_items") and not (p.name == "prompts" and position > 0)
    ]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(required) == num_agents + 1:
        return True
    if len(required) <= num_agents and (var_positional or num_agents <= len(positional)):
        return False
    raise TypeError(
        f"reward_func {describe(func)}{inspect.signature(func)} cannot be called with "
        f"{num_agents} completion lists (one per agent), nor with prompts and "
        f"{num_agents} completion lists: it has {len(required)} required positional parameters"
    )


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


@dataclass
class RewardBatch:
    """The rewards of K joint actions of N agents scored by F reward functions.

    Attributes:
        per_function: ``(F, K, N)`` float32, what each function returned (a value shared by
            all agents repeated N times), before the weights and the processor.
        raw: ``(K, N)`` float32, the weighted sum over functions, before the processor.
        processed: ``(K, N)`` float32, the processor applied to each value of ``raw`` (the
            same values as ``raw`` without a processor).
        names: F unique readable names of the functions, for logging ``reward/{name}/mean``.
    """

    per_function: Tensor
    raw: Tensor
    processed: Tensor
    names: list[str]


def _number(value: object) -> float | None:
    """``value`` as a float when it is one real number (0-d tensors and arrays included), else None."""
    if isinstance(value, Tensor | np.ndarray):
        if value.ndim != 0:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _is_vector(value: object) -> bool:
    if isinstance(value, Tensor | np.ndarray):
        return value.ndim >= 1
    return isinstance(value, list | tuple)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _single_value(value: object) -> bool:
    """True when ``value`` holds exactly one value (a number, a one-element list or tuple, a
    tensor or array of one element): what a function written for one joint action returns."""
    if _number(value) is not None:
        return True
    if isinstance(value, Tensor):
        return value.numel() == 1
    if isinstance(value, np.ndarray):
        return value.size == 1
    return isinstance(value, list | tuple) and len(value) == 1


def _flat(value: object) -> bool:
    """True when ``value`` is a flat sequence of numbers (no per-agent rows)."""
    if isinstance(value, Tensor | np.ndarray):
        return value.ndim == 1
    return isinstance(value, list | tuple) and all(_number(item) is not None for item in value)


def _per_joint_action_hint(count: int) -> str:
    """What a batch call's error adds when a comlrl 1.4.3 function may be its cause; with one
    joint action both ways of calling are the same, and it adds nothing."""
    if count <= 1:
        return ""
    return (
        "; a reward function written for comlrl 1.4.3, which called it once per joint action with "
        'one-element lists, needs reward_call="per_joint_action"'
    )


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

    def one(self, k: int, agent_prompts: bool = False) -> JointActions:
        """Joint action ``k`` alone, every list one element long, as a per-joint-action call sees
        it; with ``agent_prompts``, ``prompts`` holds each agent's prompt of the turn instead
        (what comlrl 1.4.3's actor-critic trainers passed)."""
        keywords = {
            name: value[k : k + 1] if name in _PER_JOINT_ACTION else value for name, value in self.keywords.items()
        }
        histories = self.keywords.get("prompt_history_per_agent")
        if agent_prompts and histories is not None:
            keywords["prompts"] = [history[-1] for history in histories[k]]
        return JointActions([c[k : k + 1] for c in self.completions], self.row_ids[k : k + 1], keywords)


class RewardFunctionError(RuntimeError):
    """A reward function raised: the error names it, the call and the joint action."""


# How many distinct dataset rows an error lists before "...": a batch can hold hundreds.
_ROWS_SHOWN = 10
# When a batch call and per-joint-action calls agree (``auto``): batched arithmetic, such as a
# reward model scoring padded rows together, rounds otherwise than one row at a time.
_SETTLE_RTOL, _SETTLE_ATOL = 1e-4, 1e-6


class JointReward:
    """Scores a batch of joint actions with the user's functions, weights and an optional processor.

    Every failure names the function, the joint action, the dataset row and the value, so a
    user can find the culprit; nothing is silently replaced.
    """

    def __init__(
        self,
        funcs: Callable | Sequence[Callable],
        num_agents: int,
        processor: Callable[[float], float] | None = None,
        weights: Sequence[float] | None = None,
        call: str = "auto",
        actor_critic_calls: bool = False,
    ):
        if isinstance(funcs, list | tuple):
            if not funcs:
                raise ValueError("reward_func is an empty list; give at least one reward function")
            for position, func in enumerate(funcs):
                if not callable(func):
                    raise TypeError(f"reward_func at position {position} must be callable, got {type(func).__name__}")
            funcs = tuple(funcs)
        elif callable(funcs):
            funcs = (funcs,)
        else:
            raise TypeError(f"reward_func must be callable or a list of callables, got {type(funcs).__name__}")
        if processor is not None and not callable(processor):
            raise TypeError(f"reward_processor must be callable, got {type(processor).__name__}")
        if call not in REWARD_CALLS:
            raise ValueError(f"reward_call must be one of {', '.join(map(repr, REWARD_CALLS))}, got {call!r}")
        self.funcs: tuple[Callable, ...] = funcs
        self.num_agents = num_agents
        self.actor_critic_calls = actor_critic_calls
        """Whether per-joint-action calls follow comlrl 1.4.3's actor-critic trainers, whose
        ``prompts`` held every agent's prompt of the turn and which read a flat list of N values
        as one reward per agent (its MAGRPO passed agent 0's prompt and kept a list's first
        value: an error here)."""
        self.processor = processor
        self.weights = self._check_weights(weights, len(funcs))
        self.names = unique_names([describe(func) for func in funcs])
        self.pass_prompts = tuple(takes_prompts(func, num_agents) for func in funcs)
        self.keyword_names = tuple(
            context_parameters(func) + reward_keywords(func, pass_prompts)
            for func, pass_prompts in zip(funcs, self.pass_prompts)
        )
        self.calls = [getattr(func, "reward_call", call) for func in funcs]
        """How each function is called: ``call`` (or the function's own ``reward_call``
        attribute: the library's wrappers, which are batch functions), until ``auto`` settles on
        ``batch`` or ``per_joint_action`` for a function (for the rest of the run)."""
        for func, own in zip(funcs, self.calls):
            if own not in REWARD_CALLS:
                raise ValueError(
                    f"reward_func {describe(func)} has reward_call={own!r}; it must be one of "
                    f"{', '.join(map(repr, REWARD_CALLS))}"
                )
        # How errors name each function; the position tells apart functions with the same name.
        self._sources = [
            f"reward_func {describe(func)}" + (f" (position {j})" if len(funcs) > 1 else "")
            for j, func in enumerate(funcs)
        ]

    @staticmethod
    def _check_weights(weights: Sequence[float] | None, count: int) -> tuple[float, ...]:
        if weights is None:
            return (1.0,) * count
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence | Tensor | np.ndarray):
            raise TypeError(
                f"reward_weights must be a sequence of numbers (one per reward function), got {type(weights).__name__}"
            )
        weights = list(weights)
        if len(weights) != count:
            raise ValueError(
                f"reward_weights has {_plural(len(weights), 'value')} for {_plural(count, 'reward function')}"
            )
        out = []
        for position, weight in enumerate(weights):
            number = _number(weight)
            if number is None:
                raise TypeError(
                    f"reward_weights[{position}] is {weight!r} ({type(weight).__name__}); expected a real number"
                )
            if not math.isfinite(number):
                raise ValueError(f"reward_weights[{position}] is {number}; weights must be finite")
            out.append(number)
        return tuple(out)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[Sequence[str]],
        row_ids: Sequence[int],
        context: dict[str, object] | None = None,
        batch_items: Sequence[Mapping] | None = None,
    ) -> RewardBatch:
        """Score K joint actions.

        Args:
            prompts: K prompts: agent 0's prompt of each joint action's turn.
            completions: N lists of K strings; ``completions[i][k]`` is agent i's part of
                joint action k.
            row_ids: K dataset row indices, used only to name culprits in errors.
            context: values of ``REWARD_CONTEXT`` names, handed to the functions that take them.
            batch_items: the K dataset rows (dicts) of the joint actions, handed to the
                functions that take ``batch_items``.

        Returns:
            A :class:`RewardBatch`: each function's ``(F, K, N)`` values, their weighted sum
            ``raw`` and the processor's ``processed``, both ``(K, N)``, and the functions' names.
        """
        keywords = {**(context or {}), "prompts": list(prompts)}
        if batch_items is not None:
            keywords["batch_items"] = list(batch_items)
        actions = JointActions([list(c) for c in completions], list(row_ids), keywords)
        per_function = torch.stack([self._score(j, actions) for j in range(len(self.funcs))])
        weights = torch.tensor(self.weights, dtype=torch.float64).reshape(-1, 1, 1)
        raw = (weights * per_function.double()).sum(0).float()
        bad = torch.nonzero(~torch.isfinite(raw)).tolist()
        if bad:
            k, i = bad[0]
            raise ValueError(
                f"the weighted sum of the reward functions is {raw[k, i].item()} for {self._where(row_ids, k, i)} "
                f"(values {per_function[:, k, i].tolist()} of {self.names}, reward_weights {list(self.weights)})"
            )
        if self.processor is None:
            processed = raw.clone()
        else:
            processed = self._process(raw, row_ids)
        return RewardBatch(per_function=per_function, raw=raw, processed=processed, names=list(self.names))

    def _score(self, j: int, actions: JointActions) -> Tensor:
        """Function ``j``'s ``(K, N)`` rewards, called as ``calls[j]`` says; ``auto`` settles
        here, at the first call over more than one joint action."""
        if self.calls[j] == "per_joint_action":
            return self._score_each(j, actions)
        count = len(actions.row_ids)
        returned = self._call(j, actions, hint=_per_joint_action_hint(count))
        if self.calls[j] == "auto" and count > 1 and _single_value(returned):
            self._take_for_per_joint_action(j, f"returned one value ({short_repr(returned)}) for {count} joint actions")
            return self._score_each(j, actions)
        values = self._check(returned, actions.row_ids, self._sources[j])
        if self.calls[j] != "auto" or count == 1:
            return values
        doubt = self._doubt(j, actions, returned)
        if doubt is not None:
            return self._settle(j, actions, values, doubt)
        if not self._reads_joint_action_items(j):
            self.calls[j] = "batch"  # K values for K joint actions, read from its lists alone: a batch function
        return values

    def _reads_joint_action_items(self, j: int) -> bool:
        """Whether function ``j`` gets ``batch_items`` or ``prompts``: items that a function
        written for comlrl 1.4.3 (one joint action per call) may read at ``[0]`` only."""
        return self.pass_prompts[j] or bool({"batch_items", "prompts"} & set(self.keyword_names[j]))

    def _doubt(self, j: int, actions: JointActions, returned: object) -> str | None:
        """Why K values that function ``j`` returned for K > 1 joint actions under ``auto`` may
        not be one reward per joint action, or None when they can only be that.

        Two ways a function written for comlrl 1.4.3 returns K values that mean something else:
        K = N values read at ``[0]``, one per agent of the first joint action; and values for
        every joint action all computed from the first one's ``batch_items`` or ``prompts`` (a
        list comprehension over the completions beside ``batch_items[0]``). The second shows only
        when the joint actions have different rows or prompts: until a call that has them, the
        function is left unsettled (any such reading is right while they are all the same)."""
        count = len(actions.row_ids)
        if count == self.num_agents and _flat(returned):
            return (
                f"returned {short_repr(returned)} for {count} joint actions, which called one at a time give other "
                f"rewards: a comlrl 1.4.3 function reads such a list as {_plural(count, 'value')} for the first "
                "joint action"
                + (" (one per agent, as its actor-critic trainers read it)" if self.actor_critic_calls else "")
            )
        if not self._reads_joint_action_items(j):
            return None
        prompts = actions.keywords["prompts"]
        if len(set(actions.row_ids)) > 1 or len(set(prompts)) > 1:
            return (
                f"returned {_plural(count, 'value')} for {count} joint actions of different dataset rows or "
                "prompts, which called one at a time give other rewards: it reads one joint action's batch_items "
                "or prompts for all of them, as a comlrl 1.4.3 function (one joint action per call) may read [0]"
            )
        return None

    def _settle(self, j: int, actions: JointActions, values: Tensor, doubt: str) -> Tensor:
        """Function ``j`` called once per joint action too, to tell a batch function (the same
        rewards, up to float rounding of batched arithmetic, or an error of its own: 1.4.3 called
        its functions so) from a comlrl 1.4.3 one (other rewards, or an error that says what
        such a list means). K more calls, once per function and run."""
        try:
            each = self._score_each(j, actions)
        except RewardFunctionError:
            each = values
        if torch.allclose(each, values, rtol=_SETTLE_RTOL, atol=_SETTLE_ATOL):
            self.calls[j] = "batch"
            return values
        self._take_for_per_joint_action(j, doubt)
        return each

    def _take_for_per_joint_action(self, j: int, answered: str) -> None:
        """Function ``j`` ``answered`` as a comlrl 1.4.3 one under ``auto``: it is called per joint
        action from now on; said once, as it is decided once."""
        self.calls[j] = "per_joint_action"
        warnings.warn(
            f"{self._sources[j]} {answered}, so it is "
            "taken for a function written for comlrl 1.4.3, which called reward functions once per joint action "
            "with one-element lists: it is now called that way, once per joint action, for the rest of this run. "
            'Set reward_call="per_joint_action" to say so, or reward_call="batch" to call it with all the joint '
            "actions of a turn at once (for a batch function whose rewards vary from call to call, such as a "
            "sampled judge; one value for several joint actions is then an error)",
            stacklevel=2,
        )

    def _score_each(self, j: int, actions: JointActions) -> Tensor:
        """Function ``j`` called once per joint action with one-element lists, as comlrl 1.4.3 called it."""
        entries = []
        for k in range(len(actions.row_ids)):
            where = self._where(actions.row_ids, k)
            returned = self._call(j, actions.one(k, agent_prompts=self.actor_critic_calls), where=where)
            entries.append(self._one_entry(returned, self._sources[j], where))
        return self._check(entries, actions.row_ids, self._sources[j])

    def _one_entry(self, returned: object, source: str, where: str) -> object:
        """What a call for one joint action returned, as that joint action's entry of a batch
        (a number, or N per-agent numbers); a value of the wrong kind is passed on for
        ``_check`` to name. A flat list of several values is refused (1.4.3's MAGRPO kept only
        its first value, and reading it otherwise would change the rewards without a word),
        except N values under ``actor_critic_calls``: one per agent, as 1.4.3's IAC/MAAC read them."""
        if _number(returned) is not None:
            return returned
        values = returned.detach().cpu() if isinstance(returned, Tensor) else returned
        if isinstance(values, Tensor | np.ndarray):
            if values.ndim >= 1 and math.prod(values.shape) == 1:
                return values.reshape(-1)[0]
            values = values.tolist()
        if not isinstance(values, list | tuple):
            return returned  # None, a string, a dict...: _check says what is wrong with it
        if len(values) == 1:
            return values[0]
        if self.actor_critic_calls and len(values) == self.num_agents:
            return list(values)
        per_agent = "[[" + ", ".join(f"v{i}" for i in range(self.num_agents)) + "]]"
        if not values:
            raise ValueError(
                f"{source} returned no value ({short_repr(returned)}) for {where}, called for that joint action "
                f"alone; return one reward (a number or [value]) or {per_agent} (one per agent)"
            )
        raise ValueError(
            f"{source} returned {_plural(len(values), 'value')} ({short_repr(returned)}) for {where}, called for "
            f"that joint action alone; comlrl 1.4.3 used only the first value ({short_repr(values[0])}) of such a "
            f"list. Return [value] for one reward shared by all agents, or {per_agent} for one reward per agent"
        )

    def _call(self, j: int, actions: JointActions, where: str = "", hint: str = "") -> object:
        """Function ``j`` called on ``actions``; an error it raises names it, the call and ``where``
        (one joint action's call), and adds ``hint``."""
        # Fresh lists for every function, so one that edits its arguments cannot change the next one's.
        args = [list(c) for c in actions.completions]
        if self.pass_prompts[j]:
            args.insert(0, list(actions.keywords["prompts"]))
        kwargs = {
            name: copy.deepcopy(actions.keywords[name]) for name in self.keyword_names[j] if name in actions.keywords
        }
        try:
            return self.funcs[j](*args, **kwargs)
        except Exception as error:
            sizes = ", ".join(str(len(a)) for a in args)
            raise RewardFunctionError(
                f"{self._sources[j]} raised {type(error).__name__}: {error} "
                f"(called with {len(args)} lists of sizes [{sizes}]"
                f"{', prompts first' if self.pass_prompts[j] else ''}{', for ' + where if where else ''}){hint}"
            ) from error

    @staticmethod
    def _where(row_ids: Sequence[int], k: int | None = None, agent: int | None = None) -> str:
        """How errors name joint action ``k`` and its dataset row (and ``agent``'s part of it); with
        ``k`` None, all the joint actions of one call and their distinct dataset rows."""
        if k is None and len(row_ids) == 1:
            k = 0
        if k is None:
            rows = list(dict.fromkeys(row_ids))  # a row's G samples share it: name it once
            shown = ", ".join(str(row) for row in rows[:_ROWS_SHOWN]) + (", ..." if len(rows) > _ROWS_SHOWN else "")
            return f"joint actions 0-{len(row_ids) - 1} (dataset row{'' if len(rows) == 1 else 's'} {shown})"
        where = f"joint action {k} (dataset row {row_ids[k]})"
        return where if agent is None else f"{where}, agent {agent}"

    def _check(self, values: object, row_ids: Sequence[int], source: str) -> Tensor:
        """What one function returned for K joint actions, as a ``(K, N)`` float32 tensor."""
        expected, num_agents = len(row_ids), self.num_agents
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
                f"{self._where(row_ids)}; expected a sequence of {_plural(expected, 'number')} (one per joint "
                f"action), or of {expected} sequences of {_plural(num_agents, 'number')} (one per agent)"
                + (_per_joint_action_hint(expected) if _number(returned) is not None else "")
            ) from None
        if len(values) != expected:
            raise ValueError(
                f"{source} returned {_plural(len(values), 'value')} ({short_repr(returned)}) for "
                f"{self._where(row_ids)}; expected {_plural(expected, 'value')} (one per joint action)"
                + (_per_joint_action_hint(expected) if len(values) == 1 else "")
            )
        rows = []
        for k, value in enumerate(values):
            if not _is_vector(value):
                rows.append([self._checked_number(value, source, self._where(row_ids, k))] * num_agents)
                continue
            if isinstance(value, Tensor | np.ndarray) and value.ndim != 1:
                raise TypeError(
                    f"{source} returned a {type(value).__name__} of shape {tuple(value.shape)} for "
                    f"{self._where(row_ids, k)}; expected a real number or {num_agents} numbers (one per agent)"
                )
            items = list(value)
            if len(items) != num_agents:
                raise ValueError(
                    f"{source} returned {_plural(len(items), 'value')} ({short_repr(value)}) for "
                    f"{self._where(row_ids, k)}; a per-agent reward needs {_plural(num_agents, 'value')} "
                    "(one per agent)"
                )
            rows.append(
                [self._checked_number(item, source, self._where(row_ids, k, i)) for i, item in enumerate(items)]
            )
        return self._to_float32(rows, (expected, num_agents), row_ids, source)

    @staticmethod
    def _checked_number(value: object, source: str, where: str) -> float:
        number = _number(value)
        if number is None:
            raise TypeError(f"{source} returned {value!r} ({type(value).__name__}) for {where}; expected a real number")
        if not math.isfinite(number):
            raise ValueError(f"{source} returned {number} for {where}; rewards must be finite")
        return number

    def _to_float32(
        self, rows: list[list[float]], shape: tuple[int, int], row_ids: Sequence[int], source: str
    ) -> Tensor:
        """``rows`` as a float32 tensor; a finite value too large for float32 is an error, not inf."""
        out = torch.tensor(rows, dtype=torch.float32).reshape(shape)
        bad = torch.nonzero(~torch.isfinite(out)).tolist()
        if bad:
            k, i = bad[0]
            raise ValueError(
                f"{source} returned {rows[k][i]} for {self._where(row_ids, k, i)}; rewards must fit in float32"
            )
        return out

    def _process(self, raw: Tensor, row_ids: Sequence[int]) -> Tensor:
        source = f"reward_processor {describe(self.processor)}"
        processed = []
        for k, row in enumerate(raw.tolist()):
            out = []
            for i, value in enumerate(row):
                try:
                    result = self.processor(value)
                except Exception as error:
                    raise RuntimeError(
                        f"{source} raised {type(error).__name__}: {error} on reward {value} of "
                        f"{self._where(row_ids, k, i)}"
                    ) from error
                out.append(self._checked_number(result, source, self._where(row_ids, k, i)))
            processed.append(out)
        return self._to_float32(processed, tuple(raw.shape), row_ids, source)
