"""The engine every multi-agent trainer is: one constructor, wired from the trainer's parts
(:mod:`comlrl.engine.parts`: an objective, a reward source, a schedule), the agents
(:mod:`comlrl.engine.agents`), the rollout tree and rewards (:mod:`comlrl.rollout`), the
loop (:mod:`comlrl.engine.loop`), checkpoints (:mod:`comlrl.checkpoint`), evaluation and
saving. A trainer class is this one plus its config class and its parts.

One training step of the MAGRPO family (:meth:`comlrl.engine.policy_gradient.PolicyGradient.step`):

    rows ─formatters─▶ prompts ─generate (one call per agent and turn)─▶ completions
    ─joint actions─▶ rewards [─transition─▶ next turn's prompts ...] = rollout tree
    ─estimate (the objective: group baselines, critics)─▶ advantages
    ─update─▶ optimizer steps ─▶ weights synced into the generation backend ─▶ metrics
"""

from __future__ import annotations

import abc
import functools
import math
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from comlrl.checkpoint import write_folders
from comlrl.checkpoint.config_record import config_record
from comlrl.compat import rewards as reward_calls
from comlrl.compat.arguments import POSITIONAL_ORDER, named_arguments
from comlrl.compat.trainer_attributes import TrainerAttributes
from comlrl.engine.config import TrainerConfig
from comlrl.engine.evaluation import evaluate
from comlrl.engine.inputs import TrainerInputs, call_signature
from comlrl.engine.loop import CheckpointPlan, TrainingLoop, TrainResult
from comlrl.engine.parts import Parts, Writer, raise_second_train
from comlrl.engine.setup import set_up
from comlrl.metrics.sinks import run_sinks
from comlrl.rewards import JointReward
from comlrl.rollout import AgentRollout
from comlrl.rollout.backends import generate_agents
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.tree import RolloutTree, build_tree
from comlrl.utils.cpu_memory import kept_freed_memory


class MultiAgentTrainer(TrainerAttributes, abc.ABC):
    """Trains N LLM agents together on a shared reward. Its arguments are
    :class:`~comlrl.engine.inputs.TrainerInputs` (every one documented there) and ``args``,
    the config (a ``config_class``; default ``config_class()``); positionally, in the order of
    ``positional_order``. A trainer class says its config class and its ``parts``.
    """

    config_class: ClassVar[type[TrainerConfig]] = TrainerConfig
    """The config class: built when ``args`` is not given, and what ``args`` must be."""
    positional_order: ClassVar[tuple[str, ...]] = POSITIONAL_ORDER
    """The order positional arguments are read in (:mod:`comlrl.compat.arguments`)."""
    optional_inputs: ClassVar[frozenset[str]] = frozenset()
    """The inputs beyond :data:`~comlrl.engine.inputs.COMMON_INPUTS` this trainer takes."""
    algorithm_name = "train"
    """Shown on the progress bar; names the run folders of configs without an ``output_dir``."""
    centralized_label: ClassVar[str | None] = None
    """Centralized collaboration: how errors name the trainer (None: its class name with the config's mode)."""
    one_model_per_role: ClassVar[str] = "set collaboration_mode='decentralized'"
    """Centralized collaboration: what the error about several models tells the user to do."""
    output_dir: str | None
    """The folder of the latest ``train()`` call's run: the config's ``output_dir``, or the
    new ``comlrl_output/<algorithm>-<time>`` one when the config names none (before the
    first call: the config's, None when it names none)."""
    collaboration: Any = None
    """Centralized collaboration (one model writing every role): the ``CentralizedCollaboration``
    that joins the roles' prompts and splits the model's answers; None with one model per agent."""
    train_started = False
    """Whether ``train()`` was called on this trainer."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = call_signature(cls.positional_order, cls)

    def __init__(self, *positional: Any, **named: Any):
        named = named_arguments(type(self).__name__, self.positional_order, positional, named)
        args = self.accept_config(named.pop("args", None))
        self.inputs = TrainerInputs.of(type(self), named)
        set_up(self, args, self.inputs)

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
    # set-up (the rest: comlrl.engine.setup)
    # ----------------------------------------------------------------------------------------
    def joint_reward(self, func: Any, processor: Any = None, weights: Any = None, call: str = "batch") -> JointReward:
        """``func`` called on this trainer's joint actions, as its objective calls rewards. The
        engine calls a function one way (``call="batch"``); the other values of ``call`` are comlrl
        1.4.3's, translated into it by :mod:`comlrl.compat.rewards`, installed first."""
        reward_calls.install()  # also done when comlrl is imported, for a JointReward built alone
        return JointReward(
            func,
            self.num_agents,
            processor,
            weights=weights,
            call=call,
            actor_critic_calls=self.objective.actor_critic_reward_calls,
        )

    @property
    def all_parts(self) -> tuple[Any, ...]:
        return (self.schedule, self.reward_source, self.objective)

    def add_learners(
        self,
        names: Sequence[str],
        parameters: Sequence[Sequence[torch.nn.Parameter]],
        learning_rates: Sequence[float],
        modules: Sequence[torch.nn.Module | None] | None = None,
    ) -> None:
        """One AdamW and one learning-rate schedule (the config's) for each named parameter set
        (of ``modules``' parameters, when given: a sharded one's checkpoint names them);
        every update pass steps them all, after clipping each set's gradient on its own. Every
        rank takes rank 0's weights now; when the run's length waits for ``prepare`` (MADPO's
        pairs), so do the optimizers."""
        self.parallel.broadcast_parameters(p for group in parameters for p in group)
        self.pending_learners.append((names, parameters, learning_rates, modules))
        if self.objective.schedule_known_at_setup:
            self.build_pending_learners()

    def build_pending_learners(self) -> None:
        args = self.args
        for names, parameters, rates, modules in self.pending_learners:
            steps = self.total_optimizer_steps
            self.learners.add(
                names, parameters, rates, args.weight_decay, args.lr_scheduler_type, args.warmup_ratio, steps, modules
            )
        self.pending_learners = []

    # ----------------------------------------------------------------------------------------
    # what the loop goes through
    # ----------------------------------------------------------------------------------------
    @property
    def discount(self) -> float:
        """Weight of the next turn in a joint action's return (logged and evaluated returns)."""
        return self.objective.discount

    @property
    def progress_metric(self) -> tuple[str, str]:
        return self.objective.progress_metric

    @property
    def num_train_items(self) -> int:
        """What an epoch goes through (dataset rows; MADPO: preference pairs)."""
        return self.objective.num_items(self)

    @property
    def items_per_step(self) -> int:
        """Items one training step takes, over every data-parallel rank."""
        return self.objective.items_per_step(self)

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last step of an epoch may take fewer items)."""
        return math.ceil(self.num_train_items / self.items_per_step)

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps each learner takes over one learning-rate schedule: its length."""
        per_epoch = self.steps_per_epoch * self.objective.optimizer_steps_per_step(self)
        return self.schedule.epochs_per_lr_schedule(self.args) * per_epoch

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """What a run needs that the set-up could not make, from every part (MADPO: its pairs;
        MARLHF: its reward model), then the optimizers that waited for it; ``train()`` calls it
        after seeding a new run, or, resuming, with the ``checkpoint`` to read. Returns the
        metrics to log when training starts."""
        metrics: dict[str, float] = {}
        for part in self.all_parts:
            metrics.update(part.prepare(self, checkpoint))
        self.build_pending_learners()
        return metrics

    # ----------------------------------------------------------------------------------------
    # training
    # ----------------------------------------------------------------------------------------
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
        made = [part.made_once for part in self.all_parts if part.made_once is not None]
        if made and self.train_started and not resume_from_checkpoint:
            raise_second_train(type(self).__name__, made[0])
        self.train_started = True
        plan = CheckpointPlan.resolve(self.args, checkpoint_dir, checkpoint_interval, checkpoint_total_limit)
        on_cpu = any(self.agents.device(i).type == "cpu" for i in range(len(self.agents)))
        with kept_freed_memory(self.args.keep_freed_cpu_memory and on_cpu):
            return TrainingLoop(self, resume_from_checkpoint, plan).run()

    def step(self, items: list[int]) -> Any:
        """One training step on this rank's ``items`` (dataset rows; MADPO: pairs): the objective's."""
        return self.objective.step(self, items)

    def step_samples(self, result: Any, count: int) -> list[dict[str, Any]]:
        """What a logging step shows of the step just taken."""
        return self.objective.step_samples(self, result, count)

    def training_step(self, row_ids: list[int]) -> dict[str, float]:
        """One training step on the dataset rows ``row_ids``; returns the step's metrics."""
        return self.step(row_ids).metrics

    def rollout(
        self,
        prompts: PromptTable,
        row_ids: list[int],
        num_generations: int | None = None,
        joint_indices: torch.Tensor | None = None,
        sampling: SamplingSpec | None = None,
        reward: JointReward | None = None,
    ) -> RolloutTree:
        """Generate, score and expand the rollout tree of ``row_ids``, one ``generate`` call
        per agent per turn (training settings unless given), scored by ``reward`` (default:
        the task reward, ``reward_func``)."""
        group = self.args.num_generations if num_generations is None else num_generations
        kwargs = (self.sampling if sampling is None else sampling).generate_kwargs()
        # One generator per agent, seeded from torch's (whose state checkpoints keep), so that
        # agents sampling in parallel threads draw the same tokens in every run.
        seeds = torch.randint(0, 2**63 - 1, (self.num_agents,), dtype=torch.int64).tolist()
        generators = [torch.Generator(self.agents.device(i)).manual_seed(seed) for i, seed in enumerate(seeds)]

        def generate(turn_prompts: list[list[str]]) -> list[AgentRollout]:
            return generate_agents(self.backend, self.agents, turn_prompts, group, kwargs, generators)

        return build_tree(
            prompts,
            row_ids,
            generate,
            self.reward if reward is None else reward,
            self.joint_indices if joint_indices is None else joint_indices,
            group,
            num_turns=self.args.num_turns,
            transition=self.transition,
            prompt_passthrough=self.args.external_prompt_passthrough,
            early_termination_threshold=self.args.early_termination_threshold,
            written_prompts=not self.objective.actor_critic_reward_calls,
        )

    # ----------------------------------------------------------------------------------------
    # evaluation
    # ----------------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Score the first ``eval_num_samples`` rows of ``eval_dataset``
        (:func:`comlrl.engine.evaluation.evaluate` says how)."""
        return evaluate(self, num_eval_samples)

    # ----------------------------------------------------------------------------------------
    # saving
    # ----------------------------------------------------------------------------------------
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
        self.learners.require_finite(f": {output_dir} was not written")
        with self.agents.whole_weights(merge_adapters):
            if not self.parallel.is_main:
                return []
            return write_folders(output_dir, self.model_writers(merge_adapters))

    def model_writers(self, merge_adapters: bool = False) -> list[Writer]:
        """Folder name and writer of every trained model, for ``save_model`` and checkpoints."""
        agents = [
            (f"agent_{i}", functools.partial(self.write_agent, i, merge_adapters=merge_adapters))
            for i in range(self.num_agents)
        ]
        return agents + [writer for part in (self.objective, self.reward_source) for writer in part.writers(self)]

    def write_agent(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer into ``folder``, with what its
        objective keeps there (a value head on the agent)."""
        self.agents.write(agent, folder, merge_adapters)
        self.objective.write_with_agent(self, agent, folder)

    def write_models(self, folder: str) -> None:
        """Every trained model of a checkpoint into ``folder`` (``agent_{i}/``, ...), and what
        the parts keep in a checkpoint only (MADPO's pairs, the rounds)."""
        for name, write in self.model_writers():
            write(os.path.join(folder, name))
        for part in self.all_parts:
            part.write_checkpoint(self, folder)

    def load_models(self, path: str) -> None:
        """The weights ``write_models`` wrote into checkpoint ``path``, loaded in place, and
        handed to the generation backend (an engine of its own would sample the old ones)."""
        self.agents.load(path)
        for part in (self.objective, self.reward_source):
            part.load(self, path)
        for i in range(self.num_agents):
            self.backend.sync_weights(i)

    def sinks(self) -> list:
        """Where metrics go: ``metrics.jsonl`` always, W&B and TensorBoard when asked."""
        return run_sinks(
            self.output_dir, self.wandb_config, lambda: config_record(self.args), self.args.log_tensorboard
        )
