"""comlrl 1.4.3's ways of calling reward functions, kept for the functions written for it.

:class:`~comlrl.rewards.JointReward` knows one calling convention: a function called once
with all the joint actions of a turn (``reward_call="batch"``, its
:class:`~comlrl.rewards.calls.BatchCall`). The other values of the config's ``reward_call`` are
translated into it here: :class:`PerJointActionCalls` scores a function through its
``BatchCall`` (public names of :mod:`comlrl.rewards.calls` only), calling it once per joint
action or in batch as below, and :func:`install`, run when this module is imported (``comlrl``
imports it), registers it with the engine for ``auto`` and ``per_joint_action``.

What the batch calls pass is what 1.4.3 passed: per joint action, agent 0's prompt of that
turn as that agent saw it (its formatted prompt; at later turns the prompt the transition
produced), not the row's ``prompt`` column. As in 1.4.3, a function that names
``batch_items`` gets the dataset rows (dicts) of the joint actions, and one that names
``prompts`` without taking them positionally gets them by keyword; one with ``**kwargs`` gets
both (``REWARD_KEYWORDS``). ``REWARD_CONTEXT`` goes only to functions that name it: 1.4.3
never passed it, and its ``**kwargs`` functions may forward their keywords somewhere that does
not expect them.

What differs is the call: 1.4.3 called a function once per joint action with one-element
lists, its users' functions reading ``[0]`` and returning ``[value]``. ``per_joint_action``
calls every function so; ``auto`` calls it in batch and, the first time it returns a single
value for K > 1 joint actions, takes it for a 1.4.3 one: it warns, scores that batch again per
joint action and keeps calling it so. K values for K > 1 joint actions are checked once by
calling per joint action too when they may mean something else (K = N values, which a 1.4.3
function returns as one per agent of the first joint action; a function that gets
``batch_items`` or ``prompts``, at the first call whose joint actions have different rows or
prompts, which a 1.4.3 function may read at ``[0]`` for all): the same rewards make it a batch
function, others a 1.4.3 one (warned, as above). A function settled as a batch one is called
so from then on (a single value is then an error, not a switch).

``actor_critic_calls`` makes the per-joint-action calls those of 1.4.3's actor-critic
trainers, whose ``prompts`` held every agent's prompt of the turn and which read a flat list
of N values as one reward per agent (its MAGRPO passed agent 0's prompt and kept a list's
first value: an error here).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import Tensor

from comlrl.rewards.calls import (
    ERROR_HINTS,
    BatchCall,
    JointActions,
    RewardFunctionError,
    plural,
    real_number,
    register_reward_call,
    where,
)
from comlrl.utils.text import short_repr

_PER_JOINT_ACTION = ("prompts", "batch_items", "prompt_history_per_agent", "response_history_per_agent")
"""The keyword values that hold one item per joint action: a per-joint-action call gets that
joint action's item alone (the others, such as ``turn``, are the same for every joint action)."""

# When a batch call and per-joint-action calls agree (``auto``): batched arithmetic, such as a
# reward model scoring padded rows together, rounds otherwise than one row at a time.
_SETTLE_RTOL, _SETTLE_ATOL = 1e-4, 1e-6

REWARD_CALLS = ("auto", "per_joint_action")
"""The values of ``reward_call`` translated here."""


class PerJointActionCalls:
    """A function scored under ``reward_call`` ``per_joint_action`` or ``auto``, through its
    :class:`~comlrl.rewards.calls.BatchCall` ``batch``: a :class:`~comlrl.rewards.calls.Scorer`
    whose ``reward_call`` is ``auto`` until it settles, at the first call over more than one
    joint action that decides it, on ``batch`` or ``per_joint_action``."""

    def __init__(self, batch: BatchCall, reward_call: str, actor_critic_calls: bool = False):
        if reward_call not in REWARD_CALLS:
            raise ValueError(f"reward_call must be one of {', '.join(map(repr, REWARD_CALLS))}, got {reward_call!r}")
        self.batch = batch
        self.reward_call = reward_call
        self.actor_critic_calls = actor_critic_calls

    def score(self, actions: JointActions) -> Tensor:
        """The function's ``(K, N)`` rewards of ``actions``, called as ``reward_call`` says now."""
        if self.reward_call == "per_joint_action":
            return self._score_each(actions)
        if self.reward_call == "batch":
            return self.batch.score(actions)
        count = len(actions.row_ids)
        hint = per_joint_action_hint(count)
        returned = self.batch.call(actions, hint=hint)
        if count > 1 and _single_value(returned):
            self._take_for_per_joint_action(f"returned one value ({short_repr(returned)}) for {count} joint actions")
            return self._score_each(actions)
        values = self.batch.check(returned, actions.row_ids, hint)
        if count == 1:
            return values
        doubt = self._doubt(actions, returned)
        if doubt is not None:
            return self._settle(actions, values, doubt)
        if not self._reads_joint_action_items():
            self.reward_call = "batch"  # K values for K joint actions, read from its lists alone: a batch function
        return values

    def _reads_joint_action_items(self) -> bool:
        """Whether the function gets ``batch_items`` or ``prompts``: items that a function
        written for comlrl 1.4.3 (one joint action per call) may read at ``[0]`` only."""
        return self.batch.pass_prompts or bool({"batch_items", "prompts"} & set(self.batch.keyword_names))

    def _doubt(self, actions: JointActions, returned: object) -> str | None:
        """Why K values that the function returned for K > 1 joint actions under ``auto`` may
        not be one reward per joint action, or None when they can only be that.

        Two ways a function written for comlrl 1.4.3 returns K values that mean something else:
        K = N values read at ``[0]``, one per agent of the first joint action; and values for
        every joint action all computed from the first one's ``batch_items`` or ``prompts`` (a
        list comprehension over the completions beside ``batch_items[0]``). The second shows only
        when the joint actions have different rows or prompts: until a call that has them, the
        function is left unsettled (any such reading is right while they are all the same)."""
        count = len(actions.row_ids)
        if count == self.batch.num_agents and _flat(returned):
            return (
                f"returned {short_repr(returned)} for {count} joint actions, which called one at a time give other "
                f"rewards: a comlrl 1.4.3 function reads such a list as {plural(count, 'value')} for the first "
                "joint action"
                + (" (one per agent, as its actor-critic trainers read it)" if self.actor_critic_calls else "")
            )
        if not self._reads_joint_action_items():
            return None
        prompts = actions.keywords["prompts"]
        if len(set(actions.row_ids)) > 1 or len(set(prompts)) > 1:
            return (
                f"returned {plural(count, 'value')} for {count} joint actions of different dataset rows or "
                "prompts, which called one at a time give other rewards: it reads one joint action's batch_items "
                "or prompts for all of them, as a comlrl 1.4.3 function (one joint action per call) may read [0]"
            )
        return None

    def _settle(self, actions: JointActions, values: Tensor, doubt: str) -> Tensor:
        """The function called once per joint action too, to tell a batch function (the same
        rewards, up to float rounding of batched arithmetic, or an error of its own: 1.4.3 called
        its functions so) from a comlrl 1.4.3 one (other rewards, or an error that says what
        such a list means). K more calls, once per function and run."""
        try:
            each = self._score_each(actions)
        except RewardFunctionError:
            each = values
        if torch.allclose(each, values, rtol=_SETTLE_RTOL, atol=_SETTLE_ATOL):
            self.reward_call = "batch"
            return values
        self._take_for_per_joint_action(doubt)
        return each

    def _take_for_per_joint_action(self, answered: str) -> None:
        """The function ``answered`` as a comlrl 1.4.3 one under ``auto``: it is called per joint
        action from now on; said once, as it is decided once."""
        self.reward_call = "per_joint_action"
        warnings.warn(
            f"{self.batch.source} {answered}, so it is "
            "taken for a function written for comlrl 1.4.3, which called reward functions once per joint action "
            "with one-element lists: it is now called that way, once per joint action, for the rest of this run. "
            'Set reward_call="per_joint_action" to say so, or reward_call="batch" to call it with all the joint '
            "actions of a turn at once (for a batch function whose rewards vary from call to call, such as a "
            "sampled judge; one value for several joint actions is then an error)",
            stacklevel=2,
        )

    def _score_each(self, actions: JointActions) -> Tensor:
        """The function called once per joint action with one-element lists, as comlrl 1.4.3 called it."""
        entries = []
        for k in range(len(actions.row_ids)):
            at = where(actions.row_ids, k)
            returned = self.batch.call(_one_joint_action(actions, k, self.actor_critic_calls), at=at)
            entries.append(self._one_entry(returned, at))
        return self.batch.check(entries, actions.row_ids)

    def _one_entry(self, returned: object, at: str) -> object:
        """What a call for one joint action returned, as that joint action's entry of a batch
        (a number, or N per-agent numbers); a value of the wrong kind is passed on for
        ``BatchCall.check`` to name. A flat list of several values is refused (1.4.3's MAGRPO
        kept only its first value, and reading it otherwise would change the rewards without a
        word), except N values under ``actor_critic_calls``: one per agent, as 1.4.3's IAC/MAAC
        read them."""
        if real_number(returned) is not None:
            return returned
        values = returned.detach().cpu() if isinstance(returned, Tensor) else returned
        if isinstance(values, Tensor | np.ndarray):
            if values.ndim >= 1 and math.prod(values.shape) == 1:
                return values.reshape(-1)[0]
            values = values.tolist()
        if not isinstance(values, list | tuple):
            return returned  # None, a string, a dict...: BatchCall.check says what is wrong with it
        if len(values) == 1:
            return values[0]
        num_agents, source = self.batch.num_agents, self.batch.source
        if self.actor_critic_calls and len(values) == num_agents:
            return list(values)
        per_agent = "[[" + ", ".join(f"v{i}" for i in range(num_agents)) + "]]"
        if not values:
            raise ValueError(
                f"{source} returned no value ({short_repr(returned)}) for {at}, called for that joint action "
                f"alone; return one reward (a number or [value]) or {per_agent} (one per agent)"
            )
        raise ValueError(
            f"{source} returned {plural(len(values), 'value')} ({short_repr(returned)}) for {at}, called for "
            f"that joint action alone; comlrl 1.4.3 used only the first value ({short_repr(values[0])}) of such a "
            f"list. Return [value] for one reward shared by all agents, or {per_agent} for one reward per agent"
        )


def _single_value(value: object) -> bool:
    """True when ``value`` holds exactly one value (a number, a one-element list or tuple, a
    tensor or array of one element): what a function written for one joint action returns."""
    if real_number(value) is not None:
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
    return isinstance(value, list | tuple) and all(real_number(item) is not None for item in value)


def _one_joint_action(actions: JointActions, k: int, agent_prompts: bool) -> JointActions:
    """Joint action ``k`` alone, every list one element long, as a per-joint-action call sees
    it; with ``agent_prompts``, ``prompts`` holds each agent's prompt of the turn instead
    (what comlrl 1.4.3's actor-critic trainers passed)."""
    keywords = {
        name: value[k : k + 1] if name in _PER_JOINT_ACTION else value for name, value in actions.keywords.items()
    }
    histories = actions.keywords.get("prompt_history_per_agent")
    if agent_prompts and histories is not None:
        keywords["prompts"] = [history[-1] for history in histories[k]]
    return JointActions([c[k : k + 1] for c in actions.completions], actions.row_ids[k : k + 1], keywords)


def per_joint_action_hint(count: int) -> str:
    """What a batch call's error adds, since a comlrl 1.4.3 function may be its cause; with one
    joint action both ways of calling are the same, and it adds nothing."""
    if count <= 1:
        return ""
    return (
        "; a reward function written for comlrl 1.4.3, which called it once per joint action with "
        'one-element lists, needs reward_call="per_joint_action"'
    )


def install() -> None:
    """Have the engine score functions under ``reward_call`` ``auto`` and ``per_joint_action``
    with :class:`PerJointActionCalls`, and hint at them when a batch call fails (run when this
    module is imported)."""
    for name in REWARD_CALLS:
        register_reward_call(name, PerJointActionCalls)
    if per_joint_action_hint not in ERROR_HINTS:
        ERROR_HINTS.append(per_joint_action_hint)


install()
