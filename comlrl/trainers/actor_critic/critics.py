"""The critics of IAC and MAAC at work: what each critic reads and predicts (a layout), its
values at rollout time, and its clipped value loss in the update. How they are built from
the trainer's critic arguments: :mod:`~comlrl.trainers.actor_critic.critic_setup`.

IAC has one critic per agent reading that agent's prompt (and, for a Q-critic, its
completion); MAAC has one centralized critic reading every agent's prompt (and the joint
action), with one output per agent. The two differ only in the three functions of a
:class:`CriticLayout`; everything else is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from comlrl.algorithms.critic import clipped_value_loss
from comlrl.engine import sharding
from comlrl.engine.agents import Agents
from comlrl.engine.distributed import DataParallel
from comlrl.engine.update import learner_key, micro_batches, node_sequences
from comlrl.models.modes import frozen
from comlrl.models.value import Critic, EncodedInputs
from comlrl.rollout.tree import RolloutTree, Turn
from comlrl.utils import stats
from comlrl.utils.stats import Stat


@dataclass
class CriticEstimate:
    """Advantages of a step's rollout tree and what its critics learn from."""

    returns: list[Tensor]
    """Per turn, ``(M_t, J, N)`` discounted return of each joint action (logged)."""
    credits: list[Tensor]
    """Per turn, ``(N, M_t, G)`` lambda-return credited to each agent's sample."""
    advantages: list[list[Tensor]]
    """``[agent][turn]`` ``(M_t * G,)`` advantage of each sample."""
    inputs: list[list[EncodedInputs]]
    """``[critic][turn]`` the critic's tokenized inputs."""
    old_values: list[list[Tensor]]
    """``[critic][turn]`` ``(S, K)`` the critic's values at rollout time."""
    targets: list[list[Tensor]]
    """``[critic][turn]`` ``(S, K)`` what the critic learns to predict (lambda-returns)."""


def joint_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """A centralized critic's input: every agent's prompt, then (for a Q-critic) every agent's
    action, laid out as comlrl 1.4.3's MAAC did, so a critic it trained reads what it learnt on."""
    parts = [f"[Agent {i}] {prompt}" for i, prompt in enumerate(prompts)]
    if completions is not None:
        parts.append("[Joint Action]")
        parts += [f"[Agent {i} action]\n{completion}" for i, completion in enumerate(completions)]
    return "\n\n".join(parts)


class CriticLayout(Protocol):
    """What the critics of a trainer read and predict."""

    def texts(self, turn: Turn, joint_indices: Tensor) -> list[list[str]]:
        """``[critic][input]`` texts of one turn, in the order :meth:`node_values` reads them."""
        ...

    def node_values(self, values: list[Tensor], turn: Turn) -> Tensor:
        """``(M, N)`` value of each node, per agent, from each critic's ``(S, K)`` outputs."""
        ...

    def targets(self, lambda_returns: Tensor, credit: Tensor) -> list[Tensor]:
        """Per critic, ``(S, K)`` targets of its inputs, from the turn's ``(M, J, N)``
        lambda-returns and their ``(N, M, G)`` credit per agent sample."""
        ...


@dataclass
class IndependentCritics:
    """IAC: critic i reads agent i's prompt (``v``) or prompt and completion (``q``)."""

    num_agents: int
    critic_type: str

    def texts(self, turn: Turn, joint_indices: Tensor) -> list[list[str]]:
        if self.critic_type == "v":
            return [list(turn.prompts[i]) for i in range(self.num_agents)]
        group = turn.agents[0].completion_ids.shape[0] // turn.num_nodes
        return [
            [turn.prompts[i][k // group] + text for k, text in enumerate(turn.agents[i].texts)]
            for i in range(self.num_agents)
        ]

    def node_values(self, values: list[Tensor], turn: Turn) -> Tensor:
        return torch.stack([v[:, 0].reshape(turn.num_nodes, -1).mean(dim=1) for v in values], dim=1)

    def targets(self, lambda_returns: Tensor, credit: Tensor) -> list[Tensor]:
        if self.critic_type == "v":
            node_targets = lambda_returns.mean(dim=1)  # (M, N)
            return [node_targets[:, i : i + 1] for i in range(self.num_agents)]
        return [credit[i].reshape(-1, 1) for i in range(self.num_agents)]


@dataclass
class CentralizedCritic:
    """MAAC: one critic reads every agent's prompt (``v``) and each joint action (``q``), with
    one output per agent."""

    num_agents: int
    critic_type: str

    def texts(self, turn: Turn, joint_indices: Tensor) -> list[list[str]]:
        prompts = [[turn.prompts[i][m] for i in range(self.num_agents)] for m in range(turn.num_nodes)]
        if self.critic_type == "v":
            return [[joint_critic_text(p) for p in prompts]]
        group = turn.agents[0].completion_ids.shape[0] // turn.num_nodes
        return [
            [
                joint_critic_text(
                    prompts[m],
                    [turn.agents[i].texts[m * group + joint_indices[j, i].item()] for i in range(self.num_agents)],
                )
                for m in range(turn.num_nodes)
                for j in range(joint_indices.shape[0])
            ]
        ]

    def node_values(self, values: list[Tensor], turn: Turn) -> Tensor:
        return values[0].reshape(turn.num_nodes, -1, self.num_agents).mean(dim=1)

    def targets(self, lambda_returns: Tensor, credit: Tensor) -> list[Tensor]:
        if self.critic_type == "v":
            return [lambda_returns.mean(dim=1)]
        return [lambda_returns.reshape(-1, self.num_agents)]


def frozen_values(critic: Critic, agents: Agents, inputs: EncodedInputs, micro_batch_size: int | None) -> Tensor:
    """``(S, K)`` values of all ``inputs`` at rollout time: eval mode, no gradient (a value
    head on an agent with that agent's adapter active)."""
    context = agents.frozen(critic.agent) if critic.agent is not None else frozen(critic.backbone)
    with context:
        return torch.cat([critic.values(inputs, rows) for rows in micro_batches(len(inputs), micro_batch_size)])


class CriticLoss:
    """Each critic's clipped value loss in every pass of the update (an auxiliary loss of
    :class:`~comlrl.engine.update.PolicyUpdate`)."""

    def __init__(
        self,
        critics: Sequence[Critic],
        agents: Agents,
        parallel: DataParallel,
        value_clip_range: float | None,
        value_loss_coef: float,
        micro_batch_size: int | None,
    ):
        self.critics, self.agents, self.parallel = critics, agents, parallel
        self.value_clip_range = value_clip_range
        self.value_loss_coef = value_loss_coef
        self.micro_batch_size = micro_batch_size

    def backward(
        self, tree: RolloutTree, estimate: CriticEstimate, nodes: list[Tensor] | None = None
    ) -> dict[str, Stat]:
        """Each critic's value loss over the inputs of ``nodes`` (per turn, a minibatch's; None:
        all), accumulated micro-batch by micro-batch, normalised over every rank's inputs
        (summed gradients are the global batch's)."""
        metrics: dict[str, Stat] = {}
        for c, critic in enumerate(self.critics):
            key = learner_key(critic.name)
            if critic.agent is not None:
                self.agents.trainable(critic.agent)
            critic.backbone.train()
            selected = (
                [None] * len(tree.turns)
                if nodes is None
                else [  # a node's inputs are contiguous: one (V), or one per sample or joint action (Q)
                    node_sequences(turn_nodes, len(inputs) // turn.num_nodes)
                    for turn, turn_nodes, inputs in zip(tree.turns, nodes, estimate.inputs[c])
                ]
            )
            sizes = [len(inputs) if rows is None else len(rows) for inputs, rows in zip(estimate.inputs[c], selected)]
            local_count = sum(sizes)
            count = self.parallel.sum_values([local_count])[0]
            total = clipped = 0.0
            passes = sum(len(micro_batches(size, self.micro_batch_size)) for size in sizes)
            sharding.pad_passes(critic.backbone, passes, self.parallel.most)
            for inputs, old, targets, chosen, size in zip(
                estimate.inputs[c], estimate.old_values[c], estimate.targets[c], selected, sizes
            ):
                for piece in micro_batches(size, self.micro_batch_size):
                    rows = piece if chosen is None else chosen[piece]
                    values = critic.values(inputs, rows)
                    losses, was_clipped = clipped_value_loss(
                        values, old[rows].to(values.device), targets[rows].to(values.device), self.value_clip_range
                    )
                    (self.value_loss_coef * losses.sum() / count).backward()
                    total += losses.sum().item()
                    clipped += was_clipped.sum().item()
            old_values = torch.cat([v.reshape(-1) for v in estimate.old_values[c]])
            all_targets = torch.cat([t.reshape(-1) for t in estimate.targets[c]])
            metrics[f"{key}/value_loss"] = stats.mean(total, local_count)
            metrics[f"{key}/value_clip_fraction"] = stats.mean(clipped, local_count)
            metrics[f"{key}/value_mean"] = stats.mean_of(old_values)
            metrics[f"{key}/target_mean"] = stats.mean_of(all_targets)
            metrics[f"{key}/explained_variance"] = stats.explained_variance(old_values, all_targets)
        return metrics
