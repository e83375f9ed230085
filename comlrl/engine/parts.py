"""The three parts an algorithm is made of, which :class:`~comlrl.engine.base.MultiAgentTrainer`
wires; a trainer class only says which (its ``parts``):

- an **objective**: what one training step learns from and how (group advantages and the
  policy-gradient loss; values, GAE and the critics' loss; preference pairs and the DPO loss);
- a **reward source**: what scores the training rollouts (the task's reward function, or a
  reward model fitted when training starts);
- a **schedule**: one run of ``num_train_epochs`` epochs, or rounds of them.

Each part's hooks are called by the engine at fixed points: ``attach(run, inputs)`` at the end
of the set-up, with the frozen :class:`~comlrl.engine.run.Run` (a part keeps what it uses of
it, and never sees the trainer), ``prepare`` when ``train()`` starts (after seeding, or with
the checkpoint it resumes), ``writers`` / ``load`` with the run's models (checkpoints,
``save_model``), ``write_checkpoint`` with a checkpoint's other files.
The defaults here do nothing, so a part says only what it adds.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

from comlrl.checkpoint.files import TrainerState
from comlrl.engine.checkpoint_plan import CheckpointPlan
from comlrl.engine.config import TrainerConfig
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.run import RewardMaker, Run
from comlrl.engine.saving import Writer
from comlrl.metrics.hooks import MetricsCallback
from comlrl.rewards import JointReward


class MadeOnce(NamedTuple):
    """What a part makes from the policy when ``train()`` first starts, which a second
    ``train()`` would train on again (so a second call is refused), and what to use instead."""

    what: str
    alternative: str


class Part:
    """The hooks every part has; each does nothing unless a part says otherwise."""

    made_once: MadeOnce | None = None
    """What this part makes once per trainer from the policy it starts from (None: nothing)."""

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        """At the end of the trainer's set-up: what the part keeps of the ``run`` and builds from
        it and the ``inputs``."""

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """When ``train()`` starts: what the run needs before its first step, read from
        ``checkpoint`` when resuming; returns metrics to log at the start."""
        return {}

    def writers(self) -> list[Writer]:
        """The folders this part adds beside the agents' in a checkpoint or ``save_model``."""
        return []

    def write_checkpoint(self, folder: str) -> None:
        """What this part keeps in a checkpoint ``folder`` only, read back by its ``prepare``."""

    def load(self, path: str) -> None:
        """Read back what :meth:`writers` wrote into checkpoint ``path``."""


class Objective(Part, abc.ABC):
    """What one training step learns from, and how. Subclasses give ``step``, ``discount``
    and, when they learn from something else than dataset rows, the items of an epoch."""

    progress_metric = ("reward", "reward/mean")
    """The step metric the progress bar shows: its label and its key."""
    actor_critic_reward_calls = False
    """Whether a reward function called per joint action gets every agent's prompt and may
    return N values (one per agent), as the actor-critic trainers call it
    (:class:`~comlrl.rewards.JointReward`'s ``actor_critic_calls``)."""
    schedule_known_at_setup = True
    """Whether the optimizer steps of the run are known when the trainer is built (False: its
    learning-rate schedules wait for ``prepare``, which makes the items)."""
    run: Run
    """The run it trains (from :meth:`attach`)."""

    def __init__(self, config: Any):
        self.config = config
        """The algorithm's config: the trainer's, or the one its stage runs with (MARLHF's RL phase)."""

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        self.run = run

    @property
    def needs_reference(self) -> bool:
        """Whether each agent keeps a frozen reference copy."""
        return False

    @property
    def reference_devices(self) -> Any:
        """Where the references live (``reference_devices``; None: beside their agents)."""
        return None

    @property
    def discount(self) -> float:
        """Weight of the next turn in a joint action's return (logged and evaluated returns)."""
        return 1.0

    def metrics_callback(self, callback: MetricsCallback) -> MetricsCallback:
        """The ``metrics_callback`` hook as this objective calls it (default: as given)."""
        return callback

    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps each learner takes in one training step."""
        return 1

    def num_items(self) -> int:
        """What an epoch goes through, in a new order each epoch: the dataset rows."""
        return len(self.run.train_prompts)

    def items_per_step(self) -> int:
        """Items one training step takes, over every rank: ``per_device_train_batch_size`` rows each."""
        return self.config.per_device_train_batch_size * self.run.parallel.world_size

    @abc.abstractmethod
    def step(self, items: list[int], step_number: int) -> Any:
        """Training step ``step_number`` (counted from 1) on this rank's ``items``; returns a
        result with ``metrics``."""

    def step_samples(self, result: Any, count: int) -> list[dict[str, Any]]:
        """What a logging step shows of the step ``result``: ``count`` samples."""
        return []

    def write_with_agent(self, agent: int, folder: str) -> None:
        """What this objective keeps in agent ``agent``'s own folder (a value head on it)."""


class RewardSource(Part, abc.ABC):
    """What scores the training rollouts."""

    @abc.abstractmethod
    def training_reward(self, inputs: TrainerInputs, task_reward: JointReward, make_reward: RewardMaker) -> JointReward:
        """The :class:`~comlrl.rewards.JointReward` of the training rollouts, given the task's
        reward and what builds the joint reward of another function."""


class TaskReward(RewardSource):
    """The task's reward (``reward_func``), or the trainer's ``train_reward_func`` when given."""

    def training_reward(self, inputs: TrainerInputs, task_reward: JointReward, make_reward: RewardMaker) -> JointReward:
        if inputs.train_reward_func is None:
            return task_reward
        return make_reward(inputs.train_reward_func, call="batch")


class Schedule(Part):
    """How the epochs of a run are laid out: here one run of ``num_train_epochs`` epochs."""

    def num_epochs(self, args: TrainerConfig) -> int:
        """Epochs the run goes through."""
        return args.num_train_epochs

    def epochs_per_lr_schedule(self, args: TrainerConfig) -> int:
        """Epochs one learning-rate schedule spans."""
        return args.num_train_epochs

    def restarts_lr_schedule(self, epoch: int) -> bool:
        """Whether the learning-rate schedules start over with epoch ``epoch`` (asked before
        :meth:`start_epoch`)."""
        return False

    def start_epoch(self, epoch: int) -> dict[str, float]:
        """Before epoch ``epoch``'s items are ordered; returns metrics to log with its first step."""
        return {}

    def end_epoch(self, epoch: int) -> None:
        """After epoch ``epoch``'s last step."""

    def save_every_steps(self, checkpoints: CheckpointPlan, steps_per_epoch: int) -> int | None:
        """Steps between checkpoints (None: only after a signal)."""
        return checkpoints.cadence(steps_per_epoch)

    def ends_with_save(
        self, checkpoints: CheckpointPlan, progress: TrainerState, args: TrainerConfig, steps_per_epoch: int
    ) -> bool:
        """Whether the step just taken is one the plan keeps at the end (of the run)."""
        return checkpoints.at_end and progress.global_step == self.num_epochs(args) * steps_per_epoch


class Parts(NamedTuple):
    """A trainer's parts, and its inputs as the parts read them."""

    objective: Objective
    reward_source: RewardSource
    schedule: Schedule
    inputs: Any


def raise_second_train(trainer_name: str, made: MadeOnce) -> None:
    """The error of a second ``train()`` on ``trainer_name``, which made its ``made.what`` (its
    pairs, its reward model) from the policy as it was before the first call. comlrl 1.4.3
    made them again from the trained policy on every call; training again on the old ones
    would silently mean something else, so the caller is told what to write instead."""
    what = made.what
    raise RuntimeError(
        f"{trainer_name}.train() was already called on this trainer: its {what} came from the policy as it was "
        f"before that first call, and a second train() would train on them again (older comlrl versions made new ones "
        f"from the trained policy). For new {what} from the trained policy use {made.alternative}, or build a new "
        f"{trainer_name} (agents=<the trained agents>, e.g. trainer.agents[i] or save_model() folders); to continue a "
        "run from a checkpoint, pass train(resume_from_checkpoint=...)"
    )
