"""What every multi-agent trainer shares: agents and tokenizers, rewards, the rollout tree
(one batched ``generate`` per agent and turn), the policy-gradient backward over every turn,
optimizer steps, evaluation, logging, checkpoints and saving.

A trainer is this class plus how it turns a step's rollout tree into advantages
(``_estimate``) and, when it learns something besides the policies, the extra losses of each
update pass (``_auxiliary_backward``): MAGRPO (``comlrl.trainers.reinforce``) uses group
baselines; IAC and MAAC (``comlrl.trainers.actor_critic``) learn critics.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import shutil
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from comlrl.algorithms import (
    PolicyLoss,
    joint_action_indices,
    policy_gradient_loss,
    token_weights,
)
from comlrl.checkpoint import (
    TrainerState,
    check_compatible,
    describe_agent,
    find_checkpoint,
    load_training_state,
    load_weights,
    read_state,
    save_checkpoint,
    truncate_log,
)
from comlrl.distributed import DataParallel
from comlrl.metrics import JsonlSink, MetricsLogger, TensorBoardSink, WandbSink
from comlrl.metrics.evaluation import EvalHooks, evaluation_metrics
from comlrl.metrics.rollout import completion_samples, format_metrics, rollout_metrics
from comlrl.models.forward import completion_logprobs
from comlrl.models.loading import (
    check_agents,
    enable_activation_checkpointing,
    load_agents,
    resolve_tokenizers,
    split_model_config,
)
from comlrl.models.lora import attach_adapters, is_peft_model, merged_copy, save_adapter, trainable_parameters
from comlrl.models.placement import map_agents, place_agents
from comlrl.optim import build_optimizers, build_schedulers, per_agent_learning_rates
from comlrl.rewards import JointReward
from comlrl.rollout import AgentRollout
from comlrl.rollout.backends import GenerationBackend, HFBackend
from comlrl.rollout.prompts import Formatter, PromptTable
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import RolloutTree, build_tree, tree_size
from comlrl.trainers.config import TrainerConfig
from comlrl.utils.run_control import (
    StopOnSignal,
    generator_states,
    rank_generator_states,
    restore_generator_states,
    seed_everything,
    states_of_rank,
)

RewardFunction = Callable[..., Sequence[Any]]


class Estimate(Protocol):
    """What a trainer's ``_estimate`` gives for a step's rollout tree."""

    returns: list[torch.Tensor]
    """Per turn, ``(M_t, J, N)`` return of each joint action, per agent (logged)."""
    credits: list[torch.Tensor]
    """Per turn, ``(N, M_t, G)`` return credited to each agent's sample (logged)."""
    advantages: list[list[torch.Tensor]]
    """``[agent][turn]`` ``(M_t * G,)`` advantage of each sample, node-major."""


@dataclass
class TrainResult:
    """What ``train()`` returns."""

    global_step: int
    """Optimizer steps taken (each agent takes one per step)."""
    epoch_reward_means: list[float]
    """Mean processed joint reward of each epoch (what the advantages were computed from)."""
    epoch_raw_reward_means: list[float]
    """Mean joint reward of each epoch as ``reward_func`` returned it, before the processor."""
    train_seconds: float
    """Wall time of ``train()``."""
    interrupted: bool = False
    """SIGINT or SIGTERM stopped training early, after writing a checkpoint."""


class MultiAgentTrainer:
    """Trains N LLM agents together on a shared reward; subclasses say how advantages are
    estimated (``_estimate``) and what else each update pass learns (``_auxiliary_backward``).

    Args:
        agents: the agents, one causal LM instance each (any N >= 1; they may be different
            architectures with different tokenizers).
        agent_model: instead of ``agents``, a model folder or hub id to load ``num_agents``
            copies of (with ``model_config`` as ``from_pretrained`` keyword arguments).
        num_agents: how many copies of ``agent_model`` to load.
        tokenizer: one tokenizer for all agents, a list with one per agent, or None to load
            each agent's tokenizer from where the agent was loaded.
        train_dataset: rows (a ``datasets.Dataset`` or a list of dicts).
        eval_dataset: rows scored by ``evaluate()``.
        reward_func: scores joint actions: called with one list of completions per agent
            (N positional arguments), or with the prompts first when it takes N+1; returns,
            per joint action, one number shared by all agents or a sequence of N numbers (one
            per agent). The prompts are the rows' ``prompt`` column, or agent 0's formatted
            prompts when there is no such column. A function that names ``turn``,
            ``prompt_history_per_agent`` or ``response_history_per_agent`` among its keyword
            parameters also gets those (see ``comlrl.rewards.REWARD_CONTEXT``). A list of such
            functions is summed with the config's ``reward_weights``.
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
            ``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``), or the original
            library's ``{"model_kwargs": {...}, "tokenizer_kwargs": {...}}``.
        wandb_config: turns on W&B logging: ``wandb.init`` arguments (``project``,
            ``entity``, ``name``, ...). Needs ``pip install 'comlrl[wandb]'``.
        eval_logger: evaluation hook, called with the keyword arguments it names among
            ``agent_completions_turns`` (``[agent][row][turn]`` texts), ``prompts``, ``rows``,
            ``test_cases`` and ``entry_points`` (the rows' ``test`` / ``entry_point``
            columns, as in the original library); returns a dict of metrics, or anything
            ``eval_aggregator`` turns into one.
        eval_aggregator: ``eval_aggregator(eval_logger_output, num_turns=...) -> dict``.
        peft_config: train LoRA adapters instead of whole models: a ``peft`` config (e.g.
            ``LoraConfig``) for every agent, or a list with one per agent (needs
            ``pip install 'comlrl[lora]'``). With ``agent_model``, or with the same model
            object passed for every agent, the agents share ONE frozen base model, each with
            its own adapter.
    """

    config_class: type[TrainerConfig] = TrainerConfig
    """The config class: built when ``args`` is not given, and what ``args`` must be."""
    algorithm_name = "train"
    """Shown on the progress bar."""

    def __init__(
        self,
        agents: Sequence[torch.nn.Module] | None = None,
        agent_model: str | None = None,
        num_agents: int = 2,
        tokenizer: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: RewardFunction | Sequence[RewardFunction] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Formatter | Sequence[Formatter] | None = None,
        external_transition: Callable[..., Sequence[str] | None] | None = None,
        args: TrainerConfig | None = None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., dict[str, float]] | None = None,
        peft_config: Any = None,
    ):
        self.args = args if args is not None else self.config_class()
        if not isinstance(self.args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(self.args).__name__}")
        if agents is not None and agent_model is not None:
            raise ValueError("pass either agents or agent_model, not both")
        if agents is None and agent_model is None:
            raise ValueError("no agents: pass agents=[model, ...] or agent_model=<folder or hub id>")
        if reward_func is None:
            raise ValueError("reward_func is required")
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={self.args.num_turns} needs external_transition=, a function that writes each "
                "agent's next-turn prompt from the joint action just taken"
            )
        self.parallel = DataParallel.from_environment()
        self.model_kwargs, self.tokenizer_kwargs = split_model_config(model_config)
        if agents is None:
            # With adapters, one base model serves every agent.
            agents = load_agents(agent_model, 1 if peft_config is not None else num_agents, self.model_kwargs)
            agents = agents * num_agents if peft_config is not None else agents
        agents = check_agents(agents, shared_base_allowed=peft_config is not None)
        self.agents_placed = place_agents(
            agents, self.args.agent_devices, self.parallel.local_rank if self.parallel.enabled else None
        )
        """Whether ``agent_devices`` (or torchrun on GPUs) chose the agents' devices."""
        if peft_config is not None:
            agents, self.adapters = attach_adapters(agents, peft_config)
        else:
            self.adapters = [None] * len(agents)
        self.agents = agents
        self.num_agents = len(self.agents)
        if self.args.gradient_checkpointing:
            for agent in {id(agent): agent for agent in self.agents}.values():
                enable_activation_checkpointing(agent)
        self.agent_parameters = [trainable_parameters(a, name) for a, name in zip(self.agents, self.adapters)]
        self.tokenizers = resolve_tokenizers(tokenizer, self.agents, self.tokenizer_kwargs)
        self.reward = JointReward(reward_func, self.num_agents, reward_processor, weights=self.args.reward_weights)
        self.transition = None if external_transition is None else Transition(external_transition, self.num_agents)
        self.train_prompts = PromptTable(train_dataset, formatters, self.num_agents, "train_dataset")
        self._check_rank_shares()
        self.eval_prompts = (
            None if eval_dataset is None else PromptTable(eval_dataset, formatters, self.num_agents, "eval_dataset")
        )
        self.eval_hooks = EvalHooks(eval_logger, eval_aggregator)
        self.wandb_config = wandb_config
        self.joint_indices = joint_action_indices(self.num_agents, self.args.num_generations, self.args.joint_mode)
        self._check_tree_budget()
        learning_rates = per_agent_learning_rates(self.args.agent_learning_rate, self.num_agents)
        self.learners: list[str] = []
        """Name of what each optimizer trains ("agent 0", ...), aligned with ``optimizers``."""
        self.learner_parameters: list[list[torch.nn.Parameter]] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.schedulers: list[Any] = []
        self.add_learners([f"agent {i}" for i in range(self.num_agents)], self.agent_parameters, learning_rates)
        # A frozen copy of each agent as it was before training; only when the KL term is on.
        # An agent with a LoRA adapter needs none: its base model without the adapter is it.
        self.reference_agents = [
            copy.deepcopy(agent).eval().requires_grad_(False)
            if self.args.beta > 0 and not is_peft_model(agent)
            else None
            for agent in self.agents
        ]
        self.backend = self._build_backend()
        self.global_step = 0

    def _build_backend(self) -> GenerationBackend:
        if self.args.generation_backend == "vllm":
            from comlrl.rollout.vllm_backend import VLLMBackend

            return VLLMBackend(self.agents, self.tokenizers, self.adapters, self.args.vllm_gpu_memory_utilization)
        return HFBackend(self.agents, self.tokenizers, self._activate, self._precision)

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last batch of an epoch may hold fewer rows); a step
        takes ``per_device_train_batch_size`` rows on each data-parallel rank."""
        return math.ceil(len(self.train_prompts) / (self.args.per_device_train_batch_size * self.parallel.world_size))

    def _check_rank_shares(self) -> None:
        """Under data parallelism every rank needs a row at every step, the last one included."""
        ranks = self.parallel.world_size
        rows_per_step = self.args.per_device_train_batch_size * ranks
        last = len(self.train_prompts) % rows_per_step
        if 0 < last < ranks or len(self.train_prompts) < ranks:
            raise ValueError(
                f"train_dataset has {len(self.train_prompts)} rows; with {ranks} ranks x per_device_train_batch_size="
                f"{self.args.per_device_train_batch_size} = {rows_per_step} rows per step, the last step of each epoch "
                f"holds {last or len(self.train_prompts)}, fewer than the {ranks} ranks. Use a row count whose "
                f"remainder modulo {rows_per_step} is 0 or at least {ranks}"
            )

    def add_learners(
        self, names: Sequence[str], parameters: Sequence[Sequence[torch.nn.Parameter]], learning_rates: Sequence[float]
    ) -> None:
        """One AdamW and one learning-rate schedule (the config's) for each named parameter set;
        every update pass steps them all, after clipping each set's gradient on its own."""
        args = self.args
        optimizers = build_optimizers(parameters, learning_rates, args.weight_decay)
        total_steps = args.num_train_epochs * self.steps_per_epoch * args.updates_per_step
        self.learners.extend(names)
        self.learner_parameters.extend(list(p) for p in parameters)
        self.parallel.broadcast_parameters(p for group in parameters for p in group)
        self.optimizers.extend(optimizers)
        self.schedulers.extend(build_schedulers(optimizers, args.lr_scheduler_type, args.warmup_ratio, total_steps))

    def _check_tree_budget(self) -> None:
        args = self.args
        size = tree_size(
            args.per_device_train_batch_size,
            self.num_agents,
            args.num_generations,
            self.joint_indices.shape[0],
            args.num_turns,
        )
        if size.generations > args.max_generations_per_step:
            raise ValueError(
                f"this config's rollout tree samples up to {size.generations} completions per step "
                f"({size.nodes} nodes x {self.num_agents} agents x {args.num_generations} generations; "
                f"{args.per_device_train_batch_size} rows, {args.num_turns} turns, joint_mode={args.joint_mode!r} "
                f"with {self.joint_indices.shape[0]} joint actions per node), above max_generations_per_step="
                f"{args.max_generations_per_step}. Lower num_generations, num_turns or per_device_train_batch_size, "
                "use joint_mode='aligned', or raise max_generations_per_step"
            )

    # ----------------------------------------------------------------------------------------
    # the training loop
    # ----------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainResult:
        """Train every agent for ``num_train_epochs`` epochs; returns a ``TrainResult``.

        Args:
            resume_from_checkpoint: True continues from the newest complete checkpoint in
                ``output_dir``, a path from that checkpoint; the run then goes on exactly as
                if it had not stopped (same data order, samples and weights).

        With an ``eval_dataset``, ``evaluate()`` runs before the first step and every
        ``eval_interval`` steps (when it is > 0), and always after the last step. Every
        ``save_steps`` steps a checkpoint is written; SIGINT or SIGTERM during training
        writes one after the current step and returns early (a second signal stops at once).
        """
        args = self.args
        data_order = torch.Generator()
        if resume_from_checkpoint:
            progress = self._resume(resume_from_checkpoint, data_order)
        else:
            progress = self._start_progress()
            # Ranks sample differently; they all shuffle the data alike.
            seed_everything(args.seed + self.parallel.rank)
            data_order.manual_seed(args.seed)
        main = self.parallel.is_main
        logger = MetricsLogger(self._sinks() if main else [])
        logger.add_window(progress.metrics_window)
        start = time.perf_counter()
        bar = tqdm(
            total=args.num_train_epochs * self.steps_per_epoch,
            initial=self.global_step,
            desc=self.algorithm_name,
            unit="step",
            dynamic_ncols=True,
            disable=not main,
        )
        periodic_eval = self.eval_prompts is not None and args.eval_interval > 0 and main
        rows_per_step = args.per_device_train_batch_size * self.parallel.world_size
        interrupted = False
        try:
            with StopOnSignal() as stop:
                if periodic_eval and self.global_step == 0:
                    self._log_evaluation(logger, bar)
                for epoch in range(progress.epoch, args.num_train_epochs):
                    progress.epoch = epoch
                    epoch_order_state = data_order.get_state()  # checkpoints rebuild the epoch's order from it
                    if args.shuffle:
                        order = torch.randperm(len(self.train_prompts), generator=data_order).tolist()
                    else:
                        order = list(range(len(self.train_prompts)))
                    for step_in_epoch in range(progress.step_in_epoch, self.steps_per_epoch):
                        rows = order[step_in_epoch * rows_per_step : (step_in_epoch + 1) * rows_per_step]
                        metrics, tree, returns = self._training_step(self.parallel.shard(rows))
                        metrics = self.parallel.mean_metrics(metrics)
                        self.global_step = progress.global_step = self.global_step + 1
                        progress.step_in_epoch = step_in_epoch + 1
                        progress.step_rewards.append(metrics["reward/mean"])
                        progress.step_raw_rewards.append(metrics["reward/raw_mean"])
                        logger.add(metrics)
                        bar.update(1)
                        bar.set_postfix(epoch=epoch + 1, reward=f"{metrics['reward/mean']:.3g}")
                        if self.global_step % args.logging_steps == 0:
                            flushed = logger.flush(self.global_step)
                            if main:
                                bar.write(format_metrics(self.global_step, flushed))
                            samples = completion_samples(tree, returns, self.train_prompts, args.num_completions_to_log)
                            logger.log_samples(samples, self.global_step)
                        if periodic_eval and self.global_step % args.eval_interval == 0:
                            self._log_evaluation(logger, bar)
                        interrupted = self.parallel.any(stop.signal is not None)
                        if interrupted or (args.save_steps and self.global_step % args.save_steps == 0):
                            progress.metrics_window = logger.window()
                            folder = self._save_checkpoint(progress, epoch_order_state)
                        if interrupted:
                            if main:
                                cause = signal.Signals(stop.signal).name if stop.signal else "a signal to another rank"
                                bar.write(
                                    f"stopped by {cause} after step {self.global_step}: checkpoint {folder}; "
                                    "continue with train(resume_from_checkpoint=True)"
                                )
                            break
                    if interrupted:
                        break
                    progress.epoch_reward_means.append(sum(progress.step_rewards) / len(progress.step_rewards))
                    progress.epoch_raw_reward_means.append(
                        sum(progress.step_raw_rewards) / len(progress.step_raw_rewards)
                    )
                    progress.step_rewards, progress.step_raw_rewards, progress.step_in_epoch = [], [], 0
                final_eval_done = periodic_eval and self.global_step % args.eval_interval == 0
                if self.eval_prompts is not None and main and not interrupted and not final_eval_done:
                    self._log_evaluation(logger, bar)
        finally:
            # Whatever stopped training, the metrics of the steps already taken are written;
            # after a signal they are in the checkpoint, and a resumed run writes them.
            if not interrupted:
                logger.flush(self.global_step)
            bar.close()
            logger.close()
        return TrainResult(
            self.global_step,
            progress.epoch_reward_means,
            progress.epoch_raw_reward_means,
            time.perf_counter() - start,
            interrupted,
        )

    def _start_progress(self) -> TrainerState:
        """Where a new run stands: nothing done yet."""
        return TrainerState(
            global_step=0,
            epoch=0,
            step_in_epoch=0,
            epoch_reward_means=[],
            epoch_raw_reward_means=[],
            step_rewards=[],
            step_raw_rewards=[],
            metrics_window={},
            agents=[describe_agent(agent) for agent in self.agents],
            num_rows=len(self.train_prompts),
            per_device_train_batch_size=self.args.per_device_train_batch_size,
            world_size=self.parallel.world_size,
        )

    def _save_checkpoint(self, progress: TrainerState, epoch_order_state: torch.Tensor) -> str:
        """Rank 0 writes ``output_dir/checkpoint-{step}``, with every rank's generator states
        (each rank samples its own); returns the folder on every rank."""
        json_states, tensors = generator_states()
        gathered = self.parallel.gather((json_states, tensors))
        folder = os.path.join(self.args.output_dir, f"checkpoint-{self.global_step}")
        if self.parallel.is_main:
            progress.generators = rank_generator_states([json for json, _ in gathered])
            generators = rank_generator_states([tensors for _, tensors in gathered])
            generators["data_order"] = epoch_order_state
            progress.config = asdict(self.args)
            folder = save_checkpoint(
                self.args.output_dir,
                self._write_models,
                self.optimizers,
                self.schedulers,
                generators,
                progress,
                self.args.save_total_limit,
            )
        self.parallel.barrier()
        return folder

    def _resume(self, resume_from_checkpoint: bool | str, data_order: torch.Generator) -> TrainerState:
        """Load a checkpoint into the agents, optimizers, schedulers and generators; returns its state."""
        path = find_checkpoint(self.args.output_dir, resume_from_checkpoint)
        state = read_state(path)
        check_compatible(path, state, self._start_progress())
        optimizer_state, generators = load_training_state(path)
        self._load_models(path)
        if len(optimizer_state["optimizers"]) != len(self.optimizers):
            raise ValueError(
                f"checkpoint {path} holds {len(optimizer_state['optimizers'])} optimizers; this trainer has "
                f"{len(self.optimizers)} ({', '.join(self.learners)})"
            )
        for optimizer, saved in zip(self.optimizers, optimizer_state["optimizers"]):
            optimizer.load_state_dict(saved)
        for scheduler, saved in zip(self.schedulers, optimizer_state["schedulers"]):
            scheduler.load_state_dict(saved)
        rank = self.parallel.rank
        restore_generator_states(states_of_rank(state.generators, rank), states_of_rank(generators, rank))
        data_order.set_state(generators["data_order"])
        self.global_step = state.global_step
        # Lines the stopped run wrote after its checkpoint would otherwise appear twice.
        for log in ("metrics.jsonl", "samples.jsonl") if self.parallel.is_main else ():
            truncate_log(os.path.join(self.args.output_dir, log), state.global_step)
        return state

    def training_step(self, row_ids: list[int]) -> dict[str, float]:
        """Sample, score and update every agent on the dataset rows ``row_ids``; returns the step's metrics."""
        return self._training_step(row_ids)[0]

    def _write_models(self, folder: str) -> None:
        """Every trained model of a checkpoint into ``folder`` (``agent_{i}/``, ...)."""
        for name, write in self._model_writers():
            write(os.path.join(folder, name))

    def _load_models(self, path: str) -> None:
        """The weights ``_write_models`` wrote into checkpoint ``path``, loaded in place."""
        load_weights(path, self.agents, self.adapters)

    def _training_step(self, row_ids: list[int]) -> tuple[dict[str, float], RolloutTree, list[torch.Tensor]]:
        started = time.perf_counter()
        tree = self.rollout(self.train_prompts, row_ids)
        generated = time.perf_counter()
        estimate = self._estimate(tree)
        metrics = self._update(tree, estimate)
        updated = time.perf_counter()

        metrics.update(rollout_metrics(tree, estimate.returns, estimate.credits, estimate.advantages))
        generated_tokens = sum(agent.lengths.sum().item() for turn in tree.turns for agent in turn.agents)
        metrics["time/generate_s"] = generated - started
        metrics["time/update_s"] = updated - generated
        metrics["time/step_s"] = updated - started
        metrics["time/generated_tokens_per_s"] = generated_tokens / max(generated - started, 1e-9)
        return metrics, tree, estimate.returns

    def _estimate(self, tree: RolloutTree) -> Estimate:
        """The returns, per-agent credits and advantages of a step's rollout tree."""
        raise NotImplementedError

    def _auxiliary_backward(self, tree: RolloutTree, estimate: Estimate) -> dict[str, float]:
        """Backward of whatever else an update pass trains besides the policies (critics);
        called once per pass after the policy losses' backward, before the optimizer steps.
        Returns metrics; the default trains nothing else."""
        return {}

    def rollout(
        self,
        prompts: PromptTable,
        row_ids: list[int],
        num_generations: int | None = None,
        joint_indices: torch.Tensor | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> RolloutTree:
        """Generate, score and expand the rollout tree of ``row_ids``, one ``generate`` call
        per agent per turn (training settings unless given)."""
        args = self.args
        group = args.num_generations if num_generations is None else num_generations
        sampling = args.sampling_kwargs() if sampling is None else sampling
        # One generator per agent, seeded from torch's (whose state checkpoints keep), so that
        # agents sampling in parallel threads draw the same tokens in every run.
        seeds = torch.randint(0, 2**63 - 1, (self.num_agents,), dtype=torch.int64).tolist()
        devices = [next(agent.parameters()).device for agent in self.agents]
        generators = [torch.Generator(device).manual_seed(seed) for device, seed in zip(devices, seeds)]

        def generate(agent: int, agent_prompts: list[str]) -> AgentRollout:
            return self.generate(agent, agent_prompts, group, sampling, generators[agent])

        return build_tree(
            prompts,
            row_ids,
            generate,
            self.reward,
            self.joint_indices if joint_indices is None else joint_indices,
            group,
            num_turns=args.num_turns,
            transition=self.transition,
            prompt_passthrough=args.external_prompt_passthrough,
            early_termination_threshold=args.early_termination_threshold,
            map_agents=functools.partial(map_agents, self.agents, cpu_threads=self.backend.uses_generators(sampling)),
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

    def _update(self, tree: RolloutTree, estimate: Estimate) -> dict[str, float]:
        """``updates_per_step`` optimizer steps per learner on one rollout tree (every turn of
        every agent); returns their mean metrics."""
        args = self.args
        # Token weights over ALL of an agent's sequences of the step, so the micro-batches'
        # losses add up to the loss of the whole batch whatever their sizes.
        weights = []
        for i in range(self.num_agents):
            lengths = torch.cat([turn.agents[i].lengths for turn in tree.turns])
            # Normalised over every rank's sequences: summed gradients are the global batch's.
            sequences, tokens = self.parallel.sum_values([lengths.numel(), lengths.sum().item()])
            agent_weights = token_weights(lengths, args.loss_type, args.max_new_tokens, sequences, tokens)
            weights.append(agent_weights.split([turn.agents[i].lengths.numel() for turn in tree.turns]))
        # Sampling-time log-probs are only needed when the policy moves between passes.
        passes = args.updates_per_step
        old_logps = self._frozen_logprobs(tree, reference=False) if passes > 1 else None
        ref_logps = self._frozen_logprobs(tree, reference=True) if args.beta > 0 else None
        history: dict[str, list[float]] = defaultdict(list)
        for _ in range(passes):
            outputs = map_agents(
                self.agents,
                lambda i: self._backward(
                    i,
                    [turn.agents[i] for turn in tree.turns],
                    estimate.advantages[i],
                    weights[i],
                    None if old_logps is None else old_logps[i],
                    None if ref_logps is None else ref_logps[i],
                ),
            )
            for key, value in self._auxiliary_backward(tree, estimate).items():
                history[key].append(value)
            grad_norms = self._optimizer_steps()
            for name, norm in zip(self.learners, grad_norms):
                history[f"{name.replace(' ', '')}/grad_norm"].append(norm)
            for i, out in enumerate(outputs):
                history[f"agent{i}/loss"].append(out.loss.item())
                if passes > 1:
                    history[f"agent{i}/clip_fraction"].append(out.clip_fraction.item())
                if args.beta > 0:
                    history[f"agent{i}/kl"].append(out.kl.item())
                if args.entropy_coef > 0:
                    history[f"agent{i}/entropy"].append(out.entropy.item())
        # Once, after the last pass: nothing samples between the passes.
        for i in range(self.num_agents):
            self.backend.sync_weights(i)
        for name, optimizer in zip(self.learners, self.optimizers):
            history[f"{name.replace(' ', '')}/learning_rate"].append(optimizer.param_groups[0]["lr"])
        return {key: sum(values) / len(values) for key, values in history.items()}

    def _micro_batches(self, count: int) -> list[slice]:
        """Rows of a batch of ``count`` sequences, ``micro_batch_size`` at a time."""
        size = self.args.micro_batch_size or count
        return [slice(start, start + size) for start in range(0, count, size)]

    def _frozen_logprobs(self, tree: RolloutTree, reference: bool) -> list[list[torch.Tensor]]:
        """``[agent][turn]`` log-probs of each agent's completions without gradient: under the
        agent as it is now, or under its frozen reference (its base model, for an adapter)."""
        return map_agents(self.agents, functools.partial(self._frozen_agent_logprobs, tree, reference))

    def _frozen_agent_logprobs(self, tree: RolloutTree, reference: bool, i: int) -> list[torch.Tensor]:
        """Agent ``i``'s part of :meth:`_frozen_logprobs`: one tensor per turn."""
        agent = self.agents[i]
        self._activate(i)
        model = self.reference_agents[i] if reference and self.reference_agents[i] is not None else agent
        was_training = model.training
        model.eval()
        without_adapter = agent.disable_adapter() if reference and model is agent else contextlib.nullcontext()
        with torch.no_grad(), without_adapter:
            logps = [
                torch.cat(
                    [
                        self._logprobs(model, turn.agents[i], rows)
                        for rows in self._micro_batches(len(turn.agents[i].texts))
                    ]
                )
                for turn in tree.turns
            ]
        model.train(was_training)
        return logps

    def _activate(self, agent: int) -> None:
        """Make agent ``agent``'s adapter the active one when agents share a base model."""
        if self.adapters[agent] is not None:
            self.agents[agent].set_adapter(self.adapters[agent])

    def _precision(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """bf16 autocast on the model's device when ``mixed_precision="bf16"``; the weights,
        gradients and optimizer state stay in their own dtype."""
        if self.args.mixed_precision is None:
            return contextlib.nullcontext()
        return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)

    def _logprobs(
        self, model: torch.nn.Module, rollout: AgentRollout, rows: slice, with_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        with self._precision(model):
            return completion_logprobs(
                model,
                rollout.prompt_ids[rows],
                rollout.prompt_mask[rows],
                rollout.completion_ids[rows],
                rollout.completion_mask[rows],
                temperature=self.args.temperature,
                with_entropy=with_entropy,
            )

    def _backward(
        self,
        agent_index: int,
        rollouts: list[AgentRollout],
        advantages: list[torch.Tensor],
        weights: Sequence[torch.Tensor],
        old_logps: list[torch.Tensor] | None,
        ref_logps: list[torch.Tensor] | None,
    ) -> PolicyLoss:
        """Agent ``agent_index``'s loss over all its turns, accumulated micro-batch by
        micro-batch (one batched masked forward and backward each)."""
        self._activate(agent_index)
        model = self.agents[agent_index]
        model.train()
        self.optimizers[agent_index].zero_grad(set_to_none=True)
        total = clipped = kl = entropy = tokens = 0.0
        with_entropy = self.args.entropy_coef > 0
        for t, rollout in enumerate(rollouts):
            for rows in self._micro_batches(len(rollout.texts)):
                token_logps, token_entropy = (
                    self._logprobs(model, rollout, rows, with_entropy=True)
                    if with_entropy
                    else (self._logprobs(model, rollout, rows), None)
                )
                mask = rollout.completion_mask[rows]
                out = policy_gradient_loss(
                    token_logps,
                    advantages[t][rows].to(token_logps.device),
                    mask,
                    old_logps=None if old_logps is None else old_logps[t][rows],
                    epsilon=self.args.epsilon,
                    epsilon_high=self.args.epsilon_high,
                    ref_logps=None if ref_logps is None else ref_logps[t][rows],
                    beta=self.args.beta,
                    entropy=token_entropy,
                    entropy_coef=self.args.entropy_coef,
                    sequence_weights=weights[t][rows].to(token_logps.device),
                )
                out.loss.backward()
                count = mask.sum().item()
                total += out.loss.item()
                clipped += out.clip_fraction.item() * count
                kl += out.kl.item() * count
                entropy += out.entropy.item() * count
                tokens += count
        tokens = max(tokens, 1)
        return PolicyLoss(*(torch.tensor(value) for value in (total, clipped / tokens, kl / tokens, entropy / tokens)))

    def _optimizer_steps(self) -> list[float]:
        """Clip and apply every learner's gradient, or none: a non-finite gradient stops
        training with an error before any weight changes in this step. Returns the norms."""
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm is not None else math.inf
        grad_norms = []
        for name, parameters in zip(self.learners, self.learner_parameters):
            self.parallel.sum_gradients(parameters)
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm).item()
            if not math.isfinite(norm):
                for optimizer in self.optimizers:
                    optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"{name} has a non-finite loss or gradient (gradient norm {norm}) at step "
                    f"{self.global_step + 1}; no weights were changed in this step"
                )
            grad_norms.append(norm)
        for optimizer, scheduler in zip(self.optimizers, self.schedulers):
            optimizer.step()
            scheduler.step()
        return grad_norms

    # ----------------------------------------------------------------------------------------
    # evaluation and saving
    # ----------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Score the first ``eval_num_samples`` rows of ``eval_dataset``: one episode per row
        (one sample per agent and turn, greedy or sampled as ``eval_do_sample`` says), with
        the reward mean over all turns, the reward and expected return of each turn, and the
        metrics of the ``eval_logger`` hook.

        Sampling uses its own generator seeded by ``seed``: evaluations of the same weights
        agree, and evaluating during training does not change the training samples.
        """
        if self.eval_prompts is None:
            raise ValueError("evaluate() needs an eval_dataset: pass eval_dataset= to the trainer")
        args = self.args
        rows = list(range(len(self.eval_prompts)))[: args.eval_num_samples]
        single_path = torch.zeros(1, self.num_agents, dtype=torch.long)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed)
            trees = [
                self.rollout(
                    self.eval_prompts,
                    rows[first : first + args.eval_batch_size],
                    num_generations=1,
                    joint_indices=single_path,
                    sampling=args.eval_sampling_kwargs(),
                )
                for first in range(0, len(rows), args.eval_batch_size)
            ]
        metrics, completions = evaluation_metrics(trees, args.discount, args.num_turns)
        metrics.update(
            self.eval_hooks(
                completions,
                [self.eval_prompts.rows[r] for r in rows],
                self.eval_prompts.reward_prompts(rows),
                args.num_turns,
            )
        )
        return metrics

    def _log_evaluation(self, logger: MetricsLogger, bar: Any) -> None:
        metrics = self.evaluate()
        logger.log(metrics, self.global_step)
        bar.write(format_metrics(self.global_step, metrics))

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
        os.makedirs(output_dir, exist_ok=True)
        folders = []
        for name, write in self._model_writers(merge_adapters):
            final = os.path.join(output_dir, name)
            partial = os.path.join(output_dir, f".{name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            write(partial)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            folders.append(final)
        return folders

    def _model_writers(self, merge_adapters: bool = False) -> list[tuple[str, Callable[[str], None]]]:
        """Folder name and writer of every trained model, for ``save_model`` and checkpoints."""
        return [
            (f"agent_{i}", functools.partial(self.write_agent, i, merge_adapters=merge_adapters))
            for i in range(self.num_agents)
        ]

    def write_agent(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer into ``folder``."""
        model = self.agents[agent]
        if merge_adapters and is_peft_model(model):
            model = merged_copy(model, self.adapters[agent])
        if self.adapters[agent] is not None and not merge_adapters:
            save_adapter(model, self.adapters[agent], folder)
        else:
            model.save_pretrained(folder)
        self.tokenizers[agent].save_pretrained(folder)

    def _sinks(self) -> list:
        sinks: list = [JsonlSink(os.path.join(self.args.output_dir, "metrics.jsonl"))]
        if self.wandb_config is not None:
            sinks.append(WandbSink(self.wandb_config, asdict(self.args)))
        if self.args.log_tensorboard:
            sinks.append(TensorBoardSink(os.path.join(self.args.output_dir, "tensorboard")))
        return sinks
