"""The plot command: a PNG from a small metrics log, corrupt lines skipped and said, every
panel either drawn or explained, overlapping curves told apart, the processed reward so called."""

import json
import os

import pytest

from comlrl.__main__ import main
from comlrl.metrics.plot import merge_identical, moving_average, plot_run, read_metrics, training_steps

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
    assert capsys.readouterr().out.strip() == f"{target} (3 training steps drawn)"
    assert target.read_bytes()[:8] == PNG_MAGIC


def test_command_line_without_a_log(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert f"no metrics log at {tmp_path / 'metrics.jsonl'}" in capsys.readouterr().err


def write_log(run_dir, lines: list[bytes], newline_at_end: bool = True):
    (run_dir / "metrics.jsonl").write_bytes(b"\n".join(lines) + (b"\n" if newline_at_end else b""))
    return run_dir


def record(step, reward) -> bytes:
    return json.dumps({"step": step, "agent0/reward_mean": reward}).encode()


def test_invalid_utf8_line_is_skipped_and_named(tmp_path):
    write_log(tmp_path, [record(1, 0.1), b'{"step": 2, "note": "\xff\xfe"}', record(3, 0.3)])
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable line\(s\): \[2\]"):
        records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 3]


def test_many_skipped_lines_make_one_short_warning(tmp_path):
    write_log(tmp_path, [record(0, 0.0)] + [b"garbage"] * 500)
    with pytest.warns(UserWarning) as caught:
        read_metrics(tmp_path / "metrics.jsonl")
    (warning,) = caught
    assert "skipped 500 unreadable line(s): [2, 3, 4, 5, 6, 7, 8, 9, 10, 11] and 490 more" in str(warning.message)


def test_bool_step_is_no_step(tmp_path):
    write_log(tmp_path, [record(1, 0.1), b'{"step": true, "agent0/reward_mean": 0.2}'])
    with pytest.warns(UserWarning, match=r"unreadable line\(s\): \[2\]"):
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_torn_last_line_is_called_incomplete(tmp_path):
    write_log(tmp_path, [record(1, 0.1), record(2, 0.2), b'{"step": 3, "agent0/rew'], newline_at_end=False)
    with pytest.warns(UserWarning) as caught:
        records = read_metrics(tmp_path / "metrics.jsonl")
    (warning,) = caught
    assert str(warning.message).endswith("line 3 is incomplete (the run may still be writing it)")
    assert "unreadable" not in str(warning.message) and [r["step"] for r in records] == [1, 2]


def test_torn_multibyte_character_is_incomplete_not_unreadable(tmp_path):
    # the writer was cut inside the two bytes of "é"
    write_log(tmp_path, [record(1, 0.1), b"not json", b'{"step": 2, "note": "\xc3'], newline_at_end=False)
    with pytest.warns(UserWarning) as caught:
        read_metrics(tmp_path / "metrics.jsonl")
    (warning,) = caught
    assert "skipped 1 unreadable line(s): [2]; line 3 is incomplete" in str(warning.message)


def test_complete_last_line_without_newline_is_kept(tmp_path):
    write_log(tmp_path, [record(1, 0.1), record(2, 0.2)], newline_at_end=False)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("nan", "'nan'"),
        ("abc", "'abc'"),
        (None, "None"),
        ({"a": 1}, "{'a': 1}"),
        ([1, 2], "[1, 2]"),
        (True, "True"),
        (float("inf"), "inf"),
        ("x" * 100, "'" + "x" * 36 + "..."),
    ],
)
def test_values_that_are_not_numbers_are_skipped_and_named(tmp_path, value, shown):
    lines = [record(1, 0.1), json.dumps({"step": 2, "agent1/reward_mean": value}).encode(), record(3, float("nan"))]
    write_log(tmp_path, lines)
    with pytest.warns(UserWarning) as caught:
        out = plot_run(tmp_path)
    (warning,) = caught
    assert f"skipped 1 value(s) that are not numbers: agent1/reward_mean at step 2 = {shown}" in str(warning.message)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_default_png_path_not_writable(tmp_path, capsys):
    write_log(tmp_path, [record(1, 0.1)])
    (tmp_path / "metrics.png").mkdir()  # unwritable as a file for root too, unlike a chmod
    with pytest.raises(
        PermissionError, match=r"cannot write the plot to .*metrics\.png \(it is a folder\).*--out FILE"
    ):
        plot_run(tmp_path)
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot write the plot to {tmp_path / 'metrics.png'}" in err and "--out FILE" in err


def test_out_path_whose_parent_is_a_file(tmp_path, capsys):
    write_log(tmp_path, [record(1, 0.1)])
    target = tmp_path / "metrics.jsonl" / "curves.png"
    with pytest.raises(PermissionError, match=f"{tmp_path / 'metrics.jsonl'} is not a folder"):
        plot_run(tmp_path, out=target)
    assert main(["plot", str(tmp_path), "--out", str(target)]) == 2
    assert f"cannot write the plot to {target}" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_log(run, [record(1, 0.1)]).chmod(0o555)
    try:
        assert main(["plot", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"cannot write the plot to {run / 'metrics.png'} (permission denied)" in err and "--out FILE" in err
    finally:
        run.chmod(0o755)


def test_read_only_run_folder_with_out(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_log(run, [record(1, 0.1)]).chmod(0o555)
    target = tmp_path / "curves.png"
    try:
        assert main(["plot", str(run), "--out", str(target)]) == 0
    finally:
        run.chmod(0o755)
    assert capsys.readouterr().out.strip() == f"{target} (0 training steps drawn)"
    assert target.read_bytes()[:8] == PNG_MAGIC and not (run / "metrics.png").exists()


# ---------------------------------------------------------------- pictures people can read
def test_identical_curves_are_drawn_once_and_named_so():
    shared, other = [(1, 0.5), (2, 0.7)], [(1, 0.1), (2, 0.2)]
    assert merge_identical({"joint": shared, "agent 0": shared, "agent 1": list(shared)}) == {
        "joint (= every agent's)": shared
    }
    assert merge_identical({"joint": shared, "agent 0": shared, "agent 1": other}) == {
        "agent 0 = joint (identical)": shared,
        "agent 1": other,
    }
    # MADPO: every agent logs the joint DPO loss
    assert merge_identical({"agent 0": other, "agent 1": list(other)}) == {"agent 0 = agent 1 (identical)": other}
    assert merge_identical({"agent 0": shared, "agent 1": other}) == {"agent 0": shared, "agent 1": other}


def testmoving_average_by_hand():
    values = [float(v) for v in range(20)]  # window = 20 // 10 = 2
    assert moving_average(values)[:4] == [0.0, 0.5, 1.5, 2.5]
    assert moving_average([1.0, 3.0]) == [1.0, 2.0]


def drawn_figure(run_dir, monkeypatch):
    """The figure ``plot_run`` saves, kept for its axes to be read."""
    from matplotlib.figure import Figure

    drawn = {}
    real_savefig = Figure.savefig

    def keep(figure, *args, **kwargs):
        drawn["figure"] = figure
        return real_savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_run(run_dir)
    return drawn["figure"]


def test_steps_axis_labels_and_title(run_dir, monkeypatch):
    with pytest.warns(UserWarning):
        figure = drawn_figure(run_dir, monkeypatch)
    assert figure.get_suptitle().endswith(": 3 training steps")
    reward, length, loss = figure.axes  # no raw reward in the log: no right-hand axis
    assert reward.get_ylabel() == "mean reward" and length.get_ylabel() == "tokens per completion"
    assert all(axes.get_xlabel() == "training step" for axes in figure.axes)
    assert all(float(tick).is_integer() for tick in reward.get_xticks())
    with pytest.warns(UserWarning, match="unreadable"):
        assert training_steps(read_metrics(run_dir / "metrics.jsonl")) == 3


def write_records(run_dir, records: list[dict]):
    return write_log(run_dir, [json.dumps(r).encode() for r in records])


def test_a_madpo_log_explains_its_empty_panels_and_merges_its_agents_loss(tmp_path, monkeypatch):
    # the keys a MADPO run logs: its pairs once at step 0, then DPO steps that sample nothing
    pairs = {"step": 0, "preference/num_pairs": 6.0, "preference/candidate_reward_mean": 5.8}
    steps = [
        {"step": s, "agent0/loss": loss, "agent1/loss": loss, "dpo/loss": loss, "dpo/accuracy": 0.5,
         "agent0/grad_norm": 0.9, "agent1/grad_norm": 0.8, "time/step_s": 0.03}
        for s, loss in [(1, 0.62), (2, 0.52), (3, 0.74)]
    ]  # fmt: skip
    figure = drawn_figure(write_records(tmp_path, [pairs, *steps]), monkeypatch)
    reward, length, loss = figure.axes
    for axes, title in [(reward, "reward"), (length, "completion length")]:
        assert not axes.get_lines()
        assert [t.get_text() for t in axes.texts] == [f"MADPO trains on stored pairs:\nno per-step {title}"]
    assert [line.get_label() for line in loss.get_lines()] == ["agent 0 = agent 1 (identical)"]
    assert figure.get_suptitle().endswith(": 3 training steps")


def test_a_log_without_steps_says_so_in_every_panel(tmp_path, monkeypatch):
    figure = drawn_figure(write_records(tmp_path, [{"step": 0, "preference/num_pairs": 6.0}]), monkeypatch)
    assert [[t.get_text() for t in axes.texts] for axes in figure.axes] == [
        ["no reward in the log yet"],
        ["no completion length in the log yet"],
        ["no loss in the log yet"],
    ]


def test_curves_of_one_panel_differ_in_line_style_and_marker(run_dir, monkeypatch):
    with pytest.warns(UserWarning):
        figure = drawn_figure(run_dir, monkeypatch)
    first, second = figure.axes[2].get_lines()  # the two agents' losses
    assert first.get_linestyle() != second.get_linestyle() and first.get_marker() != second.get_marker()


def test_a_processed_reward_is_called_processed_and_the_raw_one_drawn_beside_it(tmp_path, monkeypatch):
    records = [{"step": s, "reward/mean": 10.0 * s, "reward/raw_mean": 0.1 * s, "agent0/loss": 0.1} for s in (1, 2)]
    figure = drawn_figure(write_records(tmp_path, records), monkeypatch)
    reward, _, _, raw = figure.axes  # the right-hand axis comes last
    assert reward.get_ylabel() == "mean reward, processed (after reward_processor)"
    assert raw.get_ylabel() == "mean reward, raw (before reward_processor)"
    assert [text.get_text() for text in reward.get_legend().get_texts()] == ["joint", "joint, raw (right axis)"]
    assert [y for _, y in raw.get_lines()[0].get_xydata()] == pytest.approx([0.1, 0.2])
