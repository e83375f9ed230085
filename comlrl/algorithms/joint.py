"""Joint actions: which completion of each agent goes into each joint action, and how the
joint rewards are credited back to each agent's samples."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor


def aligned_indices(num_agents: int, num_generations: int) -> Tensor:
    """Joint action j pairs sample j of every agent: G joint actions."""
    return torch.arange(num_generations).unsqueeze(1).repeat(1, num_agents)


def cross_indices(num_agents: int, num_generations: int) -> Tensor:
    """The Cartesian product of the agents' samples: G**N joint actions, last agent fastest."""
    product = itertools.product(range(num_generations), repeat=num_agents)
    return torch.tensor(list(product), dtype=torch.long).reshape(-1, num_agents)


JOINT_MODES = {"aligned": aligned_indices, "cross": cross_indices}


def joint_action_indices(num_agents: int, num_generations: int, mode: str) -> Tensor:
    """``(J, N)`` long tensor: entry ``[j, i]`` is the sample of agent i in joint action j."""
    if mode not in JOINT_MODES:
        raise ValueError(f"joint_mode={mode!r}; expected one of {sorted(JOINT_MODES)}")
    return JOINT_MODES[mode](num_agents, num_generations)


def per_agent_returns(joint_rewards: Tensor, indices: Tensor, num_generations: int) -> Tensor:
    """Credit each agent's samples with the MEAN reward of the joint actions that contain them.

    Args:
        joint_rewards: ``(B, J)`` reward of joint action j for row b, shared by all agents, or
            ``(B, J, N)`` with one reward per agent (mixed cooperative settings).
        indices: ``(J, N)`` from :func:`joint_action_indices`.
        num_generations: G.

    Returns:
        ``(N, B, G)``: entry ``[i, b, k]`` is the mean of agent i's reward over the joint
        actions of row b in which agent i played its sample k. In aligned mode that is the
        joint reward itself; in cross mode it averages over the other agents' G**(N-1) samples.
    """
    num_rows, num_joint = joint_rewards.shape[:2]
    num_agents = indices.shape[1]
    if joint_rewards.dim() == 2:
        joint_rewards = joint_rewards.unsqueeze(-1).expand(num_rows, num_joint, num_agents)
    returns = joint_rewards.new_zeros(num_agents, num_rows, num_generations)
    counts = joint_rewards.new_zeros(num_agents, num_generations)
    ones = joint_rewards.new_ones(num_joint)
    for agent in range(num_agents):
        returns[agent].index_add_(1, indices[:, agent], joint_rewards[..., agent])
        counts[agent].index_add_(0, indices[:, agent], ones)
    return returns / counts.unsqueeze(1)
