"""How a trainer is built: the one constructor every trainer shares
(:class:`~comlrl.engine.base.MultiAgentTrainer` calls :func:`set_up` with its config and
inputs). The order matters where one thing reads another: the parts first (they may change
the inputs: a critic's keys out of ``model_config``), the centralized set-up (one agent for
every role), the agents (with references if the objective needs them), the rewards (called as
the objective calls them), the prompts (checked against the agents), the learners, the
generation backend; the parts' ``attach`` last.
"""

from __future__ import annotations

from typing import Any

import torch

from comlrl.algorithms import joint_action_indices
from comlrl.engine.agents import Agents
from comlrl.engine.centralized import CentralizedSetup, refuse_unused_adapter
from comlrl.engine.config import TrainerConfig
from comlrl.engine.distributed import DataParallel
from comlrl.engine.inputs import TrainerInputs, check_required_inputs
from comlrl.engine.optim import Learners, per_agent_learning_rates
from comlrl.metrics.evaluation import EvalHooks
from comlrl.metrics.hooks import MetricsCallback
from comlrl.models.hardware import warn_if_bf16_is_emulated
from comlrl.models.loading import split_model_config
from comlrl.rollout.backends import build_backend
from comlrl.rollout.prompt_fit import check_prompts_fit
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.sampling import SamplingSpec, check_generation_names
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import check_tree_budget


def set_up(trainer: Any, args: TrainerConfig, inputs: TrainerInputs) -> None:
    """Every part of ``trainer``'s run from the config ``args`` and the ``inputs``: its
    parts, agents, rewards, prompts, learners and generation backend, each checked before
    anything slow where it can be; then the parts attach to it."""
    trainer.args = args
    trainer.output_dir = args.output_dir
    trainer.objective, trainer.reward_source, trainer.schedule, inputs = trainer.parts(args, inputs)
    centralized = None
    if args.centralized:
        label = trainer.centralized_label or f"{type(trainer).__name__} with collaboration_mode='centralized'"
        centralized = CentralizedSetup.build(args, inputs, label, trainer.one_model_per_role)
        inputs, args = centralized.inputs, centralized.base_config
    else:
        refuse_unused_adapter(inputs.centralized_comparator_adapter, args)
    check_required_inputs(args, inputs)
    trainer.comparator_adapter = None if centralized else inputs.centralized_comparator_adapter
    """With one model per agent: the adapter of a comparator that writes every agent's part."""
    trainer.sampling = SamplingSpec.from_config(args)
    """How completions are sampled, fixed for the run: generation, the log-probs'
    temperature and the loss's constants all read it."""
    trainer.parallel = DataParallel.from_environment()
    trainer.parallel.check_optimizer_steps(args)
    model_config = split_model_config(inputs.model_config)
    trainer.model_kwargs, trainer.tokenizer_kwargs = model_config.model_kwargs, model_config.tokenizer_kwargs
    trainer.agents = Agents.build(
        inputs.agents,
        inputs.agent_model,
        inputs.num_agents,
        inputs.tokenizer,
        model_config,
        inputs.peft_config,
        args,
        trainer.parallel.local_rank if trainer.parallel.enabled else None,
        with_references=trainer.objective.needs_reference,
        reference_devices=trainer.objective.reference_devices,
        sharding_mode=args.sharding if trainer.parallel.enabled else "replicate",
    )
    trainer.num_agents = len(trainer.agents)
    check_generation_names(args.generation_kwargs, trainer.agents)
    trainer.reward = trainer.joint_reward(
        inputs.reward_func, inputs.reward_processor, weights=args.reward_weights, call=args.reward_call
    )
    """The task reward: scores evaluations (and, unless the reward source says otherwise, training)."""
    trainer.train_reward = trainer.reward_source.training_reward(trainer, inputs)
    """What scores the training rollouts."""
    transition = inputs.external_transition
    trainer.transition = None if transition is None else Transition(transition, trainer.num_agents)
    trainer.train_prompts = PromptTable(inputs.train_dataset, inputs.formatters, trainer.num_agents, "train_dataset")
    trainer.parallel.check_rows(len(trainer.train_prompts), args.per_device_train_batch_size)
    trainer.eval_prompts = (
        None
        if inputs.eval_dataset is None
        else PromptTable(inputs.eval_dataset, inputs.formatters, trainer.num_agents, "eval_dataset")
    )
    for table in (trainer.train_prompts, trainer.eval_prompts):
        if table is not None:
            check_prompts_fit(trainer.agents, trainer.agents.tokenizers, table.prompts, args.max_new_tokens, table.name)
    trainer.eval_hooks = EvalHooks(inputs.eval_logger, inputs.eval_aggregator)
    trainer.metrics_callback = MetricsCallback(inputs.metrics_callback)
    trainer.wandb_config = inputs.wandb_config
    trainer.joint_indices = joint_action_indices(trainer.num_agents, args.num_generations, args.joint_mode)
    check_tree_budget(
        args.per_device_train_batch_size,
        trainer.num_agents,
        args.num_generations,
        trainer.joint_indices.shape[0],
        args.num_turns,
        args.joint_mode,
        args.max_generations_per_step,
    )
    trainer.learners = Learners(fp32_masters=args.precision == "bf16", parallel=trainer.parallel)
    """Every optimizer and schedule: one per agent ("agent 0", ...), then the critics'."""
    trainer.pending_learners = []
    """Learners waiting for the run's length: (names, parameter sets, learning rates, modules)."""
    trainer.add_learners(
        [f"agent {i}" for i in range(trainer.num_agents)],
        trainer.agents.parameters,
        per_agent_learning_rates(args.agent_learning_rate, trainer.num_agents),
        modules=list(trainer.agents),
    )
    if args.precision == "bf16":
        warn_if_bf16_is_emulated(trainer.agents.device(0))
    trainer.backend = build_backend(
        args.generation_backend,
        trainer.agents,
        args.vllm_gpu_memory_utilization,
        sampler_logprobs=args.precision == "bf16",
        compiled=args.compiled_decoding,
        rollout_dtype=torch.bfloat16 if args.precision == "bf16" else None,
    )
    trainer.global_step = 0
    if centralized is not None:
        centralized.attach(trainer)
    for part in trainer.all_parts:
        part.attach(trainer, inputs)
