"""The plot command: a PNG from a small metrics log, corrupt lines skipped and said."""

import json
import os

import pytest

from comlrl.__main__ import main
from comlrl.metrics.plot import moving_average, plot_run, read_metrics, training_steps, without_copies_of_joint

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
def test_a_shared_reward_is_drawn_once():
    shared = [(1, 0.5), (2, 0.7)]
    assert without_copies_of_joint({"joint": shared, "agent 0": shared, "agent 1": list(shared)}) == {
        "joint (= every agent's)": shared
    }
    different = {"joint": shared, "agent 0": shared, "agent 1": [(1, 0.1), (2, 0.2)]}
    assert without_copies_of_joint(different) == different


def testmoving_average_by_hand():
    values = [float(v) for v in range(20)]  # window = 20 // 10 = 2
    assert moving_average(values)[:4] == [0.0, 0.5, 1.5, 2.5]
    assert moving_average([1.0, 3.0]) == [1.0, 2.0]


def test_steps_axis_labels_and_title(run_dir):
    from matplotlib.figure import Figure

    drawn = {}
    real_savefig = Figure.savefig

    def keep(figure, *args, **kwargs):
        drawn["figure"] = figure
        return real_savefig(figure, *args, **kwargs)

    Figure.savefig = keep
    try:
        with pytest.warns(UserWarning):
            plot_run(run_dir)
    finally:
        Figure.savefig = real_savefig
    figure = drawn["figure"]
    assert figure.get_suptitle().endswith(": 3 training steps")
    reward, length, loss = figure.axes
    assert "after reward_processor" in reward.get_ylabel() and length.get_ylabel() == "tokens per completion"
    assert all(axes.get_xlabel() == "training step" for axes in figure.axes)
    assert all(float(tick).is_integer() for tick in reward.get_xticks())
    assert training_steps(read_metrics(run_dir / "metrics.jsonl")) == 3
