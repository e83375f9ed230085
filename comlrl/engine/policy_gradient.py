"""The policy-gradient objective, which the MAGRPO family and the actor-critic trainers share:
rollouts scored by the training reward, an advantage for every sample (the algorithm's
``estimate``), and the clipped policy-gradient loss over ``passes`` passes. One training step
reads top to bottom in :meth:`PolicyGradient.step`.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, NamedTuple

import torch

from comlrl.algorithms.shaping import kl_shaped_rewards, sequence_kl
from comlrl.engine.parts import Objective
from comlrl.engine.update import Estimate, FrozenLogprobs, PolicyUpdate, minibatch_count
from comlrl.metrics.hooks import rollout_samples
from comlrl.metrics.rollout import completion_samples, rollout_metrics
from comlrl.rollout.tree import RolloutTree
from comlrl.utils import stats as metric_stats


class StepResult(NamedTuple):
    """One training step: its metrics (over every rank's rows), its tree and returns (this rank's)."""

    metrics: dict[str, float]
    tree: RolloutTree
    returns: list[torch.Tensor]


class PolicyGradient(Objective):
    """Learns from rollouts of the dataset rows; subclasses give ``estimate`` (the advantages),
    ``discount`` and ``passes`` (optimizer steps per minibatch of a rollout), and may add an
    auxiliary loss to the update (a critic's)."""

    update: PolicyUpdate
    """The update: every learner's optimizer steps on one step's rollout tree."""

    @property
    def needs_reference(self) -> bool:
        """A frozen reference for the loss's KL term (``beta``) or the KL shaping of the rewards."""
        return self.config.beta > 0 or self.config.reference_kl_enabled

    @property
    def reference_devices(self) -> Any:
        return self.config.reference_devices

    @property
    @abc.abstractmethod
    def passes(self) -> int:
        """Passes each update makes over a step's rollout (one optimizer step per minibatch each)."""

    @abc.abstractmethod
    def estimate(self, tree: RolloutTree) -> Estimate:
        """The returns, per-agent credits and advantages of a step's rollout tree."""

    def attach(self, trainer: Any, inputs: Any) -> None:
        self.update = PolicyUpdate(
            trainer.agents, trainer.learners, self.config, trainer.sampling, trainer.parallel, self.passes
        )

    def optimizer_steps_per_step(self, trainer: Any) -> int:
        config = trainer.args
        return self.passes * minibatch_count(config.per_device_train_batch_size, config.train_batch_size)

    def step(self, trainer: Any, row_ids: list[int]) -> StepResult:
        """Sample, score and update every agent on this rank's dataset rows ``row_ids``."""
        started = time.perf_counter()
        # The rollout tree: completions, each turn scored by the training reward as it is played.
        tree = trainer.rollout(trainer.train_prompts, row_ids, reward=trainer.train_reward)
        generated = time.perf_counter()
        frozen = self.update.frozen(tree)  # sampling-time and reference log-probs, before any change
        estimated, shaping_metrics = (
            reference_kl_shaped(tree, frozen, self.config.reference_kl_coef)
            if self.config.reference_kl_enabled
            else (tree, {})
        )
        estimate = self.estimate(estimated)  # returns, credits and advantages
        stats = self.update(tree, estimate, frozen, trainer.global_step + 1)  # losses, backward, optimizer steps
        # Once, after the last pass: nothing samples between the passes.
        for i in range(trainer.num_agents):
            trainer.backend.sync_weights(i)
        updated = time.perf_counter()
        stats.update(rollout_metrics(tree, estimate.returns, estimate.credits, estimate.advantages))
        stats.update(shaping_metrics)
        if trainer.collaboration is not None:  # one model writing every role: its unsplittable answers
            stats.update(trainer.collaboration.parse_failure_stats(tree.turns[0], trainer.train_prompts))
        if trainer.metrics_callback.callback is not None:
            samples = rollout_samples(tree, estimate.credits, estimate.advantages, trainer.train_prompts)
            stats.update({key: metric_stats.mean(value, 1) for key, value in trainer.metrics_callback(samples).items()})
        generated_tokens = sum(agent.lengths.sum().item() for turn in tree.turns for agent in turn.agents)
        # Ranks work side by side: a step lasts as long as the slowest, their throughputs add.
        stats["time/generate_s"] = metric_stats.maximum(generated - started)
        stats["time/update_s"] = metric_stats.maximum(updated - generated)
        stats["time/step_s"] = metric_stats.maximum(updated - started)
        stats["time/generated_tokens_per_s"] = metric_stats.total(generated_tokens / max(generated - started, 1e-9))
        return StepResult(trainer.parallel.reduce_metrics(stats), tree, estimate.returns)

    def step_samples(self, trainer: Any, result: StepResult, count: int) -> list[dict[str, Any]]:
        """The step's first ``count`` joint actions per turn."""
        return completion_samples(result.tree, result.returns, trainer.train_prompts, count)


def reference_kl_shaped(
    tree: RolloutTree, frozen: FrozenLogprobs, coef: float
) -> tuple[RolloutTree, dict[str, metric_stats.Stat]]:
    """``tree`` with each agent's rewards lowered by ``coef`` times the KL of its completion to
    its frozen reference (``reference_kl_enabled``: KL as reward shaping), and the KL's metrics
    per turn; the tree itself keeps the task rewards (logged as such)."""
    turns, metrics = [], {}
    for t, turn in enumerate(tree.turns):
        kls = [
            sequence_kl(frozen.sampling[i][t], frozen.reference[i][t], agent.completion_mask.to(frozen.sampling[i][t]))
            for i, agent in enumerate(turn.agents)
        ]
        shaped = kl_shaped_rewards(turn.rewards, kls, tree.joint_indices, tree.num_generations, coef)
        turns.append(dataclasses.replace(turn, rewards=shaped))
        all_kls = torch.cat([kl.cpu() for kl in kls])
        metrics[f"turn_{turn.number}/reference_kl_mean"] = metric_stats.mean_of(all_kls)
        metrics[f"turn_{turn.number}/reference_kl_penalty_mean"] = metric_stats.mean_of(coef * all_kls)
    return dataclasses.replace(tree, turns=turns), metrics
