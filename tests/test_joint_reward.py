"""JointReward: how the user's function is called, what it may return, how failures read."""

import functools
import math

import numpy as np
import pytest
import torch

from comlrl.rewards.joint_reward import JointReward
from comlrl.utils.reward_processor import RewardProcessors

PROMPTS = ["p0", "p1"]
COMPLETIONS = [["a0", "a1"], ["b0", "b1"]]  # N = 2 agents, K = 2 joint actions
ROWS = [5, 7]


def score(func, processor=None, num_agents=2):
    return JointReward(func, num_agents, processor)(PROMPTS, COMPLETIONS, ROWS)


# ---------------------------------------------------------------- calling conventions


def completions_only(c1, c2):
    return [float(x == "a0") + len(y) for x, y in zip(c1, c2, strict=True)]


def prompts_first(prompts, c1, c2):
    assert prompts == PROMPTS
    return completions_only(c1, c2)


def with_targets(c1, c2, target_min=2.0, target_max=3.0):
    # target_min / target_max reach the function: 2 + 3 = 5 is added to each value
    return [v + target_min + target_max for v in completions_only(c1, c2)]


def star_args(*lists):
    assert len(lists) == 2
    return completions_only(*lists)


def one_then_star(c1, *rest):
    return completions_only(c1, *rest)


def prompts_then_star(prompts, c1, c2, *rest):
    assert prompts == PROMPTS and rest == ()
    return completions_only(c1, c2)


def optional_third(c1, c2, c3=None):
    assert c3 is None
    return completions_only(c1, c2)


class CallableObject:
    def __call__(self, c1, c2):
        return completions_only(c1, c2)


# completions_only on COMPLETIONS: ["a0" == "a0"] + len("b0") = 3, 0 + len("b1") = 2
BASE = [3.0, 2.0]


@pytest.mark.parametrize(
    "func, pass_prompts, expected",
    [
        (completions_only, False, BASE),
        (prompts_first, True, BASE),
        (lambda c1, c2: completions_only(c1, c2), False, BASE),
        (functools.partial(with_targets, target_min=2, target_max=3), False, [8.0, 7.0]),
        (functools.partial(with_targets, target_min=-1, target_max=0), False, [2.0, 1.0]),
        (star_args, False, BASE),
        (one_then_star, False, BASE),
        (prompts_then_star, True, BASE),
        (optional_third, False, BASE),
        (CallableObject(), False, BASE),
    ],
)
def test_calling_conventions(func, pass_prompts, expected):
    reward = JointReward(func, num_agents=2)
    assert reward.pass_prompts is pass_prompts
    raw, processed = reward(PROMPTS, COMPLETIONS, ROWS)
    assert raw.dtype == torch.float32
    assert raw.tolist() == expected
    assert processed.tolist() == expected
    assert processed is not raw


def test_arguments_are_plain_lists():
    seen = []

    def record(*lists):
        seen.extend(lists)
        return [0.0, 0.0]

    JointReward(record, 2)(tuple(PROMPTS), (tuple(COMPLETIONS[0]), tuple(COMPLETIONS[1])), ROWS)
    assert seen == COMPLETIONS and all(type(x) is list for x in seen)


def too_few(c1):
    return [0.0]


def too_many(p, c1, c2, extra):
    return [0.0]


def too_many_star(p, c1, c2, extra, *rest):
    return [0.0]


@pytest.mark.parametrize("func", [too_few, too_many, too_many_star])
def test_signature_fitting_neither_raises(func):
    with pytest.raises(TypeError, match=func.__name__ + r".*cannot be called with 2 completion"):
        JointReward(func, num_agents=2)


def test_non_callables_rejected():
    with pytest.raises(TypeError, match="reward_func must be callable, got int"):
        JointReward(3, 2)
    with pytest.raises(TypeError, match="reward_processor must be callable, got str"):
        JointReward(completions_only, 2, processor="scale")


# ---------------------------------------------------------------- errors


def test_function_that_raises():
    def broken_reward(c1, c2):
        raise KeyError("missing")

    with pytest.raises(RuntimeError) as info:
        score(broken_reward)
    message = str(info.value)
    assert "broken_reward" in message and "KeyError" in message
    assert "2 lists of sizes [2, 2]" in message
    assert isinstance(info.value.__cause__, KeyError)


def test_function_that_raises_with_prompts():
    def broken_reward(prompts, c1, c2):
        raise ValueError("bad")

    with pytest.raises(RuntimeError, match=r"3 lists of sizes \[2, 2, 2\], prompts first"):
        score(broken_reward)


@pytest.mark.parametrize("values", [[1.0], [1.0, 2.0, 3.0]])
def test_wrong_number_of_values(values):
    with pytest.raises(ValueError, match=rf"returned {len(values)} values for 2 joint actions"):
        score(lambda c1, c2: values)


@pytest.mark.parametrize(
    "bad, shown",
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (np.float32("nan"), "nan")],
)
def test_non_finite_values(bad, shown):
    def nan_reward(c1, c2):
        return [1.0, bad]

    with pytest.raises(ValueError) as info:
        score(nan_reward)
    message = str(info.value)
    assert "nan_reward" in message
    assert f"returned {shown} for joint action 1 (dataset row 7)" in message


def test_non_finite_in_a_tensor():
    with pytest.raises(ValueError, match=r"returned nan for joint action 0 \(dataset row 5\)"):
        score(lambda c1, c2: torch.tensor([math.nan, 1.0]))


@pytest.mark.parametrize(
    "bad, shown",
    [("1.0", "'1.0' (str)"), (None, "None (NoneType)"), (True, "True (bool)"), ([1.0], r"[1.0]")],
)
def test_non_number_values(bad, shown):
    with pytest.raises(TypeError) as info:
        score(lambda c1, c2: [bad, 1.0])
    message = str(info.value)
    assert f"returned {shown}" in message
    assert "joint action 0 (dataset row 5)" in message


@pytest.mark.parametrize("returned, type_name", [(3.0, "float"), (None, "NoneType"), (7, "int")])
def test_non_sequence_return(returned, type_name):
    with pytest.raises(TypeError, match=rf"must return a sequence of 2 numbers.*got {type_name}"):
        score(lambda c1, c2: returned)


@pytest.mark.parametrize(
    "returned",
    [
        [np.float32(2.0), np.float64(-2.0)],
        [2, -2],  # python ints are read as floats
        [torch.tensor(2.0), torch.tensor(-2)],  # 0-d tensors, float and int
        torch.tensor([2.0, -2.0]),
        torch.tensor([[2.0], [-2.0]]),  # any shape with K elements
        np.array([2.0, -2.0]),
        (2.0, -2.0),
    ],
)
def test_accepted_numbers(returned):
    raw, processed = score(lambda c1, c2: returned)
    assert raw.dtype == torch.float32
    assert raw.tolist() == [2.0, -2.0]
    assert processed.tolist() == [2.0, -2.0]


def test_processor_applied_to_each_value():
    calls = []

    def shift_and_record(r):
        calls.append(r)
        return r * 10 + 1

    raw, processed = score(lambda c1, c2: [1.5, -2.0], processor=shift_and_record)
    assert calls == [1.5, -2.0]
    assert raw.tolist() == [1.5, -2.0]  # what the function returned
    assert processed.tolist() == [16.0, -19.0]  # 1.5 * 10 + 1, -2 * 10 + 1


def test_processor_producing_nan_is_named():
    def to_nan(r):
        return math.nan if r < 0 else r

    with pytest.raises(ValueError) as info:
        score(lambda c1, c2: [1.5, -2.0], processor=to_nan)
    message = str(info.value)
    assert "reward_processor" in message and "to_nan" in message
    assert "returned nan for joint action 1 (dataset row 7)" in message


def test_named_processor_producing_inf_is_named():
    processor = RewardProcessors.compose(RewardProcessors.scale(math.inf))
    with pytest.raises(ValueError, match=r"reward_processor compose\(scale\(factor=inf\)\)"):
        score(lambda c1, c2: [1.5, 2.0], processor=processor)


def test_processor_that_raises_names_itself_the_value_and_the_row():
    def reciprocal(r):
        return 1 / r

    with pytest.raises(
        RuntimeError,
        match=r"reward_processor .*reciprocal raised ZeroDivisionError: .* on reward 0.0 "
        r"of joint action 1 \(dataset row 7\)",
    ) as info:
        score(lambda c1, c2: [1.0, 0.0], processor=reciprocal)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
