"""One run per output folder, and a folder that can be written before the first step.

A config that names no ``output_dir`` gives every run a new folder of its own,
``comlrl_output/<algorithm>-<time>`` (:func:`new_run_folder`), and points
``comlrl_output/latest`` at it: scripts that train twice, or run twice, never meet an earlier
run, and ``resume_from_checkpoint=True`` continues the newest run of the trainer's algorithm
(:func:`latest_run`).

A run writes its log and checkpoints into ``output_dir``. Two runs writing there at once mix
them (one run's weights beside the other's optimizer state, interleaved log lines), and a new
run in a folder that holds an earlier one buries it: a later ``resume_from_checkpoint=True``
would continue the wrong run. So ``train()``:

- takes an exclusive lock on the folder for the run (``.comlrl-run.lock``, holding the
  owner's pid, host and start time, removed when the run ends); a second run stops with an
  error naming the owner. The lock is an ``flock``, which the system drops when its process
  dies, so a crashed run never blocks the next one: its lock file is reported and taken over;
- refuses to start a new run in a folder that holds another run's checkpoints or log, unless
  it resumes that run or ``overwrite_output_dir=True`` says to replace it;
- creates the folder and writes the lock before anything slow happens, so a folder that
  cannot be written fails at once, not after the last step.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
import warnings

from comlrl.checkpoint.files import PREFIX, complete_checkpoints, find_checkpoint, read_state

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


DEFAULT_ROOT = "comlrl_output"
"""Where the runs of configs that name no ``output_dir`` get their folders (in the working folder)."""
LATEST = "latest"
"""``DEFAULT_ROOT/latest``: a link to the newest run's folder there (a file naming it where
links cannot be made)."""
_STAMP = "%Y%m%d-%H%M%S"


def run_name_prefix(algorithm: str) -> str:
    """``MAGRPO`` -> ``magrpo``: the start of a run folder's name (letters, digits and ``-``)."""
    return re.sub(r"[^a-z0-9]+", "-", algorithm.lower()).strip("-") or "run"


def new_run_folder(root: str, algorithm: str) -> str:
    """Create and return ``root/<algorithm>-<YYYYmmdd-HHMMSS>``, or with ``-2``, ``-3``, ...
    when a run of the same second has that name: ``mkdir`` claims a name atomically, so two
    processes never get the same folder."""
    base = f"{run_name_prefix(algorithm)}-{time.strftime(_STAMP)}"
    os.makedirs(root, exist_ok=True)
    for number in range(1, 10_000):
        folder = os.path.join(root, base if number == 1 else f"{base}-{number}")
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{os.path.abspath(root)} holds 9999 runs named {base}*: remove some")


def latest_run(root: str, algorithm: str) -> str | None:
    """The newest folder :func:`new_run_folder` made in ``root`` for ``algorithm``; None if none."""
    pattern = re.compile(rf"{re.escape(run_name_prefix(algorithm))}-(\d{{8}}-\d{{6}})(?:-(\d+))?")
    runs = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        match = pattern.fullmatch(name)
        if match and os.path.isdir(os.path.join(root, name)):
            runs.append((match.group(1), int(match.group(2) or 1), name))
    return os.path.join(root, max(runs)[2]) if runs else None


def point_latest(root: str, folder: str) -> None:
    """Make ``root/latest`` point at ``folder`` (a run folder, in ``root`` unless a resumed run
    lives elsewhere), replacing the previous pointer in one step: a relative link, or a file
    holding the name where the file system has no links."""
    name, latest = os.path.relpath(folder, root), os.path.join(root, LATEST)
    staged = os.path.join(root, f".{LATEST}.{os.getpid()}")
    try:
        os.symlink(name, staged)
    except OSError:  # no symbolic links here (some Windows set-ups)
        with open(staged, "w", encoding="utf-8") as f:
            f.write(name + "\n")
    os.replace(staged, latest)


def default_run_folder(algorithm: str, resume_from_checkpoint: bool | str | None, checkpoint_dir: str | None) -> str:
    """The folder of a run whose config names no ``output_dir``.

    A new run gets a new folder (:func:`new_run_folder`). A resumed one goes on in the folder
    its checkpoint recorded (when it still exists), else in the folder holding the
    checkpoint, else (``checkpoint_dir`` elsewhere, the recorded folder gone) in a new one;
    ``resume_from_checkpoint=True`` without ``checkpoint_dir`` resumes the newest run of
    ``algorithm`` in ``comlrl_output/``.
    """
    if not resume_from_checkpoint:
        return new_run_folder(DEFAULT_ROOT, algorithm)
    if resume_from_checkpoint is True and checkpoint_dir is None:
        latest = latest_run(DEFAULT_ROOT, algorithm)
        if latest is None:
            raise ValueError(
                f"resume_from_checkpoint=True with no output_dir in the config, but {os.path.abspath(DEFAULT_ROOT)} "
                f"holds no {algorithm} run ({run_name_prefix(algorithm)}-<time>) to continue: set output_dir to the "
                "run's folder, or pass resume_from_checkpoint='<folder>/checkpoint-<step>'"
            )
        return latest
    checkpoint = find_checkpoint(checkpoint_dir or "", resume_from_checkpoint)
    recorded = read_state(checkpoint).output_dir
    if recorded is not None and os.path.isdir(recorded):
        return recorded
    if checkpoint_dir is None:
        return os.path.dirname(os.path.abspath(checkpoint))
    return new_run_folder(DEFAULT_ROOT, algorithm)


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
    # Resuming is a way out only where there is a checkpoint to resume.
    resume = "continue it with train(resume_from_checkpoint=True), " if complete_checkpoints(folder) else ""
    raise FileExistsError(
        f"{what} {os.path.abspath(folder)} holds an earlier run ({shown}); a new run there would mix with it. "
        f"{resume}replace it with overwrite_output_dir=True in the config, choose another {what}, or leave "
        f"output_dir unset (each run then gets a new folder in {DEFAULT_ROOT}/)"
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
        fd = self._open_locked(where)
        try:
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

    def _open_locked(self, where: str) -> int:
        """The lock file, created if needed and locked. A run that ends removes its lock file
        (:meth:`release`), so one opened just before that removal locks a file no longer in
        the folder: then it is opened again."""
        while True:
            try:
                os.makedirs(self.folder, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise PermissionError(
                    f"{where} cannot be written ({error.strerror or error}): training would fail at its first "
                    f"save; choose another {self.what} or make this one writable"
                ) from error
            if fcntl is None:
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _describe_owner(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
                os.close(fd)
                raise RuntimeError(
                    f"{where} is in use by another run ({owner}); two runs in one folder would mix their "
                    f"checkpoints and logs: wait for it, stop it, or choose another {self.what}"
                ) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def release(self) -> None:
        """Remove and unlock the lock file, so a finished run leaves none behind; idempotent."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # a file left behind (removal failed) reads as released, not stale
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)  # while locked: no other run holds this file
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
