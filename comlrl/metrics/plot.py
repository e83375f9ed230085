"""Curves of a run from its ``metrics.jsonl``: reward, completion length and loss per agent.

python -m comlrl plot RUN_DIR            # writes RUN_DIR/metrics.png
python -m comlrl plot RUN_DIR --out FILE # for a run folder that is read-only
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path

from comlrl.utils.text import short_repr

AGENT_LOSS = r"agent(\d+)/loss"
"""Every trainer logs each agent's loss at every training step."""
# (panel title, y-axis label, metric key pattern with the agent index as a group, joint key drawn too)
PANELS = [
    ("reward", "mean reward, as trained (after reward_processor)", r"agent(\d+)/reward_mean", "reward/mean"),
    ("completion length", "tokens per completion", r"agent(\d+)/completion_length", None),
    ("loss", "loss per optimizer step", AGENT_LOSS, None),
]
SMOOTH_FROM = 20  # points in a curve from which a moving average is drawn over the faint raw points
SHOWN = 10  # items a warning lists before "and N more", so a badly damaged log gives one short line
VALUE_REPR = 40  # characters of a skipped value a warning shows


def _more(items: list) -> str:
    """What a warning adds after the first ``SHOWN`` of ``items``."""
    rest = len(items) - SHOWN
    return f" and {rest} more" if rest > 0 else ""


def _parse(raw: bytes) -> dict | None:
    """The record on one line, or None when it is not a JSON object with an integer ``step``."""
    try:
        # json.loads decodes bytes itself: invalid UTF-8 raises UnicodeDecodeError, a ValueError
        record = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a line of thousands of nested brackets
        return None
    step = record.get("step") if isinstance(record, dict) else None
    # bool is an int to Python, but ``"step": true`` is no step
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics log. A line that is not valid UTF-8 or not a JSON object with an
    integer ``step`` is skipped, and one warning names the skipped line numbers (a run killed
    mid-write leaves such a line; a run still writing leaves its last line without a newline)."""
    records, skipped, torn = [], [], None
    with open(path, "rb") as file:  # bytes: one undecodable line must not stop the others
        for number, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            record = _parse(raw)
            if record is not None:
                records.append(record)
            elif not raw.endswith(b"\n"):  # only the last line can lack its newline
                torn = number
            else:
                skipped.append(number)
    problems = [f"skipped {len(skipped)} unreadable line(s): {skipped[:SHOWN]}{_more(skipped)}"] if skipped else []
    if torn is not None:
        problems.append(f"line {torn} is incomplete (the run may still be writing it)")
    if problems:
        warnings.warn(f"{path}: {'; '.join(problems)}", stacklevel=2)
    return records


def _plottable(value) -> bool:
    """A real number matplotlib can place: a string would turn the axis categorical, None or a
    list or dict raises, and an infinity or an int beyond float range breaks the scale. NaN is
    kept: it draws as a gap, which is what a missing measurement is."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return not math.isinf(float(value))
    except OverflowError:
        return False


def _series(records: list[dict], pattern: str, joint_key: str | None, bad: list[str]) -> dict:
    """One panel's points by label; a value that is not plottable goes to ``bad`` instead."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            match = re.fullmatch(pattern, key)
            if not (match or key == joint_key):
                continue
            if not _plottable(value):
                bad.append(f"{key} at step {record['step']} = {short_repr(value, VALUE_REPR)}")
                continue
            label = f"agent {match.group(1)}" if match else "joint"
            series.setdefault(label, []).append((record["step"], value))
    return series


def without_copies_of_joint(series: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """With a shared reward every agent's curve is the joint one: keep one line, named so."""
    joint = series.get("joint")
    agents = [label for label in series if label != "joint"]
    if joint is None or not agents or any(series[label] != joint for label in agents):
        return series
    return {"joint (= every agent's)": joint}


def moving_average(values: list[float]) -> list[float]:
    """Trailing mean over a tenth of the curve (at least 2 points)."""
    window = max(2, len(values) // 10)
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def _draw(axes, label: str, points: list[tuple[int, float]]) -> None:
    steps, values = zip(*points)
    if len(points) < SMOOTH_FROM:
        axes.plot(steps, values, marker="o", markersize=3, label=label)
        return
    (line,) = axes.plot(steps, moving_average(list(values)), label=f"{label} (moving average)")
    axes.plot(steps, values, linestyle="none", marker=".", markersize=3, alpha=0.3, color=line.get_color())


def training_steps(records: list[dict]) -> int:
    """How many training steps ``records`` hold (steps with a per-agent loss)."""
    return len({record["step"] for record in records if any(re.fullmatch(AGENT_LOSS, key) for key in record)})


def _cannot_write(out: Path, reason: str) -> PermissionError:
    return PermissionError(
        f"cannot write the plot to {out} ({reason}): pass --out FILE (out= in Python) to write it elsewhere"
    )


def _check_writable(out: Path) -> None:
    """Fail before drawing, with the path named, rather than deep inside matplotlib's savefig."""
    if out.is_dir():
        raise _cannot_write(out, "it is a folder")
    if not out.parent.is_dir():
        raise _cannot_write(out, f"{out.parent} is not a folder")
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        raise _cannot_write(out, "permission denied")


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a PNG of the run's curves (default ``RUN_DIR/metrics.png``); returns its path."""
    return draw_run(run_dir, out)[0]


def draw_run(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, int]:
    """:func:`plot_run`, also returning how many training steps it drew (a live run's so far)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (in a clone of comlrl: pip install -e '.[plot]')"
        ) from None
    log = Path(run_dir) / "metrics.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"no metrics log at {log}: is {run_dir} a run's output_dir?")
    out = Path(out) if out is not None else Path(run_dir) / "metrics.png"
    _check_writable(out)
    records = read_metrics(log)
    if not records:
        raise ValueError(f"{log} holds no readable metrics yet")
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(5 * len(PANELS), 4), layout="constrained")
    steps = training_steps(records)
    figure.suptitle(f"{Path(run_dir).resolve().name}: {steps} training steps")
    bad: list[str] = []
    for axes, (title, ylabel, pattern, joint_key) in zip(figure.subplots(1, len(PANELS)), PANELS):
        series = without_copies_of_joint(_series(records, pattern, joint_key, bad))
        for label, points in sorted(series.items()):
            _draw(axes, label, points)
        axes.set(title=title, xlabel="training step", ylabel=ylabel)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if series:
            axes.legend()
    if bad:
        listed = "; ".join(bad[:SHOWN]) + _more(bad)
        warnings.warn(f"{log}: skipped {len(bad)} value(s) that are not numbers: {listed}", stacklevel=2)
    try:
        figure.savefig(out, dpi=100)
    except OSError as error:  # the check above can still miss: a full disk, a folder changed meanwhile
        raise _cannot_write(out, error.strerror or str(error)) from error
    return out, steps
