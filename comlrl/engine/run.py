"""What a trainer's set-up builds (:func:`comlrl.engine.setup.build_run`): one frozen
:class:`Run` holding the collaborators every part works with (the agents, their learners, the
generation backend and the rollout, the data-parallel group, the prompts and the rewards), and
the one thing that changes as it trains, :class:`RunState`. Parts receive the run when the
trainer is built (their ``attach``) and keep what they use; no part sees the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from comlrl.engine.agents import Agents
from comlrl.engine.centralized import CentralizedCollaboration, CentralizedComparatorAdapter
from comlrl.engine.config import TrainerConfig
from comlrl.engine.distributed import DataParallel
from comlrl.engine.optim import Learners
from comlrl.engine.saving import RunModels
from comlrl.metrics.evaluation import EvalHooks
from comlrl.metrics.hooks import MetricsCallback
from comlrl.models.loading import ModelConfig
from comlrl.rewards import JointReward
from comlrl.rollout.backends import GenerationBackend, sync_every_agent
from comlrl.rollout.episodes import Rollout
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.transition import Transition


class RunState:
    """Where a run stands: its step count and the folder of its latest ``train()`` call."""

    def __init__(self, output_dir: str | None):
        self.global_step = 0
        """Training steps taken (a resumed run: counted from its first)."""
        self.output_dir = output_dir
        """The folder the latest ``train()`` call writes to (before the first: the config's)."""

    def advance(self) -> int:
        """One more step taken; returns the new count."""
        self.global_step += 1
        return self.global_step

    def resume_at(self, step: int) -> None:
        """The count of a checkpoint read back."""
        self.global_step = step

    def write_to(self, folder: str) -> None:
        """A ``train()`` call's folder."""
        self.output_dir = folder


@dataclass(frozen=True)
class RewardMaker:
    """Builds the :class:`~comlrl.rewards.JointReward` of a function for this run's agents,
    called as the run's objective calls rewards."""

    num_agents: int
    actor_critic_calls: bool
    """Per-joint-action functions get every agent's prompt and may return one value per agent
    (:class:`~comlrl.rewards.JointReward`'s ``actor_critic_calls``)."""

    def __call__(self, func: Any, processor: Any = None, weights: Any = None, call: str = "batch") -> JointReward:
        """``func`` (a reward function), processed by ``processor``, weighted by ``weights`` when
        it returns several terms, called as ``call`` says."""
        return JointReward(
            func, self.num_agents, processor, weights=weights, call=call, actor_critic_calls=self.actor_critic_calls
        )


@dataclass(frozen=True)
class Run:
    """A trainer's collaborators, built once by its set-up and fixed for its life."""

    config: TrainerConfig
    """The trainer's config as the user gave it (parts keep the one they build with)."""
    name: str
    """The algorithm's name: the progress bar's label, the default run folder's prefix."""
    agents: Agents
    """The trained models, their tokenizers, references and devices."""
    learners: Learners
    """Every optimizer and schedule: one per agent ("agent 0", ...), then the critics'."""
    parallel: DataParallel
    """The data-parallel group (one rank without torchrun)."""
    sampling: SamplingSpec
    """How completions are sampled, fixed for the run: generation, the log-probs' temperature
    and the loss's constants all read it."""
    backend: GenerationBackend
    """What samples the completions; weights are synced into it after every update."""
    rollout: Rollout
    """Plays rows out into rollout trees with ``backend``, scored by ``reward`` unless a call
    names another (training's: ``train_reward``)."""
    train_prompts: PromptTable
    """The training rows and each agent's first-turn prompts."""
    eval_prompts: PromptTable | None
    """The evaluation rows and prompts (None: no ``eval_dataset``)."""
    reward: JointReward | None
    """The task reward: scores evaluations (and, unless the reward source says otherwise,
    training); None where an environment scores."""
    train_reward: JointReward | None
    """What scores the training rollouts."""
    make_reward: RewardMaker
    """Builds a joint reward of another function for these agents (a reward model's)."""
    transition: Transition | None
    """Writes the next turn's prompts (multi-turn runs)."""
    joint_indices: torch.Tensor
    """``(J, N)`` sample of each agent in each joint action."""
    model_config: ModelConfig
    """How models and tokenizers loaded by name are loaded (critics, comparators, reward models)."""
    eval_hooks: EvalHooks
    """The ``eval_logger`` and ``eval_aggregator`` hooks (centralized: given each role's texts)."""
    metrics_callback: MetricsCallback
    """The ``metrics_callback`` hook, called as the objective describes its samples."""
    wandb_config: dict[str, Any] | None
    """W&B's settings (None: W&B off)."""
    collaboration: CentralizedCollaboration | None
    """One model writing every role: joins the roles' prompts and splits its answers (else None)."""
    comparator_adapter: CentralizedComparatorAdapter | None
    """With one model per agent: the adapter of a comparator that writes every agent's part."""
    models: RunModels
    """The trained models on disk: ``save_model``'s folders, and a checkpoint's."""
    state: RunState
    """Its step count and output folder."""

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def sync_weights(self) -> None:
        """Every agent's weights into the generation backend (after an update)."""
        sync_every_agent(self.backend, self.num_agents)
