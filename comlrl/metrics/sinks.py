"""Where metrics go. The console is the trainer's progress bar; files and services are sinks."""

from __future__ import annotations

import html
import json
import os
import re
from collections import defaultdict
from collections.abc import Callable
from typing import IO, Any, Protocol


class Sink(Protocol):
    """What ``MetricsLogger`` writes to. Samples are flat JSON-able dicts (say turn, row, prompt,
    each agent's completion, reward), for reading what the agents wrote next to the numbers."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per training step (and per evaluation) to ``path``, and one per
    sample to ``samples_path`` (by default ``samples.jsonl`` next to ``path``). Each file is
    created on its first write, so a run that fails before logging leaves nothing behind."""

    every_step = True
    """The local record keeps every step (a line is cheap); remote sinks get ``logging_steps`` averages."""

    def __init__(self, path: str, samples_path: str | None = None):
        self.path = path
        self.samples_path = samples_path or os.path.join(os.path.dirname(path), "samples.jsonl")
        self._files: dict[str, IO[str]] = {}  # kept open for the whole run

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._write(self.path, [{"step": step, **metrics}])

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        self._write(self.samples_path, [{"step": step, **sample} for sample in samples])

    def _write(self, path: str, rows: list[dict[str, Any]]) -> None:
        if path not in self._files:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._files[path] = open(path, "a", encoding="utf-8")
        file = self._files[path]
        file.writelines(json.dumps(row) + "\n" for row in rows)
        file.flush()

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()


def wandb_init_kwargs(wandb_config: dict[str, Any], run_config: dict[str, Any]) -> dict[str, Any]:
    """``wandb.init`` keyword arguments from a ``wandb_config``, with comlrl 1.4.3's keys:
    ``run_name`` is ``name``, ``config_sections`` (a dict of sections) joins the run's config
    beside ours, ``dir`` is created. Other keys (``project``, ``entity``, ``tags``, ``config``,
    ...) go to ``wandb.init`` as they are."""
    if not isinstance(wandb_config, dict):
        raise TypeError(f"wandb_config must be a dict of wandb.init arguments, got {type(wandb_config).__name__}")
    kwargs = dict(wandb_config)
    run_name = kwargs.pop("run_name", None)
    if run_name is not None:
        if kwargs.get("name") not in (None, run_name):
            raise ValueError(
                f"wandb_config has name={kwargs['name']!r} and run_name={run_name!r} (an older name of name): keep one"
            )
        kwargs["name"] = run_name
    sections = kwargs.pop("config_sections", None) or {}
    if not isinstance(sections, dict):
        raise TypeError(f"wandb_config['config_sections'] must be a dict of sections, got {type(sections).__name__}")
    kwargs["config"] = {**run_config, **sections, **kwargs.get("config", {})}
    if kwargs.get("dir") is not None:
        os.makedirs(kwargs["dir"], exist_ok=True)
    return kwargs


class WandbSink:
    """Weights & Biases; ``wandb`` is imported only when this sink is created.

    ``wandb_config`` keys are ``wandb.init``'s (``project``, ``entity``, ``name``, ``tags``,
    ``dir``, ``config``, ...) and comlrl 1.4.3's ``run_name`` and ``config_sections``
    (see :func:`wandb_init_kwargs`).
    """

    def __init__(self, wandb_config: dict[str, Any], run_config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "W&B logging was requested but wandb is not installed: pip install 'comlrl[wandb]'"
            ) from None
        self._wandb = wandb
        self._run = wandb.init(**wandb_init_kwargs(wandb_config, run_config))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        """One ``wandb.Table`` under ``samples``; W&B drops a step below the last one logged."""
        columns = _columns(samples)
        rows = [[sample.get(column) for column in columns] for sample in samples]
        # A column may hold text in one sample and a number in another (an answer, say).
        table = self._wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
        self._run.log({"samples": table}, step=step)

    def close(self) -> None:
        self._run.finish()


class TensorBoardSink:
    """TensorBoard event files in ``log_dir``; ``tensorboard`` is imported only when this sink is created."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(
                "TensorBoard logging was requested but tensorboard is not installed: pip install 'comlrl[tensorboard]'"
            ) from None
        self._writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        """A Markdown table under ``samples``, which TensorBoard's Text tab renders."""
        columns = _columns(samples)
        lines = ["| " + " | ".join(_markdown_cell(column) for column in columns) + " |"]
        lines.append("|" + " --- |" * len(columns))
        for sample in samples:
            lines.append("| " + " | ".join(_markdown_cell(sample.get(column)) for column in columns) + " |")
        self._writer.add_text("samples", "\n".join(lines), step)

    def close(self) -> None:
        self._writer.close()


def _columns(samples: list[dict[str, Any]]) -> list[str]:
    """Every key of every sample, in first-seen order: samples of different turns may differ."""
    return list(dict.fromkeys(key for sample in samples for key in sample))


def _markdown_cell(value: Any) -> str:
    """The value as table-cell text that shows verbatim: completions are raw model text, whose
    newlines and pipes would break the table and whose ``*``, ``_``, ``<...>`` would restyle it."""
    text = "" if value is None else str(value)
    text = re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(text, quote=False))
    return text.replace("\r\n", "\n").replace("\n", "<br>")


class MetricsLogger:
    """Hands every step's metrics to the sinks that keep every step (``every_step``: the JSONL
    record), and to the others their averages over the steps since the last flush."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks
        self._per_step = [sink for sink in sinks if getattr(sink, "every_step", False)]
        self._averaged = [sink for sink in sinks if not getattr(sink, "every_step", False)]
        self._window: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict[str, float], step: int) -> None:
        """One training step's metrics: written to the per-step sinks now, averaged for the others."""
        for sink in self._per_step:
            sink.log(metrics, step)
        for key, value in metrics.items():
            self._window[key].append(value)

    def window(self) -> dict[str, list[float]]:
        """The metrics added since the last flush (a checkpoint keeps them)."""
        return {key: list(values) for key, values in self._window.items()}

    def add_window(self, window: dict[str, list[float]]) -> None:
        """Add metrics saved with :meth:`window`, as if each value had been added again."""
        for key, values in window.items():
            self._window[key].extend(values)

    def flush(self, step: int) -> dict[str, float]:
        """Send the averages to the averaging sinks and start a new window; returns the averages."""
        averaged = {key: sum(values) / len(values) for key, values in self._window.items()}
        self._window.clear()
        if averaged:
            for sink in self._averaged:
                sink.log(averaged, step)
        return averaged

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send metrics measured once, not per step (an evaluation), to every sink as they are."""
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_samples(self, samples: list[dict[str, Any]], step: int) -> None:
        """Send the samples to every sink as they are (nothing to average); an empty list sends nothing."""
        if samples:
            for sink in self.sinks:
                sink.log_samples(samples, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def run_sinks(output_dir: str, wandb_config: dict | None, config: Callable[[], dict], tensorboard: bool) -> list:
    """A run's sinks: ``output_dir/metrics.jsonl`` always, W&B (with the run's ``config()``) when
    ``wandb_config`` is given, TensorBoard in ``output_dir/tensorboard`` when asked."""
    sinks: list = [JsonlSink(os.path.join(output_dir, "metrics.jsonl"))]
    if wandb_config is not None:
        sinks.append(WandbSink(wandb_config, config()))
    if tensorboard:
        sinks.append(TensorBoardSink(os.path.join(output_dir, "tensorboard")))
    return sinks
