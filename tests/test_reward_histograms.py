"""The per-round reward histograms of the iterative preference trainers (comlrl 1.4.3's
``log_reward_distribution=True``): bins, counts and records by hand, the declared reward
range and its errors, and MADPOIter and MARLHFIter runs that write them from the raw
rewards (before ``reward_processor``)."""

import functools
import json
import re

import numpy as np
import pytest
import torch

import comlrl.utils
from comlrl.checkpoint.run_folder import check_new_run
from comlrl.rewards import JointReward
from comlrl.trainers.dpo import MADPOIterTrainer
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.trainers.dpo.reward_histograms import (
    bin_counts,
    bin_edges,
    log_reward_distribution,
    pair_raw_rewards,
    raw_reward_range,
    reward_series,
    round_metrics,
    round_record,
)
from comlrl.trainers.rlhf import MARLHFIterTrainer
from comlrl.utils.reward_range import resolve_reward_range, set_reward_range

from .helpers import DATA, char_tokenizer, content_score, log_lines, tiny_llama
from .test_madpo_iter import config as madpo_iter_config
from .test_marlhf_iter import config as marlhf_iter_config
from .test_marlhf_iter import folder  # noqa: F401 (the fixture)


def ranged(low=0.0, high=13.0):
    """``content_score`` (values 0 to 12) under its own name, declaring ``reward_range``."""

    def scored(*completions):
        return content_score(*completions)

    scored.reward_range = (low, high)
    return scored


def processed(reward):
    """A processor that moves every value, so processed and raw rewards differ."""
    return 10.0 * reward + 1.0


def pair(target, comparator):
    return PreferencePair(0, [], [], [], [], [], [], 1.0, 0.0, None, target, comparator)


# ------------------------------------------------------------------------------ by hand
def test_sixteen_equal_bins_span_the_range():
    edges = bin_edges((0.0, 1.6))
    np.testing.assert_allclose(edges, [0.1 * i for i in range(17)])
    record = round_record(0, (0.0, 1.6), ([], []), ([], []))
    assert (record["iteration"], record["reward_min"], record["reward_max"], record["num_bins"]) == (1, 0.0, 1.6, 16)
    np.testing.assert_allclose(record["bin_centers"], [0.05 + 0.1 * i for i in range(16)])


def test_counts_by_hand_out_of_range_values_in_the_edge_bins():
    edges = bin_edges((0.0, 1.6))
    counts = bin_counts([0.0, 0.05, 0.1, 0.8, 1.6], edges)  # a value on an edge goes up; the last bin is closed
    assert counts == [2, 1] + [0] * 6 + [1] + [0] * 6 + [1]
    outside = bin_counts([-3.0, 99.0, 1.7], edges)  # 1.4.3 clipped them into the edge bins
    assert outside == [1] + [0] * 14 + [2]
    series = reward_series([-3.0, 0.05, 99.0], edges)
    assert series["sample_count"] == sum(series["counts"]) == 3
    assert series["raw_rewards"] == [-3.0, 0.05, 99.0] and series["mean"] == pytest.approx(32.0166666)  # unclipped


def test_an_empty_side_has_zero_counts_and_no_mean():
    series = reward_series([], bin_edges((0.0, 1.0)))
    assert series == {"sample_count": 0, "mean": None, "counts": [0] * 16, "raw_rewards": []}
    record = round_record(1, (0.0, 1.0), (torch.tensor([[0.5]]), []), ([], []))
    metrics = round_metrics(record, pair_count=0)
    assert metrics == {
        "iter/reward_distribution/current_iteration": 2.0,
        "iter/reward_distribution/target_sample_count": 1.0,
        "iter/reward_distribution/comparator_sample_count": 0.0,
        "iter/reward_distribution/target_mean": 0.5,
    }  # no comparator mean, no selected pairs' metrics


def test_the_record_and_metrics_of_a_round_in_1_4_3s_layout():
    candidates = (torch.tensor([[0.0, 1.0], [0.25, 0.75]]), torch.tensor([[1.0], [1.0]]))  # (rows, N), (rows, M)
    pairs = [pair(0.75, 1.0), pair(0.0, 1.0), pair(None, None)]  # the last read from an older checkpoint
    record = round_record(2, (0.0, 1.0), candidates, pair_raw_rewards(pairs))
    assert list(record) == [
        "iteration",
        "reward_min",
        "reward_max",
        "num_bins",
        "bin_edges",
        "bin_centers",
        "candidate",
        "selected",
    ]
    assert record["iteration"] == 3
    target, comparator = record["candidate"]["target"], record["candidate"]["comparator"]
    assert target["raw_rewards"] == [0.0, 1.0, 0.25, 0.75] and target["mean"] == 0.5
    assert target["counts"] == [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1]
    assert comparator["counts"] == [0] * 15 + [2] and comparator["sample_count"] == 2
    assert record["selected"]["target"]["raw_rewards"] == [0.75, 0.0]
    assert record["selected"]["comparator"]["raw_rewards"] == [1.0, 1.0]
    metrics = round_metrics(record, pair_count=len(pairs))
    assert metrics["iter/selected_reward_distribution/pair_count"] == 3.0  # 1.4.3 counted every pair
    assert metrics["iter/selected_reward_distribution/target_sample_count"] == 2.0
    assert metrics["iter/selected_reward_distribution/target_mean"] == 0.375
    assert metrics["iter/selected_reward_distribution/comparator_mean"] == 1.0
    assert metrics["iter/reward_distribution/comparator_mean"] == 1.0


def test_a_round_is_written_whole(tmp_path):
    pairs = [pair(0.5, 0.25), pair(None, None)]
    metrics = log_reward_distribution(str(tmp_path), 0, (0.0, 1.0), ([0.5], [0.25]), pairs)
    written = tmp_path / "reward_distributions"
    assert [p.name for p in written.iterdir()] == ["iteration_0001.json"]  # no .tmp left
    record = json.loads((written / "iteration_0001.json").read_text())
    assert record == round_record(0, (0.0, 1.0), ([0.5], [0.25]), ([0.5], [0.25]))
    assert metrics == round_metrics(record, 2)  # every training pair counted, as 1.4.3


# ------------------------------------------------------------------------------ the range
def test_the_range_of_weighted_functions():
    assert raw_reward_range(JointReward(ranged(0.0, 1.0), 2)) == (0.0, 1.0)
    weighted = JointReward([ranged(0.0, 1.0), ranged(0.0, 3.0)], 2, weights=[2.0, -1.0])
    assert raw_reward_range(weighted) == (-3.0, 2.0)  # 2 * [0, 1] + (-1) * [0, 3]
    with pytest.raises(ValueError, match=r"reward_weights=\[0.0\] make the raw reward's range the single value 0"):
        raw_reward_range(JointReward(ranged(), 2, weights=[0.0]))


@pytest.mark.parametrize("declared", [(1.0, 0.0), (0.0, 0.0), (0.0, float("inf")), "01", (0.0, 1.0, 2.0), 5, (0, "1")])
def test_a_bad_reward_range_is_named(declared):
    reward = ranged()
    reward.reward_range = declared
    with pytest.raises(
        ValueError, match=rf"reward_func scored has reward_range={re.escape(repr(declared))}: it must be \(minimum"
    ):
        raw_reward_range(JointReward(reward, 2))


def test_a_missing_reward_range_says_how_to_set_it():
    with pytest.raises(ValueError, match=r"reward_func content_score declares none: set content_score.reward_range"):
        raw_reward_range(JointReward([ranged(), content_score], 2))


def test_set_reward_range_is_1_4_3s_helper():
    assert (
        comlrl.utils.set_reward_range is set_reward_range and comlrl.utils.resolve_reward_range is resolve_reward_range
    )

    def reward(*completions):
        return [0.0] * len(completions[0])

    assert resolve_reward_range(reward) is None
    assert set_reward_range(reward, 0, 2) is reward and reward.reward_range == (0.0, 2.0)
    assert resolve_reward_range(set_reward_range(functools.partial(reward), -1, 1)) == (-1.0, 1.0)
    with pytest.raises(ValueError, match=r"reward_func reward has reward_range=\(2, 0\)"):
        set_reward_range(reward, 2, 0)
    assert reward.reward_range == (0.0, 2.0)  # checked before it is set

    class Scorer:
        def score(self, *completions):
            return reward(*completions)

    with pytest.raises(TypeError, match=r"reward_func score \(method\) takes no attributes"):
        set_reward_range(Scorer().score, 0, 1)


# ------------------------------------------------------------------------------ the trainers
def madpo_iter(tmp_path, reward, **overrides):
    tok = char_tokenizer()
    return MADPOIterTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=reward,
        reward_processor=processed,
        args=madpo_iter_config(tmp_path, log_reward_distribution=True, **overrides),
    )


def test_madpo_iter_writes_each_rounds_raw_rewards(tmp_path):
    run = madpo_iter(tmp_path, ranged(), comparator_num_candidates=3)
    run.train()
    lines = [line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "iter/current_iteration" in line]
    written = tmp_path / "run" / "reward_distributions"
    assert len(lines) == 2 and sorted(p.name for p in written.iterdir()) == [
        "iteration_0001.json",
        "iteration_0002.json",
    ]
    for round_index, line in enumerate(lines):
        record = json.loads((written / f"iteration_{round_index + 1:04d}.json").read_text())
        assert record["iteration"] == round_index + 1 and record["bin_edges"][::4] == [0.0, 3.25, 6.5, 9.75, 13.0]
        target, comparator = record["candidate"]["target"], record["candidate"]["comparator"]
        assert target["sample_count"] == sum(target["counts"]) == 3 * 4  # rows x preference_num_candidates
        assert comparator["sample_count"] == sum(comparator["counts"]) == 3 * 3  # rows x comparator_num_candidates
        for value in target["raw_rewards"] + comparator["raw_rewards"]:
            assert value == int(value) and 0 <= value <= 12  # content_score's values, not the processor's
        assert line["iter/current_reward_mean"] == pytest.approx(processed(target["mean"]))
        assert line["iter/comparator_reward_mean"] == pytest.approx(processed(comparator["mean"]))
        assert line["iter/reward_distribution/target_mean"] == pytest.approx(target["mean"])
        assert line["iter/reward_distribution/comparator_sample_count"] == 9.0
        selected = record["selected"]
        assert selected["target"]["sample_count"] == line["iter/train_preference_pairs"] > 0
        assert line["iter/selected_reward_distribution/pair_count"] == line["iter/train_preference_pairs"]
        assert line["iter/selected_reward_distribution/comparator_mean"] == pytest.approx(
            selected["comparator"]["mean"]
        )
    assert record["selected"]["target"]["raw_rewards"] == [p.target_raw_reward for p in run.pairs]  # the last round's
    for p in run.pairs:
        sides = sorted(map(processed, (p.target_raw_reward, p.comparator_raw_reward)))
        assert [p.rejected_reward, p.chosen_reward] == sides  # the pair's rewards are the processed ones


def test_madpo_iter_refuses_a_missing_or_bad_range_when_built(tmp_path):
    with pytest.raises(ValueError, match=r"reward_func content_score declares none: .*\(0.0, 1.0\)"):
        madpo_iter(tmp_path, content_score)
    with pytest.raises(ValueError, match=r"reward_func scored has reward_range=\(1.0, 0.0\)"):
        madpo_iter(tmp_path, ranged(1.0, 0.0))
    tok = char_tokenizer()
    MADPOIterTrainer(  # without the histograms, the range is not read
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=ranged(1.0, 0.0),
        args=madpo_iter_config(tmp_path),
    )


def test_marlhf_iter_histograms_what_ranked_the_candidates(folder):  # noqa: F811 (the fixture)
    tok = char_tokenizer()
    run = MARLHFIterTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=ranged(),
        reward_processor=processed,
        args=marlhf_iter_config(folder, log_reward_distribution=True, preference_scoring_reward="reward_model"),
    )
    run.train()
    records = [
        json.loads((folder / "run" / "reward_distributions" / f"iteration_000{r}.json").read_text()) for r in (1, 2)
    ]
    first = records[0]["candidate"]["target"]["raw_rewards"]
    assert len(first) == 12 and all(value == int(value) and 0 <= value <= 12 for value in first)  # the task reward
    first_round, second_round = run.rounds.shards
    assert first_round and second_round
    for p in first_round:  # the task reward: processed
        assert sorted(map(processed, (p.target_raw_reward, p.comparator_raw_reward))) == [
            p.rejected_reward,
            p.chosen_reward,
        ]
    for p in second_round:  # the reward model's scores, which no processor moves (1.4.3: "raw equals processed")
        assert sorted((p.target_raw_reward, p.comparator_raw_reward)) == [p.rejected_reward, p.chosen_reward]
    assert records[1]["candidate"]["comparator"]["sample_count"] == 12
    lines = [line for line in log_lines(folder / "run", "metrics.jsonl") if "iter/current_iteration" in line]
    assert [line["iter/selected_reward_distribution/pair_count"] for line in lines] == [
        line["iter/train_preference_pairs"] for line in lines
    ]
    assert records[1]["selected"]["target"]["raw_rewards"] == [p.target_raw_reward for p in run.reward_source.pairs]


# ------------------------------------------------------------------------------ the output folder
def test_overwrite_output_dir_removes_the_reward_histograms(tmp_path):
    run = tmp_path / "run"
    (run / "reward_distributions").mkdir(parents=True)
    (run / "reward_distributions" / "iteration_0001.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        check_new_run(str(run), overwrite=False)
    assert (run / "reward_distributions" / "iteration_0001.json").is_file()
    assert check_new_run(str(run), overwrite=True) == ["metrics.jsonl", "reward_distributions"]
    assert list(run.iterdir()) == []
