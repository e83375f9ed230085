"""How many items, steps and optimizer steps a run takes: the objective's items (dataset rows;
MADPO: preference pairs) laid out by the schedule's epochs. MADPO's items are known only once
``train()`` has made its pairs, so these are read when needed, never stored."""

from __future__ import annotations

import math
from dataclasses import dataclass

from comlrl.engine.config import TrainerConfig
from comlrl.engine.optim import Learners
from comlrl.engine.parts import Objective, Schedule


@dataclass(frozen=True)
class StepPlan:
    """The run's counts, from its ``objective``, ``schedule`` and ``config``, and the
    learning-rate schedules they size."""

    objective: Objective
    schedule: Schedule
    config: TrainerConfig
    learners: Learners
    """What :meth:`add_waiting_learners` and :meth:`restart_lr_schedules` build."""

    @property
    def num_items(self) -> int:
        """What an epoch goes through (dataset rows; MADPO: preference pairs)."""
        return self.objective.num_items()

    @property
    def items_per_step(self) -> int:
        """Items one training step takes, over every data-parallel rank."""
        return self.objective.items_per_step()

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last step of an epoch may take fewer items)."""
        return math.ceil(self.num_items / self.items_per_step)

    @property
    def num_epochs(self) -> int:
        """Epochs the run goes through (the schedule's: in rounds, every round's epochs)."""
        return self.schedule.num_epochs(self.config)

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps each learner takes over one learning-rate schedule: its length."""
        per_epoch = self.steps_per_epoch * self.objective.optimizer_steps_per_step()
        return self.schedule.epochs_per_lr_schedule(self.config) * per_epoch

    def add_waiting_learners(self) -> None:
        """Build the learners that waited for the run's length (:meth:`~comlrl.engine.optim.Learners.wait`)."""
        config = self.config
        self.learners.add_waiting(
            config.weight_decay, config.lr_scheduler_type, config.warmup_ratio, self.total_optimizer_steps
        )

    def restart_lr_schedules(self) -> None:
        """Every learning-rate schedule started over, spanning the steps of one schedule now (a new round's)."""
        config = self.config
        self.learners.restart_schedules(config.lr_scheduler_type, config.warmup_ratio, self.total_optimizer_steps)
