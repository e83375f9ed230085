"""The engine every multi-agent trainer is: one constructor, wired from the trainer's parts
(:mod:`comlrl.engine.parts`: an objective, a reward source, a schedule), the agents
(:mod:`comlrl.engine.agents`), the rollout tree and rewards (:mod:`comlrl.rollout`), the
loop (:mod:`comlrl.engine.loop`), checkpoints (:mod:`comlrl.checkpoint`), evaluation and
saving. A trainer class is this one plus its config class and its parts.

The set-up (:func:`comlrl.engine.setup.build_run`) builds one frozen :class:`~comlrl.engine.run.Run`
that the parts keep what they use of; the trainer holds it, its parts, their counts
(:class:`~comlrl.engine.plan.StepPlan`) and nothing else.

One training step of the MAGRPO family (:meth:`comlrl.trainers.reinforce.objective.PolicyGradient.step`):

    rows ─formatters─▶ prompts ─generate (one call per agent and turn)─▶ completions
    ─joint actions─▶ rewards [─transition─▶ next turn's prompts ...] = rollout tree
    ─estimate (the objective: group baselines, critics)─▶ advantages
    ─update─▶ optimizer steps ─▶ weights synced into the generation backend ─▶ metrics
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from comlrl.engine.checkpoint_plan import CheckpointPlan
from comlrl.engine.config import TrainerConfig
from comlrl.engine.evaluation import evaluate
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.loop import TrainingLoop, TrainResult
from comlrl.engine.parts import Parts, raise_second_train
from comlrl.engine.plan import StepPlan
from comlrl.engine.run import Run
from comlrl.engine.setup import build_run
from comlrl.rewards import JointReward
from comlrl.utils.cpu_memory import kept_freed_memory


def of_run(name: str, doc: str) -> property:
    """A read-only trainer attribute that is the run's ``name``."""
    return property(lambda trainer: getattr(trainer.run, name), doc=doc)


class MultiAgentTrainer(abc.ABC):
    """Trains N LLM agents together on a shared reward. Its arguments, by keyword, are
    :class:`~comlrl.engine.inputs.TrainerInputs` (every one documented there) and ``args``,
    the config (a ``config_class``; default ``config_class()``). A trainer class says its config
    class and its ``parts``; the user-facing ones also take positional arguments
    (:mod:`comlrl.compat.entry`).
    """

    config_class: ClassVar[type[TrainerConfig]] = TrainerConfig
    """The config class: built when ``args`` is not given, and what ``args`` must be."""
    optional_inputs: ClassVar[frozenset[str]] = frozenset()
    """The inputs beyond :data:`~comlrl.engine.inputs.COMMON_INPUTS` this trainer takes."""
    algorithm_name = "train"
    """Shown on the progress bar; names the run folders of configs without an ``output_dir``."""
    centralized_label: ClassVar[str | None] = None
    """Centralized collaboration: how errors name the trainer (None: its class name with the config's mode)."""
    one_model_per_role: ClassVar[str] = "set collaboration_mode='decentralized'"
    """Centralized collaboration: what the error about several models tells the user to do."""
    train_started = False
    """Whether ``train()`` was called on this trainer."""

    def __init__(self, *, args: TrainerConfig | None = None, **inputs: Any):
        args = self.accept_config(args)
        self.inputs = TrainerInputs.of(type(self), inputs)
        """The trainer's arguments other than ``args``, as given."""
        parts = self.parts(args, self.inputs)
        self.objective, self.reward_source, self.schedule = parts.objective, parts.reward_source, parts.schedule
        label = self.centralized_label or f"{type(self).__name__} with collaboration_mode='centralized'"
        self.run: Run = build_run(self.algorithm_name, parts, args, label, self.one_model_per_role)
        """Everything the set-up built: agents, learners, backend, prompts, rewards."""
        self.plan = StepPlan(self.objective, self.schedule, self.run.config, self.run.learners)
        """The run's items, steps and optimizer steps."""
        if self.objective.schedule_known_at_setup:
            self.plan.add_waiting_learners()

    @abc.abstractmethod
    def parts(self, args: Any, inputs: TrainerInputs) -> Parts:
        """The trainer's objective, reward source and schedule for config ``args``."""

    @classmethod
    def accept_config(cls, args: TrainerConfig | None) -> TrainerConfig:
        """The run's config: ``args``, which must be a ``config_class``, or its defaults."""
        if args is None:
            return cls.config_class()
        if not isinstance(args, cls.config_class):
            raise TypeError(f"args must be a {cls.config_class.__name__}, got {type(args).__name__}")
        return args

    # ----------------------------------------------------------------------------------------
    # what the run holds, read through the trainer
    # ----------------------------------------------------------------------------------------
    args = of_run("config", "The trainer's config.")
    agents = of_run("agents", "The trained agents (:class:`~comlrl.engine.agents.Agents`).")
    num_agents = of_run("num_agents", "How many agents are trained.")
    learners = of_run("learners", "Every optimizer and learning-rate schedule.")
    parallel = of_run("parallel", "The data-parallel group.")
    sampling = of_run("sampling", "How completions are sampled.")
    backend = of_run("backend", "What samples the completions.")
    rollout = of_run(
        "rollout", "Plays dataset rows out into rollout trees (:class:`~comlrl.rollout.episodes.Rollout`)."
    )
    train_prompts = of_run("train_prompts", "The training rows and prompts.")
    eval_prompts = of_run("eval_prompts", "The evaluation rows and prompts (None without an eval_dataset).")
    reward = of_run("reward", "The task reward.")
    train_reward = of_run("train_reward", "What scores the training rollouts.")
    transition = of_run("transition", "Writes the next turn's prompts (None: one turn).")
    joint_indices = of_run("joint_indices", "``(J, N)`` sample of each agent in each joint action.")
    eval_hooks = of_run("eval_hooks", "The eval_logger and eval_aggregator hooks.")
    metrics_callback = of_run("metrics_callback", "The metrics_callback hook, as the objective calls it.")
    wandb_config = of_run("wandb_config", "W&B's settings (None: off).")
    collaboration = of_run("collaboration", "One model writing every role: its collaboration (else None).")
    comparator_adapter = of_run("comparator_adapter", "A comparator writing every agent's part: its adapter.")

    @property
    def global_step(self) -> int:
        """Training steps taken."""
        return self.run.state.global_step

    @property
    def output_dir(self) -> str | None:
        """The folder of the latest ``train()`` call's run: the config's ``output_dir``, or the
        new ``comlrl_output/<algorithm>-<time>`` one when the config names none (before the
        first call: the config's, None when it names none)."""
        return self.run.state.output_dir

    @property
    def num_roles(self) -> int:
        """Centralized collaboration: the roles the one model writes."""
        if self.run.collaboration is None:
            raise AttributeError(f"{type(self).__name__} has no roles: num_roles is centralized collaboration's")
        return self.run.collaboration.num_roles

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments of models loaded by name."""
        return self.run.model_config.model_kwargs

    @property
    def tokenizer_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments of tokenizers loaded by name."""
        return self.run.model_config.tokenizer_kwargs

    def joint_reward(self, func: Any, processor: Any = None, weights: Any = None, call: str = "batch") -> JointReward:
        """``func`` called on this trainer's joint actions, as its objective calls rewards."""
        return self.run.make_reward(func, processor, weights=weights, call=call)

    @property
    def discount(self) -> float:
        """Weight of the next turn in a joint action's return (logged and evaluated returns)."""
        return self.objective.discount

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last step of an epoch may take fewer items)."""
        return self.plan.steps_per_epoch

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps each learner takes over one learning-rate schedule: its length."""
        return self.plan.total_optimizer_steps

    # ----------------------------------------------------------------------------------------
    # training
    # ----------------------------------------------------------------------------------------
    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """What a run needs that the set-up could not make, from every part (MADPO: its pairs;
        MARLHF: its reward model), then the optimizers that waited for it; ``train()`` calls it
        after seeding a new run, or, resuming, with the ``checkpoint`` to read. Returns the
        metrics to log when training starts."""
        metrics: dict[str, float] = {}
        for part in (self.schedule, self.reward_source, self.objective):
            metrics.update(part.prepare(checkpoint))
        self.plan.add_waiting_learners()
        return metrics

    def train(
        self,
        resume_from_checkpoint: bool | str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int | None = None,
        checkpoint_total_limit: int | None = None,
    ) -> TrainResult:
        """Train every agent for ``num_train_epochs`` epochs (rounds: every round's); returns a
        ``TrainResult``.

        Args:
            resume_from_checkpoint: True continues from the newest complete checkpoint in
                the checkpoint folder, a path from that checkpoint; the run then goes on
                exactly as if it had not stopped (same data order, samples and weights).
            checkpoint_dir: where checkpoints go (default ``output_dir``); given alone, a
                checkpoint is written after every epoch (rounds: every round).
            checkpoint_interval: write a checkpoint every this many epochs (rounds: rounds;
                the config's ``save_steps`` counts steps: set one of the two).
            checkpoint_total_limit: another name of the config's ``save_total_limit``.

        With an ``eval_dataset``, ``evaluate()`` runs before the first step and every
        ``eval_interval`` steps (when it is > 0), and always after the last step. Every
        ``save_steps`` steps a checkpoint is written; SIGINT or SIGTERM during training
        writes one after the current step and returns early (a second signal stops at once).
        A trainer whose parts make something from the starting policy (MADPO's pairs, MARLHF's
        reward model) trains once: a second call is an error, raised before anything is
        cleared, unless it resumes a checkpoint.
        """
        parts = (self.schedule, self.reward_source, self.objective)
        made = [part.made_once for part in parts if part.made_once is not None]
        if made and self.train_started and not resume_from_checkpoint:
            raise_second_train(type(self).__name__, made[0])
        self.train_started = True
        plan = CheckpointPlan.resolve(self.args, checkpoint_dir, checkpoint_interval, checkpoint_total_limit)
        on_cpu = any(self.agents.device(i).type == "cpu" for i in range(len(self.agents)))
        with kept_freed_memory(self.args.keep_freed_cpu_memory and on_cpu):
            return TrainingLoop(
                self.run, self.objective, self.schedule, self.plan, self.prepare, resume_from_checkpoint, plan
            ).train()

    def step(self, items: list[int]) -> Any:
        """One training step on this rank's ``items`` (dataset rows; MADPO: pairs): the objective's."""
        return self.objective.step(items, self.global_step + 1)

    def training_step(self, row_ids: list[int]) -> dict[str, float]:
        """One training step on the dataset rows ``row_ids``; returns the step's metrics."""
        return self.step(row_ids).metrics

    # ----------------------------------------------------------------------------------------
    # evaluation and saving
    # ----------------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Score the first ``eval_num_samples`` rows of ``eval_dataset``
        (:func:`comlrl.engine.evaluation.evaluate` says how)."""
        return evaluate(self.run, self.objective.discount, num_eval_samples)

    def save_model(self, output_dir: str, merge_adapters: bool = False) -> list[str]:
        """Write each agent to ``output_dir/agent_{i}`` in Hugging Face format, with its
        tokenizer, and what the parts keep beside them (critics, the reward model).

        An agent trained with LoRA is written as its adapter (``adapter_model.safetensors``,
        loadable with ``peft.PeftModel.from_pretrained(base, folder)``), or, with
        ``merge_adapters=True``, as a whole model with the adapter merged in. Each folder is
        written under a temporary name and renamed, so an interrupted save never leaves a
        folder that looks complete. Returns the folders. Under data parallelism only rank 0
        writes (every rank holds the same weights); the others return an empty list. Every
        rank must call it: sharded agents' whole weights are gathered from all of them.
        """
        return self.run.models.save(output_dir, merge_adapters)
