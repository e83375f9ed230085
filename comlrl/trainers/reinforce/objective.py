"""MAGRPO's objective and its step: rollouts scored by the training reward, an advantage for
every sample, and the clipped policy-gradient loss over ``passes`` passes. One training step
reads top to bottom in :meth:`PolicyGradient.step`; the MAGRPO family's advantages are
:class:`GroupAdvantages`' (the actor-critic trainers give theirs from critics, on the same step).

    rows ─formatters─▶ prompts per agent ─generate─▶ G completions per prompt and agent
    ─joint actions─▶ reward_func ─reward_processor─▶ joint rewards (nodes, J)
    [multi-turn: ─external_transition─▶ next turn's prompts, one child node per joint action;
     the same again one turn (tree level) at a time]
    ─returns (r + discount * mean of the child's returns)─▶ credit per agent (N, nodes, G)
    ─group baseline per node─▶ advantages
    ─masked batched forwards (micro-batches)─▶ loss terms ─▶ one optimizer step per agent
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, NamedTuple

import torch

from comlrl.algorithms.advantages import batch_scaled
from comlrl.algorithms.filtering import flat_rows
from comlrl.algorithms.joint import per_agent_returns
from comlrl.algorithms.returns import (
    TreeAdvantages,
    function_credits,
    tree_advantages,
    tree_decoupled_advantages,
    tree_returns,
)
from comlrl.algorithms.shaping import overlong_penalty, penalized_rewards, sequence_kl
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import Objective
from comlrl.engine.policy_gradient_config import PolicyGradientConfig
from comlrl.engine.run import Run
from comlrl.engine.update import Estimate, FrozenLogprobs, PolicyUpdate, minibatch_count
from comlrl.metrics.hooks import rollout_samples
from comlrl.metrics.rollout import completion_samples, rollout_metrics
from comlrl.metrics.update import step_time_metrics
from comlrl.rollout.dynamic_sampling import DynamicSampling
from comlrl.rollout.tree import RolloutTree
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.utils import stats as metric_stats
from comlrl.utils.signatures import describe


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
    refill: DynamicSampling | None = None
    """Replaces each step's flat rows (the group objectives' ``dynamic_sampling``)."""

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

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        super().attach(run, inputs)
        self.update = PolicyUpdate(run.agents, run.learners, self.config, run.sampling, run.parallel, self.passes)

    def optimizer_steps_per_step(self) -> int:
        config = self.run.config
        return self.passes * minibatch_count(config.per_device_train_batch_size, config.train_batch_size)

    def step(self, row_ids: list[int], step_number: int) -> StepResult:
        """Sample, score and update every agent on this rank's dataset rows ``row_ids``."""
        run = self.run
        started = time.perf_counter()
        # The rollout tree: completions, each turn scored by the training reward as it is played.
        tree = run.rollout(run.train_prompts, row_ids, reward=run.train_reward)
        refill_metrics: dict[str, metric_stats.Stat] = {}
        if self.refill is not None:  # DAPO's dynamic sampling: flat rows replaced by rows played now
            tree, refill_metrics = self.refill(tree, step_number)
        generated = time.perf_counter()
        frozen = self.update.frozen(tree)  # sampling-time and reference log-probs, before any change
        # Per-agent reward shaping (KL to the reference, overlong completions), then returns,
        # credits and advantages.
        estimated, shaping_metrics = shaped_rewards(tree, frozen, self.config, run.sampling.max_new_tokens)
        estimate = self.estimate(estimated)
        stats = self.update(tree, estimate, frozen, step_number)  # losses, backward, optimizer steps
        # Once, after the last pass: nothing samples between the passes.
        run.sync_weights()
        updated = time.perf_counter()
        stats.update(rollout_metrics(tree, estimate.returns, estimate.credits, estimate.advantages))
        stats.update(shaping_metrics)
        stats.update(refill_metrics)
        if run.collaboration is not None:  # one model writing every role: its unsplittable answers
            stats.update(run.collaboration.parse_failure_stats(tree.turns[0], run.train_prompts))
        if run.metrics_callback.callback is not None:
            samples = rollout_samples(tree, estimate.credits, estimate.advantages, run.train_prompts)
            stats.update({key: metric_stats.mean(value, 1) for key, value in run.metrics_callback(samples).items()})
        generated_tokens = sum(agent.lengths.sum().item() for turn in tree.turns for agent in turn.agents)
        stats.update(step_time_metrics(started, generated, updated, generated_tokens))
        return StepResult(run.parallel.reduce_metrics(stats), tree, estimate.returns)

    def step_samples(self, result: StepResult, count: int) -> list[dict[str, Any]]:
        """The step's first ``count`` joint actions per turn."""
        return completion_samples(result.tree, result.returns, self.run.train_prompts, count)


class GroupAdvantages(PolicyGradient):
    """Each agent's sample is scored against the other samples of its group (same prompt,
    same agent): the MAGRPO family's objective, its baseline the config's ``advantage_mode``."""

    config: MAGRPOConfig
    reward_weights: tuple[float, ...] = ()
    """The training reward's weights, applied after each function's normalisation with
    ``normalize_then_sum`` (from :meth:`attach`)."""

    @property
    def discount(self) -> float:
        return self.config.discount

    @property
    def passes(self) -> int:
        return self.config.num_iterations

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        super().attach(run, inputs)
        if self.config.multi_objective_aggregation == "normalize_then_sum":
            reward = run.train_reward
            if reward is None:  # an environment's one reward
                self.reward_weights = (1.0,)
            elif reward.processor is not None:
                raise ValueError(
                    "multi_objective_aggregation='normalize_then_sum' (GDPO) normalises what each reward function "
                    f"returned; reward_processor {describe(reward.processor)} acts on their weighted sum only, so "
                    "it would be bypassed: drop reward_processor (fold it into the reward functions), or use "
                    "multi_objective_aggregation='sum_then_normalize'"
                )
            else:
                self.reward_weights = reward.weights
        if self.config.dynamic_sampling:
            self.refill = DynamicSampling(
                play=lambda rows: run.rollout(run.train_prompts, rows, reward=run.train_reward),
                is_flat=self.flat_rows,
                num_rows=len(run.train_prompts.rows),
                max_rounds=self.config.max_resample_rounds,
                seed=run.config.seed,
                rank=run.parallel.rank,
                most=run.parallel.most,
            )

    def flat_rows(self, tree: RolloutTree) -> torch.Tensor:
        """``(M_1,)`` bool: the rows of ``tree`` whose every group has one return in all its
        samples (:func:`~comlrl.algorithms.filtering.flat_rows`), in the task reward before
        any shaping and, with ``normalize_then_sum``, in each reward function's too."""
        children = [turn.children for turn in tree.turns]
        returns = tree_returns([turn.rewards for turn in tree.turns], children, self.discount)
        signals = [[per_agent_returns(r, tree.joint_indices, tree.num_generations) for r in returns]]
        if self.config.multi_objective_aggregation == "normalize_then_sum":
            per_function = [turn.per_function_rewards for turn in tree.turns]
            signals += function_credits(per_function, children, tree.joint_indices, tree.num_generations, self.discount)
        return flat_rows(signals, children)

    def estimate(self, tree: RolloutTree) -> TreeAdvantages:
        config = self.config
        rewards, children = [turn.rewards for turn in tree.turns], [turn.children for turn in tree.turns]
        if config.multi_objective_aggregation == "normalize_then_sum":  # GDPO: each function's own group std
            return tree_decoupled_advantages(
                rewards,
                [turn.per_function_rewards for turn in tree.turns],
                children,
                tree.joint_indices,
                config.num_generations,
                config.discount,
                config.advantage_mode,
                self.reward_weights,
                config.advantage_std_floor,
                config.num_turns,
                self.run.parallel.sum_values,
            )
        by_batch = config.advantage_normalization and config.scale_rewards == "batch"
        estimate = tree_advantages(
            rewards,
            children,
            tree.joint_indices,
            config.num_generations,
            config.discount,
            config.advantage_mode,
            config.advantage_normalization and not by_batch,
            std_floor=config.advantage_std_floor,
        )
        if not by_batch:
            return estimate
        scaled = batch_scaled(
            estimate.advantages,
            estimate.credits,
            config.advantage_std_floor,
            config.num_turns,
            self.run.parallel.sum_values,
        )
        return estimate._replace(advantages=scaled)


def shaped_rewards(
    tree: RolloutTree, frozen: FrozenLogprobs, config: PolicyGradientConfig, max_new_tokens: int
) -> tuple[RolloutTree, dict[str, metric_stats.Stat]]:
    """``tree`` with each agent's rewards lowered by ``reference_kl_coef`` times the KL of its
    completion to its frozen reference (``reference_kl_enabled``: KL as reward shaping) and by
    ``overlong_penalty_factor`` times DAPO's overlong penalty of its completion
    (``overlong_buffer``), and the penalties' metrics per turn; the tree given keeps the task
    rewards (logged as such). Without either, ``tree`` itself."""
    if not config.reference_kl_enabled and config.overlong_buffer is None:
        return tree, {}
    turns, metrics = [], {}
    for t, turn in enumerate(tree.turns):
        rewards, prefix = turn.rewards, f"turn_{turn.number}"
        if config.reference_kl_enabled:
            kls = [
                sequence_kl(frozen.sampling[i][t], frozen.reference[i][t], agent.own_mask.to(frozen.sampling[i][t]))
                for i, agent in enumerate(turn.agents)
            ]
            rewards = penalized_rewards(
                rewards, kls, tree.joint_indices, tree.num_generations, config.reference_kl_coef
            )
            all_kls = torch.cat([kl.cpu() for kl in kls])
            metrics[f"{prefix}/reference_kl_mean"] = metric_stats.mean_of(all_kls)
            metrics[f"{prefix}/reference_kl_penalty_mean"] = metric_stats.mean_of(config.reference_kl_coef * all_kls)
        if config.overlong_buffer is not None:
            penalties = [
                overlong_penalty(agent.lengths, max_new_tokens, config.overlong_buffer) for agent in turn.agents
            ]
            factor = config.overlong_penalty_factor
            rewards = penalized_rewards(rewards, penalties, tree.joint_indices, tree.num_generations, factor)
            metrics[f"{prefix}/overlong_penalty_mean"] = metric_stats.mean_of(factor * torch.cat(penalties).cpu())
        turns.append(dataclasses.replace(turn, rewards=rewards))
    return dataclasses.replace(tree, turns=turns), metrics
