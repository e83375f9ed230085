"""Curves of a run from its ``metrics.jsonl``: reward, completion length and loss per agent.
A panel the log has nothing for says why in place of the curves.

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
from typing import TYPE_CHECKING, NamedTuple

from comlrl.metrics.rollout import reward_was_processed
from comlrl.utils.text import short_repr

if TYPE_CHECKING:  # matplotlib is an optional extra
    from matplotlib.axes import Axes


class Panel(NamedTuple):
    """One plot of the figure: a metric per agent, and the joint one beside it."""

    title: str
    ylabel: str
    pattern: str
    """The per-agent metric's key, with the agent index as a group."""
    joint_key: str | None = None
    raw_key: str | None = None
    """The joint metric before the reward processor: drawn on a right-hand axis where it differs."""
    sampled: bool = True
    """Measured on the step's samples: a step that trains on stored pairs logs none."""


AGENT_LOSS = r"agent(\d+)/loss"
"""Every trainer logs each agent's loss at every training step."""
PANELS = [
    Panel("reward", "mean reward", r"agent(\d+)/reward_mean", "reward/mean", raw_key="reward/raw_mean"),
    Panel("completion length", "tokens per completion", r"agent(\d+)/completion_length"),
    Panel("loss", "loss per optimizer step", AGENT_LOSS, sampled=False),
]
STORED_PAIRS_KEY = "dpo/loss"
"""Logged by a step that trains on stored preference pairs (MADPO, MADPOIter) and samples nothing."""
LINE_STYLES = ["-", "--", ":", "-."]  # one per curve of a panel, with MARKERS: curves that overlap stay apart
MARKERS = ["o", "s", "^", "D", "v"]
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


def _series(records: list[dict], pattern: str | None, joint_key: str | None, bad: list[str]) -> dict:
    """One panel's points by label (per agent from ``pattern``, "joint" from ``joint_key``); a
    value that is not plottable goes to ``bad`` instead."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            match = re.fullmatch(pattern, key) if pattern else None
            if not (match or key == joint_key):
                continue
            if not _plottable(value):
                bad.append(f"{key} at step {record['step']} = {short_repr(value, VALUE_REPR)}")
                continue
            label = f"agent {match.group(1)}" if match else "joint"
            series.setdefault(label, []).append((record["step"], value))
    return series


def merge_identical(series: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """Curves with the same points drawn once and named after each curve they stand for: drawn
    apart, the last would hide the others. With a shared reward every agent's curve is the
    joint one; MADPO's agents all log the joint DPO loss."""
    groups: dict[tuple, list[str]] = {}
    for label, points in series.items():
        groups.setdefault(tuple(points), []).append(label)
    merged = {}
    for points, labels in groups.items():
        if len(labels) == 1:
            name = labels[0]
        elif "joint" in labels and len(labels) == len(series):
            name = "joint (= every agent's)"
        else:
            name = " = ".join(sorted(labels)) + " (identical)"
        merged[name] = list(points)
    return merged


def moving_average(values: list[float]) -> list[float]:
    """Trailing mean over a tenth of the curve (at least 2 points)."""
    window = max(2, len(values) // 10)
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def _draw(axes, label: str, points: list[tuple[int, float]], index: int, color: str | None = None) -> None:
    """Curve ``index`` of a panel, in a line style and marker of its own (None: the next colour)."""
    steps, values = zip(*points)
    style = {"linestyle": LINE_STYLES[index % len(LINE_STYLES)], "color": color}
    marker = MARKERS[index % len(MARKERS)]
    if len(points) < SMOOTH_FROM:
        axes.plot(steps, values, marker=marker, markersize=3, label=label, **style)
        return
    (line,) = axes.plot(steps, moving_average(list(values)), label=f"{label} (moving average)", **style)
    axes.plot(steps, values, linestyle="none", marker=marker, markersize=3, alpha=0.3, color=line.get_color())


def empty_note(panel: Panel, records: list[dict]) -> str:
    """What a panel without curves says in their place, so that no empty panel is a puzzle."""
    if panel.sampled and any(STORED_PAIRS_KEY in record for record in records):
        return f"MADPO trains on stored pairs:\nno per-step {panel.title}"
    return f"no {panel.title} in the log yet"


def _draw_panel(axes: Axes, panel: Panel, records: list[dict], bad: list[str]) -> None:
    """One panel's curves, or the note saying why there are none. Where the reward processor
    changed the reward, the left axis says processed and the raw joint reward gets a
    right-hand axis of its own: a x100 scale leaves both curves readable."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is an optional extra: imported when drawing

    series = merge_identical(_series(records, panel.pattern, panel.joint_key, bad))
    for index, (label, points) in enumerate(sorted(series.items())):
        _draw(axes, label, points, index)
    axes.set(title=panel.title, xlabel="training step", ylabel=panel.ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    raw = _series(records, None, panel.raw_key, bad).get("joint") if panel.raw_key else None
    all_axes = [axes]
    if raw and any(reward_was_processed(record, panel.joint_key, panel.raw_key) for record in records):
        axes.set_ylabel(f"{panel.ylabel}, processed (after reward_processor)")
        all_axes.append(axes.twinx())
        _draw(all_axes[1], "joint, raw (right axis)", raw, len(series), color="black")
        all_axes[1].set_ylabel(f"{panel.ylabel}, raw (before reward_processor)")
    if series:
        handles, labels = (sum(column, []) for column in zip(*(a.get_legend_handles_labels() for a in all_axes)))
        axes.legend(handles, labels)
    else:  # no ticks either: a scale of nothing would read as data
        axes.set(xticks=[], yticks=[])
        axes.text(0.5, 0.5, empty_note(panel, records), transform=axes.transAxes, ha="center", va="center")


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
    figure = Figure(figsize=(5 * len(PANELS), 4), layout="constrained")
    steps = training_steps(records)
    figure.suptitle(f"{Path(run_dir).resolve().name}: {steps} training steps")
    bad: list[str] = []
    for axes, panel in zip(figure.subplots(1, len(PANELS)), PANELS):
        _draw_panel(axes, panel, records, bad)
    if bad:
        listed = "; ".join(bad[:SHOWN]) + _more(bad)
        warnings.warn(f"{log}: skipped {len(bad)} value(s) that are not numbers: {listed}", stacklevel=2)
    try:
        figure.savefig(out, dpi=100)
    except OSError as error:  # the check above can still miss: a full disk, a folder changed meanwhile
        raise _cannot_write(out, error.strerror or str(error)) from error
    return out, steps
