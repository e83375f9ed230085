"""Metric sinks: JSONL always, W&B only when asked (and only then imported)."""

import json
import sys

import pytest

from comlrl.metrics import JsonlSink, MetricsLogger, WandbSink


def test_logger_averages_each_window_and_jsonl_appends_lines(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    logger = MetricsLogger([JsonlSink(str(path))])
    logger.add({"reward/mean": 1.0, "loss": 4.0})
    logger.add({"reward/mean": 3.0, "loss": 2.0})
    assert not path.exists()  # nothing is written before the first flush
    assert logger.flush(step=2) == {"reward/mean": 2.0, "loss": 3.0}
    logger.add({"reward/mean": 5.0})
    logger.flush(step=3)
    assert logger.flush(step=3) == {}  # an empty window writes nothing
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"step": 2, "reward/mean": 2.0, "loss": 3.0}, {"step": 3, "reward/mean": 5.0}]


def test_wandb_missing_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[wandb\]'"):
        WandbSink({"project": "p"}, run_config={})


def test_wandb_sink_passes_config_and_logs(fake_wandb):
    sink = WandbSink({"project": "p", "entity": "e", "config": {"extra": 1}}, run_config={"seed": 3})
    sink.log({"reward/mean": 0.5}, step=7)
    sink.close()
    assert fake_wandb["init"] == {"project": "p", "entity": "e", "config": {"seed": 3, "extra": 1}}
    assert fake_wandb["log"] == [({"reward/mean": 0.5}, 7)] and fake_wandb["finished"]
