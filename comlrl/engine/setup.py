"""How a trainer's run is built: the one constructor every trainer shares
(:class:`~comlrl.engine.base.MultiAgentTrainer` calls :func:`build_run` with its parts, config
and inputs). The order matters where one thing reads another: the centralized set-up (one
agent for every role), the agents (with references if the objective needs them), the rewards
(called as the objective calls them), the prompts (checked against the agents), the learners,
the generation backend and the rollout; the parts' ``attach`` last, with the finished run.
"""

from __future__ import annotations

from typing import Any

import torch

from comlrl.algorithms import joint_action_indices
from comlrl.engine.agents import Agents
from comlrl.engine.centralized import CentralizedSetup, RoleEvalHooks, refuse_unused_adapter
from comlrl.engine.config import TrainerConfig
from comlrl.engine.distributed import DataParallel
from comlrl.engine.inputs import TrainerInputs, check_required_inputs
from comlrl.engine.optim import Learners, per_agent_learning_rates
from comlrl.engine.parts import Parts
from comlrl.engine.run import RewardMaker, Run, RunState
from comlrl.engine.saving import RunModels
from comlrl.environments.played import EnvironmentOnRows
from comlrl.metrics.evaluation import EvalHooks
from comlrl.metrics.hooks import MetricsCallback
from comlrl.models.hardware import warn_if_bf16_is_emulated
from comlrl.models.loading import split_model_config
from comlrl.rollout.backends import build_backend
from comlrl.rollout.chat import ChatRenderer
from comlrl.rollout.episodes import Rollout
from comlrl.rollout.prompt_fit import check_prompts_fit
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.sampling import SamplingSpec, check_generation_names
from comlrl.rollout.transition import Transition
from comlrl.rollout.tree import check_tree_budget


def build_run(name: str, parts: Parts, args: TrainerConfig, centralized_label: str, one_model_per_role: str) -> Run:
    """The run of a trainer named ``name`` (the algorithm's) from its ``parts`` (with the inputs
    as they read them) and its config ``args``: agents, rewards, prompts, learners and
    generation backend, each checked before anything slow where it can be; then the parts
    attach to it. ``centralized_label`` names the trainer in centralized mode's errors and
    ``one_model_per_role`` says what to do instead of giving it several models."""
    objective, inputs = parts.objective, parts.inputs
    user_config = args
    centralized = None
    if args.centralized:
        centralized = CentralizedSetup.build(args, inputs, centralized_label, one_model_per_role)
        inputs, args = centralized.inputs, centralized.base_config
    else:
        refuse_unused_adapter(inputs.centralized_comparator_adapter, args)
    check_required_inputs(args, inputs)
    sampling = SamplingSpec.from_config(args)
    parallel = DataParallel.from_environment()
    parallel.check_optimizer_steps(
        args.train_batch_size, args.per_device_train_batch_size, args.train_batch_size_counts_rows
    )
    model_config = split_model_config(inputs.model_config)
    agents = Agents.build(
        inputs.agents,
        inputs.agent_model,
        inputs.num_agents,
        inputs.tokenizer,
        model_config,
        inputs.peft_config,
        args,
        parallel.local_rank if parallel.enabled else None,
        with_references=objective.needs_reference,
        reference_devices=objective.reference_devices,
        sharding_mode=args.sharding if parallel.enabled else "replicate",
    )
    num_agents = len(agents)
    check_generation_names(args.generation_kwargs, agents)
    make_reward = RewardMaker(num_agents, objective.actor_critic_reward_calls)
    environment = inputs.environment
    reward = train_reward = None  # an environment scores its own joint actions
    if environment is None:
        reward = make_reward(
            inputs.reward_func, inputs.reward_processor, weights=args.reward_weights, call=args.reward_call
        )
        train_reward = parts.reward_source.training_reward(inputs, reward, make_reward)
    transition = None if inputs.external_transition is None else Transition(inputs.external_transition, num_agents)
    renderers = [ChatRenderer(tokenizer, i) for i, tokenizer in enumerate(agents.tokenizers)]
    train_prompts = prompt_table(inputs.train_dataset, inputs, renderers, "train_dataset")
    parallel.check_rows(len(train_prompts), args.per_device_train_batch_size)
    eval_prompts = (
        None if inputs.eval_dataset is None else prompt_table(inputs.eval_dataset, inputs, renderers, "eval_dataset")
    )
    for table in (train_prompts, eval_prompts):
        if table is not None:
            check_prompts_fit(agents, agents.tokenizers, table.prompts, args.max_new_tokens, table.name)
    joint_indices = joint_action_indices(num_agents, args.num_generations, args.joint_mode)
    check_tree_budget(
        args.per_device_train_batch_size,
        num_agents,
        args.num_generations,
        joint_indices.shape[0],
        args.num_turns,
        args.joint_mode,
        args.max_generations_per_step,
    )
    learners = Learners(fp32_masters=args.precision == "bf16", parallel=parallel)
    learners.wait(
        [f"agent {i}" for i in range(num_agents)],
        agents.parameters,
        per_agent_learning_rates(args.agent_learning_rate, num_agents),
        modules=list(agents),
    )
    if args.precision == "bf16":
        warn_if_bf16_is_emulated(agents.device(0))
    backend = build_backend(
        args.generation_backend,
        agents,
        args.vllm_gpu_memory_utilization,
        sampler_logprobs=args.precision == "bf16",
        compiled=args.compiled_decoding,
        rollout_dtype=torch.bfloat16 if args.precision == "bf16" else None,
    )
    rollout = Rollout(
        backend,
        agents,
        agents.device,
        sampling,
        reward,
        args.num_generations,
        joint_indices,
        num_turns=args.num_turns,
        transition=transition,
        prompt_passthrough=args.external_prompt_passthrough,
        early_termination_threshold=args.early_termination_threshold,
        written_prompts=not objective.actor_critic_reward_calls,
        environment=environment,
    )
    eval_hooks = EvalHooks(inputs.eval_logger, inputs.eval_aggregator)
    collaboration = None if centralized is None else centralized.collaboration
    if collaboration is not None:  # eval_logger sees each role's texts
        eval_hooks = RoleEvalHooks(eval_hooks, collaboration)
    run = Run(
        config=user_config,
        name=name,
        agents=agents,
        learners=learners,
        parallel=parallel,
        sampling=sampling,
        backend=backend,
        rollout=rollout,
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        reward=reward,
        train_reward=train_reward,
        make_reward=make_reward,
        transition=transition,
        joint_indices=joint_indices,
        model_config=model_config,
        eval_hooks=eval_hooks,
        metrics_callback=objective.metrics_callback(MetricsCallback(inputs.metrics_callback)),
        wandb_config=inputs.wandb_config,
        collaboration=collaboration,
        comparator_adapter=None if centralized else inputs.centralized_comparator_adapter,
        models=RunModels(agents, learners, parallel, backend, objective, (parts.schedule, parts.reward_source)),
        state=RunState(user_config.output_dir),
    )
    for part in (parts.schedule, parts.reward_source, objective):
        part.attach(run, inputs)
    return run


def prompt_table(dataset: Any, inputs: TrainerInputs, renderers: list[ChatRenderer], name: str) -> PromptTable:
    """The agents' first prompts of ``dataset``'s rows: formatted, or the environment's first
    observations (each row reset once here, every return checked before training), chat
    messages rendered by each agent's template."""
    num_agents = len(renderers)
    if inputs.environment is None:
        return PromptTable(dataset, inputs.formatters, num_agents, name, renderers=renderers)
    rows = list(dataset)
    starts = EnvironmentOnRows(inputs.environment, rows, renderers, name).start(range(len(rows)))
    first = [[s.observations[i] for s in starts] for i in range(num_agents)]
    return PromptTable(rows, None, num_agents, name, first, renderers)
