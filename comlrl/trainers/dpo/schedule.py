"""Rounds as a schedule: ``num_iterations`` rounds of ``num_train_epochs`` epochs in one
training loop, a round started when its first epoch starts. What a round gives its trainer is
the ``consumer``'s, which is handed the rounds when one starts: MADPOIter's objective takes DPO
steps on the round's pairs, MARLHFIter's reward source fits a fresh reward model to them
(:class:`~comlrl.trainers.dpo.rounds.PreferenceRounds` makes the pairs). An epoch cadence of
checkpoints (``checkpoint_interval``) counts rounds.
"""

from __future__ import annotations

from typing import Protocol

from comlrl.checkpoint.files import TrainerState
from comlrl.engine.checkpoint_plan import CheckpointPlan
from comlrl.engine.config import TrainerConfig
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import Schedule
from comlrl.engine.run import Run
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig
from comlrl.trainers.dpo.rounds import PreferenceRounds


class RoundConsumer(Protocol):
    """The part a round's pairs are for."""

    def start_round(self, rounds: PreferenceRounds, round_index: int) -> dict[str, float]:
        """Round ``round_index`` of ``rounds``: its pairs made (``rounds.start``) and taken in;
        returns the round's metrics."""
        ...


class Rounds(Schedule):
    """The rounds of an iterative trainer.

    Args:
        consumer: the part a round's pairs are for.
        config: the iterative config (MADPOIterConfig, MARLHFIterConfig) the rounds are made with.
        schedule_per_round: each round's learning-rate schedules start over, spanning its
            steps (MADPOIter: a round's pairs, known when it starts, set its length); else one
            schedule spans every round (MARLHFIter: rows, the same every round).
    """

    rounds: PreferenceRounds
    """Every round's pairs, the round in progress, the comparator (from :meth:`attach`)."""

    def __init__(self, consumer: RoundConsumer, config: MADPOIterConfig, schedule_per_round: bool):
        self.consumer = consumer
        self.config = config
        self.schedule_per_round = schedule_per_round

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        self.rounds = PreferenceRounds(run, self.config, run.comparator_adapter)

    def num_epochs(self, args: TrainerConfig) -> int:
        return self.config.num_iterations * args.num_train_epochs

    def epochs_per_lr_schedule(self, args: TrainerConfig) -> int:
        return args.num_train_epochs if self.schedule_per_round else self.num_epochs(args)

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """A resumed run reads its rounds back; a new one starts round 1 (its metrics are returned)."""
        if checkpoint is not None:
            self.rounds.read(checkpoint)
            return {}
        self.rounds.reset()
        return self.consumer.start_round(self.rounds, 0)

    def restarts_lr_schedule(self, epoch: int) -> bool:
        """With a schedule per round: epoch ``epoch`` starts a new round, whose pairs set its length."""
        return self.schedule_per_round and self.rounds.round_of(epoch) != self.rounds.round

    def start_epoch(self, epoch: int) -> dict[str, float]:
        """Start the round epoch ``epoch`` belongs to, if it is a new one (its metrics are returned)."""
        round_index = self.rounds.round_of(epoch)
        if round_index == self.rounds.round:
            return {}
        return self.consumer.start_round(self.rounds, round_index)

    def end_epoch(self, epoch: int) -> None:
        if (epoch + 1) % self.config.num_train_epochs == 0:
            self.rounds.end(self.rounds.round_of(epoch))

    def save_every_steps(self, checkpoints: CheckpointPlan, steps_per_epoch: int) -> int | None:
        return checkpoints.every_steps  # checkpoint_interval counts rounds: see ends_with_save

    def ends_with_save(
        self, checkpoints: CheckpointPlan, progress: TrainerState, args: TrainerConfig, steps_per_epoch: int
    ) -> bool:
        """The step just taken ends a round the plan keeps: every ``checkpoint_interval``-th, and the last."""
        every, epochs = checkpoints.every_epochs, args.num_train_epochs
        epoch = progress.epoch
        if not every or (epoch + 1) % epochs or progress.step_in_epoch != steps_per_epoch:
            return False
        rounds_done = (epoch + 1) // epochs
        return rounds_done % every == 0 or rounds_done == self.rounds.num_rounds

    def write_checkpoint(self, folder: str) -> None:
        """``preference_rounds.pt``: the rounds, read back by :meth:`prepare`."""
        self.rounds.write(folder)
