"""MAGRPO: several LLM agents trained together with group-relative policy gradients on a
shared (joint) reward.

One training step, as the code below reads:

    rows ─formatters─▶ prompts per agent ─generate─▶ G completions per prompt and agent
    ─joint actions─▶ reward_func ─reward_processor─▶ joint rewards (B, J)
    ─credit─▶ returns per agent (N, B, G) ─group baseline─▶ advantages
    ─masked batched forward─▶ policy-gradient loss ─▶ one optimizer step per agent
"""

from __future__ import annotations

import copy
import math
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from comlrl.algorithms import (
    PolicyLoss,
    group_advantages,
    joint_action_indices,
    per_agent_returns,
    policy_gradient_loss,
)
from comlrl.metrics import JsonlSink, MetricsLogger, WandbSink
from comlrl.models.forward import completion_logprobs
from comlrl.models.loading import check_agents, load_agents, resolve_tokenizers
from comlrl.optim import build_optimizers, build_schedulers, per_agent_learning_rates
from comlrl.rewards import JointReward
from comlrl.rollout import AgentRollout, generate_group
from comlrl.rollout.prompts import Formatter, PromptTable
from comlrl.trainers.reinforce.config import MAGRPOConfig

RewardFunction = Callable[..., Sequence[Any]]


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


@dataclass
class StepRollout:
    """Everything sampled and scored in one step."""

    agents: list[AgentRollout]
    """One rollout per agent, ``B*G`` completions each."""
    rewards: torch.Tensor
    """``(B, J, N)`` processed joint rewards, per agent (equal across agents for a shared reward)."""
    raw_rewards: torch.Tensor
    """``(B, J, N)`` joint rewards before the processor."""
    per_function_rewards: torch.Tensor
    """``(F, B, J, N)`` what each reward function returned, before weights and processor."""
    reward_names: list[str]
    """F names, one per reward function, for logging."""


class MAGRPOTrainer:
    """Multi-Agent Group Relative Policy Optimization.

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
            prompts when there is no such column. A list of such functions is summed with
            the config's ``reward_weights``.
        reward_processor: ``float -> float`` applied to each reward (see ``RewardProcessors``).
        formatters: maps a row to an agent's prompt; one callable for all agents or a list
            with one per agent. Default: the row's ``prompt`` column.
        args: the ``MAGRPOConfig``; defaults to ``MAGRPOConfig()``.
        model_config: ``from_pretrained`` keyword arguments used with ``agent_model``.
        wandb_config: turns on W&B logging: ``wandb.init`` arguments (``project``,
            ``entity``, ``name``, ...). Needs ``pip install 'comlrl[wandb]'``.
    """

    config_class = MAGRPOConfig
    """The config built when ``args`` is not given; variants only change this."""

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
        args: MAGRPOConfig | None = None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
    ):
        self.args = args if args is not None else self.config_class()
        if not isinstance(self.args, MAGRPOConfig):
            raise TypeError(f"args must be a MAGRPOConfig, got {type(self.args).__name__}")
        if agents is not None and agent_model is not None:
            raise ValueError("pass either agents or agent_model, not both")
        if agents is None and agent_model is None:
            raise ValueError("no agents: pass agents=[model, ...] or agent_model=<folder or hub id>")
        if reward_func is None:
            raise ValueError("reward_func is required")
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        if agents is None:
            agents = load_agents(agent_model, num_agents, model_config)
        self.agents = check_agents(agents)
        self.num_agents = len(self.agents)
        self.tokenizers = resolve_tokenizers(tokenizer, self.agents)
        self.reward = JointReward(reward_func, self.num_agents, reward_processor, weights=self.args.reward_weights)
        self.train_prompts = PromptTable(train_dataset, formatters, self.num_agents, "train_dataset")
        self.eval_prompts = (
            None if eval_dataset is None else PromptTable(eval_dataset, formatters, self.num_agents, "eval_dataset")
        )
        self.wandb_config = wandb_config
        self.joint_indices = joint_action_indices(self.num_agents, self.args.num_generations, self.args.joint_mode)
        learning_rates = per_agent_learning_rates(self.args.agent_learning_rate, self.num_agents)
        self.optimizers = build_optimizers(self.agents, learning_rates, self.args.weight_decay)
        total_optimizer_steps = self.args.num_train_epochs * self.steps_per_epoch * self.args.num_iterations
        self.schedulers = build_schedulers(
            self.optimizers, self.args.lr_scheduler_type, self.args.warmup_ratio, total_optimizer_steps
        )
        # A frozen copy of each agent as it was before training; only when the KL term is on.
        self.reference_agents = (
            [copy.deepcopy(agent).eval().requires_grad_(False) for agent in self.agents] if self.args.beta > 0 else []
        )
        self.global_step = 0

    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (the last batch of an epoch may hold fewer rows)."""
        return math.ceil(len(self.train_prompts) / self.args.per_device_train_batch_size)

    # ----------------------------------------------------------------------------------------
    # the training loop
    # ----------------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train every agent for ``num_train_epochs`` epochs; returns a ``TrainResult``."""
        args = self.args
        seed_everything(args.seed)
        data_order = torch.Generator().manual_seed(args.seed)
        num_rows = len(self.train_prompts)
        batch = args.per_device_train_batch_size
        logger = MetricsLogger(self._sinks())
        epoch_rewards, epoch_raw_rewards = [], []
        start = time.perf_counter()
        bar = tqdm(total=args.num_train_epochs * self.steps_per_epoch, desc="MAGRPO", unit="step", dynamic_ncols=True)
        try:
            for epoch in range(args.num_train_epochs):
                if args.shuffle:
                    order = torch.randperm(num_rows, generator=data_order).tolist()
                else:
                    order = list(range(num_rows))
                step_rewards, step_raw_rewards = [], []
                for first in range(0, num_rows, batch):
                    metrics = self.training_step(order[first : first + batch])
                    self.global_step += 1
                    step_rewards.append(metrics["reward/mean"])
                    step_raw_rewards.append(metrics["reward/raw_mean"])
                    logger.add(metrics)
                    bar.update(1)
                    bar.set_postfix(epoch=epoch + 1, reward=f"{metrics['reward/mean']:.3g}")
                    if self.global_step % args.logging_steps == 0:
                        bar.write(format_metrics(self.global_step, logger.flush(self.global_step)))
                epoch_rewards.append(sum(step_rewards) / len(step_rewards))
                epoch_raw_rewards.append(sum(step_raw_rewards) / len(step_raw_rewards))
            logger.flush(self.global_step)
        finally:
            bar.close()
            logger.close()
        return TrainResult(self.global_step, epoch_rewards, epoch_raw_rewards, time.perf_counter() - start)

    def training_step(self, row_ids: list[int]) -> dict[str, float]:
        """Sample, score and update every agent on the dataset rows ``row_ids``."""
        started = time.perf_counter()
        rollout = self.rollout(self.train_prompts, row_ids)
        generated = time.perf_counter()

        returns = per_agent_returns(rollout.rewards, self.joint_indices, self.args.num_generations)  # (N, B, G)
        advantages = [
            group_advantages(returns[i], self.args.advantage_mode, self.args.advantage_normalization).reshape(-1)
            for i in range(self.num_agents)
        ]  # N x (B*G,)
        metrics = self._update(rollout, advantages)
        updated = time.perf_counter()

        metrics.update(rollout_metrics(rollout, returns, advantages))
        generated_tokens = sum(agent.lengths.sum().item() for agent in rollout.agents)
        metrics["time/generate_s"] = generated - started
        metrics["time/update_s"] = updated - generated
        metrics["time/step_s"] = updated - started
        metrics["time/generated_tokens_per_s"] = generated_tokens / max(generated - started, 1e-9)
        return metrics

    def rollout(self, prompts: PromptTable, row_ids: list[int]) -> StepRollout:
        """Generate every agent's completions for ``row_ids`` and score the joint actions."""
        group = self.args.num_generations
        sampling = self.args.sampling_kwargs()
        agent_rollouts = [
            generate_group(agent, tok, prompts.agent_prompts(i, row_ids), group, sampling)
            for i, (agent, tok) in enumerate(zip(self.agents, self.tokenizers))
        ]
        # Joint action j of row b takes sample joint_indices[j, i] of agent i: flat index b*G + that.
        num_joint = self.joint_indices.shape[0]
        flat = (torch.arange(len(row_ids)).unsqueeze(1) * group).unsqueeze(2) + self.joint_indices  # (B, J, N)
        flat = flat.reshape(-1, self.num_agents)
        completions = [[r.texts[k] for k in flat[:, i].tolist()] for i, r in enumerate(agent_rollouts)]
        joint_rows = [row for row in row_ids for _ in range(num_joint)]
        scored = self.reward(prompts.reward_prompts(joint_rows), completions, joint_rows)
        shape = (len(row_ids), num_joint, self.num_agents)
        return StepRollout(
            agents=agent_rollouts,
            rewards=scored.processed.reshape(shape),
            raw_rewards=scored.raw.reshape(shape),
            per_function_rewards=scored.per_function.reshape(-1, *shape),
            reward_names=scored.names,
        )

    def _update(self, rollout: StepRollout, advantages: list[torch.Tensor]) -> dict[str, float]:
        """``num_iterations`` optimizer steps per agent on one rollout; returns their mean metrics."""
        args = self.args
        # Sampling-time log-probs are only needed when the policy moves between passes.
        old_logps = self._frozen_logprobs(self.agents, rollout) if args.num_iterations > 1 else None
        ref_logps = self._frozen_logprobs(self.reference_agents, rollout) if self.reference_agents else None
        history: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.num_iterations):
            outputs = [
                self._backward(
                    i,
                    rollout.agents[i],
                    advantages[i],
                    None if old_logps is None else old_logps[i],
                    None if ref_logps is None else ref_logps[i],
                )
                for i in range(self.num_agents)
            ]
            grad_norms = self._optimizer_steps([out.loss for out in outputs])
            for i, (out, norm) in enumerate(zip(outputs, grad_norms)):
                history[f"agent{i}/loss"].append(out.loss.item())
                history[f"agent{i}/grad_norm"].append(norm)
                if args.num_iterations > 1:
                    history[f"agent{i}/clip_fraction"].append(out.clip_fraction.item())
                if args.beta > 0:
                    history[f"agent{i}/kl"].append(out.kl.item())
        for i, optimizer in enumerate(self.optimizers):
            history[f"agent{i}/learning_rate"].append(optimizer.param_groups[0]["lr"])
        return {key: sum(values) / len(values) for key, values in history.items()}

    def _frozen_logprobs(self, models: list[torch.nn.Module], rollout: StepRollout) -> list[torch.Tensor]:
        """Each model's log-probs of its agent's completions, one batched pass, no gradient."""
        logps = []
        for model, agent_rollout in zip(models, rollout.agents):
            was_training = model.training
            model.eval()
            with torch.no_grad():
                logps.append(self._logprobs(model, agent_rollout))
            model.train(was_training)
        return logps

    def _logprobs(self, model: torch.nn.Module, rollout: AgentRollout) -> torch.Tensor:
        return completion_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=self.args.temperature,
        )

    def _backward(
        self,
        agent_index: int,
        rollout: AgentRollout,
        advantages: torch.Tensor,
        old_logps: torch.Tensor | None,
        ref_logps: torch.Tensor | None,
    ) -> PolicyLoss:
        """One batched masked forward and backward of agent ``agent_index``'s loss."""
        model = self.agents[agent_index]
        model.train()
        token_logps = self._logprobs(model, rollout)
        out = policy_gradient_loss(
            token_logps,
            advantages.to(token_logps.device),
            rollout.completion_mask,
            loss_type=self.args.loss_type,
            max_new_tokens=self.args.max_new_tokens,
            old_logps=old_logps,
            epsilon=self.args.epsilon,
            epsilon_high=self.args.epsilon_high,
            ref_logps=ref_logps,
            beta=self.args.beta,
        )
        self.optimizers[agent_index].zero_grad(set_to_none=True)
        out.loss.backward()
        return PolicyLoss(out.loss.detach(), out.clip_fraction, out.kl)

    def _optimizer_steps(self, losses: list[torch.Tensor]) -> list[float]:
        """Clip and apply every agent's gradient, or none: a non-finite loss or gradient stops
        training with an error before any weight changes in this step."""
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm is not None else math.inf
        grad_norms = []
        for i, (agent, loss) in enumerate(zip(self.agents, losses)):
            norm = torch.nn.utils.clip_grad_norm_(agent.parameters(), max_norm).item()
            if not (math.isfinite(loss.item()) and math.isfinite(norm)):
                for optimizer in self.optimizers:
                    optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"agent {i} has a non-finite loss ({loss.item()}) or gradient norm ({norm}) at step "
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
        """Mean joint reward on ``eval_dataset`` with the training sampling settings."""
        if self.eval_prompts is None:
            raise ValueError("evaluate() needs an eval_dataset: pass eval_dataset= to the trainer")
        batch = self.args.per_device_train_batch_size
        rows = list(range(len(self.eval_prompts)))
        rewards, raw = [], []
        for first in range(0, len(rows), batch):
            rollout = self.rollout(self.eval_prompts, rows[first : first + batch])
            rewards.append(rollout.rewards.reshape(-1))
            raw.append(rollout.raw_rewards.reshape(-1))
        return {
            "eval/reward_mean": torch.cat(rewards).mean().item(),
            "eval/raw_reward_mean": torch.cat(raw).mean().item(),
        }

    def save_model(self, output_dir: str) -> list[str]:
        """Write each agent (weights + tokenizer, Hugging Face format) to ``output_dir/agent_{i}``.

        Each folder is written under a temporary name and renamed, so an interrupted save
        never leaves a folder that looks complete. Returns the folders.
        """
        os.makedirs(output_dir, exist_ok=True)
        folders = []
        for i, (agent, tok) in enumerate(zip(self.agents, self.tokenizers)):
            final = os.path.join(output_dir, f"agent_{i}")
            partial = os.path.join(output_dir, f".agent_{i}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            agent.save_pretrained(partial)
            tok.save_pretrained(partial)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            folders.append(final)
        return folders

    def _sinks(self) -> list:
        sinks: list = [JsonlSink(os.path.join(self.args.output_dir, "metrics.jsonl"))]
        if self.wandb_config is not None:
            sinks.append(WandbSink(self.wandb_config, asdict(self.args)))
        return sinks


def _std(values: torch.Tensor) -> float:
    return values.std().item() if values.numel() > 1 else 0.0


def rollout_metrics(rollout: StepRollout, returns: torch.Tensor, advantages: list[torch.Tensor]) -> dict[str, float]:
    """What one step's samples look like: rewards (joint, per function, per agent), advantages,
    completion lengths, truncation and groups that carry no signal (all returns equal)."""
    metrics = {
        "reward/mean": rollout.rewards.mean().item(),
        "reward/std": _std(rollout.rewards),
        "reward/raw_mean": rollout.raw_rewards.mean().item(),
    }
    for name, values in zip(rollout.reward_names, rollout.per_function_rewards):
        metrics[f"reward/{name}/mean"] = values.mean().item()
        metrics[f"reward/{name}/std"] = _std(values)
    for i, agent in enumerate(rollout.agents):
        lengths = agent.lengths.float()
        metrics[f"agent{i}/reward_mean"] = rollout.rewards[..., i].mean().item()
        metrics[f"agent{i}/advantage_mean"] = advantages[i].mean().item()
        metrics[f"agent{i}/advantage_std"] = _std(advantages[i])
        metrics[f"agent{i}/zero_std_group_frac"] = (returns[i].std(dim=1) == 0).float().mean().item()
        metrics[f"agent{i}/completion_length"] = lengths.mean().item()
        metrics[f"agent{i}/completion_length_min"] = lengths.min().item()
        metrics[f"agent{i}/completion_length_max"] = lengths.max().item()
        metrics[f"agent{i}/truncated_frac"] = agent.truncated.float().mean().item()
    return metrics


def seed_everything(seed: int) -> None:
    """Seed every generator sampling can draw from."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def format_metrics(step: int, metrics: dict[str, float]) -> str:
    """A compact one-line view of the logged metrics for the console."""
    shown = ", ".join(f"{key}={value:.4g}" for key, value in metrics.items() if not key.startswith("time/"))
    return f"step {step}: {shown}"
