"""What every multi-agent trainer shares, wired from its parts: the agents
(:mod:`comlrl.trainers.agents`), the rollout tree and rewards (:mod:`comlrl.rollout`), one
update (:mod:`comlrl.trainers.update`), the loop (:mod:`comlrl.trainers.loop`), checkpoints
(:mod:`comlrl.checkpoint`), evaluation and saving.

One training step (:meth:`MultiAgentTrainer.step`):

    rows ─formatters─▶ prompts ─generate (one call per agent and turn)─▶ completions
    ─joint actions─▶ rewards [─transition─▶ next turn's prompts ...] = rollout tree
    ─estimate (the algorithm: group baselines, critics)─▶ advantages
    ─update─▶ optimizer steps ─▶ weights synced into the generation backend ─▶ metrics

A trainer class is this one plus its ``estimate``, the ``discount`` of its returns and the
``passes`` of its update (MAGRPO: ``comlrl.trainers.reinforce``; IAC and MAAC:
``comlrl.trainers.actor_critic``, which also give the update an auxiliary critic loss).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from comlrl.algorithms import joint_action_indices
from comlrl.algorithms.shaping import kl_shaped_rewards, sequence_kl
from comlrl.checkpoint import write_folders
from comlrl.checkpoint.config_record import config_record
from comlrl.distributed import DataParallel
from comlrl.metrics import JsonlSink, TensorBoardSink, WandbSink
from comlrl.metrics import stats as metric_stats
from comlrl.metrics.evaluation import EvalHooks, evaluation_metrics
from comlrl.metrics.hooks import MetricsCallback, RolloutSample, rollout_samples
from comlrl.metrics.rollout import completion_samples, rollout_metrics
from comlrl.models.hardware import cpu_has_bf16_units
from comlrl.models.loading import split_model_config
from comlrl.models.placement import map_agents
from comlrl.optim import Learners, per_agent_learning_rates
from comlrl.rewards import JointReward
from comlrl.rollout import AgentRollout
from comlrl.rollout.backends import build_backend
from comlrl.rollout.prompt_fit import check_prompts_fit
from comlrl.rollout.prompts import Formatter, PromptTable
from comlrl.rollout.sampling import SamplingSpec, check_generation_names
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import RolloutTree, build_tree, check_tree_budget
from comlrl.trainers.agents import Agents
from comlrl.trainers.config import TrainerConfig
from comlrl.trainers.loop import CheckpointPlan, TrainingLoop, TrainResult
from comlrl.trainers.update import Estimate, FrozenLogprobs, PolicyUpdate, minibatch_count
from comlrl.utils.caller import user_stacklevel
from comlrl.utils.run_control import seeded_cuda_devices

RewardFunction = Callable[..., Sequence[Any]]


class StepResult(NamedTuple):
    """One training step: its metrics (over every rank's rows), its tree and returns (this rank's)."""

    metrics: dict[str, float]
    tree: RolloutTree
    returns: list[torch.Tensor]


class MultiAgentTrainer(abc.ABC):
    """Trains N LLM agents together on a shared reward; subclasses say how advantages are
    estimated (``estimate``), the discount of returns (``discount``) and how many optimizer
    steps an update takes (``passes``).

    Arguments come in comlrl 1.4.3's order (positional calls written for it keep their meaning).

    Args:
        agents: the agents, one causal LM each (any N >= 1; they may be different
            architectures with different tokenizers): a model instance, or a folder or hub
            id to load.
        agent_model: instead of ``agents``, a model folder or hub id to load ``num_agents``
            copies of (with ``model_config`` as ``from_pretrained`` keyword arguments); given
            with ``agents``, each of those must be this model.
        num_agents: how many copies of ``agent_model`` to load (default: the config's
            ``num_agents``, else 2); with ``agents``, it must match their count.
        tokenizer: one tokenizer for all agents, a list with one per agent, or None to load
            each agent's tokenizer from where the agent was loaded.
        train_dataset: rows (a ``datasets.Dataset`` or a list of dicts).
        eval_dataset: rows scored by ``evaluate()``.
        reward_func: scores joint actions: called with one list of completions per agent
            (N positional arguments), or with the prompts first when it takes N+1; returns,
            per joint action, one number shared by all agents or a sequence of N numbers (one
            per agent). The prompts are, as in comlrl 1.4.3, agent 0's prompt of the joint
            action's turn as it saw it (its formatted prompt; at later turns the prompt the
            transition produced). As in 1.4.3, a function that names ``batch_items`` gets the
            dataset row (dict) of each joint action, one that names ``prompts`` gets them by
            keyword when they are not positional, and one with ``**kwargs`` gets both. A
            function that names ``turn``, ``prompt_history_per_agent`` or
            ``response_history_per_agent`` among its keyword parameters also gets those (see
            ``comlrl.rewards.joint_reward.REWARD_CONTEXT``). The config's ``reward_call`` says
            whether a function scores the K joint actions of a turn in one call or, as in
            1.4.3, one joint action per call (one-element lists); the default, ``auto``, tells
            them apart by what they return. A list of such functions is summed with the
            config's ``reward_weights``.
        reward_processor: ``float -> float`` applied to each reward (see ``RewardProcessors``).
        formatters: maps a row to an agent's prompt; one callable for all agents or a list
            with one per agent. Default: the row's ``prompt`` column.
        external_transition: for ``num_turns > 1``: called after each turn on each branch
            with the keyword arguments it names among ``prompt`` (the row's prompt),
            ``agent_completions`` (the joint action just taken, one text per agent),
            ``num_agents``, ``prompt_history_per_agent``, ``response_history_per_agent``
            (every turn so far, the one just played included), ``row`` and ``turn``; returns
            the next turn's prompt of every agent, or None to end the branch.
        args: the trainer's config (``config_class``); defaults to ``config_class()``.
        model_config: ``from_pretrained`` keyword arguments used with ``agent_model`` (e.g.
            ``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``), and the original
            library's sections ``model_kwargs``, ``tokenizer_kwargs`` and ``special_tokens``
            (added to every agent's tokenizer; a model loaded by name that its tokenizer
            outgrows is resized to it, one passed in is an error).
        wandb_config: turns on W&B logging: ``wandb.init`` arguments (``project``,
            ``entity``, ``name``, ...). Needs ``pip install 'comlrl[wandb]'``.
        eval_logger: evaluation hook, called with the keyword arguments it names among
            ``agent_completions_turns`` (``[agent][row][turn]`` texts), ``prompts``, ``rows``,
            ``test_cases`` and ``entry_points`` (the rows' ``test`` / ``entry_point``
            columns, as in the original library); returns a dict of metrics, or anything
            ``eval_aggregator`` turns into one.
        eval_aggregator: ``eval_aggregator(eval_logger_output, num_turns=...) -> dict``.
        metrics_callback: ``metrics_callback(samples) -> dict``, comlrl 1.4.3's hook for
            metrics of your own, from agent samples (:class:`~comlrl.metrics.hooks.RolloutSample`:
            ``agent_idx``, ``prompt``, ``completion``, ``reward``, ``returns``, ``advantage``,
            ``metadata``): called with every training rollout's samples (its numbers logged
            beside ours), and in ``evaluate()`` with each row's (averaged over the rows, logged
            as ``eval/<key>``; an evaluation sample's ``advantage`` is NaN).
        peft_config: train LoRA adapters instead of whole models: a ``peft`` config (e.g.
            ``LoraConfig``) for every agent, or a list with one per agent (needs
            ``pip install 'comlrl[lora]'``). With ``agent_model``, or with the same model
            object passed for every agent, the agents share ONE frozen base model, each with
            its own adapter.
        train_reward_func: scores the training rollouts in place of ``reward_func``: called
            with all the joint actions of a turn at once, its values used as returned (no
            ``reward_processor``, no ``reward_weights``), while ``reward_func`` still scores
            ``evaluate()`` (MARLHF trains on a learned reward model and evaluates on the task
            reward). None: ``reward_func`` scores both.
    """

    config_class: type[TrainerConfig] = TrainerConfig
    """The config class: built when ``args`` is not given, and what ``args`` must be."""
    algorithm_name = "train"
    """Shown on the progress bar; names the run folders of configs without an ``output_dir``."""
    output_dir: str | None
    """The folder of the latest ``train()`` call's run: the config's ``output_dir``, or the
    new ``comlrl_output/<algorithm>-<time>`` one when the config names none (before the
    first call: the config's, None when it names none)."""
    progress_metric = ("reward", "reward/mean")
    """The step metric the progress bar shows: its label and its key."""
    collaboration: Any = None
    """Centralized trainers (one model writing every role): the ``CentralizedCollaboration``
    that joins the roles' prompts and splits the model's answers; None with one model per agent."""
    actor_critic_reward_calls = False
    """Whether a reward function called per joint action (``reward_call``) is called as comlrl
    1.4.3's actor-critic trainers called it (``prompts``: every agent's prompt; a flat list of
    N values: one reward per agent) rather than as its MAGRPO (agent 0's prompt; one value);
    and whether later turns' prompts reach the reward and the transition's history formatted,
    as there, rather than as the transition wrote them, as in its MAGRPO."""

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[torch.nn.Module | str] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: RewardFunction | Sequence[RewardFunction] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Formatter | Sequence[Formatter] | None = None,
        external_transition: Callable[..., Sequence[str] | None] | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., dict[str, float]] | None = None,
        args: TrainerConfig | None = None,
        *,
        peft_config: Any = None,
        metrics_callback: Callable[[list[RolloutSample]], dict[str, float]] | None = None,
        train_reward_func: RewardFunction | None = None,
    ):
        self.args = args = self.accept_config(args)
        self.output_dir = args.output_dir
        if reward_func is None:
            raise ValueError("reward_func is required")
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={args.num_turns} needs external_transition=, a function that writes each "
                "agent's next-turn prompt from the joint action just taken"
            )
        if args.num_turns == 1 and external_transition is not None:
            raise ValueError(
                "external_transition is given but num_turns=1, so it would never be called (comlrl 1.4.3's "
                "default was num_turns=2; ours is 1): set num_turns=2 (or more) in the config, "
                "or drop external_transition"
            )
        self.sampling = SamplingSpec.from_config(args)
        """How completions are sampled, fixed for the run: generation, the log-probs'
        temperature and the loss's constants all read it."""
        self.parallel = DataParallel.from_environment()
        several_steps = args.train_batch_size not in (None, args.per_device_train_batch_size)
        if self.parallel.enabled and args.train_batch_size_counts_rows and several_steps:
            raise ValueError(
                f"train_batch_size={args.train_batch_size} (several optimizer steps per rollout) is not supported "
                "under torchrun yet: leave it None, or lower per_device_train_batch_size instead"
            )
        model_config = split_model_config(model_config)
        self.model_kwargs, self.tokenizer_kwargs = model_config.model_kwargs, model_config.tokenizer_kwargs
        self.agents = Agents.build(
            agents,
            agent_model,
            num_agents,
            tokenizer,
            model_config,
            peft_config,
            args,
            self.parallel.local_rank if self.parallel.enabled else None,
        )
        self.num_agents = len(self.agents)
        check_generation_names(args.generation_kwargs, self.agents)
        self.reward = JointReward(
            reward_func,
            self.num_agents,
            reward_processor,
            weights=args.reward_weights,
            call=args.reward_call,
            actor_critic_calls=self.actor_critic_reward_calls,
        )
        self.train_reward = (
            self.reward
            if train_reward_func is None
            else JointReward(
                train_reward_func, self.num_agents, call="batch", actor_critic_calls=self.actor_critic_reward_calls
            )
        )
        """What scores the training rollouts; ``self.reward`` (the task reward) scores evaluations."""
        self.transition = None if external_transition is None else Transition(external_transition, self.num_agents)
        self.train_prompts = PromptTable(train_dataset, formatters, self.num_agents, "train_dataset")
        self.parallel.check_rows(len(self.train_prompts), args.per_device_train_batch_size)
        self.eval_prompts = (
            None if eval_dataset is None else PromptTable(eval_dataset, formatters, self.num_agents, "eval_dataset")
        )
        for table in (self.train_prompts, self.eval_prompts):
            if table is not None:
                check_prompts_fit(self.agents, self.agents.tokenizers, table.prompts, args.max_new_tokens, table.name)
        self.eval_hooks = EvalHooks(eval_logger, eval_aggregator)
        self.metrics_callback = MetricsCallback(metrics_callback)
        self.wandb_config = wandb_config
        self.joint_indices = joint_action_indices(self.num_agents, args.num_generations, args.joint_mode)
        check_tree_budget(
            args.per_device_train_batch_size,
            self.num_agents,
            args.num_generations,
            self.joint_indices.shape[0],
            args.num_turns,
            args.joint_mode,
            args.max_generations_per_step,
        )
        self.learners = Learners()
        """Every optimizer and schedule: one per agent ("agent 0", ...), then the critics'."""
        self.add_learners(
            [f"agent {i}" for i in range(self.num_agents)],
            self.agents.parameters,
            per_agent_learning_rates(args.agent_learning_rate, self.num_agents),
        )
        if args.precision == "bf16" and self.agents.device(0).type == "cpu" and cpu_has_bf16_units() is False:
            warnings.warn(
                "precision='bf16' on a CPU without bf16 matrix units (no amx_bf16 or avx512_bf16 in /proc/cpuinfo): "
                "torch emulates bf16 products here, far slower than fp32; precision='fp32' is the fast choice on "
                "this machine",
                stacklevel=user_stacklevel(),
            )
        self.backend = build_backend(
            args.generation_backend,
            self.agents,
            args.vllm_gpu_memory_utilization,
            torch.bfloat16 if args.precision == "bf16" else None,
        )
        self.update = PolicyUpdate(self.agents, self.learners, args, self.sampling, self.parallel, self.passes)
        self.global_step = 0

    @classmethod
    def accept_config(cls, args: TrainerConfig | None) -> TrainerConfig:
        """The run's config: ``args``, which must be a ``config_class``, or its defaults."""
        if args is None:
            return cls.config_class()
        if not isinstance(args, cls.config_class):
            raise TypeError(f"args must be a {cls.config_class.__name__}, got {type(args).__name__}")
        return args

    # ----------------------------------------------------------------------------------------
    # what an algorithm says
    # ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def estimate(self, tree: RolloutTree) -> Estimate:
        """The returns, per-agent credits and advantages of a step's rollout tree."""

    @property
    @abc.abstractmethod
    def discount(self) -> float:
        """Weight of the next turn in a joint action's return (logged and evaluated returns)."""

    @property
    @abc.abstractmethod
    def passes(self) -> int:
        """Passes each update makes over a step's rollout (one optimizer step per minibatch each)."""

    # ----------------------------------------------------------------------------------------
    # set-up
    # ----------------------------------------------------------------------------------------
    @property
    def num_train_items(self) -> int:
        """What an epoch goes through, in a new order each epoch: the dataset rows here (MADPO:
        its preference pairs)."""
        return len(self.train_prompts)

    @property
    def items_per_step(self) -> int:
        """Items one training step takes, over every data-parallel rank: here
        ``per_device_train_batch_size`` rows on each rank."""
        return self.args.per_device_train_batch_size * self.parallel.world_size

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last step of an epoch may take fewer items)."""
        return math.ceil(self.num_train_items / self.items_per_step)

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps each learner takes over the run: the learning-rate schedules' length."""
        args = self.args
        steps_per_rollout = self.passes * minibatch_count(args.per_device_train_batch_size, args.train_batch_size)
        return args.num_train_epochs * self.steps_per_epoch * steps_per_rollout

    def add_learners(
        self, names: Sequence[str], parameters: Sequence[Sequence[torch.nn.Parameter]], learning_rates: Sequence[float]
    ) -> None:
        """One AdamW and one learning-rate schedule (the config's) for each named parameter set;
        every update pass steps them all, after clipping each set's gradient on its own."""
        args = self.args
        self.parallel.broadcast_parameters(p for group in parameters for p in group)
        self.learners.add(
            names,
            parameters,
            learning_rates,
            args.weight_decay,
            args.lr_scheduler_type,
            args.warmup_ratio,
            self.total_optimizer_steps,
        )

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """Make what a run needs that the constructor could not, before the first step (MADPO:
        its preference pairs); ``train()`` calls it after seeding a new run, or, resuming, with
        the ``checkpoint`` to read before anything is loaded from it. Returns metrics to log
        when training starts. Nothing here: the dataset rows are ready at construction."""
        return {}

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
        """Train every agent for ``num_train_epochs`` epochs; returns a ``TrainResult``.

        Args:
            resume_from_checkpoint: True continues from the newest complete checkpoint in
                the checkpoint folder, a path from that checkpoint; the run then goes on
                exactly as if it had not stopped (same data order, samples and weights).
            checkpoint_dir: where checkpoints go (default ``output_dir``), as in comlrl 1.4.3;
                given alone, a checkpoint is written after every epoch.
            checkpoint_interval: write a checkpoint every this many epochs (comlrl 1.4.3's
                cadence; the config's ``save_steps`` counts steps: set one of the two).
            checkpoint_total_limit: comlrl 1.4.3's name of the config's ``save_total_limit``.

        With an ``eval_dataset``, ``evaluate()`` runs before the first step and every
        ``eval_interval`` steps (when it is > 0), and always after the last step. Every
        ``save_steps`` steps a checkpoint is written; SIGINT or SIGTERM during training
        writes one after the current step and returns early (a second signal stops at once).
        """
        self.start_training(resume_from_checkpoint)
        plan = CheckpointPlan.resolve(self.args, checkpoint_dir, checkpoint_interval, checkpoint_total_limit)
        return TrainingLoop(self, resume_from_checkpoint, plan).run()

    def start_training(self, resume_from_checkpoint: bool | str | None) -> None:
        """Called first by ``train()``, before the output folder is claimed (and maybe cleared):
        a trainer that may train only once (its pairs or reward model come from the policy it
        started from) refuses a second call here. MAGRPO and actor-critic train on."""
        return None

    def step(self, row_ids: list[int]) -> StepResult:
        """Sample, score and update every agent on this rank's dataset rows ``row_ids``."""
        started = time.perf_counter()
        tree = self.rollout(self.train_prompts, row_ids, reward=self.train_reward)
        generated = time.perf_counter()
        frozen = self.update.frozen(tree)
        shaping_metrics: dict[str, metric_stats.Stat] = {}
        estimated_tree = tree
        if self.args.reference_kl_enabled:
            estimated_tree, shaping_metrics = self.shape_with_reference_kl(tree, frozen)
        estimate = self.estimate(estimated_tree)
        stats = self.update(tree, estimate, frozen, self.global_step + 1)
        # Once, after the last pass: nothing samples between the passes.
        for i in range(self.num_agents):
            self.backend.sync_weights(i)
        updated = time.perf_counter()
        stats.update(rollout_metrics(tree, estimate.returns, estimate.credits, estimate.advantages))
        stats.update(shaping_metrics)
        if self.metrics_callback.callback is not None:
            samples = rollout_samples(tree, estimate.credits, estimate.advantages, self.train_prompts)
            stats.update({key: metric_stats.mean(value, 1) for key, value in self.metrics_callback(samples).items()})
        generated_tokens = sum(agent.lengths.sum().item() for turn in tree.turns for agent in turn.agents)
        # Ranks work side by side: a step lasts as long as the slowest, their throughputs add.
        stats["time/generate_s"] = metric_stats.maximum(generated - started)
        stats["time/update_s"] = metric_stats.maximum(updated - generated)
        stats["time/step_s"] = metric_stats.maximum(updated - started)
        stats["time/generated_tokens_per_s"] = metric_stats.total(generated_tokens / max(generated - started, 1e-9))
        return StepResult(self.parallel.reduce_metrics(stats), tree, estimate.returns)

    def shape_with_reference_kl(
        self, tree: RolloutTree, frozen: FrozenLogprobs
    ) -> tuple[RolloutTree, dict[str, metric_stats.Stat]]:
        """``tree`` with each agent's rewards lowered by ``reference_kl_coef`` times the KL of
        its completion to its frozen reference (comlrl 1.4.3's reference KL), and the KL's
        metrics per turn; the tree itself keeps the task rewards (logged as such)."""
        coef = self.args.reference_kl_coef
        turns, metrics = [], {}
        for t, turn in enumerate(tree.turns):
            kls = [
                sequence_kl(
                    frozen.sampling[i][t], frozen.reference[i][t], agent.completion_mask.to(frozen.sampling[i][t])
                )
                for i, agent in enumerate(turn.agents)
            ]
            shaped = kl_shaped_rewards(turn.rewards, kls, tree.joint_indices, tree.num_generations, coef)
            turns.append(dataclasses.replace(turn, rewards=shaped))
            all_kls = torch.cat([kl.cpu() for kl in kls])
            metrics[f"turn_{turn.number}/reference_kl_mean"] = metric_stats.mean_of(all_kls)
            metrics[f"turn_{turn.number}/reference_kl_penalty_mean"] = metric_stats.mean_of(coef * all_kls)
        return dataclasses.replace(tree, turns=turns), metrics

    def step_samples(self, result: StepResult, count: int) -> list[dict[str, Any]]:
        """What a logging step shows of the step just taken: its first ``count`` joint actions per turn."""
        return completion_samples(result.tree, result.returns, self.train_prompts, count)

    def training_step(self, row_ids: list[int]) -> dict[str, float]:
        """Sample, score and update every agent on the dataset rows ``row_ids``; returns the step's metrics."""
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

        def generate(agent: int, agent_prompts: list[str]) -> AgentRollout:
            return self.generate(agent, agent_prompts, group, kwargs, generators[agent])

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
            map_agents=functools.partial(map_agents, self.agents, cpu_threads=self.backend.uses_generators(kwargs)),
            written_prompts=not self.actor_critic_reward_calls,
        )

    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        """Agent ``agent``'s ``num_generations`` completions of every prompt, in one batched
        call of the generation backend (``generation_backend``), drawn from ``generator``."""
        return self.backend.generate(agent, prompts, num_generations, sampling, generator)

    # ----------------------------------------------------------------------------------------
    # evaluation
    # ----------------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Score the first ``eval_num_samples`` rows of ``eval_dataset``: one episode per row
        (one sample per agent and turn, greedy or sampled as ``eval_do_sample`` says), with
        the reward mean over all turns, the reward and expected return of each turn, and the
        metrics of the ``eval_logger`` hook.

        Sampling uses generators seeded by ``seed``, and every generator (the CPU's and each
        GPU's) is put back afterwards: evaluations of the same weights agree, and evaluating
        during training does not change the training samples.
        """
        if self.eval_prompts is None:
            warnings.warn(
                "evaluate() without an eval_dataset scores nothing: pass eval_dataset= to the trainer", stacklevel=2
            )
            return {}
        args = self.args
        count = args.eval_num_samples if num_eval_samples is None else num_eval_samples
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"num_eval_samples must be an integer >= 1 or None (all rows), got {count!r}")
        rows = list(range(len(self.eval_prompts)))[:count]
        single_path = torch.zeros(1, self.num_agents, dtype=torch.long)
        sampling = self.sampling if args.eval_do_sample else self.sampling.greedy()
        # manual_seed reseeds the CPU's generator and every GPU's: all of them are put back.
        with torch.random.fork_rng(devices=seeded_cuda_devices(), device_type="cuda"):
            torch.manual_seed(args.seed)
            trees = [
                self.rollout(
                    self.eval_prompts,
                    rows[first : first + args.eval_batch_size],
                    num_generations=1,
                    joint_indices=single_path,
                    sampling=sampling,
                )
                for first in range(0, len(rows), args.eval_batch_size)
            ]
        metrics, completions = evaluation_metrics(trees, self.discount, args.num_turns)
        metrics.update(
            self.eval_hooks(
                completions,
                [self.eval_prompts.rows[r] for r in rows],
                self.eval_prompts.row_prompts(rows),
                args.num_turns,
            )
        )
        if self.metrics_callback.callback is not None:
            metrics.update(self.metrics_callback.evaluation(trees, self.discount, self.eval_prompts))
        return metrics

    # ----------------------------------------------------------------------------------------
    # saving
    # ----------------------------------------------------------------------------------------
    def save_model(self, output_dir: str, merge_adapters: bool = False) -> list[str]:
        """Write each agent to ``output_dir/agent_{i}`` in Hugging Face format, with its tokenizer.

        An agent trained with LoRA is written as its adapter (``adapter_model.safetensors``,
        loadable with ``peft.PeftModel.from_pretrained(base, folder)``), or, with
        ``merge_adapters=True``, as a whole model with the adapter merged in. Each folder is
        written under a temporary name and renamed, so an interrupted save never leaves a
        folder that looks complete. Returns the folders. Under data parallelism only rank 0
        writes (every rank holds the same weights); the others return an empty list.
        """
        if not self.parallel.is_main:
            return []
        self.learners.require_finite(f": {output_dir} was not written")
        return write_folders(output_dir, self.model_writers(merge_adapters))

    def model_writers(self, merge_adapters: bool = False) -> list[tuple[str, Callable[[str], None]]]:
        """Folder name and writer of every trained model, for ``save_model`` and checkpoints."""
        return [
            (f"agent_{i}", functools.partial(self.write_agent, i, merge_adapters=merge_adapters))
            for i in range(self.num_agents)
        ]

    def write_agent(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer into ``folder``."""
        self.agents.write(agent, folder, merge_adapters)

    def write_models(self, folder: str) -> None:
        """Every trained model of a checkpoint into ``folder`` (``agent_{i}/``, ...)."""
        for name, write in self.model_writers():
            write(os.path.join(folder, name))

    def load_models(self, path: str) -> None:
        """The weights ``write_models`` wrote into checkpoint ``path``, loaded in place."""
        self.agents.load(path)

    def sinks(self) -> list:
        """Where metrics go: ``metrics.jsonl`` always, W&B and TensorBoard when asked."""
        sinks: list = [JsonlSink(os.path.join(self.output_dir, "metrics.jsonl"))]
        if self.wandb_config is not None:
            sinks.append(WandbSink(self.wandb_config, config_record(self.args)))
        if self.args.log_tensorboard:
            sinks.append(TensorBoardSink(os.path.join(self.output_dir, "tensorboard")))
        return sinks
