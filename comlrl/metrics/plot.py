"""Curves of a run from its ``metrics.jsonl``: reward, completion length and loss per agent.

python -m comlrl plot RUN_DIR            # writes RUN_DIR/metrics.png
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

# (panel title, metric key pattern with the agent index as a group, joint key drawn too)
PANELS = [
    ("reward", r"agent(\d+)/reward_mean", "reward/mean"),
    ("completion length (tokens)", r"agent(\d+)/completion_length", None),
    ("loss", r"agent(\d+)/loss", None),
]


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics log; a line that is not a JSON object with a ``step`` is
    skipped with a warning naming its line number (a run killed mid-write leaves one)."""
    records, skipped = [], []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            skipped.append(number)
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} unreadable line(s): {skipped}", stacklevel=2)
    return records


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a PNG of the run's curves (default ``RUN_DIR/metrics.png``); returns its path."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (in a clone of comlrl: pip install -e '.[plot]')"
        ) from None
    log = Path(run_dir) / "metrics.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"no metrics log at {log}: is {run_dir} a run's output_dir?")
    records = read_metrics(log)
    if not records:
        raise ValueError(f"{log} holds no readable metrics yet")
    figure = Figure(figsize=(5 * len(PANELS), 4), layout="constrained")
    for axes, (title, pattern, joint_key) in zip(figure.subplots(1, len(PANELS)), PANELS):
        series: dict[str, list[tuple[int, float]]] = {}
        for record in records:
            for key, value in record.items():
                match = re.fullmatch(pattern, key)
                if match or key == joint_key:
                    label = f"agent {match.group(1)}" if match else "joint"
                    series.setdefault(label, []).append((record["step"], value))
        for label, points in sorted(series.items()):
            axes.plot(*zip(*points), marker="o", markersize=3, label=label)
        axes.set(title=title, xlabel="step")
        if series:
            axes.legend()
    out = Path(out) if out is not None else Path(run_dir) / "metrics.png"
    figure.savefig(out, dpi=100)
    return out
