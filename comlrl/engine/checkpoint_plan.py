"""Where a run's checkpoints go, how often and how many are kept: the config's settings and
``train()``'s arguments, resolved once per call."""

from __future__ import annotations

import os
from dataclasses import dataclass

from comlrl.engine.config import TrainerConfig
from comlrl.utils.checks import require_int


@dataclass(frozen=True)
class CheckpointPlan:
    """Where checkpoints go, how often, how many are kept."""

    folder: str | None
    """The folder of the ``checkpoint-{step}`` folders; None: the run's ``output_dir``."""
    every_steps: int | None
    """A checkpoint every this many steps (the config's ``save_steps``), or None."""
    every_epochs: int | None
    """A checkpoint every this many epochs (comlrl 1.4.3's ``checkpoint_interval``), or None;
    neither: only after a signal."""
    total_limit: int | None
    """Keep the newest this many (None: all)."""
    at_end: bool = False
    """Also after the last step, whatever the cadence (1.4.3 always saved its last epoch)."""

    def cadence(self, steps_per_epoch: int) -> int | None:
        """Steps between checkpoints (None: only after a signal)."""
        return self.every_steps if self.every_epochs is None else self.every_epochs * steps_per_epoch

    @classmethod
    def resolve(
        cls,
        args: TrainerConfig,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int | None = None,
        checkpoint_total_limit: int | None = None,
    ) -> CheckpointPlan:
        """The plan of the config (``save_steps``, ``save_total_limit``, ``output_dir``) and of
        comlrl 1.4.3's ``train()`` arguments: ``checkpoint_dir`` (alone: a checkpoint every
        epoch, as 1.4.3), ``checkpoint_interval`` (epochs), ``checkpoint_total_limit``."""
        if checkpoint_dir is not None and (
            not isinstance(checkpoint_dir, str | os.PathLike) or not os.fspath(checkpoint_dir)
        ):
            raise ValueError(f"checkpoint_dir must be a folder path, got {checkpoint_dir!r}")
        require_int(checkpoint_interval, "checkpoint_interval", allow_none=True, note=" (epochs)")
        require_int(checkpoint_total_limit, "checkpoint_total_limit", allow_none=True)
        if checkpoint_interval is not None:
            if args.save_steps is not None:
                raise ValueError(
                    f"checkpoint_interval={checkpoint_interval} (epochs) and the config's save_steps={args.save_steps} "
                    "both set a checkpoint cadence: keep one"
                )
        elif checkpoint_dir is not None and args.save_steps is None:
            checkpoint_interval = 1
        total_limit = args.save_total_limit
        if checkpoint_total_limit is not None:
            if total_limit not in (None, checkpoint_total_limit):
                raise ValueError(
                    f"checkpoint_total_limit={checkpoint_total_limit} and the config's save_total_limit={total_limit} "
                    "disagree: keep one"
                )
            total_limit = checkpoint_total_limit
        folder = args.output_dir if checkpoint_dir is None else os.fspath(checkpoint_dir)
        return cls(folder, args.save_steps, checkpoint_interval, total_limit, at_end=checkpoint_interval is not None)
