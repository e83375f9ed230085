"""KL to a reference as reward shaping (comlrl 1.4.3's ``reference_kl``): each agent's
reward of a joint action loses ``coef`` times the KL of its own completion to a frozen copy
of the agent, before returns and advantages are computed. The loss-side alternative (a
per-token penalty in the loss, GRPO's ``beta``) is in :mod:`comlrl.algorithms.losses`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from comlrl.algorithms.losses import k3_kl


def sequence_kl(token_logps: Tensor, ref_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S,)`` KL of each completion to the reference: the sum of the per-token k3 estimate
    over its completion tokens (``mask``: 1 on them, 0 on padding)."""
    return (k3_kl(token_logps, ref_logps) * mask).sum(dim=-1)


def kl_shaped_rewards(
    rewards: Tensor, agent_kls: Sequence[Tensor], joint_indices: Tensor, num_generations: int, coef: float
) -> Tensor:
    """``(M, J, N)`` rewards minus ``coef`` times the KL of each agent's part of each joint action.

    Args:
        rewards: ``(M, J, N)`` rewards of J joint actions at M nodes, per agent.
        agent_kls: per agent, ``(M * G,)`` KL of each of its samples (node-major).
        joint_indices: ``(J, N)`` sample of each agent in each joint action.
        num_generations: G, the samples per node and agent.
        coef: the shaping weight.
    """
    num_nodes = rewards.shape[0]
    node_start = (torch.arange(num_nodes) * num_generations).unsqueeze(1)  # (M, 1)
    penalty = torch.stack(
        [kl.to(rewards.dtype).cpu()[node_start + joint_indices[:, i]] for i, kl in enumerate(agent_kls)], dim=-1
    )  # (M, J, N)
    return rewards - coef * penalty
