"""Seeding a run and stopping it cleanly on a signal."""

from __future__ import annotations

import random
import signal
import threading
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed every generator sampling can draw from."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class StopOnSignal:
    """While active, SIGINT and SIGTERM only record the signal (training checks it after each
    step, saves and stops); the first one puts the previous handlers back, so a second
    signal acts at once, and makes a second SIGINT raise KeyboardInterrupt whatever handler
    SIGINT had (one that ignores it, as a job a script starts in the background inherits,
    would let the run end with exit code 0 as if nothing had happened). Leaving puts every
    handler back as it was. Outside the main thread, where handlers cannot be set, it does nothing."""

    def __enter__(self) -> StopOnSignal:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self.signal = signum
        self._restore()
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __exit__(self, *exc_info: Any) -> None:
        self._restore()


def seeded_cuda_devices() -> list[int]:
    """Every CUDA device whose generator ``torch.manual_seed`` reseeds (all visible ones), so
    what ``torch.random.fork_rng`` must fork to leave every generator as it was."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def generator_states() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Every generator sampling draws from: Python's and NumPy's as JSON-ready values, torch's
    (CPU, and CUDA when present) as tensors."""
    numpy_state = np.random.get_state()
    json_states = {
        "python": list(random.getstate()),
        "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
    }
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return json_states, tensors


def restore_generator_states(json_states: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Put back what :func:`generator_states` captured."""
    version, internal, gauss = json_states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = json_states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))


def rank_generator_states(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's generator states in one mapping: rank 0's under their own names (the
    layout of a one-process checkpoint), rank r's under ``rank{r}/<name>``."""
    merged = dict(per_rank[0])
    for rank, states in enumerate(per_rank[1:], start=1):
        merged.update({f"rank{rank}/{name}": value for name, value in states.items()})
    return merged


def states_of_rank(merged: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank ``rank``'s part of what :func:`rank_generator_states` merged."""
    if rank == 0:
        return {name: value for name, value in merged.items() if not name.startswith("rank")}
    prefix = f"rank{rank}/"
    return {name[len(prefix) :]: value for name, value in merged.items() if name.startswith(prefix)}
