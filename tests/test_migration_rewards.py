"""Reward functions and evaluation hooks written for comlrl 1.4.3 keep their meaning here.

1.4.3 scored one joint action per call, with one-element lists (one per agent), gave a
function that names ``batch_items`` the dataset row and one that names ``prompts`` agent 0's
prompt of the turn, and took the first value returned. Each test below writes a reward as
its users did and checks what it received or what it scored."""

import re
import warnings

import pytest
import torch

from comlrl.rewards.joint_reward import JointReward

from .helpers import DATA, make_trainer, multi_turn_trainer, small_config

ROWS = [0, 2]  # two dataset rows with different prompts


def formatters():
    """Prompts that differ from the row's ``prompt`` column, and from agent to agent."""
    return [lambda row: "A: " + row["prompt"], lambda row: "B: " + row["prompt"]]


# ------------------------------------------------------------------------------ batch_items and prompts
# What one batch call receives (reward_call="batch"): under "auto" a function that takes them is
# also called once per joint action, once, to tell a 1.4.3 one that reads [0] (tested below).
@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_batch_items_are_the_rows_of_their_joint_actions(tmp_path, joint_mode):
    calls = []

    def reward(c1, c2, batch_items=None):
        calls.append((c1, c2, batch_items))
        return [0.0] * len(c1)

    trainer = make_trainer(
        tmp_path, reward_func=reward, args=small_config(tmp_path, joint_mode=joint_mode, reward_call="batch")
    )
    tree = trainer.rollout(trainer.train_prompts, ROWS)
    ((c1, c2, batch_items),) = calls
    turn, num_joint = tree.turns[0], tree.joint_indices.shape[0]
    assert len(batch_items) == len(c1) == len(ROWS) * num_joint
    for k, row in enumerate(batch_items):
        node = [DATA[r] for r in ROWS].index(row)  # the node sampled from this row's prompt
        samples = [node * 2 + tree.joint_indices[k % num_joint, i].item() for i in range(2)]
        assert (c1[k], c2[k]) == (turn.agents[0].texts[samples[0]], turn.agents[1].texts[samples[1]])
    assert batch_items == [DATA[r] for r in ROWS for _ in range(num_joint)]


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_prompts_are_agent_zeros_prompt_of_each_turn_with_the_branch_row(tmp_path, joint_mode):
    by_keyword, positional = [], []

    def keyword_reward(c1, c2, batch_items=None, prompts=None, turn=1, response_history_per_agent=None):
        by_keyword.append((turn, batch_items, prompts, response_history_per_agent))
        return [0.0] * len(c1)

    def positional_reward(prompts, c1, c2):
        positional.append(prompts)
        return [0.0] * len(c1)

    trainer = multi_turn_trainer(
        tmp_path,
        reward=[keyword_reward, positional_reward],
        formatters=formatters(),
        joint_mode=joint_mode,
        reward_call="batch",
    )
    trainer.rollout(trainer.train_prompts, ROWS)
    assert [turn for turn, *_ in by_keyword] == [1, 2]
    (_, rows_1, prompts_1, _), (_, rows_2, prompts_2, history) = by_keyword
    assert prompts_1 == ["A: " + row["prompt"] for row in rows_1]
    # turn 2: the transition's prompt as it wrote it (agent 0 read it through its formatter),
    # from that branch's row and agent 1's turn-1 text (tests/helpers.py revise)
    assert prompts_2 == [f"{row['prompt']} | others: {h[1][0]}" for row, h in zip(rows_2, history)]
    assert {row["prompt"] for row in rows_2} == {DATA[r]["prompt"] for r in ROWS}
    assert positional == [prompts_1, prompts_2]


def recording_transition(calls):
    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        calls.append((prompt, prompt_history_per_agent))
        return [f"turn {len(history) + 1}" for history in prompt_history_per_agent]

    return transition


def test_the_transition_gets_143s_prompt_and_histories(tmp_path):
    """1.4.3's MAGRPO: the row's prompt column ("" without one), and at later turns the
    prompts as the transition wrote them; the agents read them through their formatters."""
    calls, seen = [], []

    def reward(c1, c2, prompts=None):
        seen.append(prompts)
        return [0.0] * len(c1)

    trainer = multi_turn_trainer(
        tmp_path,
        reward=reward,
        transition=recording_transition(calls),
        # at later turns the "prompt" column holds the transition's text (the row has no other)
        formatters=[lambda row: "A: " + row.get("prompt", row["text"]), lambda row: "B: " + row.get("prompt", "-")],
        trainer_kwargs={"train_dataset": [{"text": "hi"}]},
        num_turns=3,
        joint_mode="aligned",
        reward_call="batch",
    )
    tree = trainer.rollout(trainer.train_prompts, [0])
    assert [prompt for prompt, _ in calls] == [""] * 6  # 2 joint actions at turn 1, 2 x 2 at turn 2
    assert [history for _, history in calls] == [[["A: hi"], ["B: -"]]] * 2 + [
        [["A: hi", "turn 2"], ["B: -", "turn 2"]]
    ] * 4
    assert seen == [["A: hi"] * 2, ["turn 2"] * 4, ["turn 3"] * 8]
    assert [turn.prompts for turn in tree.turns] == [[["A: hi"], ["B: -"]]] + [
        [[f"A: turn {t}"] * n, [f"B: turn {t}"] * n] for t, n in ((2, 2), (3, 4))
    ]


def test_kwargs_reward_gets_rows_and_prompts(tmp_path):
    received = []

    def reward(c1, c2, **kwargs):
        received.append(kwargs)
        return [0.0] * len(c1)

    trainer = make_trainer(
        tmp_path, reward_func=reward, formatters=formatters(), args=small_config(tmp_path, reward_call="batch")
    )
    trainer.rollout(trainer.train_prompts, ROWS)
    ((kwargs,),) = [received]
    assert sorted(kwargs) == ["batch_items", "prompts"]
    assert kwargs["prompts"] == ["A: " + row["prompt"] for row in kwargs["batch_items"]]


def test_evaluation_rewards_get_each_rows_item_and_prompt(tmp_path):
    received = []

    def reward(c1, c2, batch_items=None, prompts=None):
        received.append((batch_items, prompts))
        return [0.0] * len(c1)

    trainer = make_trainer(
        tmp_path,
        reward_func=reward,
        formatters=formatters(),
        eval_dataset=DATA,
        args=small_config(tmp_path, eval_num_samples=3, eval_batch_size=2, reward_call="batch"),
    )
    trainer.evaluate()
    assert received == [(DATA[:2], ["A: hello there:", "A: a cat"]), (DATA[2:], ["A: tell me, why?"])]


# ------------------------------------------------------------------------------ one joint action per call
def ratio_143(completions1, completions2):
    """1.4.3's style: one joint action per call, read with [0], the reward returned as [value]."""
    return [len(completions2[0]) / max(1, len(completions1[0]))]


def ratio_batch(completions1, completions2):
    """The same reward over all the joint actions of a turn."""
    return [len(b) / max(1, len(a)) for a, b in zip(completions1, completions2)]


def first_turn_rewards(tmp_path, reward, call, joint_mode="cross"):
    """The rewards of a seeded rollout of two rows (cross: 8 joint actions) under ``reward_call=call``."""
    trainer = make_trainer(
        tmp_path / call, reward_func=reward, args=small_config(tmp_path / call, reward_call=call, joint_mode=joint_mode)
    )
    torch.manual_seed(0)
    return trainer, trainer.rollout(trainer.train_prompts, ROWS).turns[0].rewards


def test_auto_scores_a_143_reward_per_joint_action_and_warns_once(tmp_path):
    _, expected = first_turn_rewards(tmp_path, ratio_batch, "batch")
    with pytest.warns(UserWarning) as caught:
        trainer, rewards = first_turn_rewards(tmp_path, ratio_143, "auto")
        trainer.rollout(trainer.train_prompts, ROWS)
    torch.testing.assert_close(rewards, expected)
    assert len(expected.unique()) > 1, "the rows' joint actions must score differently for the test to mean anything"
    (message,) = [str(w.message) for w in caught if "comlrl 1.4.3" in str(w.message)]
    assert message.startswith("reward_func ratio_143 returned one value ([")
    assert "for 8 joint actions" in message and "comlrl 1.4.3" in message and "once per joint action" in message
    assert 'reward_call="per_joint_action"' in message and 'reward_call="batch"' in message
    assert trainer.reward.calls == ["per_joint_action"]


def test_per_joint_action_scores_a_143_reward_without_a_warning(tmp_path):
    _, expected = first_turn_rewards(tmp_path, ratio_batch, "batch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, rewards = first_turn_rewards(tmp_path, ratio_143, "per_joint_action")
    torch.testing.assert_close(rewards, expected)


def test_batch_refuses_a_143_reward_and_says_what_to_set(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"ratio_143 returned 1 value \(\[.*\]\) for joint actions 0-7 .*expected 8 values .*"
        r'needs reward_call="per_joint_action"',
    ):
        first_turn_rewards(tmp_path, ratio_143, "batch")


def test_a_143_reward_asserting_one_element_lists_is_told_what_to_set(tmp_path):
    def strict_143(completions1, completions2):
        assert len(completions1) == 1, "one joint action per call"
        return [float(len(completions1[0]))]

    with pytest.raises(
        RuntimeError, match=r'(?s)strict_143 raised AssertionError: .*needs reward_call="per_joint_action"'
    ):
        first_turn_rewards(tmp_path, strict_143, "auto")
    _, rewards = first_turn_rewards(tmp_path, strict_143, "per_joint_action")
    assert rewards.shape == (2, 4, 2)


@pytest.mark.parametrize("call", ["per_joint_action", "auto"])
def test_per_joint_action_reward_returning_two_values_is_an_error(tmp_path, call):
    def per_agent_143(completions1, completions2):
        return [float(len(completions1[0])), float(len(completions2[0]))]

    if call == "auto":  # two values for 8 joint actions: a batch function's wrong count
        with pytest.raises(ValueError, match=r"per_agent_143 returned 2 values .*expected 8 values"):
            first_turn_rewards(tmp_path, per_agent_143, call)
        return
    with pytest.raises(ValueError, match=r"comlrl 1.4.3 used only the first value .* or \[\[v0, v1\]\] for one reward"):
        first_turn_rewards(tmp_path, per_agent_143, call)


def test_per_joint_action_per_agent_rewards(tmp_path):
    def per_agent_pair(completions1, completions2):
        return [[float(len(completions1[0])), float(len(completions2[0]))]]

    trainer, rewards = first_turn_rewards(tmp_path, per_agent_pair, "per_joint_action", joint_mode="aligned")
    torch.manual_seed(0)
    turn = trainer.rollout(trainer.train_prompts, ROWS).turns[0]
    lengths = [[len(text) for text in agent.texts] for agent in turn.agents]  # aligned: joint action j = sample j
    assert rewards.reshape(-1, 2).tolist() == [[float(a), float(b)] for a, b in zip(*lengths)]


# ------------------------------------------------------------------------------ K values that mean something else
def score_rows(reward, prompts, completions, rows):
    """``reward``'s ``(K, N)`` rewards of joint actions on ``rows`` (dataset rows of ``TARGETS``)."""
    return reward(prompts, completions, rows, batch_items=[TARGETS[r] for r in rows]).raw


TARGETS = [{"target": 1.0}, {"target": 100.0}, {"target": 7.0}]


def first_row_143(completions1, completions2, batch_items=None):
    """1.4.3's style (one joint action per call, so its row is batch_items[0]), scored with a
    comprehension: called with several rows it gives the first one's target to all."""
    return [batch_items[0]["target"] for _ in zip(completions1, completions2)]


def first_prompt_143(prompts, completions1, completions2):
    return [float(len(prompts[0])) for _ in zip(completions1, completions2)]


def test_auto_catches_a_143_reward_reading_the_first_row_and_scores_each_row(tmp_path):
    trainer = make_trainer(
        tmp_path, reward_func=first_row_143, train_dataset=[{**DATA[r], **TARGETS[r]} for r in (0, 1)]
    )
    with pytest.warns(
        UserWarning,
        match=r"(?s)first_row_143 returned 4 values for 4 joint actions of different "
        r"dataset rows.*reads one joint action's batch_items.*reward_call=\"per_joint_action\"",
    ):
        rewards = trainer.rollout(trainer.train_prompts, [0, 1]).turns[0].rewards
    assert rewards[0].unique().tolist() == [1.0] and rewards[1].unique().tolist() == [100.0]
    assert trainer.reward.calls == ["per_joint_action"]


def test_auto_catches_a_143_reward_reading_the_first_prompt():
    reward = JointReward(first_prompt_143, num_agents=2)
    with pytest.warns(UserWarning, match="first_prompt_143 returned 3 values for 3 joint actions of different"):
        values = reward(["ab", "abcd", "abc"], [["x", "y", "z"], ["u", "v", "w"]], [0, 0, 0]).raw
    assert values[:, 0].tolist() == [2.0, 4.0, 3.0]


def test_auto_waits_for_joint_actions_of_several_rows_before_settling():
    calls = []

    def counted(completions1, completions2, batch_items=None):
        calls.append(len(completions1))
        return first_row_143(completions1, completions2, batch_items)

    reward = JointReward(counted, num_agents=2)
    one_row = score_rows(reward, ["p", "p", "p"], [["a", "b", "c"], ["d", "e", "f"]], [1, 1, 1])
    assert one_row[:, 0].tolist() == [100.0] * 3 and calls == [3] and reward.calls == ["auto"]
    with pytest.warns(UserWarning, match="counted returned 3 values"):
        two_rows = score_rows(reward, ["p", "q", "q"], [["a", "b", "c"], ["d", "e", "f"]], [0, 2, 2])
    assert two_rows[:, 0].tolist() == [1.0, 7.0, 7.0] and calls == [3, 3, 1, 1, 1]


def test_auto_settles_a_batch_reward_that_reads_each_row_after_one_check():
    calls = []

    def each_row(completions1, completions2, batch_items=None):
        calls.append(len(completions1))
        # a batch of several rounds otherwise than one row alone, as a batched model would
        return [item["target"] * (1 + 1e-7 * (len(completions1) > 1)) for item in batch_items]

    reward = JointReward(each_row, num_agents=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = score_rows(reward, ["p", "q"], [["a", "b"], ["c", "d"]], [0, 1])
        score_rows(reward, ["p", "q"], [["a", "b"], ["c", "d"]], [1, 2])
    assert reward.calls == ["batch"] and calls == [2, 1, 1, 2]
    torch.testing.assert_close(first[:, 0], torch.tensor([1.0, 100.0]))


def test_auto_scores_a_varying_batch_reward_per_joint_action_and_says_how_to_keep_the_batch():
    draws = iter(range(100))

    def sampled_judge(completions1, completions2, batch_items=None):
        return [float(next(draws)) for _ in completions1]

    reward = JointReward(sampled_judge, num_agents=2)
    with pytest.warns(UserWarning, match=r"for a batch function whose rewards vary from call to call"):
        values = score_rows(reward, ["p", "q"], [["a", "b"], ["c", "d"]], [0, 1])
    assert values[:, 0].tolist() == [2.0, 3.0] and reward.calls == ["per_joint_action"]


@pytest.mark.parametrize("actor_critic_calls", [False, True])
def test_auto_checks_n_values_for_n_joint_actions(actor_critic_calls):
    def per_agent_143(completions1, completions2):
        return [float(len(completions1[0])), float(len(completions2[0]))]

    reward = JointReward(per_agent_143, num_agents=2, actor_critic_calls=actor_critic_calls)
    completions = [["a", "bbb"], ["cc", "dddd"]]
    if not actor_critic_calls:  # 1.4.3's MAGRPO kept the first value: an error that says so
        with pytest.raises(ValueError, match=r"returned 2 values \(\[1.0, 2.0\]\) .*1.4.3 used only the first value"):
            reward(["p", "p"], completions, [0, 0])
        return
    with pytest.warns(UserWarning, match="one per agent, as its actor-critic trainers read it"):
        values = reward(["p", "p"], completions, [0, 0]).raw
    assert values.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_auto_settles_a_batch_reward_of_n_values_for_n_joint_actions():
    def lengths(completions1, completions2):
        return [float(len(a) + len(b)) for a, b in zip(completions1, completions2)]

    reward = JointReward(lengths, num_agents=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = reward(["p", "p"], [["a", "bbb"], ["cc", "dddd"]], [0, 0]).raw
    assert values[:, 0].tolist() == [3.0, 7.0] and reward.calls == ["batch"]


# ------------------------------------------------------------------------------ metric names
def test_metric_names_are_143s(tmp_path):
    trainer = make_trainer(tmp_path, eval_dataset=DATA[:1])
    trained, evaluated = trainer.training_step([0]), trainer.evaluate()
    assert {"turn_1/reward_mean", "turn_1/expected_return", "turn_1/nodes"} <= set(trained)
    assert {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"} <= set(evaluated)
    assert not [key for key in [*trained, *evaluated] if re.search(r"turn\d", key)]


def test_a_functions_own_reward_call_attribute_wins_over_the_configs():
    calls = []

    def wrapper(completions1, completions2, batch_items=None):
        calls.append(len(completions1))
        return [item["target"] for item in batch_items]

    wrapper.reward_call = "batch"  # as the library's own wrappers (reward models, role splitting) say
    reward = JointReward(wrapper, num_agents=2, call="auto")
    score_rows(reward, ["p", "q"], [["a", "b"], ["c", "d"]], [0, 1])
    assert calls == [2] and reward.calls == ["batch"]
    wrapper.reward_call = "sometimes"
    with pytest.raises(ValueError, match="reward_func wrapper has reward_call='sometimes'; it must be one of 'auto'"):
        JointReward(wrapper, num_agents=2)


def test_a_batch_reward_that_cannot_score_one_joint_action_alone_stays_a_batch_one():
    def ranks(completions1, completions2):  # ranks the joint actions against each other: needs them all
        assert len(completions1) > 1, "one joint action has nothing to be ranked against"
        lengths = [len(a) + len(b) for a, b in zip(completions1, completions2)]
        return [float(sorted(lengths).index(n)) for n in lengths]

    reward = JointReward(ranks, num_agents=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = reward(["p", "p"], [["a", "bbb"], ["cc", "dddd"]], [0, 0]).raw
    assert values[:, 0].tolist() == [0.0, 1.0] and reward.calls == ["batch"]
