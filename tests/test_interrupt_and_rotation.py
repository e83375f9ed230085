"""Runs that end abruptly never leave a checkpoint that looks complete and is not: one killed
while the ``save_total_limit`` rotation deletes a checkpoint, one given a second Ctrl-C while
it saves after the first. The second Ctrl-C stops at once: ``train()`` raises
KeyboardInterrupt after naming the last complete checkpoint, and puts the signal handlers back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from comlrl.checkpoint import complete_checkpoints, find_checkpoint, verify_checkpoint

from .helpers import killable_trainer, make_trainer, small_config
from .rotation_worker import interrupt_twice, interrupted_trainer

REPO = Path(__file__).resolve().parents[1]


def run_worker(scenario: str, folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "tests.rotation_worker", scenario, str(folder)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def logged_steps(folder: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_run_killed_while_the_rotation_deletes_a_checkpoint_leaves_none_that_looks_complete(tmp_path):
    folder = tmp_path / "run"
    worker = run_worker("killed-in-rotation", folder)
    assert worker.returncode == -signal.SIGKILL, worker.stderr[-3000:]
    # The third save was complete; the deletion of the first was cut short after one file.
    found = complete_checkpoints(str(folder))
    assert [os.path.basename(path) for path in found] == ["checkpoint-2", "checkpoint-3"]
    for path in found:
        verify_checkpoint(path)
    assert find_checkpoint(str(folder), True) == str(folder / "checkpoint-3")
    leftovers = [name for name in os.listdir(folder) if "checkpoint-1" in name]
    assert leftovers and "checkpoint-1" not in leftovers
    for name in leftovers:  # not even named explicitly
        with pytest.raises(ValueError, match=rf"{name} is a checkpoint whose deletion was cut short"):
            find_checkpoint(str(folder), str(folder / name))

    with pytest.warns(UserWarning, match=r"a run \(pid \d+ .*\) stopped without releasing it"):  # the killed one
        result = killable_trainer(str(folder)).train(resume_from_checkpoint=True)
    assert result.global_step == 24
    assert logged_steps(folder) == list(range(1, 25))
    assert not [name for name in os.listdir(folder) if "checkpoint-1" in name]  # removed when the run started


@pytest.mark.parametrize("scenario", ["interrupted-twice", "interrupted-twice-ignored"])
def test_a_second_sigint_while_saving_stops_at_once_naming_the_last_complete_checkpoint(tmp_path, scenario):
    folder = tmp_path / "run"
    worker = run_worker(scenario, folder)
    # Python ends an uncaught KeyboardInterrupt by killing itself with SIGINT: a shell reports 130.
    assert worker.returncode == -signal.SIGINT, worker.stdout[-2000:] + worker.stderr[-3000:]
    assert "train() returned" not in worker.stdout
    checkpoint = folder / "checkpoint-1"
    assert f"KeyboardInterrupt after step 2: stopped at once; the last complete checkpoint is {checkpoint}" in (
        worker.stderr
    )
    assert worker.stderr.rstrip().endswith("KeyboardInterrupt")  # the traceback follows the note
    # checkpoint-2 was being written: it is not taken for a checkpoint.
    assert complete_checkpoints(str(folder)) == [str(checkpoint)]

    args = small_config(tmp_path, num_train_epochs=2, save_steps=1)
    result = make_trainer(tmp_path, args=args).train(resume_from_checkpoint=True)
    assert result.global_step == 4 and not result.interrupted
    assert logged_steps(folder) == [1, 2, 3, 4]


def test_train_puts_the_signal_handlers_back(tmp_path):
    def handlers():
        return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    before = handlers()
    assert interrupted_trainer(tmp_path / "a" / "run").train().interrupted
    assert handlers() == before
    with pytest.raises(KeyboardInterrupt):
        interrupt_twice(str(tmp_path / "b" / "run"))
    assert handlers() == before
