"""Rounds as a schedule: ``num_iterations`` rounds of ``num_train_epochs`` epochs in one
training loop, a round started when its first epoch starts. What a round gives its trainer is
the ``consumer``'s: MADPOIter's objective takes DPO steps on the round's pairs, MARLHFIter's
reward source fits a fresh reward model to them (:class:`~comlrl.trainers.dpo.rounds.PreferenceRounds`
makes the pairs). An epoch cadence of checkpoints (``checkpoint_interval``) counts rounds.
"""

from __future__ import annotations

from typing import Any, Protocol

from comlrl.engine.optim import build_schedulers
from comlrl.engine.parts import Schedule
from comlrl.trainers.dpo.rounds import PreferenceRounds


class RoundConsumer(Protocol):
    """The part a round's pairs are for."""

    def start_round(self, trainer: Any, round_index: int) -> dict[str, float]:
        """Round ``round_index``: its pairs made and taken in; returns the round's metrics."""
        ...


class Rounds(Schedule):
    """The rounds of an iterative trainer.

    Args:
        consumer: the part a round's pairs are for.
        schedule_per_round: each round's learning-rate schedules start over, spanning its
            steps (MADPOIter: a round's pairs, known when it starts, set its length); else one
            schedule spans every round (MARLHFIter: rows, the same every round).
    """

    rounds: PreferenceRounds
    """Every round's pairs, the round in progress, the comparator."""

    def __init__(self, consumer: RoundConsumer, schedule_per_round: bool):
        self.consumer = consumer
        self.schedule_per_round = schedule_per_round

    def attach(self, trainer: Any, inputs: Any) -> None:
        self.rounds = PreferenceRounds(trainer, trainer.args, trainer.comparator_adapter)

    def num_epochs(self, args: Any) -> int:
        return args.num_iterations * args.num_train_epochs

    def epochs_per_lr_schedule(self, args: Any) -> int:
        return args.num_train_epochs if self.schedule_per_round else self.num_epochs(args)

    def prepare(self, trainer: Any, checkpoint: str | None) -> dict[str, float]:
        """A resumed run reads its rounds back; a new one starts round 1 (its metrics are returned)."""
        if checkpoint is not None:
            self.rounds.read(checkpoint)
            return {}
        self.rounds.reset()
        return self.consumer.start_round(trainer, 0)

    def start_epoch(self, trainer: Any, epoch: int) -> dict[str, float]:
        """Start the round epoch ``epoch`` belongs to, if it is a new one (its metrics are returned)."""
        round_index = self.rounds.round_of(epoch)
        if round_index == self.rounds.round:
            return {}
        metrics = self.consumer.start_round(trainer, round_index)
        if self.schedule_per_round:
            args, learners = trainer.args, trainer.learners
            learners.schedulers = build_schedulers(
                learners.optimizers, args.lr_scheduler_type, args.warmup_ratio, trainer.total_optimizer_steps
            )
        return metrics

    def end_epoch(self, trainer: Any, epoch: int) -> None:
        if (epoch + 1) % trainer.args.num_train_epochs == 0:
            self.rounds.end(trainer, self.rounds.round_of(epoch))

    def save_every_steps(self, checkpoints: Any, steps_per_epoch: int) -> int | None:
        return checkpoints.every_steps  # checkpoint_interval counts rounds: see ends_with_save

    def ends_with_save(self, checkpoints: Any, progress: Any, trainer: Any) -> bool:
        """The step just taken ends a round the plan keeps: every ``checkpoint_interval``-th, and the last."""
        every, epochs = checkpoints.every_epochs, trainer.args.num_train_epochs
        epoch = progress.epoch
        if not every or (epoch + 1) % epochs or progress.step_in_epoch != trainer.steps_per_epoch:
            return False
        rounds_done = (epoch + 1) // epochs
        return rounds_done % every == 0 or rounds_done == self.rounds.num_rounds

    def write_checkpoint(self, trainer: Any, folder: str) -> None:
        """``preference_rounds.pt``: the rounds, read back by :meth:`prepare`."""
        self.rounds.write(folder)
