"""The user's metric hooks: ``metrics_callback`` (comlrl 1.4.3's: metrics of their own from
every agent sample of a training rollout), and the check every hook's output goes through.
The actor-critic trainers' callback gets :class:`ActorCriticSample` s, the shape of 1.4.3's
IAC and MAAC samples (:class:`ActorCriticCallback`)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl.algorithms import per_agent_returns
from comlrl.algorithms.returns import tree_returns
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree
from comlrl.utils.signatures import describe


@dataclass(frozen=True)
class RolloutSample:
    """One agent's completion at one node of a rollout tree, as comlrl 1.4.3's callback saw it."""

    agent_idx: int
    prompt: str
    """The prompt the agent saw."""
    completion: str
    reward: torch.Tensor
    """``(1,)`` the agent's reward (the mean over the joint actions its completion took part
    in); one-element tensors, as 1.4.3 gave them, so ``.item()`` and ``float()`` both work."""
    returns: torch.Tensor
    """``(1,)`` the return credited to the completion (what the advantage was computed from)."""
    advantage: torch.Tensor
    """``(1,)``."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """``turn_idx`` (0-based), ``generation_idx`` (the sample's index in its group), ``batch_item`` (the row)."""


def rollout_samples(
    tree: RolloutTree,
    credits: Sequence[torch.Tensor],
    advantages: Sequence[Sequence[torch.Tensor]],
    prompts: PromptTable,
) -> list[RolloutSample]:
    """Every agent sample of ``tree``, turn by turn, node by node, agent by agent."""
    samples = []
    group = tree.num_generations
    for t, turn in enumerate(tree.turns):
        rewards = per_agent_returns(turn.rewards, tree.joint_indices, group)  # (N, M, G)
        for m in range(turn.num_nodes):
            for i, agent in enumerate(turn.agents):
                for g in range(group):
                    samples.append(
                        RolloutSample(
                            agent_idx=i,
                            prompt=turn.prompts[i][m],
                            completion=agent.texts[m * group + g],
                            reward=rewards[i, m, g].reshape(1).float(),
                            returns=credits[t][i, m, g].reshape(1).float(),
                            advantage=advantages[i][t][m * group + g].reshape(1).float().cpu(),
                            metadata={"turn_idx": t, "generation_idx": g, "batch_item": prompts.rows[turn.rows[m]]},
                        )
                    )
    return samples


def evaluation_samples(
    tree: RolloutTree, discount: float, prompts: PromptTable, shape: SampleShape | None = None
) -> list[list[RolloutSample]]:
    """The samples of an evaluation tree (one sample per agent and turn), row by row; their
    ``returns`` are the episode's from that turn on, their ``advantage`` NaN (no baseline).
    ``shape(tree, samples)`` turns them into a trainer's sample class first."""
    returns = tree_returns([t.rewards for t in tree.turns], [t.children for t in tree.turns], discount)
    credits = [per_agent_returns(r, tree.joint_indices, tree.num_generations) for r in returns]
    nan = [torch.full((turn.num_nodes * tree.num_generations,), math.nan) for turn in tree.turns]
    samples = rollout_samples(tree, credits, [nan] * len(tree.turns[0].agents), prompts)
    by_row: dict[int, list[RolloutSample]] = {}
    for sample in samples if shape is None else shape(tree, samples):
        by_row.setdefault(id(sample.metadata["batch_item"]), []).append(sample)
    return list(by_row.values())


@dataclass(frozen=True, kw_only=True)
class ActorCriticSample(RolloutSample):
    """An IAC or MAAC agent sample with the fields of comlrl 1.4.3's actor-critic ``RolloutSample``.

    ``returns`` is the lambda-return credited to the sample (1.4.3's value target), ``advantage``
    ``returns - old_value`` before whitening, as 1.4.3 computed it. In ``evaluate()``, which
    computes no values or log-probs, ``old_value``, ``old_logprob`` and ``normalized_advantage``
    are NaN, as ``advantage`` is.
    """

    full_input_ids: torch.Tensor
    """``(prompt_len + response_len,)`` the prompt's tokens (without padding), then the completion's."""
    attention_mask: torch.Tensor
    """Ones over ``full_input_ids``, as 1.4.3's."""
    prompt_len: int
    response_len: int
    """Tokens generated, the EOS included (1.4.3 counted up to the first pad token)."""
    old_logprob: torch.Tensor
    """``(1,)`` the completion's summed log-prob under the agent as it sampled."""
    old_value: torch.Tensor
    """``(1,)`` the critic's value of the sample's node for this agent, what the advantage is
    measured from (for a Q-critic, the mean of the node's Q values, where 1.4.3 took the sample's own)."""
    normalized_advantage: torch.Tensor | None = None
    """``(1,)`` the advantage the policy loss used: whitened over the agent's samples of the step
    (``advantage_normalization``), else ``advantage``. 1.4.3 set it only after calling the
    callback, whose samples held None."""


@dataclass
class StepValues:
    """What a training step of an actor-critic trainer knew of its samples, ``[agent][turn]``."""

    node_values: list[torch.Tensor]
    """Per turn, ``(M, N)`` each node's value per agent."""
    old_logprobs: list[list[torch.Tensor]]
    """``(M * G,)`` each completion's summed log-prob as sampled."""
    advantages: list[list[torch.Tensor]]
    """``(M * G,)`` the advantages the policy loss used."""


SampleShape = Callable[[RolloutTree, list[RolloutSample]], list[RolloutSample]]
"""Turns a tree's samples, in :func:`rollout_samples`' order, into a trainer's sample class."""


def actor_critic_samples(
    tree: RolloutTree, samples: list[RolloutSample], values: StepValues | None
) -> list[ActorCriticSample]:
    """``samples`` (:func:`rollout_samples` of ``tree``, in its order) with 1.4.3's actor-critic
    fields; ``values`` None (an evaluation) leaves the value fields NaN."""
    nan = torch.full((1,), math.nan)
    shaped = []
    positions = (
        (t, m, i, g)
        for t, turn in enumerate(tree.turns)
        for m in range(turn.num_nodes)
        for i in range(len(turn.agents))
        for g in range(tree.num_generations)
    )
    for sample, (t, m, i, g) in zip(samples, positions, strict=True):
        agent, k = tree.turns[t].agents[i], m * tree.num_generations + g
        prompt = agent.prompt_ids[k][agent.prompt_mask[k].bool()].cpu()
        completion = agent.completion_ids[k][agent.completion_mask[k].bool()].cpu()
        ids = torch.cat([prompt, completion])
        fields = {spec.name: getattr(sample, spec.name) for spec in dataclasses.fields(RolloutSample)}
        if values is None:
            numbers = {"old_value": nan, "old_logprob": nan, "normalized_advantage": nan}
        else:
            old_value = values.node_values[t][m, i].reshape(1).float().cpu()
            numbers = {
                "old_value": old_value,
                "old_logprob": values.old_logprobs[i][t][k].reshape(1).float().cpu(),
                "normalized_advantage": values.advantages[i][t][k].reshape(1).float().cpu(),
                "advantage": sample.returns - old_value,
            }
        shaped.append(
            ActorCriticSample(
                **{**fields, **numbers},
                full_input_ids=ids,
                attention_mask=torch.ones_like(ids),
                prompt_len=len(prompt),
                response_len=len(completion),
            )
        )
    return shaped


class MetricsCallback:
    """Calls the user's ``metrics_callback(samples) -> dict`` and checks what it returns."""

    def __init__(self, callback: Callable[[list[RolloutSample]], dict[str, float]] | None):
        if callback is not None and not callable(callback):
            raise TypeError(f"metrics_callback must be callable, got {type(callback).__name__}")
        self.callback = callback

    def __call__(self, samples: list[RolloutSample]) -> dict[str, float]:
        """The callback on a training step's samples."""
        return {} if self.callback is None else self.run(samples)

    def run(self, samples: list[RolloutSample]) -> dict[str, float]:
        """The callback on ``samples``, its output checked."""
        source = f"metrics_callback {describe(self.callback)}"
        try:
            output = self.callback(samples)
        except Exception as error:
            raise RuntimeError(f"{source} raised {type(error).__name__}: {error}") from error
        return {} if output is None else checked_metrics(output, source)

    evaluation_shape: SampleShape | None = None
    """What evaluation samples are turned into before the callback sees them."""

    def evaluation(self, trees: list[RolloutTree], discount: float, prompts: PromptTable) -> dict[str, float]:
        """The callback on every evaluated row's samples, each metric averaged over the rows
        and logged as ``eval/<key>`` (as comlrl 1.4.3's actor-critic evaluation did)."""
        values: dict[str, list[float]] = {}
        for tree in trees:
            for samples in evaluation_samples(tree, discount, prompts, self.evaluation_shape):
                for key, value in self.run(samples).items():
                    values.setdefault(key, []).append(value)
        return {f"eval/{key}": sum(v) / len(v) for key, v in values.items()}


class ActorCriticCallback(MetricsCallback):
    """An actor-critic trainer's callback: it sees :class:`ActorCriticSample` s, built from the
    step's tree and :class:`StepValues` that its objective records in ``record`` (an object
    with ``step_tree`` and ``step_values``) before the update changes the agents."""

    def __init__(self, callback: Callable[[list[RolloutSample]], dict[str, float]], record: Any):
        super().__init__(callback)
        self.record = record

    def __call__(self, samples: list[RolloutSample]) -> dict[str, float]:
        return self.run(actor_critic_samples(self.record.step_tree, samples, self.record.step_values))

    def evaluation_shape(self, tree: RolloutTree, samples: list[RolloutSample]) -> list[RolloutSample]:  # type: ignore[override]
        return actor_critic_samples(tree, samples, None)


def checked_metrics(output: object, source: str, prefix: str = "", hint: str = "") -> dict[str, float]:
    """A hook's ``{name: number}`` output as floats under ``prefix``; anything else is an error
    that names the hook (``source``) and the metric, followed by ``hint``."""
    if not isinstance(output, dict):
        raise TypeError(f"{source} returned {type(output).__name__}; expected a dict of metric name -> number{hint}")
    metrics = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"{source} returned {value!r} for metric {key!r}; expected a finite number")
        metrics[f"{prefix}{key}"] = float(value)
    return metrics
