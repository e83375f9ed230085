"""The plot command: a PNG from a small metrics log, corrupt lines skipped and said."""

import json

import pytest

from comlrl.__main__ import main
from comlrl.metrics.plot import plot_run, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_dir(tmp_path):
    lines = [
        json.dumps(
            {
                "step": s,
                "reward/mean": s / 10,
                "agent0/reward_mean": s / 10,
                "agent1/reward_mean": s / 5,
                "agent0/completion_length": 100 - s,
                "agent1/completion_length": 50 + s,
                "agent0/loss": -0.1 * s,
                "agent1/loss": 0.1 * s,
            }
        )  # fmt: skip
        for s in (10, 20, 30)
    ]
    lines.insert(2, '{"step": 25, "reward/me')  # a write cut short by a crash
    lines.append("[1, 2]")
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_corrupt_lines_are_skipped_and_named(run_dir):
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable line\(s\): \[3, 5\]"):
        records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [10, 20, 30]


def test_plot_writes_a_png(run_dir):
    with pytest.warns(UserWarning, match="unreadable"):
        out = plot_run(run_dir)
    assert out == run_dir / "metrics.png" and out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000


def test_command_line(run_dir, tmp_path, capsys):
    target = tmp_path / "curves.png"
    with pytest.warns(UserWarning):
        assert main(["plot", str(run_dir), "--out", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target) and target.read_bytes()[:8] == PNG_MAGIC


def test_command_line_without_a_log(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert f"no metrics log at {tmp_path / 'metrics.jsonl'}" in capsys.readouterr().err
