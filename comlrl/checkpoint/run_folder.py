"""One run per output folder, and a folder that can be written before the first step.

A run writes its log and checkpoints into ``output_dir``. Two runs writing there at once mix
them (one run's weights beside the other's optimizer state, interleaved log lines), and a new
run in a folder that holds an earlier one buries it: a later ``resume_from_checkpoint=True``
would continue the wrong run. So ``train()``:

- takes an exclusive lock on the folder for the run (``.comlrl-run.lock``, holding the
  owner's pid, host and start time); a second run stops with an error naming the owner. The
  lock is an ``flock``, which the system drops when its process dies, so a crashed run never
  blocks the next one: its lock file is reported and taken over;
- refuses to start a new run in a folder that holds another run's checkpoints or log, unless
  it resumes that run or ``overwrite_output_dir=True`` says to replace it;
- creates the folder and writes the lock before anything slow happens, so a folder that
  cannot be written fails at once, not after the last step.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import warnings

from comlrl.checkpoint.files import PREFIX

try:  # POSIX; elsewhere the folder is checked and written but not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_FILE = ".comlrl-run.lock"
RUN_LOGS = ("metrics.jsonl", "samples.jsonl")
"""The logs a run appends to; with the checkpoints they are what marks a folder as a run's."""
RUN_OUTPUTS = (*RUN_LOGS, "metrics.png", "tensorboard", "reward_model", "preference_replay", "reward_distributions")
"""What ``overwrite_output_dir=True`` removes beside the checkpoints (MARLHF's fitted reward
model, the iterative trainers' replay shards and reward histograms; nothing else is touched)."""


def earlier_run(folder: str) -> list[str]:
    """What in ``folder`` belongs to a run: checkpoint folders (complete or cut short) and logs."""
    if not os.path.isdir(folder):
        return []
    names = sorted(os.listdir(folder))
    return [n for n in names if n.startswith(PREFIX) and os.path.isdir(os.path.join(folder, n))] + [
        n for n in names if n in RUN_LOGS
    ]


def clear_earlier_run(folder: str) -> list[str]:
    """Remove an earlier run's checkpoints, logs and picture from ``folder``; returns what was removed."""
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not (name.startswith(PREFIX) and os.path.isdir(path)) and name not in RUN_OUTPUTS:
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        removed.append(name)
    return removed


def check_new_run(folder: str, overwrite: bool, what: str = "output_dir") -> list[str]:
    """Before a new (not resumed) run writes into ``folder``: refuse if it holds an earlier
    run, or with ``overwrite`` remove that run's outputs; returns what was removed."""
    found = earlier_run(folder)
    if not found:
        return []
    if overwrite:
        return clear_earlier_run(folder)
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    raise FileExistsError(
        f"{what} {os.path.abspath(folder)} holds an earlier run ({shown}); a new run there would mix with it. "
        "Continue it with train(resume_from_checkpoint=True), replace it with overwrite_output_dir=True "
        f"in the config, or choose another {what}"
    )


def _owner_record() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _describe_owner(text: str) -> str:
    try:
        owner = json.loads(text)
        return f"pid {owner['pid']} on host {owner['host']}, started {owner['started']}"
    except (ValueError, KeyError, TypeError):
        return "an unknown process"


class RunFolderLock:
    """The exclusive right of this process to write runs into one folder, until :meth:`release`."""

    def __init__(self, folder: str, what: str = "output_dir"):
        self.folder, self.what = folder, what
        self.path = os.path.join(folder, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> RunFolderLock:
        """Create the folder if needed and lock it; errors name the folder and what to do."""
        where = f"{self.what} {os.path.abspath(self.folder)}"
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise NotADirectoryError(f"{where} is a file, not a folder: remove it or choose another {self.what}")
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise PermissionError(
                f"{where} cannot be written ({error.strerror or error}): training would fail at its first "
                f"save; choose another {self.what} or make this one writable"
            ) from error
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = _describe_owner(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
                    raise RuntimeError(
                        f"{where} is in use by another run ({owner}); two runs in one folder would mix their "
                        f"checkpoints and logs: wait for it, stop it, or choose another {self.what}"
                    ) from None
            previous = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            if previous:
                warnings.warn(
                    f"{where}: a run ({_describe_owner(previous)}) stopped without releasing it; taking it over",
                    stacklevel=3,
                )
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_owner_record()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty and unlock the lock file (an empty one is not a stale lock); idempotent."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
