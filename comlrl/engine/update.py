"""One update: every learner's optimizer steps on one step's rollout tree.

    sampling-time log-probs (several optimizer steps, or KL shaping) and reference log-probs
        (beta > 0, or KL shaping), frozen: eval mode, no gradient (``frozen``, before the estimate)
    for each pass:
        for each minibatch (train_batch_size rows and their subtrees, shuffled; default: all):
            token weights (loss_type over each turn, turn_weighting across turns, all ranks' counts)
            zero every gradient
            per agent, micro-batch by micro-batch: log-probs (train mode) -> loss terms
                (:func:`~comlrl.algorithms.micro_batch_policy_terms`) -> backward
            auxiliary losses (critics) -> backward
            per learner: gradients summed over ranks -> clipped -> optimizer and schedule step

Modes are decided here and in :mod:`comlrl.models.modes`: frozen forwards run in eval mode,
the loss's forward in train mode, and dropout was turned off when the agents were built
(``disable_dropout``), so both modes compute the same function and the first pass's ratio
is exactly 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from comlrl.algorithms import PolicyObjective, SamplerCorrection, micro_batch_policy_terms, turn_token_weights
from comlrl.engine import sharding
from comlrl.engine.agents import Agents
from comlrl.engine.config import TrainerConfig
from comlrl.engine.distributed import DataParallel
from comlrl.engine.optim import Learners
from comlrl.metrics.update import UpdateTotals, agent_update_metrics
from comlrl.models.forward import completion_logprobs
from comlrl.models.placement import map_agents
from comlrl.rollout import AgentRollout
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.tree import RolloutTree
from comlrl.utils import stats
from comlrl.utils.stats import Stat


class Estimate(Protocol):
    """What a trainer's ``estimate`` gives for a step's rollout tree."""

    returns: list[Tensor]
    """Per turn, ``(M_t, J, N)`` return of each joint action, per agent (logged)."""
    credits: list[Tensor]
    """Per turn, ``(N, M_t, G)`` return credited to each agent's sample (logged)."""
    advantages: list[list[Tensor]]
    """``[agent][turn]`` ``(M_t * G,)`` advantage of each sample, node-major."""


class AuxiliaryLoss(Protocol):
    """Something else an update trains besides the policies (a critic)."""

    def backward(self, tree: RolloutTree, estimate: Estimate, nodes: list[Tensor] | None) -> dict[str, Stat]:
        """Its loss's backward over the minibatch ``nodes`` of the step (per turn; None: all),
        micro-batch by micro-batch; returns its metrics."""
        ...


Rows = slice | Tensor
"""Sequences of one agent at one turn: a slice, or a tensor of their indices."""


def micro_batches(count: int, size: int | None) -> list[slice]:
    """Rows of a batch of ``count`` sequences, ``size`` at a time (None: all at once)."""
    size = size or count
    return [slice(start, start + size) for start in range(0, count, size)]


def subtree_nodes(children: Sequence[Tensor], roots: Tensor) -> list[Tensor]:
    """Per turn, the sorted nodes of the subtrees of first-turn nodes ``roots``.

    Args:
        children: per turn, ``(M_t, J)`` index of the next-turn node each joint action led
            to, or -1 (the tree's ``Turn.children``).
        roots: first-turn nodes.
    """
    nodes = [roots.sort().values]
    for turn_children in children[:-1]:
        reached = turn_children[nodes[-1]].reshape(-1)
        nodes.append(reached[reached >= 0].sort().values)
    return nodes


def node_sequences(nodes: Tensor, per_node: int) -> Tensor:
    """Indices of the ``per_node`` entries of each of ``nodes`` in a node-major list (a
    rollout's G samples per node, a critic's inputs per node)."""
    return (nodes.unsqueeze(1) * per_node + torch.arange(per_node)).reshape(-1)


def minibatch_count(rows: int, train_batch_size: int | None) -> int:
    """Optimizer steps a pass takes over a rollout of ``rows`` rows."""
    return 1 if train_batch_size is None else math.ceil(rows / train_batch_size)


@dataclass
class FrozenLogprobs:
    """``[agent][turn]`` log-probs of a step's completions without gradient, taken once
    before anything changes the agents."""

    sampling: list[list[Tensor]] | None
    """Under each agent as it sampled: the ratio's denominator after the first optimizer step."""
    reference: list[list[Tensor]] | None
    """Under each agent's frozen reference: the KL penalty's and the KL shaping's."""


class PolicyUpdate:
    """``passes`` optimizer steps per learner on one rollout tree."""

    def __init__(
        self,
        agents: Agents,
        learners: Learners,
        args: TrainerConfig,
        sampling: SamplingSpec,
        parallel: DataParallel,
        passes: int,
    ):
        self.agents, self.learners, self.args = agents, learners, args
        self.sampling, self.parallel, self.passes = sampling, parallel, passes
        self.auxiliary: list[AuxiliaryLoss] = []
        self.objective = PolicyObjective(
            policy_loss=args.policy_loss,
            importance_sampling_level=args.importance_sampling_level,
            epsilon=args.epsilon,
            epsilon_high=args.epsilon_high,
            delta=args.delta,
            sapo_temperature_pos=args.sapo_temperature_pos,
            sapo_temperature_neg=args.sapo_temperature_neg,
        )
        cap = args.sampler_ratio_cap
        self.sampler_correction = (
            None if cap is None else SamplerCorrection(args.sampler_correction, cap, args.sampler_ratio_floor)
        )

    def frozen(self, tree: RolloutTree) -> FrozenLogprobs:
        """The log-probs this step's update and KL shaping need, before either changes anything."""
        args = self.args
        several_steps = self.passes > 1 or minibatch_count(len(tree.turns[0].rows), args.train_batch_size) > 1
        return FrozenLogprobs(
            sampling=self.frozen_logprobs(tree, reference=False)
            if several_steps or args.reference_kl_enabled
            else None,
            reference=self.frozen_logprobs(tree, reference=True)
            if args.beta > 0 or args.reference_kl_enabled
            else None,
        )

    def minibatches(self, tree: RolloutTree) -> list[list[Tensor] | None]:
        """Per optimizer step of a pass, the nodes of each turn it trains on (``None``: all):
        the first-turn nodes shuffled and cut into ``train_batch_size`` pieces, each with its subtrees."""
        roots = len(tree.turns[0].rows)
        if minibatch_count(roots, self.args.train_batch_size) == 1:
            return [None]
        children = [turn.children for turn in tree.turns]
        return [subtree_nodes(children, piece) for piece in torch.randperm(roots).split(self.args.train_batch_size)]

    def __call__(
        self, tree: RolloutTree, estimate: Estimate, frozen: FrozenLogprobs, step_number: int
    ) -> dict[str, Stat]:
        """Every pass over ``tree``, one optimizer step per minibatch; returns the metrics
        averaged over the optimizer steps."""
        reference = frozen.reference if self.args.beta > 0 else None
        history = []
        for _ in range(self.passes):
            batches = self.minibatches(tree)
            # One optimizer step in all: the policy is still the sampler's, the ratio 1.
            sampling = frozen.sampling if self.passes > 1 or len(batches) > 1 else None
            for nodes in batches:
                history.append(self.optimizer_step(tree, estimate, nodes, sampling, reference, step_number))
        metrics = stats.average(history)
        for name, rate in zip(self.learners.names, self.learners.learning_rates()):
            metrics[f"{learner_key(name)}/learning_rate"] = stats.same(rate)
        return metrics

    def optimizer_step(
        self,
        tree: RolloutTree,
        estimate: Estimate,
        nodes: list[Tensor] | None,
        old_logps: list[list[Tensor]] | None,
        ref_logps: list[list[Tensor]] | None,
        step_number: int,
    ) -> dict[str, Stat]:
        """One optimizer step of every learner on the minibatch ``nodes`` (per turn; None: the
        whole tree); returns its metrics."""
        sequences = None if nodes is None else [node_sequences(n, tree.num_generations) for n in nodes]

        def backward(i: int) -> dict[str, Stat]:
            return self.agent_backward(
                i,
                [turn.agents[i] for turn in tree.turns],
                estimate.advantages[i],
                self.token_weights(tree, i, sequences),
                None if old_logps is None else old_logps[i],
                None if ref_logps is None else ref_logps[i],
                sequences,
            )

        self.learners.zero_grad()
        metrics = {
            key: value for agent_metrics in map_agents(self.agents, backward) for key, value in agent_metrics.items()
        }
        for auxiliary in self.auxiliary:
            metrics.update(auxiliary.backward(tree, estimate, nodes))
        norms = self.learners.step(self.args.max_grad_norm, self.parallel.sum_gradients, step_number)
        metrics.update({f"{learner_key(name)}/grad_norm": stats.same(n) for name, n in zip(self.learners.names, norms)})
        return metrics

    def token_weights(self, tree: RolloutTree, agent: int, sequences: list[Tensor] | None = None) -> list[Tensor]:
        """Per turn, the token weight of each of ``agent``'s sequences (of a minibatch's
        ``sequences``, when given), normalised over every rank's sequences, so the
        micro-batches' losses (and ranks' gradients) add up to the loss of the whole batch.
        Turns no branch reached count as empty (every rank then passes ``num_turns`` turns,
        and the scale does not depend on where branches ended)."""
        lengths = [self.loss_mask(turn.agents[agent]).sum(dim=1) for turn in tree.turns]
        nodes = [turn.num_nodes for turn in tree.turns]
        if sequences is not None:
            lengths = [turn_lengths[rows] for turn_lengths, rows in zip(lengths, sequences)]
            nodes = [len(rows) // tree.num_generations for rows in sequences]
        missing = self.args.num_turns - len(lengths)
        weights = turn_token_weights(
            lengths + [lengths[0].new_zeros(0)] * missing,
            nodes + [0] * missing,
            tree.joint_indices.shape[0],
            self.args.loss_type,
            self.sampling.max_new_tokens,
            self.args.turn_weighting,
            self.parallel.sum_values,
        )
        return weights[: len(tree.turns)]

    def frozen_logprobs(self, tree: RolloutTree, reference: bool) -> list[list[Tensor]]:
        """``[agent][turn]`` log-probs of each agent's completions without gradient: under the
        agent as it is now, or under its frozen reference (its base model, for an adapter). They
        are computed where the model lives and returned on the agent's device, beside the
        loss's log-probs (a reference may live elsewhere: ``reference_devices``)."""

        def agent_logprobs(i: int) -> list[Tensor]:
            with self.agents.frozen(i, reference) as model:
                return [
                    torch.cat(
                        [self.logprobs(model, turn.agents[i], rows) for rows in self.micro_batches(turn.agents[i])]
                    ).to(self.agents.device(i))
                    for turn in tree.turns
                ]

        return map_agents(self.agents, agent_logprobs)

    def loss_mask(self, rollout: AgentRollout) -> Tensor:
        """``(S, T)`` bool: the completion tokens the loss counts: the agent's own
        (:attr:`~comlrl.rollout.generation.AgentRollout.own_mask`, no tool's result), and with
        ``mask_truncated_completions`` none of a completion cut at ``max_new_tokens``."""
        own = rollout.own_mask
        if not self.args.mask_truncated_completions:
            return own
        return own & ~rollout.truncated.to(own.device).unsqueeze(1)

    def micro_batches(self, rollout: AgentRollout) -> list[slice]:
        return micro_batches(len(rollout.texts), self.args.micro_batch_size)

    def logprobs(
        self, model: torch.nn.Module, rollout: AgentRollout, rows: Rows, with_entropy: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Log-probs (and entropies) of the completions ``rows`` at the sampling temperature,
        on ``model``'s device (the rollout's tensors are on the agent's)."""
        device = next(model.parameters()).device
        return completion_logprobs(
            model,
            rollout.prompt_ids[rows].to(device),
            rollout.prompt_mask[rows].to(device),
            rollout.completion_ids[rows].to(device),
            rollout.completion_mask[rows].to(device),
            temperature=self.sampling.temperature,
            with_entropy=with_entropy,
        )

    def agent_backward(
        self,
        agent: int,
        rollouts: Sequence[AgentRollout],
        advantages: Sequence[Tensor],
        weights: Sequence[Tensor],
        old_logps: Sequence[Tensor] | None,
        ref_logps: Sequence[Tensor] | None,
        sequences: Sequence[Tensor] | None = None,
    ) -> dict[str, Stat]:
        """Agent ``agent``'s loss over all its turns (one rollout, advantages and token weights
        per turn; with ``sequences``, only those of each turn, whose token weights ``weights``
        are), accumulated micro-batch by micro-batch; returns its metrics."""
        args = self.args
        model = self.agents.trainable(agent)
        with_entropy = args.entropy_coef > 0 or args.top_entropy_quantile < 1
        totals = UpdateTotals()
        passes = sum(len(micro_batches(len(turn_weights), args.micro_batch_size)) for turn_weights in weights)
        sharding.pad_passes(model, passes, self.parallel.most)
        for t, rollout in enumerate(rollouts):
            selected = None if sequences is None else sequences[t]
            loss_mask = self.loss_mask(rollout)
            for piece in micro_batches(len(weights[t]), args.micro_batch_size):
                rows = piece if selected is None else selected[piece]
                if with_entropy:
                    token_logps, token_entropy = self.logprobs(model, rollout, rows, with_entropy=True)
                else:
                    token_logps, token_entropy = self.logprobs(model, rollout, rows), None
                mask = loss_mask[rows]
                sampler = rollout.sampler_logprobs
                terms = micro_batch_policy_terms(
                    token_logps,
                    advantages[t][rows].to(token_logps.device),
                    mask,
                    weights[t][piece].to(token_logps.device),
                    old_logps=None if old_logps is None else old_logps[t][rows],
                    sampler_logps=None if sampler is None else sampler[rows].to(token_logps.device),
                    ref_logps=None if ref_logps is None else ref_logps[t][rows],
                    entropy=token_entropy,
                    objective=self.objective,
                    beta=args.beta,
                    entropy_coef=args.entropy_coef,
                    sampler_correction=self.sampler_correction,
                    top_entropy_quantile=args.top_entropy_quantile,
                )
                terms.loss.loss.backward()
                totals.add(terms, mask.sum().item())
        return agent_update_metrics(
            agent,
            totals,
            ratio=old_logps is not None,
            kl=args.beta > 0,
            entropy=with_entropy,
            correction=None if self.sampler_correction is None else self.sampler_correction.mode,
            entropy_quantile=args.top_entropy_quantile < 1,
        )


def learner_key(name: str) -> str:
    """A learner's metric prefix: "agent 0" -> "agent0"."""
    return name.replace(" ", "")
