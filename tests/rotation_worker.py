"""Entry point for tests/test_interrupt_and_rotation.py's runs that end abruptly, at a chosen
point (``-m tests.rotation_worker SCENARIO OUT_DIR``):

- ``killed-in-rotation``: checkpoints every step, keeping 2; the deletion of the oldest, at
  the third save, removes one weight file and the process is killed (SIGKILL);
- ``interrupted-twice`` / ``interrupted-twice-ignored``: a SIGINT during step 2, a second one
  while that step's checkpoint is written; ``-ignored`` first ignores SIGINT, as a job a
  script starts in the background inherits.
"""

import os
import shutil
import signal
import sys
from pathlib import Path

from comlrl.checkpoint.files import STATE_FILE
from tests.helpers import interrupting_reward, killable_trainer, make_trainer, small_config


def interrupted_trainer(output_dir: Path):
    """2 epochs of 2 steps, a checkpoint every step, stopped by a SIGINT during step 2."""
    args = small_config(output_dir.parent, num_train_epochs=2, save_steps=1, output_dir=str(output_dir))
    return make_trainer(output_dir.parent, reward_func=interrupting_reward(2), args=args)


def kill_in_rotation(output_dir: str) -> None:
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if os.path.isfile(os.path.join(path, STATE_FILE)):  # a complete checkpoint being deleted
            os.remove(os.path.join(path, "agent_0", "model.safetensors"))
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree
    killable_trainer(output_dir).train()


def interrupt_twice(output_dir: str) -> None:
    trainer = interrupted_trainer(Path(output_dir))
    write_models = trainer.run.models.write

    def write_then_interrupt(folder: str) -> None:
        write_models(folder)
        if os.path.basename(folder) == "checkpoint-2.partial":  # the save the first SIGINT asked for
            os.kill(os.getpid(), signal.SIGINT)

    trainer.run.models.write = write_then_interrupt
    trainer.train()
    print("train() returned", flush=True)


if __name__ == "__main__":
    scenario, out = sys.argv[1], sys.argv[2]
    if scenario == "killed-in-rotation":
        kill_in_rotation(out)
    else:
        if scenario == "interrupted-twice-ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        interrupt_twice(out)
