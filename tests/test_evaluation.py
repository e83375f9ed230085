"""evaluate(): one episode per eval row, metrics per turn, the evaluation hooks, and its place
in the training loop."""

import json

import pytest

import comlrl.rollout.backends as backends_module

from .helpers import DATA, length_sum, make_trainer, multi_turn_trainer, small_config, snapshot, unchanged


def capture(store):
    """An eval_logger with the simple interface: returns its metrics as a dict."""

    def eval_logger(agent_completions_turns, rows):
        store.append((agent_completions_turns, rows))
        return {"rows_seen": float(len(rows))}

    return eval_logger


def test_single_turn_metrics_agree_with_the_completions(tmp_path):
    seen = []
    trainer = make_trainer(
        tmp_path,
        eval_dataset=DATA,
        eval_logger=capture(seen),
        args=small_config(tmp_path, eval_do_sample=False, eval_num_samples=None),
    )
    metrics = trainer.evaluate()
    ((completions, rows),) = seen
    assert rows == DATA and [len(c) for c in completions] == [3, 3]
    assert all(len(turns) == 1 for agent in completions for turns in agent)
    # length_sum of each row's joint action, averaged over the rows
    expected = sum(len(completions[0][r][0]) + len(completions[1][r][0]) for r in range(3)) / 3
    assert metrics["eval/reward_mean"] == pytest.approx(expected)
    assert metrics["eval/turn_1/reward_mean"] == metrics["eval/turn_1/expected_return"] == metrics["eval/reward_mean"]
    assert metrics["eval/rows_seen"] == 3.0
    assert trainer.evaluate() == metrics, "greedy evaluation of the same weights must agree"


def test_sampled_evaluation_is_repeatable_and_leaves_training_samples_alone(tmp_path):
    runs = []
    for with_eval in (False, True):
        extra = dict(eval_dataset=DATA[:2], args=small_config(tmp_path / str(with_eval), eval_interval=1))
        trainer = make_trainer(tmp_path / str(with_eval), **(extra if with_eval else {}))
        if with_eval:
            assert trainer.evaluate() == trainer.evaluate()
        trainer.train()
        runs.append(trainer.agents)
    assert unchanged(snapshot(runs[0]), runs[1]), "evaluating during training changed what training sampled"


def test_multi_turn_rewards_returns_and_ended_episodes(tmp_path):
    seen = []

    def reward(a, b, turn):
        return [float(turn)] * len(a)  # 1 at turn 1, 2 at turn 2

    def transition(prompt):
        return None if prompt == "a cat" else ["again", "again"]  # row 1's episode ends after turn 1

    trainer = multi_turn_trainer(
        tmp_path,
        transition=transition,
        reward=reward,
        trainer_kwargs=dict(eval_dataset=DATA, eval_logger=capture(seen)),
        discount=0.5,
        eval_num_samples=3,
    )
    metrics = trainer.evaluate()
    ((completions, rows),) = seen
    assert [len(turns) for turns in completions[0]] == [2, 1, 2]
    # turn 1: every row returns 1 + 0.5 * 2, except row 1 (ended): 1 -> mean (2 + 1 + 2) / 3
    assert metrics["eval/turn_1/reward_mean"] == 1.0 and metrics["eval/turn_2/reward_mean"] == 2.0
    assert metrics["eval/turn_1/expected_return"] == pytest.approx(5 / 3)
    assert metrics["eval/turn_2/expected_return"] == 2.0
    assert metrics["eval/reward_mean"] == pytest.approx((1 + 1 + 1 + 2 + 2) / 5)


def test_eval_num_samples_and_batch_size_shape_the_generate_calls(tmp_path, monkeypatch):
    calls = []
    real = backends_module.generate_group

    def counting(model, tokenizer, prompts, num_generations, sampling, generator=None, **options):
        calls.append((len(prompts), num_generations, sampling["do_sample"]))
        return real(model, tokenizer, prompts, num_generations, sampling, generator, **options)

    monkeypatch.setattr(backends_module, "generate_group", counting)
    trainer = make_trainer(
        tmp_path,
        eval_dataset=DATA,
        args=small_config(tmp_path, eval_num_samples=3, eval_batch_size=2, eval_do_sample=False),
    )
    trainer.evaluate()
    assert calls == [(2, 1, False), (2, 1, False), (1, 1, False), (1, 1, False)]  # 2 batches x 2 agents


def test_original_logger_and_aggregator_interface(tmp_path):
    received = {}

    def eval_logger(agent_completions_turns, test_cases, entry_points, prompts):
        received.update(turns=agent_completions_turns, tests=test_cases, entries=entry_points, prompts=prompts)
        return [{"passed": float(test == "ok")} for test in test_cases]

    def eval_aggregator(detailed, num_turns):
        return {f"turn_{num_turns}/pass_rate": sum(d["passed"] for d in detailed) / len(detailed)}

    rows = [{"prompt": "p1", "test": "ok", "entry_point": "f"}, {"prompt": "p2", "test": "no", "entry_point": "g"}]
    trainer = make_trainer(tmp_path, eval_dataset=rows, eval_logger=eval_logger, eval_aggregator=eval_aggregator)
    metrics = trainer.evaluate()
    assert metrics["eval/turn_1/pass_rate"] == 0.5
    assert (
        received["tests"] == ["ok", "no"] and received["entries"] == ["f", "g"] and received["prompts"] == ["p1", "p2"]
    )


def test_143_logger_gets_the_rows_as_batch_items_and_their_prompt_column(tmp_path):
    received = {}

    def eval_logger(agent_completions_turns, batch_items, prompts):
        received.update(turns=agent_completions_turns, rows=batch_items, prompts=prompts)
        return [{"long": float(len(turns[0]) > 2)} for turns in agent_completions_turns[0]]

    def eval_aggregator(detailed, num_turns):
        return {"turn_1/long_rate": sum(d["long"] for d in detailed) / len(detailed)}

    trainer = make_trainer(
        tmp_path,
        eval_dataset=DATA,
        formatters=lambda row: "Q: " + row["prompt"],  # not what eval_logger's prompts are
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
        args=small_config(tmp_path, eval_batch_size=2),
    )
    metrics = trainer.evaluate()
    assert received["rows"] == DATA and received["prompts"] == [row["prompt"] for row in DATA]
    assert [len(agent) for agent in received["turns"]] == [3, 3]
    assert "eval/turn_1/long_rate" in metrics


def test_training_logs_evaluations_before_during_and_after(tmp_path):
    trainer = make_trainer(
        tmp_path,
        eval_dataset=DATA[:1],
        args=small_config(tmp_path, num_train_epochs=3, per_device_train_batch_size=3, eval_interval=2),
    )
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "eval/reward_mean" in line] == [0, 2, 3]
    assert [line["step"] for line in lines if "reward/mean" in line] == [1, 2, 3]


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(eval_logger=lambda rows: 0.5), TypeError, r"eval_logger <lambda> returned float; expected a dict"),
        (dict(eval_logger=lambda rows: {"x": "high"}), TypeError, r"returned 'high' for metric 'x'; expected a finite"),
        (dict(eval_logger=lambda rows: 1 / 0), RuntimeError, r"eval_logger <lambda> raised ZeroDivisionError"),
        (dict(eval_aggregator=lambda d, num_turns: {}), ValueError, r"eval_aggregator needs an eval_logger"),
    ],
)
def test_bad_hooks_are_named(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_trainer(tmp_path, eval_dataset=DATA, **kwargs).evaluate()


def test_eval_rows_without_the_prompt_column_are_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"eval_dataset row 1 has no 'prompt' column \(columns: \['question'\]\)"):
        make_trainer(tmp_path, eval_dataset=[{"prompt": "x"}, {"question": "y"}])


def test_evaluate_without_eval_dataset_warns_and_scores_nothing(tmp_path):
    with pytest.warns(UserWarning, match="evaluate\\(\\) without an eval_dataset scores nothing"):
        assert make_trainer(tmp_path, reward_func=length_sum).evaluate() == {}
