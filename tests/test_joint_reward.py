"""JointReward: how the user's functions are called, what they may return, how they are weighted and
processed, how failures read."""

import functools
import math

import numpy as np
import pytest
import torch

from comlrl.rewards import RewardBatch
from comlrl.rewards.joint_reward import JointReward
from comlrl.utils.reward_processor import RewardProcessors

PROMPTS = ["p0", "p1"]
COMPLETIONS = [["a0", "a1"], ["b0", "b1"]]  # N = 2 agents, K = 2 joint actions
ROWS = [5, 7]


def score(func, processor=None, num_agents=2, weights=None, call="batch"):
    """One batch call (``auto`` would also call a function once per joint action here, K = N = 2
    values being ambiguous: tested with ``auto``'s other choices below)."""
    return JointReward(func, num_agents, processor, weights, call=call)(PROMPTS, COMPLETIONS, ROWS)


def shared(values):
    """The (K, N) rewards of one value per joint action shared by both agents."""
    return [[v, v] for v in values]


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
    assert len(reward.pass_prompts) == 1 and reward.pass_prompts[0] is pass_prompts
    batch = reward(PROMPTS, COMPLETIONS, ROWS)
    assert isinstance(batch, RewardBatch)
    assert batch.raw.dtype == torch.float32 and batch.processed.dtype == torch.float32
    assert batch.per_function.dtype == torch.float32
    assert batch.raw[:, 0].tolist() == expected
    assert batch.raw.tolist() == shared(expected)  # one number per joint action: both agents get it
    assert batch.processed.tolist() == shared(expected)
    assert batch.per_function.tolist() == [shared(expected)]
    assert batch.processed is not batch.raw


def test_arguments_are_plain_lists():
    seen = []

    def record(*lists):
        seen.extend(lists)
        return [0.0, 0.0]

    JointReward(record, 2, call="batch")(tuple(PROMPTS), (tuple(COMPLETIONS[0]), tuple(COMPLETIONS[1])), ROWS)
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
    with pytest.raises(TypeError, match="reward_func must be callable or a list of callables, got int"):
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
    # one value for two joint actions is an error only under "batch" ("auto" takes it for a 1.4.3 function)
    count = f"{len(values)} value{'' if len(values) == 1 else 's'}"
    with pytest.raises(ValueError, match=rf"returned {count} \(.*\) for joint actions 0-1 \(dataset rows 5, 7\)"):
        score(lambda c1, c2: values, call="batch")


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
    [
        ("1.0", "'1.0' (str)"),
        (None, "None (NoneType)"),
        (True, "True (bool)"),
        (torch.tensor(True), "tensor(True) (Tensor)"),
        ({"r": 1.0}, "{'r': 1.0} (dict)"),
    ],
)
def test_non_number_values(bad, shown):
    with pytest.raises(TypeError) as info:
        score(lambda c1, c2: [bad, 1.0])
    message = str(info.value)
    assert f"returned {shown}" in message
    assert "joint action 0 (dataset row 5)" in message


def test_non_number_inside_a_per_agent_reward():
    with pytest.raises(TypeError) as info:
        score(lambda c1, c2: [1.0, [0.5, "x"]])
    assert "returned 'x' (str) for joint action 1 (dataset row 7), agent 1; expected a real number" in str(info.value)


@pytest.mark.parametrize("returned, type_name", [(3.0, "float"), (None, "NoneType"), (7, "int")])
def test_non_sequence_return(returned, type_name):
    with pytest.raises(
        TypeError,
        match=rf"returned {returned!r} \({type_name}\) for joint actions 0-1 \(dataset rows 5, 7\); "
        "expected a sequence of 2 numbers",
    ):
        score(lambda c1, c2: returned, call="batch")


@pytest.mark.parametrize(
    "returned",
    [
        [np.float32(2.0), np.float64(-2.0)],
        [2, -2],  # python ints are read as floats
        [torch.tensor(2.0), torch.tensor(-2)],  # 0-d tensors, float and int
        [np.array(2.0), np.array(-2)],  # 0-d arrays
        torch.tensor([2.0, -2.0]),
        torch.tensor([[2.0], [-2.0]]),  # any shape with K elements
        torch.tensor([[2.0, -2.0]]),
        np.array([2.0, -2.0]),
        np.array([[2.0], [-2.0]]),
        (2.0, -2.0),
    ],
)
def test_accepted_numbers(returned):
    batch = score(lambda c1, c2: returned)
    assert batch.raw.dtype == torch.float32
    assert batch.raw.tolist() == [[2.0, 2.0], [-2.0, -2.0]]
    assert batch.processed.tolist() == [[2.0, 2.0], [-2.0, -2.0]]


def test_processor_applied_to_each_value():
    calls = []

    def shift_and_record(r):
        calls.append(r)
        return r * 10 + 1

    batch = score(lambda c1, c2: [1.5, -2.0], processor=shift_and_record)
    assert calls == [1.5, 1.5, -2.0, -2.0]  # once per agent's value, joint action by joint action
    assert batch.raw.tolist() == [[1.5, 1.5], [-2.0, -2.0]]  # what the function returned
    assert batch.processed.tolist() == [[16.0, 16.0], [-19.0, -19.0]]  # 1.5 * 10 + 1, -2 * 10 + 1


def test_processor_producing_nan_is_named():
    def to_nan(r):
        return math.nan if r < 0 else r

    with pytest.raises(ValueError) as info:
        score(lambda c1, c2: [1.5, -2.0], processor=to_nan)
    message = str(info.value)
    assert "reward_processor" in message and "to_nan" in message
    assert "returned nan for joint action 1 (dataset row 7), agent 0" in message


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
        r"of joint action 1 \(dataset row 7\), agent 0",
    ) as info:
        score(lambda c1, c2: [1.0, 0.0], processor=reciprocal)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


# ---------------------------------------------------------------- several functions, weights


def first_reward(c1, c2):
    return [1.0, -2.0]


def second_reward(c1, c2):
    return [3.0, 0.25]


def test_two_functions_weighted():
    reward = JointReward([first_reward, second_reward], 2, weights=[0.5, 2.0], call="batch")
    batch = reward(PROMPTS, COMPLETIONS, ROWS)
    # joint action 0: 0.5 * 1 + 2 * 3 = 6.5; joint action 1: 0.5 * -2 + 2 * 0.25 = -0.5
    assert batch.raw.tolist() == [[6.5, 6.5], [-0.5, -0.5]]
    assert batch.processed.tolist() == [[6.5, 6.5], [-0.5, -0.5]]
    assert batch.names == ["first_reward", "second_reward"]
    assert batch.per_function.shape == (2, 2, 2)


def test_per_function_keeps_unweighted_values():
    batch = score((first_reward, second_reward), weights=[0.0, -3.0])
    assert batch.per_function.tolist() == [
        [[1.0, 1.0], [-2.0, -2.0]],  # first_reward as returned, although its weight is 0
        [[3.0, 3.0], [0.25, 0.25]],  # second_reward as returned, not times -3
    ]
    # 0 * 1 - 3 * 3 = -9; 0 * -2 - 3 * 0.25 = -0.75
    assert batch.raw.tolist() == [[-9.0, -9.0], [-0.75, -0.75]]


def test_default_weights_are_one():
    batch = score([first_reward, second_reward])
    assert batch.raw.tolist() == [[4.0, 4.0], [-1.75, -1.75]]  # 1 + 3, -2 + 0.25


@pytest.mark.parametrize("weights", [[2.0], np.array([2.0]), torch.tensor([2.0]), (2,)])
def test_weights_accepted_forms(weights):
    batch = score(first_reward, weights=weights)
    assert batch.raw.tolist() == [[2.0, 2.0], [-4.0, -4.0]]
    assert batch.per_function.tolist() == [[[1.0, 1.0], [-2.0, -2.0]]]


def test_each_function_has_its_own_calling_convention_and_fresh_lists():
    seen = []

    def takes_prompts_and_edits(prompts, c1, c2):
        assert prompts == PROMPTS
        c1.append("edited")
        return [1.0, 2.0]

    def completions_only_records(c1, c2):
        seen.append(c1)
        return [10.0, 20.0]

    reward = JointReward([takes_prompts_and_edits, completions_only_records], 2, call="batch")
    assert reward.pass_prompts == (True, False)
    batch = reward(PROMPTS, COMPLETIONS, ROWS)
    assert seen == [["a0", "a1"]]  # the first function's edit did not reach the second
    assert batch.raw.tolist() == [[11.0, 11.0], [22.0, 22.0]]


def test_weights_count_mismatch():
    with pytest.raises(ValueError, match=r"^reward_weights has 3 values for 2 reward functions$"):
        JointReward([first_reward, second_reward], 2, weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"^reward_weights has 1 value for 2 reward functions$"):
        JointReward([first_reward, second_reward], 2, weights=[1.0])
    with pytest.raises(ValueError, match=r"^reward_weights has 2 values for 1 reward function$"):
        JointReward(first_reward, 2, weights=[1.0, 2.0])


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ([1.0, math.nan], ValueError, r"reward_weights\[1\] is nan; weights must be finite"),
        ([math.inf, 1.0], ValueError, r"reward_weights\[0\] is inf; weights must be finite"),
        ([1.0, "2"], TypeError, r"reward_weights\[1\] is '2' \(str\); expected a real number"),
        ([True, 1.0], TypeError, r"reward_weights\[0\] is True \(bool\); expected a real number"),
        (2.0, TypeError, r"reward_weights must be a sequence of numbers .*got float"),
        ("12", TypeError, r"reward_weights must be a sequence of numbers .*got str"),
    ],
)
def test_bad_weights(weights, error, message):
    with pytest.raises(error, match=message):
        JointReward([first_reward, second_reward], 2, weights=weights)


def test_bad_function_lists():
    with pytest.raises(TypeError, match=r"reward_func at position 1 must be callable, got str"):
        JointReward([first_reward, "second_reward"], 2)
    with pytest.raises(ValueError, match="reward_func is an empty list"):
        JointReward([], 2)
    with pytest.raises(TypeError, match=r"reward_func must be callable or a list of callables, got set"):
        JointReward({first_reward}, 2)


def test_errors_name_the_position_among_several_functions():
    def broken_reward(c1, c2):
        raise KeyError("missing")

    with pytest.raises(RuntimeError, match=r"reward_func .*broken_reward \(position 1\) raised KeyError"):
        score([first_reward, broken_reward])
    with pytest.raises(
        ValueError, match=r"reward_func first_reward \(position 1\) returned nan for joint action 0 \(dataset row 5\)"
    ):
        score([first_reward, nan_first])


def nan_first(c1, c2):
    return [math.nan, 1.0]


nan_first.__name__ = "first_reward"  # a name clash, told apart by position


def test_single_function_in_a_list_reads_as_one_function():
    with pytest.raises(ValueError) as info:
        score([nan_first])
    assert str(info.value).startswith("reward_func first_reward returned nan for joint action 0 (dataset row 5);")


def test_duplicate_names_get_suffixes_by_position():
    reward = JointReward([first_reward, second_reward, first_reward, lambda a, b: [0, 0], lambda a, b: [0, 0]], 2)
    lam = "<lambda>"
    assert reward.names == ["first_reward_1", "second_reward", "first_reward_2", lam + "_1", lam + "_2"]
    assert score([first_reward, second_reward, first_reward]).names == [
        "first_reward_1",
        "second_reward",
        "first_reward_2",
    ]


def test_suffixes_skip_names_already_taken():
    def taken(c1, c2):
        return [0.0, 0.0]

    taken.__name__ = "first_reward_1"
    names = JointReward([first_reward, first_reward, taken], 2).names
    assert names == ["first_reward_2", "first_reward_3", "first_reward_1"]
    assert len(set(names)) == 3


def test_processor_applied_after_the_weighted_sum():
    calls = []

    def shift_and_record(r):
        calls.append(r)
        return r * 10 + 1

    batch = score(
        [lambda c1, c2: [1.0, 2.0], lambda c1, c2: [[0.5, -1.0], 3.0]],
        processor=shift_and_record,
        weights=[2.0, 4.0],
    )
    # joint action 0: 2 * 1 + 4 * [0.5, -1] = [4, -2]; joint action 1: 2 * 2 + 4 * 3 = 16 for both agents
    assert batch.raw.tolist() == [[4.0, -2.0], [16.0, 16.0]]
    assert calls == [4.0, -2.0, 16.0, 16.0]  # the processor sees the weighted sums, not each function's value
    assert batch.processed.tolist() == [[41.0, -19.0], [161.0, 161.0]]
    assert batch.per_function.tolist() == [[[1.0, 1.0], [2.0, 2.0]], [[0.5, -1.0], [3.0, 3.0]]]


def test_clamp_processor_on_a_weighted_sum():
    # 0.5 * 1 + 2 * 3 = 6.5 clamped to 5; 0.5 * -2 + 2 * 0.25 = -0.5 kept
    batch = score([first_reward, second_reward], processor=RewardProcessors.clamp(-1.0, 5.0), weights=[0.5, 2.0])
    assert batch.processed.tolist() == [[5.0, 5.0], [-0.5, -0.5]]
    assert batch.raw.tolist() == [[6.5, 6.5], [-0.5, -0.5]]


# ---------------------------------------------------------------- per-agent rewards


@pytest.mark.parametrize(
    "returned",
    [
        [[1.0, 2.0], [3.0, -4.0]],
        [(1.0, 2.0), (3, -4)],
        [torch.tensor([1.0, 2.0]), np.array([3.0, -4.0])],
        [[np.float32(1.0), torch.tensor(2.0)], [3.0, -4.0]],
        torch.tensor([[1.0, 2.0], [3.0, -4.0]]),  # (K, N): row k is joint action k
        np.array([[1.0, 2.0], [3.0, -4.0]]),
    ],
)
def test_per_agent_rewards(returned):
    batch = score(lambda c1, c2: returned)
    assert batch.raw.tolist() == [[1.0, 2.0], [3.0, -4.0]]
    assert batch.processed.tolist() == [[1.0, 2.0], [3.0, -4.0]]
    assert batch.per_function.tolist() == [[[1.0, 2.0], [3.0, -4.0]]]


def test_shared_and_per_agent_mixed_in_one_call():
    batch = score(lambda c1, c2: [5.0, [1.0, 2.0]])
    assert batch.raw.tolist() == [[5.0, 5.0], [1.0, 2.0]]


def test_two_dimensional_tensor_rows_are_joint_actions():
    # 3 agents and 2 joint actions: (K, N) = (2, 3), row k is joint action k
    completions = [["a0", "a1"], ["b0", "b1"], ["c0", "c1"]]
    returned = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    batch = JointReward(lambda a, b, c: returned, 3)(PROMPTS, completions, ROWS)
    assert batch.raw.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert batch.per_function.shape == (1, 2, 3)
    # a 1-D tensor of K values is one shared value per joint action
    batch = JointReward(lambda a, b, c: torch.tensor([1.0, 2.0]), 3)(PROMPTS, completions, ROWS)
    assert batch.raw.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]


def per_agent(c1, c2):
    return [1.0, [1.0, 2.0, 3.0]]


per_agent.__name__ = "f"


def test_wrong_per_agent_width():
    with pytest.raises(ValueError) as info:
        score(per_agent)
    assert str(info.value) == (
        "reward_func f returned 3 values ([1.0, 2.0, 3.0]) for joint action 1 (dataset row 7); "
        "a per-agent reward needs 2 values (one per agent)"
    )


@pytest.mark.parametrize(
    "returned, width, k",
    [
        ([[1.0], 2.0], 1, 0),  # one value in a list is not a number: the width is checked
        ([1.0, torch.tensor([2.0])], 1, 1),
        ([1.0, []], 0, 1),
        (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), 3, 0),
        (np.zeros((2, 4)), 4, 0),
    ],
)
def test_wrong_per_agent_width_forms(returned, width, k):
    with pytest.raises(
        ValueError,
        match=rf"returned {width} values? \(.*\) for joint action {k} \(dataset row {ROWS[k]}\); "
        r"a per-agent reward needs 2 values \(one per agent\)",
    ):
        score(lambda c1, c2: returned)


def test_per_agent_entry_of_two_dimensions_rejected():
    with pytest.raises(TypeError, match=r"returned a Tensor of shape \(1, 2\) for joint action 1 \(dataset row 7\)"):
        score(lambda c1, c2: [1.0, torch.tensor([[1.0, 2.0]])])


def test_non_finite_per_agent_value_names_the_agent():
    def nan_reward(c1, c2):
        return torch.tensor([[1.0, 2.0], [3.0, math.nan]])

    with pytest.raises(
        ValueError,
        match=r"nan_reward returned nan for joint action 1 \(dataset row 7\), agent 1; rewards must be finite",
    ):
        score(nan_reward)


def test_values_too_large_for_float32():
    with pytest.raises(
        ValueError, match=r"returned 1e\+300 for joint action 1 \(dataset row 7\), agent 0; rewards must fit in float32"
    ):
        score(lambda c1, c2: [1.0, 1e300])


def test_weighted_sum_overflow_is_named():
    with pytest.raises(ValueError) as info:
        score([first_reward, lambda c1, c2: [3e38, 0.0]], weights=[1.0, 10.0])
    message = str(info.value)
    assert "weighted sum of the reward functions is inf for joint action 0 (dataset row 5), agent 0" in message
    assert "reward_weights [1.0, 10.0]" in message


def test_empty_batch():
    batch = JointReward([lambda c1, c2: [], lambda c1, c2: torch.zeros(0, 2)], 2)([], [[], []], [])
    assert batch.per_function.shape == (2, 0, 2) and batch.raw.shape == (0, 2) and batch.processed.shape == (0, 2)


# ---------------------------------------------------------------- a wrong count or a non-list names rows and value


def one_value_reward(c1, c2):
    return [0.25]


def test_wrong_count_names_the_rows_the_value_and_the_count():
    with pytest.raises(ValueError) as info:
        score(one_value_reward, call="batch")
    assert str(info.value) == (
        "reward_func one_value_reward returned 1 value ([0.25]) for joint actions 0-1 (dataset rows 5, 7); "
        "expected 2 values (one per joint action); a reward function written for comlrl 1.4.3, which called it "
        'once per joint action with one-element lists, needs reward_call="per_joint_action"'
    )


def test_wrong_count_names_each_dataset_row_once():
    # G = 2 samples of dataset row 3: its joint actions share the row, which is named once
    with pytest.raises(ValueError, match=r"returned 3 values \(\[1, 2, 3\]\) for joint actions 0-1 \(dataset row 3\)"):
        JointReward(lambda c1, c2: [1, 2, 3], 2)(PROMPTS, COMPLETIONS, [3, 3])


@pytest.mark.parametrize(
    "returned, shown",
    [(0.5, "0.5 (float)"), ("ok", "'ok' (str)"), ("1.0", "'1.0' (str)"), ({"a": 1.0, "b": 2.0}, "(dict)")],
)
def test_non_list_return_names_the_rows_and_the_value(returned, shown):
    # a string or a dict of the right length is not read as one reward per character or key
    with pytest.raises(TypeError) as info:
        score(lambda c1, c2: returned, call="batch")
    message = str(info.value)
    assert f"returned {returned!r} ({type(returned).__name__}) for joint actions 0-1 (dataset rows 5, 7)" in message
    assert shown in message
    assert "expected a sequence of 2 numbers (one per joint action)" in message


def test_long_return_is_cut_short():
    with pytest.raises(ValueError) as info:
        score(lambda c1, c2: list(range(1000)))
    message = str(info.value)
    assert "returned 1000 values ([0, 1, 2," in message
    assert "...) for joint actions 0-1 (dataset rows 5, 7)" in message
    assert len(message) < 400


def test_single_value_per_agent_reward_is_singular():
    with pytest.raises(ValueError) as info:
        score(lambda c1, c2: [1.0, [2.0]])
    assert "returned 1 value ([2.0]) for joint action 1 (dataset row 7); a per-agent reward needs 2 values" in str(
        info.value
    )


# ---------------------------------------------------------------- comlrl 1.4.3's keywords and reward_call

BATCH_ITEMS = [{"prompt": "row 5"}, {"prompt": "row 7"}]
CONTEXT = {
    "turn": 2,
    "prompt_history_per_agent": [[["p5"], ["q5"]], [["p7"], ["q7"]]],
    "response_history_per_agent": [[["a0"], ["b0"]], [["a1"], ["b1"]]],
}


def score_all(func, call="batch", num_agents=2):
    """``func`` scored on the two joint actions with every keyword value the trainer gives, in
    one call."""
    return JointReward(func, num_agents, call=call)(PROMPTS, COMPLETIONS, ROWS, CONTEXT, BATCH_ITEMS)


def test_unknown_reward_call_is_refused():
    with pytest.raises(ValueError, match=r"reward_call must be one of 'auto', 'batch', 'per_joint_action', got 'each'"):
        JointReward(completions_only, 2, call="each")


def test_named_keywords_and_kwargs_get_rows_and_prompts_but_not_unnamed_context():
    seen = {}

    def names_them(c1, c2, batch_items=None, prompts=None):
        seen["named"] = (batch_items, prompts)
        return [0.0, 0.0]

    def takes_kwargs(c1, c2, turn, **kwargs):
        seen["kwargs"] = (turn, kwargs)
        return [0.0, 0.0]

    def prompts_first(prompts, c1, c2, **kwargs):
        seen["first"] = (prompts, kwargs)
        return [0.0, 0.0]

    score_all([names_them, takes_kwargs, prompts_first])
    assert seen["named"] == (BATCH_ITEMS, PROMPTS)
    # **kwargs gets 1.4.3's keywords; the context only by name, as 1.4.3 never passed it
    assert seen["kwargs"] == (2, {"batch_items": BATCH_ITEMS, "prompts": PROMPTS})
    assert seen["first"] == (PROMPTS, {"batch_items": BATCH_ITEMS})  # prompts once, positionally


def test_a_required_batch_items_parameter_is_a_keyword_not_the_prompts():
    def rows_required(c1, c2, batch_items):
        assert c1 == COMPLETIONS[0] and batch_items == BATCH_ITEMS
        return [0.0, 1.0]

    reward = JointReward(rows_required, 2)
    assert reward.pass_prompts == (False,)
    assert reward(PROMPTS, COMPLETIONS, ROWS, batch_items=BATCH_ITEMS).raw[:, 0].tolist() == [0.0, 1.0]


def test_a_prompts_parameter_after_the_completions_is_a_keyword():
    def prompts_last(c1, c2, prompts):
        assert (c1, c2, prompts) == (COMPLETIONS[0], COMPLETIONS[1], PROMPTS)
        return [0.0, 1.0]

    reward = JointReward(prompts_last, 2)
    assert reward.pass_prompts == (False,)
    assert reward(PROMPTS, COMPLETIONS, ROWS).raw[:, 0].tolist() == [0.0, 1.0]


def test_rows_edited_by_one_function_reach_neither_the_next_nor_the_dataset():
    rows = [{"prompt": "row 5", "tests": ["t"]}, {"prompt": "row 7", "tests": []}]
    seen = []

    def edits(c1, c2, batch_items):
        batch_items[0]["tests"].append("edited")
        return [0.0, 0.0]

    def reads(c1, c2, batch_items):
        seen.append(batch_items[0]["tests"])
        return [0.0, 0.0]

    JointReward([edits, reads], 2, call="batch")(PROMPTS, COMPLETIONS, ROWS, batch_items=rows)
    assert seen == [["t"]] and rows[0]["tests"] == ["t"]


def test_per_joint_action_calls_get_one_joint_action_of_every_value():
    calls = []

    def record(c1, c2, batch_items, prompts, turn, prompt_history_per_agent, response_history_per_agent):
        calls.append((c1, c2, batch_items, prompts, turn, prompt_history_per_agent, response_history_per_agent))
        return [1.0]

    batch = score_all(record, call="per_joint_action")
    assert calls == [
        ([a], [b], [row], [prompt], 2, [prompts], [responses])
        for a, b, row, prompt, prompts, responses in zip(
            *COMPLETIONS,
            BATCH_ITEMS,
            PROMPTS,
            *(CONTEXT[k] for k in ("prompt_history_per_agent", "response_history_per_agent")),
        )
    ]
    assert batch.raw.tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize(
    "returned, expected",
    [
        (1.5, [1.5, 1.5]),
        ([1.5], [1.5, 1.5]),
        ((1.5,), [1.5, 1.5]),
        (torch.tensor(1.5), [1.5, 1.5]),
        (torch.tensor([1.5]), [1.5, 1.5]),
        (torch.tensor([[1.5]]), [1.5, 1.5]),
        (np.array([1.5]), [1.5, 1.5]),
        ([torch.tensor(1.5)], [1.5, 1.5]),
        ([[1.5, -2.0]], [1.5, -2.0]),  # one per-agent pair
        ([(1.5, -2.0)], [1.5, -2.0]),
        ([torch.tensor([1.5, -2.0])], [1.5, -2.0]),
        (torch.tensor([[1.5, -2.0]]), [1.5, -2.0]),
    ],
)
def test_per_joint_action_returns(returned, expected):
    batch = score(lambda c1, c2: returned, call="per_joint_action")
    assert batch.raw.tolist() == [expected, expected]


@pytest.mark.parametrize("returned", [[1.5, -2.0], torch.tensor([1.5, -2.0]), (1.5, -2.0, 3.0)])
def test_per_joint_action_refuses_a_flat_list_of_several_values(returned):
    def two_values(c1, c2):
        return returned

    with pytest.raises(ValueError) as info:
        score(two_values, call="per_joint_action")
    message = str(info.value)
    assert message.startswith(f"reward_func two_values returned {len(returned)} values (")
    assert "for joint action 0 (dataset row 5), called for that joint action alone" in message
    assert "comlrl 1.4.3 used only the first value (1.5) of such a list" in message
    assert "Return [value] for one reward shared by all agents, or [[v0, v1]] for one reward per agent" in message


def test_actor_critic_reads_a_flat_list_of_n_values_as_per_agent_rewards():
    # comlrl 1.4.3's IAC/MAAC read [r_0, r_1] for one joint action as one reward per agent
    reward = JointReward(lambda c1, c2: [1.5, -2.0], 2, call="per_joint_action", actor_critic_calls=True)
    assert reward(PROMPTS, COMPLETIONS, ROWS).raw.tolist() == [[1.5, -2.0], [1.5, -2.0]]
    three = JointReward(lambda c1, c2: [1.0, 2.0, 3.0], 2, call="per_joint_action", actor_critic_calls=True)
    with pytest.raises(ValueError, match="returned 3 values"):
        three(PROMPTS, COMPLETIONS, ROWS)


def test_auto_tells_a_batch_function_from_a_per_agent_one_when_there_are_as_many_joint_actions_as_agents():
    # 2 joint actions, 2 agents: [x, y] is one reward per joint action (batch) or one per agent
    # of joint action 0 (a 1.4.3 actor-critic function reading [0] only); one call per joint
    # action tells them apart
    def batch(c1, c2):
        return [float(len(a)) for a in c1]

    def per_agent_of_the_first(c1, c2):
        return [float(len(c1[0])), -float(len(c2[0]))]

    reward = JointReward([batch, per_agent_of_the_first], 2, actor_critic_calls=True)
    with pytest.warns(UserWarning, match="per_agent_of_the_first .* returned .* which called one at a time"):
        scored = reward(PROMPTS, COMPLETIONS, ROWS)
    assert reward.calls == ["batch", "per_joint_action"]
    lengths = [[float(len(text)) for text in agent] for agent in COMPLETIONS]
    assert scored.per_function[0].tolist() == [[a, a] for a in lengths[0]]
    assert scored.per_function[1].tolist() == [[a, -b] for a, b in zip(*lengths)]


def test_per_joint_action_refuses_no_value():
    with pytest.raises(ValueError, match=r"returned no value \(\[\]\) for joint action 0 \(dataset row 5\)"):
        score(lambda c1, c2: [], call="per_joint_action")


def test_per_joint_action_errors_name_the_joint_action():
    def fails_on_the_second(c1, c2):
        if c1 == ["a1"]:
            raise KeyError("missing")
        return [1.0]

    with pytest.raises(RuntimeError) as info:
        score(fails_on_the_second, call="per_joint_action")
    message = str(info.value)
    assert message.endswith("(called with 2 lists of sizes [1, 1], for joint action 1 (dataset row 7))")
    with pytest.raises(TypeError, match=r"returned None \(NoneType\) for joint action 1 \(dataset row 7\); expected a"):
        score(lambda c1, c2: [None] if c1 == ["a1"] else [1.0], call="per_joint_action")


@pytest.mark.parametrize("call", ["auto", "batch"])
def test_a_batch_call_that_raises_hints_at_per_joint_action(call):
    def one_joint_action_only(c1, c2):
        assert len(c1) == 1
        return [1.0]

    with pytest.raises(
        RuntimeError, match=r'lists of sizes \[2, 2\]\); .*comlrl 1.4.3.*reward_call="per_joint_action"'
    ):
        score(one_joint_action_only, call=call)
    # with one joint action both ways of calling agree: nothing to hint at
    with pytest.raises(RuntimeError) as info:
        JointReward(lambda c1, c2: 1 / 0, 2, call=call)(PROMPTS[:1], [["a0"], ["b0"]], ROWS[:1])
    assert "reward_call" not in str(info.value)


def test_auto_settles_on_batch_after_a_full_answer():
    # K = N = 2 values are checked once per joint action ([1.0], [2.0]: the same rewards)
    answers = iter([[1.0, 2.0], [1.0], [2.0], [3.0]])
    reward = JointReward(lambda c1, c2: next(answers), 2)
    assert reward(PROMPTS, COMPLETIONS, ROWS).raw[:, 0].tolist() == [1.0, 2.0]
    assert reward.calls == ["batch"]
    with pytest.raises(ValueError, match=r'returned 1 value \(\[3.0\]\) .*needs reward_call="per_joint_action"'):
        reward(PROMPTS, COMPLETIONS, ROWS)


def test_auto_decides_nothing_on_one_joint_action():
    reward = JointReward(lambda c1, c2: [len(c1[0])], 2)
    assert reward(PROMPTS[:1], [["a0"], ["b0"]], ROWS[:1]).raw.tolist() == [[2.0, 2.0]]
    assert reward.calls == ["auto"]


def test_auto_decides_per_function():
    def per_joint(c1, c2):
        return [float(len(c1[0]))]

    with pytest.warns(UserWarning) as caught:
        reward = JointReward([completions_only, per_joint], 2)
        reward(PROMPTS, COMPLETIONS, ROWS)
        batch = reward(PROMPTS, COMPLETIONS, ROWS)
    assert [str(w.message).split(" returned")[0] for w in caught] == ["reward_func per_joint (position 1)"]
    assert reward.calls == ["batch", "per_joint_action"]
    assert batch.per_function[:, :, 0].tolist() == [BASE, [2.0, 2.0]]
