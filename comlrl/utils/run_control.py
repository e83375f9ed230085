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
    signal acts at once. Outside the main thread, where handlers cannot be set, it does nothing."""

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

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __exit__(self, *exc_info: Any) -> None:
        self._restore()
