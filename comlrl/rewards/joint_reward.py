"""The contract between the trainer and the user's reward functions.

A reward function receives one list of completion strings per agent (N positional
arguments), or the prompts first when it takes N+1 positional arguments, and returns, for
each joint action, either one number shared by all agents or N numbers, one per agent
(mixed cooperative settings). ``functools.partial`` objects and callables with extra
keyword arguments that have defaults work.

The prompts are, per joint action, agent 0's prompt of that turn as that agent saw it (its
formatted prompt; at later turns the prompt the transition produced), not the row's
``prompt`` column. A function that names ``batch_items`` gets the dataset rows (dicts) of
the joint actions, and one that names ``prompts`` without taking them positionally gets
them by keyword; one with ``**kwargs`` gets both (``REWARD_KEYWORDS``); each is one item per
joint action, aligned with the completion lists. A function may also name keyword
parameters from ``REWARD_CONTEXT`` to receive where the joint actions stand in a multi-turn
episode: ``turn`` (1 for the first turn), and per joint action the prompt and response
histories of every agent up to and including this turn; those go only to the functions
that name them.

How a function is called is the config's ``reward_call`` (``REWARD_CALLS``): ``batch`` calls
it once with the K joint actions of a turn (:class:`~comlrl.rewards.calls.BatchCall`, the
engine's one calling convention); ``per_joint_action`` and ``auto``, for functions written to
score one joint action per call, are translated into it by :mod:`comlrl.compat.rewards`
(which says how, and why ``**kwargs`` does not get ``REWARD_CONTEXT``), through the scorers it
installs with :func:`~comlrl.rewards.calls.register_reward_call`. A callable with a
``reward_call`` attribute is called as it says, whatever the config's (the library's own
wrappers, such as a reward model, say ``batch``).

Several reward functions can be given with weights; the joint reward is their weighted
sum, then the optional processor is applied to each value.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from comlrl.rewards.calls import (
    REWARD_CALL_SCORERS,
    BatchCall,
    JointActions,
    Scorer,
    checked_number,
    plural,
    real_number,
    to_float32,
    where,
)
from comlrl.utils.signatures import describe, keyword_arguments, signature_parameters, unique_names

REWARD_CALLS = ("auto", "batch", "per_joint_action")
"""How reward functions are called (the config's ``reward_call``)."""

REWARD_KEYWORDS = ("batch_items", "prompts")
"""Keyword arguments given to a function that names them or takes ``**kwargs``: ``batch_items``
(the dataset row, a dict, of each joint action) and ``prompts`` (the prompts, when not already
passed positionally)."""

REWARD_CONTEXT = ("turn", "prompt_history_per_agent", "response_history_per_agent")
"""Keyword arguments a reward function receives when its signature names them:
``turn`` (int, 1-based), ``prompt_history_per_agent`` and ``response_history_per_agent``
(per joint action, one list per agent of its prompts / responses on that branch, from the
first turn up to and including the current one)."""


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
        """Whether per-joint-action calls are the actor-critic trainers' (:mod:`comlrl.compat.rewards`)."""
        self.processor = processor
        self.weights = self._check_weights(weights, len(funcs))
        self.names = unique_names([describe(func) for func in funcs])
        self.pass_prompts = tuple(takes_prompts(func, num_agents) for func in funcs)
        self.keyword_names = tuple(
            context_parameters(func) + reward_keywords(func, pass_prompts)
            for func, pass_prompts in zip(funcs, self.pass_prompts)
        )
        calls = [getattr(func, "reward_call", call) for func in funcs]
        for func, own in zip(funcs, calls):
            if own not in REWARD_CALLS:
                raise ValueError(
                    f"reward_func {describe(func)} has reward_call={own!r}; it must be one of "
                    f"{', '.join(map(repr, REWARD_CALLS))}"
                )
        # How errors name each function; the position tells apart functions with the same name.
        sources = [
            f"reward_func {describe(func)}" + (f" (position {j})" if len(funcs) > 1 else "")
            for j, func in enumerate(funcs)
        ]
        self.scorers: tuple[Scorer, ...] = tuple(
            self._scorer(BatchCall(func, num_agents, source, pass_prompts, keywords), own)
            for func, source, pass_prompts, keywords, own in zip(
                funcs, sources, self.pass_prompts, self.keyword_names, calls
            )
        )
        """How each function is scored: its :class:`~comlrl.rewards.calls.BatchCall`, or the
        scorer that ``compat/`` installed for its ``reward_call``."""

    @property
    def calls(self) -> list[str]:
        """How each function is called: ``call`` (or the function's own ``reward_call``
        attribute: the library's wrappers, which are batch functions), until ``auto`` settles on
        ``batch`` or ``per_joint_action`` for a function (for the rest of the run)."""
        return [scorer.reward_call for scorer in self.scorers]

    def _scorer(self, batch: BatchCall, call: str) -> Scorer:
        if call == BatchCall.reward_call:
            return batch
        factory = REWARD_CALL_SCORERS.get(call)
        if factory is None:  # comlrl.compat.rewards installs them when comlrl is imported
            raise RuntimeError(f"reward_call={call!r} has no scorer: import comlrl.compat.rewards, which installs it")
        return factory(batch, call, self.actor_critic_calls)

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
                f"reward_weights has {plural(len(weights), 'value')} for {plural(count, 'reward function')}"
            )
        out = []
        for position, weight in enumerate(weights):
            number = real_number(weight)
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
        per_function = torch.stack([scorer.score(actions) for scorer in self.scorers])
        weights = torch.tensor(self.weights, dtype=torch.float64).reshape(-1, 1, 1)
        raw = (weights * per_function.double()).sum(0).float()
        bad = torch.nonzero(~torch.isfinite(raw)).tolist()
        if bad:
            k, i = bad[0]
            raise ValueError(
                f"the weighted sum of the reward functions is {raw[k, i].item()} for {where(row_ids, k, i)} "
                f"(values {per_function[:, k, i].tolist()} of {self.names}, reward_weights {list(self.weights)})"
            )
        if self.processor is None:
            processed = raw.clone()
        else:
            processed = self._process(raw, row_ids)
        return RewardBatch(per_function=per_function, raw=raw, processed=processed, names=list(self.names))

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
                        f"{source} raised {type(error).__name__}: {error} on reward {value} of {where(row_ids, k, i)}"
                    ) from error
                out.append(checked_number(result, source, where(row_ids, k, i)))
            processed.append(out)
        return to_float32(processed, tuple(raw.shape), row_ids, source)
