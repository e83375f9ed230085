"""The contract between the trainer and a user's reward function.

A reward function receives one list of completion strings per agent (N positional
arguments), or the prompts first when it takes N+1 positional arguments, and returns one
number per joint action. ``functools.partial`` objects and callables with extra
keyword arguments that have defaults work.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def describe(func: Callable) -> str:
    """A readable name for a callable, ``partial`` objects included."""
    if isinstance(func, functools.partial):
        return f"partial({describe(func.func)})"
    return getattr(func, "__qualname__", None) or repr(func)


def takes_prompts(func: Callable, num_agents: int) -> bool:
    """True when ``func`` wants the prompts before the N completion lists.

    Decided from the signature: N+1 positional parameters without defaults mean prompts
    come first; a function that can take N positional arguments gets only completions.
    """
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # builtins and C callables without a signature
        return False
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


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Tensor):
        return None
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return None
        return float(value.item())
    return float(value)


class JointReward:
    """Scores a batch of joint actions with the user's function and an optional processor.

    Every failure names the function, the dataset row and the joint action, so a user can
    find the culprit; nothing is silently replaced.
    """

    def __init__(
        self,
        func: Callable,
        num_agents: int,
        processor: Callable[[float], float] | None = None,
    ):
        if not callable(func):
            raise TypeError(f"reward_func must be callable, got {type(func).__name__}")
        if processor is not None and not callable(processor):
            raise TypeError(f"reward_processor must be callable, got {type(processor).__name__}")
        self.func = func
        self.name = describe(func)
        self.num_agents = num_agents
        self.processor = processor
        self.pass_prompts = takes_prompts(func, num_agents)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[Sequence[str]],
        row_ids: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """Score K joint actions.

        Args:
            prompts: K prompts, the one of each joint action's dataset row.
            completions: N lists of K strings; ``completions[i][k]`` is agent i's part of
                joint action k.
            row_ids: K dataset row indices, used only to name culprits in errors.

        Returns:
            ``(raw, processed)``, two ``(K,)`` float tensors: what the function returned and
            what the processor made of it (the same values without a processor).
        """
        expected = len(row_ids)
        args = [list(c) for c in completions]
        if self.pass_prompts:
            args.insert(0, list(prompts))
        try:
            values = self.func(*args)
        except Exception as error:
            sizes = ", ".join(str(len(a)) for a in args)
            raise RuntimeError(
                f"reward_func {self.name} raised {type(error).__name__}: {error} "
                f"(called with {len(args)} lists of sizes [{sizes}]"
                f"{', prompts first' if self.pass_prompts else ''})"
            ) from error
        raw = self._check(values, expected, row_ids, f"reward_func {self.name}")
        if self.processor is None:
            return raw, raw.clone()
        source = f"reward_processor {describe(self.processor)}"
        processed = []
        for k, value in enumerate(raw.tolist()):
            try:
                processed.append(self.processor(value))
            except Exception as error:
                raise RuntimeError(
                    f"{source} raised {type(error).__name__}: {error} on reward {value} of joint action {k} "
                    f"(dataset row {row_ids[k]})"
                ) from error
        return raw, self._check(processed, expected, row_ids, source)

    def _check(self, values: object, expected: int, row_ids: Sequence[int], source: str) -> Tensor:
        if isinstance(values, Tensor):
            values = values.detach().cpu().reshape(-1).tolist()
        try:
            values = list(values)
        except TypeError:
            raise TypeError(
                f"{source} must return a sequence of {expected} numbers (one per joint action), "
                f"got {type(values).__name__}"
            ) from None
        if len(values) != expected:
            raise ValueError(
                f"{source} returned {len(values)} values for {expected} joint actions "
                f"(one value per joint action expected)"
            )
        out = []
        for k, value in enumerate(values):
            number = _as_float(value)
            where = f"joint action {k} (dataset row {row_ids[k]})"
            if number is None:
                raise TypeError(
                    f"{source} returned {value!r} ({type(value).__name__}) for {where}; expected a real number"
                )
            if not math.isfinite(number):
                raise ValueError(f"{source} returned {number} for {where}; rewards must be finite")
            out.append(number)
        return torch.tensor(out, dtype=torch.float32)
