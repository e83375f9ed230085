"""Dynamic sampling (DAPO): which rows are flat (by hand), rollout trees cut and joined back
into the tree of the same rows, the refill's rounds, draws and bound, and MAGRPO runs whose
batches stay full and resume exactly from an interruption in the middle of a refill."""

import json
import os
import random
import signal
import warnings
from unittest import mock

import pytest
import torch

from comlrl.algorithms import flat_rows
from comlrl.engine.update import PolicyUpdate
from comlrl.environments.functions import RewardAndTransition
from comlrl.rewards.joint_reward import JointReward
from comlrl.rollout.dynamic_sampling import DynamicSampling, refill_rows
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import RolloutTree, build_tree, join_trees
from comlrl.trainers.reinforce import MAGRPOConfig
from tests.helpers import (
    assert_same_run,
    char_tokenizer,
    log_lines,
    make_trainer,
    scripted_generate,
    small_config,
)
from tests.test_distributed import torchrun


# ------------------------------------------------------------------ which rows are flat, by hand
def test_a_row_is_flat_when_every_agents_group_is():
    # N = 2 agents, M = 3 rows, G = 2: row 0 flat for both; row 1 flat for agent 0 only; row 2 for neither.
    credits = torch.tensor([[[1.0, 1.0], [2.0, 2.0], [0.0, 1.0]], [[3.0, 3.0], [0.0, 5.0], [1.0, 2.0]]])
    assert flat_rows([[credits]], [torch.full((3, 2), -1)]).tolist() == [True, False, False]
    # A second signal (a reward function of its own) that differs in row 0 keeps it.
    other = credits.clone()
    other[0, 0] = torch.tensor([0.0, 1.0])
    assert flat_rows([[credits], [other]], [torch.full((3, 2), -1)]).tolist() == [False, False, False]


def test_a_row_is_flat_only_when_every_node_below_it_is():
    # Turn 1: 2 rows, J = 2; row 0's joint actions start turn-2 nodes 0 and 1, row 1's second one node 2.
    turn1 = torch.tensor([[[4.0, 4.0], [7.0, 7.0]]])  # N = 1: both rows' groups flat at turn 1
    children1 = torch.tensor([[0, 1], [-1, 2]])
    turn2 = torch.tensor([[[1.0, 1.0], [0.0, 3.0], [2.0, 2.0]]])  # node 1 (row 0's) is not flat
    children2 = torch.full((3, 2), -1)
    assert flat_rows([[turn1, turn2]], [children1, children2]).tolist() == [False, True]
    turn2[0, 1] = torch.tensor([3.0, 3.0])
    assert flat_rows([[turn1, turn2]], [children1, children2]).tolist() == [True, True]


# ------------------------------------------------------------------ trees cut and joined
ROWS = [{"prompt": p} for p in ["ab", "hello there", "c", "tell me why", "xyz"]]


def scripted_tree(rows, num_turns=2, ends=frozenset()):
    """The rollout tree of ``rows`` with completions written from the prompts (no model): 2
    agents, G = 2, aligned; a branch of a row in ``ends`` stops after turn 1 at its 2nd joint
    action, and its 1st joint action ends at turn 2 only."""
    table = PromptTable(ROWS, None, num_agents=2)

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        if prompt in {ROWS[r]["prompt"] for r in ends} and agent_completions[0].endswith("z"):
            return None
        return [f"{prompt} {c}" for c in agent_completions]

    def score(a, b):
        return [float(len(x) * 2 + len(y)) for x, y in zip(a, b)]

    reward = JointReward(score, 2, call="batch")
    joint = torch.arange(2).unsqueeze(1).expand(2, 2)
    environment = RewardAndTransition(table, reward, 2, transition=Transition(transition, 2))
    return build_tree(environment, rows, scripted_generate, joint, 2, num_turns)


def assert_same_tree(ours: RolloutTree, theirs: RolloutTree):
    assert len(ours.turns) == len(theirs.turns)
    for a, b in zip(ours.turns, theirs.turns):
        assert (a.number, a.rows, a.prompts) == (b.number, b.rows, b.prompts)
        assert (a.prompt_history, a.response_history) == (b.prompt_history, b.response_history)
        for name in ("rewards", "raw_rewards", "per_function_rewards", "children"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        for x, y in zip(a.agents, b.agents):
            assert x.texts == y.texts
            for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
                assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_rows_cut_from_trees_and_joined_are_the_tree_of_those_rows():
    ends = frozenset({1, 3})
    whole = scripted_tree([0, 1, 2, 3], ends=ends)
    assert whole.turns[1].num_nodes == 6  # rows 1 and 3 stop one branch each: the children need renumbering
    later = scripted_tree([4, 1], ends=ends)
    joined = join_trees([whole.select_roots([3, 1]), later.select_roots([0]), whole.select_roots([0])])
    assert_same_tree(joined, scripted_tree([3, 1, 4, 0], ends=ends))
    assert joined.transition_calls == 2 * whole.transition_calls + later.transition_calls  # each part's, summed


def test_joining_pads_prompts_with_the_pad_id_so_a_prompt_reads_alike():
    short, long = scripted_tree([2], num_turns=1), scripted_tree([1], num_turns=1)
    agent = join_trees([short, long]).turns[0].agents[0]
    assert agent.prompt_ids.shape[1] == long.turns[0].agents[0].prompt_ids.shape[1] > 1
    pad = char_tokenizer().pad_token_id
    assert agent.pad_id == pad and (agent.prompt_ids[~agent.prompt_mask.bool()] == pad).all()
    assert torch.equal(agent.prompt_ids[:2], scripted_tree([2, 1], num_turns=1).turns[0].agents[0].prompt_ids[:2])


# ------------------------------------------------------------------ the refill, on scripted trees
def flat_by_row(flat):
    """Flatness by dataset row: the rows in ``flat`` are flat."""
    return lambda tree: torch.tensor([row in flat for row in tree.turns[0].rows])


def sampler(flat, max_rounds=3, rank=0, most=lambda missing: missing, played=None):
    def play(rows):
        if played is not None:
            played.append(list(rows))
        return scripted_tree(rows, num_turns=1)

    return DynamicSampling(play, flat_by_row(flat), len(ROWS), max_rounds, seed=7, rank=rank, most=most)


def test_flat_rows_are_replaced_by_rows_not_played_in_the_step():
    played = []
    tree, metrics = sampler({0, 2}, played=played)(scripted_tree([0, 1, 2], num_turns=1), step=5)
    assert played == [refill_rows(5, 2, {0, 1, 2}, random.Random("7/5/1/0"))]
    assert sorted(played[0]) == [3, 4]  # the only rows this step has not played
    assert tree.turns[0].rows == [1, *played[0]] and tree.turns[0].num_nodes == 3
    own_rewards = scripted_tree([0, 1, 2], num_turns=1).turns[0].rewards
    assert {key: stat.value() for key, stat in metrics.items()} == {
        "dynamic_sampling/batch_reward_mean": pytest.approx(own_rewards.mean().item()),
        "dynamic_sampling/rounds": 1.0,
        "dynamic_sampling/flat_row_frac": 2 / 5,
        "dynamic_sampling/refill_rows": 2.0,
        "dynamic_sampling/flat_rows_trained": 0.0,
    }


def test_draws_depend_on_the_seed_step_round_and_rank_only():
    draws = {refill_rows(100, 3, set(), random.Random(f"7/{s}/{r}/{k}")).__repr__() for s, r, k in
             [(1, 1, 0), (2, 1, 0), (1, 2, 0), (1, 1, 1)]}  # fmt: skip
    assert len(draws) == 4
    assert refill_rows(100, 3, set(), random.Random("7/1/1/0")) == refill_rows(100, 3, set(), random.Random("7/1/1/0"))
    assert sorted(refill_rows(3, 5, {0, 1}, random.Random(0))[:1]) == [2]  # fresh rows first, then any


def test_the_bound_keeps_the_batch_full_with_flat_rows_and_warns():
    played = []
    with pytest.warns(UserWarning, match="max_resample_rounds=2 refill rounds left flat rows"):
        tree, metrics = sampler({0, 1, 2, 3}, max_rounds=2, played=played)(
            scripted_tree([0, 1, 2], num_turns=1), step=1
        )
    assert len(played) == 2 and tree.turns[0].num_nodes == 3
    kept = [row for round_rows in played for row in round_rows if row == 4]
    assert tree.turns[0].rows == kept + [0, 1, 2][: 3 - len(kept)]  # refilled rows, then the first flat ones
    assert metrics["dynamic_sampling/flat_rows_trained"].value() == 3 - len(kept)


def test_a_full_rank_joins_every_round_and_plays_nothing():
    asked, played = [], []

    def other_rank_misses_two(missing):  # the all-reduce's max: another rank misses rows for two rounds
        asked.append(missing)
        return 1 if len(asked) <= 2 else missing

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree, metrics = sampler(set(), most=other_rank_misses_two, played=played)(scripted_tree([0, 1], 1), 1)
    assert asked == [0, 0, 0] and played == [] and tree.turns[0].rows == [0, 1]
    assert metrics["dynamic_sampling/rounds"].value() == 2.0


# ------------------------------------------------------------------ MAGRPO with dynamic sampling
TASK = [{"prompt": p, "flat": i % 2 == 0} for i, p in enumerate(["hi:", "a cat", "why?", "dogs", "x y", "end"])]


def half_flat(a, b, batch_items):
    """The even rows give every sample 1; the others reward length."""
    return [1.0 if row["flat"] else float(len(x) + 2 * len(y)) for x, y, row in zip(a, b, batch_items)]


def interrupting_half_flat(at_call):
    """``half_flat`` that sends this process SIGINT during its ``at_call``-th call (the step still finishes)."""
    calls = []

    def half_flat_(a, b, batch_items):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return half_flat(a, b, batch_items)

    half_flat_.__name__ = "half_flat"  # logged under the straight run's name
    return half_flat_


def dynamic_trainer(tmp_path, reward=half_flat, **overrides):
    values = dict(dynamic_sampling=True, per_device_train_batch_size=3, num_train_epochs=2, max_new_tokens=4)
    args = small_config(tmp_path, save_steps=1, **{**values, **overrides})
    return make_trainer(tmp_path, train_dataset=TASK, reward_func=reward, args=args)


def test_the_batch_stays_full_of_rows_that_teach(tmp_path):
    trainer = dynamic_trainer(tmp_path)
    with mock.patch.object(PolicyUpdate, "__call__", autospec=True, side_effect=PolicyUpdate.__call__) as update:
        trainer.train()
    batches = [call.args[1].turns[0].rows for call in update.call_args_list]  # each step's trained rows
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    assert [len(rows) for rows in batches] == [3] * 4
    refilled = [line for line in lines if line["dynamic_sampling/refill_rows"] > 0]
    assert refilled, "the even rows are flat: some step must refill"
    for line, rows in zip(lines, batches):
        trained = line["dynamic_sampling/flat_rows_trained"]
        assert sum(TASK[row]["flat"] for row in rows) == trained
        if trained == 0:
            assert line["reward/zero_std_group_frac"] == 0.0
    assert all(line["dynamic_sampling/flat_row_frac"] > 0 for line in lines)


def test_default_runs_do_not_refill(tmp_path):
    trainer = make_trainer(tmp_path, train_dataset=TASK, reward_func=half_flat, args=small_config(tmp_path))
    assert trainer.objective.refill is None
    trainer.train()
    assert not any(key.startswith("dynamic_sampling/") for line in log_lines(tmp_path / "run", "metrics.jsonl")
                   for key in line)  # fmt: skip


def test_an_interruption_inside_a_refill_resumes_exactly(tmp_path):
    straight = dynamic_trainer(tmp_path / "straight")
    straight.train()
    # Call 1 scores step 1's batch, call 2 its first refill round: SIGINT there lets the step finish.
    interrupted = dynamic_trainer(tmp_path / "cut", reward=interrupting_half_flat(2))
    interrupted.train()
    assert interrupted.global_step == 1
    assert log_lines(tmp_path / "cut" / "run", "metrics.jsonl")[0]["dynamic_sampling/refill_rows"] > 0
    resumed = dynamic_trainer(tmp_path / "cut")
    resumed.train(resume_from_checkpoint=True)
    assert_same_run(resumed, straight, tmp_path / "cut", tmp_path / "straight")


def test_settings_that_cannot_refill_are_refused():
    with pytest.raises(ValueError, match="advantage_mode='raw' has no baseline"):
        MAGRPOConfig(dynamic_sampling=True, advantage_mode="raw", advantage_normalization=False)
    with pytest.raises(ValueError, match="max_resample_rounds=5 bounds .* set dynamic_sampling=True"):
        MAGRPOConfig(max_resample_rounds=5)
    with pytest.raises(ValueError, match="max_resample_rounds"):
        MAGRPOConfig(dynamic_sampling=True, max_resample_rounds=0)


def test_two_ranks_agree_on_the_rounds_when_only_one_ranks_groups_are_flat(tmp_path):
    """2 ranks x 2 rows, 2 epochs of 2 steps, then a resume from checkpoint-2: rank 0's
    odd-length prompts are flat (``rank_flat_score``), rank 1's groups never are."""
    torchrun("dynamic", tmp_path, ranks=2, per_device_rows=2)
    records = [
        [json.loads(line) for line in (tmp_path / f"refill_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    ]
    assert [r["step"] for r in records[0]] == [r["step"] for r in records[1]] == [1, 2, 3, 4, 3, 4]
    assert [r["rounds"] for r in records[0]] == [r["rounds"] for r in records[1]]  # one all-reduce a round
    assert sum(r["refill_rows"] for r in records[0]) > 0
    assert all(r["refill_rows"] == 0 and r["flat_row_frac"] == 0 for r in records[1])
    assert any(r["rounds"] > 0 for r in records[1])  # full, rank 1 still joined rank 0's rounds
    assert records[0][2:4] == records[0][4:6]  # the resumed steps refilled as the straight run's did
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for a, b in zip(rank0["straight"], rank1["straight"]):
        assert torch.equal(a, b)
    for a, b in zip(rank0["resumed"], rank0["straight"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_under_gdpo_a_row_flat_only_in_the_summed_reward_is_kept(tmp_path):
    def letters(a, b):
        return [float(sum(map(ord, x + y))) for x, y in zip(a, b)]

    def minus_letters(a, b):
        return [-score for score in letters(a, b)]

    flat = {}
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        args = small_config(tmp_path / aggregation, dynamic_sampling=True, multi_objective_aggregation=aggregation)
        trainer = make_trainer(tmp_path / aggregation, reward_func=[letters, minus_letters], args=args)
        run = trainer.objective.run
        tree = run.rollout(run.train_prompts, [0, 1, 2], reward=run.train_reward)
        assert (tree.turns[0].rewards == 0).all()  # the sum is 0 for every joint action
        flat[aggregation] = trainer.objective.flat_rows(tree).tolist()
    assert flat == {"sum_then_normalize": [True] * 3, "normalize_then_sum": [False] * 3}
