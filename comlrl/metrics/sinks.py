"""Where metrics go. The console is the trainer's progress bar; files and services are sinks."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any, Protocol


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per logging step to ``path``; the file is created on the first
    write, so a run that fails before logging leaves nothing behind."""

    def __init__(self, path: str):
        self.path = path
        self._file = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # kept open for the whole run
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class WandbSink:
    """Weights & Biases; ``wandb`` is imported only when this sink is created.

    ``wandb_config`` keys follow the original library: ``project``, ``entity``, ``name``,
    ``tags``, ``dir``, ``config`` (any other key is passed to ``wandb.init`` as well).
    """

    def __init__(self, wandb_config: dict[str, Any], run_config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "W&B logging was requested but wandb is not installed: pip install 'comlrl[wandb]'"
            ) from None
        init_kwargs = dict(wandb_config)
        init_kwargs["config"] = {**run_config, **init_kwargs.get("config", {})}
        self._run = wandb.init(**init_kwargs)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MetricsLogger:
    """Averages each metric over the steps since the last flush, then hands them to sinks."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks
        self._window: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._window[key].append(value)

    def flush(self, step: int) -> dict[str, float]:
        """Send the averages to every sink and start a new window; returns the averages."""
        averaged = {key: sum(values) / len(values) for key, values in self._window.items()}
        self._window.clear()
        if averaged:
            for sink in self.sinks:
                sink.log(averaged, step)
        return averaged

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
