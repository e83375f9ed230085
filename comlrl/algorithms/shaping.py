"""Reward shaping per agent: each agent's reward of a joint action loses ``coef`` times a
penalty of its own completion, before returns and advantages are computed. The penalties: the
KL to a frozen copy of the agent (comlrl 1.4.3's ``reference_kl``; the loss-side alternative,
a per-token penalty in the loss, GRPO's ``beta``, is in :mod:`comlrl.algorithms.losses`), and
DAPO's soft overlong punishment of completions that near ``max_new_tokens``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from comlrl.algorithms.losses import k3_kl


def sequence_kl(token_logps: Tensor, ref_logps: Tensor, mask: Tensor) -> Tensor:
    """``(S,)`` KL of each completion to the reference: the sum of the per-token k3 estimate
    over its completion tokens (``mask``: 1 on them, 0 on padding)."""
    return (k3_kl(token_logps, ref_logps) * mask).sum(dim=-1)


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int) -> Tensor:
    """``(S,)`` DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), as a penalty in
    [0, 1]: 0 up to ``max_new_tokens - buffer`` tokens, then rising linearly to 1 at
    ``max_new_tokens`` (a completion cut there pays it in full).

    Args:
        lengths: ``(S,)`` generated tokens of each completion (EOS included).
        max_new_tokens: the sampling limit, DAPO's ``L_max``.
        buffer: DAPO's ``L_cache``, in [1, max_new_tokens].
    """
    start = max_new_tokens - buffer
    return ((lengths.double() - start) / buffer).clamp(min=0, max=1)


def penalized_rewards(
    rewards: Tensor, agent_penalties: Sequence[Tensor], joint_indices: Tensor, num_generations: int, coef: float
) -> Tensor:
    """``(M, J, N)`` rewards minus ``coef`` times the penalty of each agent's part of each joint action.

    Args:
        rewards: ``(M, J, N)`` rewards of J joint actions at M nodes, per agent.
        agent_penalties: per agent, ``(M * G,)`` penalty of each of its samples (node-major).
        joint_indices: ``(J, N)`` sample of each agent in each joint action.
        num_generations: G, the samples per node and agent.
        coef: the shaping weight.
    """
    num_nodes = rewards.shape[0]
    node_start = (torch.arange(num_nodes) * num_generations).unsqueeze(1)  # (M, 1)
    penalty = torch.stack(
        [p.to(rewards.dtype).cpu()[node_start + joint_indices[:, i]] for i, p in enumerate(agent_penalties)], dim=-1
    )  # (M, J, N)
    return rewards - coef * penalty
