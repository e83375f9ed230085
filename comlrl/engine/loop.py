"""The training loop: epochs of shuffled items (dataset rows; MADPO: preference pairs), one
training step per batch, logging, evaluation and checkpoints at their cadence, and a clean
stop on SIGINT/SIGTERM (a second Ctrl-C: at once, raising KeyboardInterrupt).

    seed (or find the checkpoint) -> prepare the parts -> resume (or start) -> [evaluate]
    -> for each epoch: order the items
        for each step: objective.step(items) -> log every logging_steps -> evaluate every
        eval_interval -> checkpoint at the plan's cadence, or after a signal, then stop
    -> evaluate after the last step -> TrainResult
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from tqdm.auto import tqdm

from comlrl.checkpoint.config_record import config_record
from comlrl.checkpoint.files import complete_checkpoints, find_checkpoint, remove_discarded
from comlrl.checkpoint.manifest import verify_checkpoint
from comlrl.checkpoint.run_folder import (
    DEFAULT_ROOT,
    RunFolderLock,
    check_new_run,
    default_run_folder,
    point_latest,
)
from comlrl.engine.checkpoint_plan import CheckpointPlan
from comlrl.engine.checkpoints import resume_run, save_run, start_state
from comlrl.engine.evaluation import evaluate
from comlrl.engine.parts import Objective, Schedule
from comlrl.engine.plan import StepPlan
from comlrl.engine.run import Run
from comlrl.metrics import MetricsLogger
from comlrl.metrics.alerts import ZeroSpreadWatch
from comlrl.metrics.rollout import format_metrics, reward_fields
from comlrl.metrics.sinks import run_sinks
from comlrl.utils.run_control import StopOnSignal, seed_everything


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
    raises KeyboardInterrupt instead: :meth:`TrainingLoop.train`)."""
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
    """One call of ``train()``: the loop and what it keeps between steps."""

    def __init__(
        self,
        run: Run,
        objective: Objective,
        schedule: Schedule,
        plan: StepPlan,
        prepare: Callable[[str | None], dict[str, float]],
        resume_from_checkpoint: bool | str | None,
        checkpoints: CheckpointPlan,
    ):
        """The loop of ``run`` trained by ``objective`` over ``schedule``'s epochs (``plan``
        counts them); ``prepare`` readies the trainer's parts (a checkpoint's path, or None)."""
        self.run, self.args = run, run.config
        self.objective, self.schedule, self.plan, self.prepare = objective, schedule, plan, prepare
        self.main = run.parallel.is_main
        self.output_dir = self.run_folder(resume_from_checkpoint, checkpoints.folder)
        run.state.write_to(self.output_dir)
        self.checkpoints = replace(checkpoints, folder=checkpoints.folder or self.output_dir)
        self.data_order = torch.Generator()
        self.locks = self.claim_folders(bool(resume_from_checkpoint)) if self.main else []
        if self.main:
            tqdm.write(f"{run.name}: this run writes to {os.path.abspath(self.output_dir)}")
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
                chosen = (default_run_folder(self.run.name, resume_from_checkpoint, checkpoint_dir), None)
            except (OSError, ValueError) as error:
                chosen = (None, error)
        folder, error = self.run.parallel.gather(chosen)[0]
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
        run, checkpoints = self.run, self.checkpoints
        checkpoint = find_checkpoint(checkpoints.folder, resume_from_checkpoint) if resume_from_checkpoint else None
        if checkpoint is not None:
            verify_checkpoint(checkpoint)  # before anything, the trainer's prepare() included, reads it
        if checkpoint is None:
            # Ranks sample differently; they all shuffle the data alike.
            seed_everything(self.args.seed + run.parallel.rank)
            self.data_order.manual_seed(self.args.seed)
        start_metrics = self.prepare(checkpoint)
        if checkpoint is None:
            self.progress = start_state(run)
        else:
            say = tqdm.write if self.main else lambda note: None
            self.progress = resume_run(run, run.models.load, checkpoint, self.data_order, say, checkpoints.folder)
        run.learners.allocate_state()  # below the first rollout's and update's memory
        self.save_every = self.schedule.save_every_steps(checkpoints, self.plan.steps_per_epoch)
        sinks = run_sinks(
            self.output_dir, run.wandb_config, lambda: config_record(self.args), self.args.log_tensorboard
        )
        self.logger = MetricsLogger(sinks if self.main else [])
        self.zero_spread = ZeroSpreadWatch()
        if start_metrics:
            self.log_once(start_metrics, run.state.global_step)
        self.logger.add_window(self.progress.metrics_window)
        self.bar = tqdm(
            total=self.plan.num_epochs * self.plan.steps_per_epoch,
            initial=run.state.global_step,
            desc=run.name,
            unit="step",
            dynamic_ncols=True,
            disable=not self.main,
        )
        self.evaluates = run.eval_prompts is not None and self.main
        self.interrupted = False

    def train(self) -> TrainResult:
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
                if self.periodic_evaluation and self.run.state.global_step == 0:
                    self.evaluate()
                for epoch in range(self.progress.epoch, self.plan.num_epochs):
                    self.progress.start_epoch(epoch)
                    epoch_order_state = self.data_order.get_state()  # a checkpoint rebuilds the order from it
                    order = self.epoch_order()
                    for step_in_epoch in range(self.progress.step_in_epoch, self.plan.steps_per_epoch):
                        self.step(order, step_in_epoch, epoch)
                        self.interrupted = self.run.parallel.any(stop.signal is not None)
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
    def periodic_evaluation(self) -> bool:
        return self.evaluates and self.args.eval_interval > 0

    def finished_with_save(self) -> bool:
        """The step just taken is one the plan keeps at the end (of the run; in rounds, of a round)."""
        return self.schedule.ends_with_save(self.checkpoints, self.progress, self.args, self.plan.steps_per_epoch)

    def due(self, every: int | None) -> bool:
        """Whether the step just taken is a multiple of ``every`` (None or 0: never)."""
        return bool(every) and self.run.state.global_step % every == 0

    def epoch_order(self) -> list[int]:
        """The order of the epoch's items (dataset rows; MADPO: preference pairs), after the
        schedule has started the epoch (in rounds, maybe a new round and its items)."""
        restart = self.schedule.restarts_lr_schedule(self.progress.epoch)
        metrics = self.schedule.start_epoch(self.progress.epoch)
        if restart:
            self.plan.restart_lr_schedules()
        if metrics:
            # Logged with the round's first step: a run resumed from a checkpoint taken before
            # the round (which drops later lines from the log) makes and logs them again.
            self.log_once(metrics, self.run.state.global_step + 1)
            # A round's items may differ from the last's (MADPOIter's pairs): the bar counts on this round's.
            self.bar.total = self.bar.n + (self.plan.num_epochs - self.progress.epoch) * self.plan.steps_per_epoch
        items = self.plan.num_items
        if self.args.shuffle:
            return torch.randperm(items, generator=self.data_order).tolist()
        return list(range(items))

    def step(self, order: list[int], step_in_epoch: int, epoch: int) -> None:
        """One training step on the items of ``order`` at ``step_in_epoch``, then its logging
        and evaluation."""
        run, progress = self.run, self.progress
        per_step = self.plan.items_per_step
        items = order[step_in_epoch * per_step : (step_in_epoch + 1) * per_step]
        result = self.objective.step(run.parallel.shard(items), run.state.global_step + 1)
        step = run.state.advance()
        progress.record_step(step, step_in_epoch + 1, result.metrics)
        self.logger.add(result.metrics, step)
        if (warning := self.zero_spread.check(result.metrics)) and self.main:
            self.bar.write(warning)
        self.bar.update(1)
        self.bar.set_postfix(progress_postfix(result.metrics, self.objective.progress_metric, epoch + 1))
        if self.due(self.args.logging_steps):
            flushed = self.logger.flush(step)
            if self.main:
                self.bar.write(format_metrics(step, flushed))
            samples = self.objective.step_samples(result, self.args.num_completions_to_log)
            self.logger.log_samples(samples, step)
        if self.periodic_evaluation and self.due(self.args.eval_interval):
            self.evaluate()

    def end_epoch(self) -> None:
        self.progress.end_epoch()
        self.schedule.end_epoch(self.progress.epoch)

    def evaluate(self) -> None:
        started = time.perf_counter()
        metrics = evaluate(self.run, self.objective.discount)
        metrics["time/eval_s"] = time.perf_counter() - started
        self.logger.log(metrics, self.run.state.global_step)
        self.bar.write(format_metrics(self.run.state.global_step, metrics))

    def save(self, epoch_order_state: torch.Tensor) -> str:
        self.progress.keep_window(self.logger.window())
        return save_run(
            self.run,
            self.run.models.write,
            self.progress,
            epoch_order_state,
            self.checkpoints.folder,
            self.checkpoints.total_limit,
        )

    def say_stopped(self, signal_number: int | None, folder: str) -> None:
        if self.main:
            cause = signal.Signals(signal_number).name if signal_number else "a signal to another rank"
            self.bar.write(
                f"stopped by {cause} after step {self.run.state.global_step}: checkpoint {folder}; "
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
                f"KeyboardInterrupt after step {self.run.state.global_step}: stopped at once; {last}", file=sys.stderr
            )

    def close(self) -> None:
        # After a signal the pending metrics are in the checkpoint, and the resumed run writes them.
        if not self.interrupted:
            self.logger.flush(self.run.state.global_step)
        self.bar.close()
        self.logger.close()
        self.release_folders()

    def result(self, started: float) -> TrainResult:
        progress = self.progress
        return TrainResult(
            self.run.state.global_step,
            progress.epoch_reward_means,
            progress.epoch_raw_reward_means,
            time.perf_counter() - started,
            self.interrupted,
            os.path.abspath(self.output_dir),
        )
