"""The training loop: epochs of shuffled items (dataset rows; MADPO: preference pairs), one
training step per batch, logging, evaluation and checkpoints at their cadence, and a clean
stop on SIGINT/SIGTERM (a second Ctrl-C: at once, raising KeyboardInterrupt).

    seed (or find the checkpoint) -> trainer.prepare -> resume (or start) -> [evaluate]
    -> for each epoch: order the items
        for each step: trainer.step(items) -> log every logging_steps -> evaluate every
        eval_interval -> checkpoint at the plan's cadence, or after a signal, then stop
    -> evaluate after the last step -> TrainResult
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from tqdm.auto import tqdm

from comlrl.checkpoint.files import complete_checkpoints, find_checkpoint, remove_discarded
from comlrl.checkpoint.manifest import verify_checkpoint
from comlrl.checkpoint.run_folder import (
    DEFAULT_ROOT,
    RunFolderLock,
    check_new_run,
    default_run_folder,
    point_latest,
)
from comlrl.checkpoint.trainer import resume_trainer, save_trainer, start_state
from comlrl.metrics import MetricsLogger
from comlrl.metrics.alerts import ZeroSpreadWatch
from comlrl.metrics.rollout import format_metrics, reward_fields
from comlrl.utils.checks import require_int
from comlrl.utils.run_control import StopOnSignal, seed_everything


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
        args: Any,
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


@dataclass
class TrainResult:
    """What ``train()`` returns."""

    global_step: int
    """Optimizer steps taken (each agent takes one per step)."""
    epoch_reward_means: list[float]
    """Mean processed joint reward of each epoch (what the advantages were computed from);
    empty when the steps sample nothing (MADPO trains on pairs sampled before the first step)."""
    epoch_raw_reward_means: list[float]
    """Mean joint reward of each epoch as ``reward_func`` returned it, before the processor."""
    train_seconds: float
    """Wall time of ``train()``."""
    interrupted: bool = False
    """SIGINT or SIGTERM stopped training early, after writing a checkpoint (a second SIGINT
    raises KeyboardInterrupt instead: :meth:`TrainingLoop.run`)."""
    output_dir: str | None = None
    """The absolute folder the run wrote to (its logs and checkpoints)."""


def progress_postfix(metrics: dict[str, float], progress_metric: tuple[str, str], epoch: int) -> dict[str, str]:
    """The progress bar's fields after a step: the epoch and the trainer's progress metric;
    the reward as the console line shows it (processed, with the raw one beside it, when a
    reward processor changed it: the bar would otherwise show, say, the reward x100 while
    the summaries speak 0..1)."""
    label, key = progress_metric
    if key == "reward/mean":
        return {"epoch": str(epoch), **reward_fields(metrics, 3)}
    return {"epoch": str(epoch), label: f"{metrics[key]:.3g}"}


class TrainingLoop:
    """One call of ``trainer.train()``: the loop and what it keeps between steps."""

    def __init__(self, trainer: Any, resume_from_checkpoint: bool | str | None, checkpoints: CheckpointPlan):
        self.trainer, self.args = trainer, trainer.args
        self.main = trainer.parallel.is_main
        self.output_dir = trainer.output_dir = self.run_folder(resume_from_checkpoint, checkpoints.folder)
        self.checkpoints = replace(checkpoints, folder=checkpoints.folder or self.output_dir)
        self.data_order = torch.Generator()
        self.locks = self.claim_folders(bool(resume_from_checkpoint)) if self.main else []
        if self.main:
            tqdm.write(f"{trainer.algorithm_name}: this run writes to {os.path.abspath(self.output_dir)}")
        try:
            self.start(resume_from_checkpoint)
        except BaseException:
            self.release_folders()
            raise

    def run_folder(self, resume_from_checkpoint: bool | str | None, checkpoint_dir: str | None) -> str:
        """The config's ``output_dir``, or when it names none the folder rank 0 chose for every
        rank (:func:`default_run_folder`; an error there is raised on every rank)."""
        if self.args.output_dir is not None:
            return self.args.output_dir
        chosen: tuple[str | None, BaseException | None] = (None, None)
        if self.main:
            try:
                chosen = (default_run_folder(self.trainer.algorithm_name, resume_from_checkpoint, checkpoint_dir), None)
            except (OSError, ValueError) as error:
                chosen = (None, error)
        folder, error = self.trainer.parallel.gather(chosen)[0]
        if error is not None:
            raise error
        return folder

    def claim_folders(self, resuming: bool) -> list[RunFolderLock]:
        """Lock the run's folders (which also shows they can be written) before anything slow,
        and, for a new run, make sure they hold no earlier run (or clear it, when told to). A
        folder chosen for a config without ``output_dir`` becomes ``comlrl_output/latest``."""
        folders = {os.path.realpath(self.output_dir): (self.output_dir, "output_dir")}
        folders.setdefault(os.path.realpath(self.checkpoints.folder), (self.checkpoints.folder, "checkpoint_dir"))
        locks: list[RunFolderLock] = []
        try:
            for folder, what in folders.values():
                locks.append(RunFolderLock(folder, what).acquire())
                for name in remove_discarded(folder):  # under the lock: no run is deleting there now
                    tqdm.write(f"removed {name} in {folder}: the rest of a checkpoint whose deletion was cut short")
                removed = [] if resuming else check_new_run(folder, self.args.overwrite_output_dir, what)
                if removed:
                    tqdm.write(f"overwrite_output_dir=True: removed the earlier run's {', '.join(removed)} in {folder}")
        except BaseException:
            for lock in locks:
                lock.release()
            raise
        if self.args.output_dir is None:
            point_latest(DEFAULT_ROOT, self.output_dir)
        return locks

    def release_folders(self) -> None:
        for lock in self.locks:
            lock.release()

    def start(self, resume_from_checkpoint: bool | str | None) -> None:
        """Seed a new run, or find the checkpoint to resume; prepare the trainer and the logging."""
        trainer, checkpoints = self.trainer, self.checkpoints
        checkpoint = find_checkpoint(checkpoints.folder, resume_from_checkpoint) if resume_from_checkpoint else None
        if checkpoint is not None:
            verify_checkpoint(checkpoint)  # before anything, the trainer's prepare() included, reads it
        if checkpoint is None:
            # Ranks sample differently; they all shuffle the data alike.
            seed_everything(self.args.seed + trainer.parallel.rank)
            self.data_order.manual_seed(self.args.seed)
        start_metrics = trainer.prepare(checkpoint)
        if checkpoint is None:
            self.progress = start_state(trainer)
        else:
            say = tqdm.write if self.main else lambda note: None
            self.progress = resume_trainer(trainer, checkpoint, self.data_order, say, checkpoints.folder)
        trainer.learners.allocate_state()  # below the first rollout's and update's memory
        self.save_every = trainer.schedule.save_every_steps(checkpoints, trainer.steps_per_epoch)
        self.logger = MetricsLogger(trainer.sinks() if self.main else [])
        self.zero_spread = ZeroSpreadWatch()
        if start_metrics:
            self.log_once(start_metrics, trainer.global_step)
        self.logger.add_window(self.progress.metrics_window)
        self.bar = tqdm(
            total=self.num_epochs * trainer.steps_per_epoch,
            initial=trainer.global_step,
            desc=trainer.algorithm_name,
            unit="step",
            dynamic_ncols=True,
            disable=not self.main,
        )
        self.evaluates = trainer.eval_prompts is not None and self.main
        self.interrupted = False

    def run(self) -> TrainResult:
        """Train to the last epoch, or until a signal; the metrics of every step taken are
        written whatever stops training (after a signal, into the checkpoint).

        A SIGINT or SIGTERM lets the step finish, writes a checkpoint and returns; the ranks
        agree on stopping after the same step. A second SIGINT (Ctrl-C) stops at once: the
        step or save in progress is dropped (it never leaves a folder that looks complete),
        rank 0 names the last complete checkpoint and KeyboardInterrupt propagates, so a
        script ends as after any Ctrl-C (exit code 130). Under torchrun it is raised on the
        ranks that got the signal; a rank that did not waits at its next collective until
        torchrun, seeing a rank exit, ends it.
        """
        started = time.perf_counter()
        try:
            with StopOnSignal() as stop:
                if self.periodic_evaluation and self.trainer.global_step == 0:
                    self.evaluate()
                for epoch in range(self.progress.epoch, self.num_epochs):
                    self.progress.epoch = epoch
                    epoch_order_state = self.data_order.get_state()  # a checkpoint rebuilds the order from it
                    order = self.epoch_order()
                    for step_in_epoch in range(self.progress.step_in_epoch, self.trainer.steps_per_epoch):
                        self.step(order, step_in_epoch, epoch)
                        self.interrupted = self.trainer.parallel.any(stop.signal is not None)
                        if self.interrupted or self.due(self.save_every) or self.finished_with_save():
                            folder = self.save(epoch_order_state)
                        if self.interrupted:
                            self.say_stopped(stop.signal, folder)
                            return self.result(started)
                    self.end_epoch()
                if self.evaluates and not (self.periodic_evaluation and self.due(self.args.eval_interval)):
                    self.evaluate()
        except KeyboardInterrupt:
            self.bar.close()  # the note goes under the bar, last before the traceback
            self.say_interrupted()
            raise
        finally:
            self.close()
        return self.result(started)

    def log_once(self, metrics: dict[str, float], step: int) -> None:
        """Metrics measured once, not per step (a preference trainer's pairs, a round's start):
        to every sink at ``step``, and one console line."""
        self.logger.log(metrics, step)
        if self.main:
            tqdm.write(" | ".join(f"{key} {value:.4g}" for key, value in metrics.items()))

    @property
    def num_epochs(self) -> int:
        """Epochs the run goes through (the schedule's: in rounds, every round's epochs)."""
        return self.trainer.schedule.num_epochs(self.args)

    @property
    def periodic_evaluation(self) -> bool:
        return self.evaluates and self.args.eval_interval > 0

    def finished_with_save(self) -> bool:
        """The step just taken is one the plan keeps at the end (of the run; in rounds, of a round)."""
        return self.trainer.schedule.ends_with_save(self.checkpoints, self.progress, self.trainer)

    def due(self, every: int | None) -> bool:
        """Whether the step just taken is a multiple of ``every`` (None or 0: never)."""
        return bool(every) and self.trainer.global_step % every == 0

    def epoch_order(self) -> list[int]:
        """The order of the epoch's items (dataset rows; MADPO: preference pairs), after the
        schedule has started the epoch (in rounds, maybe a new round and its items)."""
        metrics = self.trainer.schedule.start_epoch(self.trainer, self.progress.epoch)
        if metrics:
            # Logged with the round's first step: a run resumed from a checkpoint taken before
            # the round (which drops later lines from the log) makes and logs them again.
            self.log_once(metrics, self.trainer.global_step + 1)
            # A round's items may differ from the last's (MADPOIter's pairs): the bar counts on this round's.
            self.bar.total = self.bar.n + (self.num_epochs - self.progress.epoch) * self.trainer.steps_per_epoch
        items = self.trainer.num_train_items
        if self.args.shuffle:
            return torch.randperm(items, generator=self.data_order).tolist()
        return list(range(items))

    def step(self, order: list[int], step_in_epoch: int, epoch: int) -> None:
        """One training step on the items of ``order`` at ``step_in_epoch``, then its logging
        and evaluation."""
        trainer, progress = self.trainer, self.progress
        per_step = trainer.items_per_step
        items = order[step_in_epoch * per_step : (step_in_epoch + 1) * per_step]
        result = trainer.step(trainer.parallel.shard(items))
        trainer.global_step = progress.global_step = trainer.global_step + 1
        progress.step_in_epoch = step_in_epoch + 1
        if "reward/mean" in result.metrics:  # a step that samples (MADPO's steps train on stored pairs)
            progress.step_rewards.append(result.metrics["reward/mean"])
            progress.step_raw_rewards.append(result.metrics["reward/raw_mean"])
        self.logger.add(result.metrics, trainer.global_step)
        if (warning := self.zero_spread.check(result.metrics)) and self.main:
            self.bar.write(warning)
        self.bar.update(1)
        self.bar.set_postfix(progress_postfix(result.metrics, trainer.progress_metric, epoch + 1))
        if self.due(self.args.logging_steps):
            flushed = self.logger.flush(trainer.global_step)
            if self.main:
                self.bar.write(format_metrics(trainer.global_step, flushed))
            samples = trainer.step_samples(result, self.args.num_completions_to_log)
            self.logger.log_samples(samples, trainer.global_step)
        if self.periodic_evaluation and self.due(self.args.eval_interval):
            self.evaluate()

    def end_epoch(self) -> None:
        progress = self.progress
        if progress.step_rewards:
            progress.epoch_reward_means.append(sum(progress.step_rewards) / len(progress.step_rewards))
            progress.epoch_raw_reward_means.append(sum(progress.step_raw_rewards) / len(progress.step_raw_rewards))
        progress.step_rewards, progress.step_raw_rewards, progress.step_in_epoch = [], [], 0
        self.trainer.schedule.end_epoch(self.trainer, progress.epoch)

    def evaluate(self) -> None:
        metrics = self.trainer.evaluate()
        self.logger.log(metrics, self.trainer.global_step)
        self.bar.write(format_metrics(self.trainer.global_step, metrics))

    def save(self, epoch_order_state: torch.Tensor) -> str:
        self.progress.metrics_window = self.logger.window()
        return save_trainer(
            self.trainer, self.progress, epoch_order_state, self.checkpoints.folder, self.checkpoints.total_limit
        )

    def say_stopped(self, signal_number: int | None, folder: str) -> None:
        if self.main:
            cause = signal.Signals(signal_number).name if signal_number else "a signal to another rank"
            self.bar.write(
                f"stopped by {cause} after step {self.trainer.global_step}: checkpoint {folder}; "
                "continue with train(resume_from_checkpoint=True)"
            )

    def say_interrupted(self) -> None:
        if self.main:
            found = complete_checkpoints(self.checkpoints.folder)
            last = (
                f"the last complete checkpoint is {os.path.abspath(found[-1])}; continue with "
                "train(resume_from_checkpoint=True)"
                if found
                else f"{os.path.abspath(self.checkpoints.folder)} holds no complete checkpoint"
            )
            tqdm.write(
                f"KeyboardInterrupt after step {self.trainer.global_step}: stopped at once; {last}", file=sys.stderr
            )

    def close(self) -> None:
        # After a signal the pending metrics are in the checkpoint, and the resumed run writes them.
        if not self.interrupted:
            self.logger.flush(self.trainer.global_step)
        self.bar.close()
        self.logger.close()
        self.release_folders()

    def result(self, started: float) -> TrainResult:
        progress = self.progress
        return TrainResult(
            self.trainer.global_step,
            progress.epoch_reward_means,
            progress.epoch_raw_reward_means,
            time.perf_counter() - started,
            self.interrupted,
            os.path.abspath(self.output_dir),
        )
