"""Returns over a multi-turn rollout tree.

Turn t of a step holds M_t nodes; each node has J joint actions with a reward each, and a
joint action may have one child node at turn t+1 (the branch it started). The return of a
joint action is its reward plus the discounted mean return of its child's joint actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import Tensor

from comlrl.algorithms.advantages import group_advantages
from comlrl.algorithms.joint import per_agent_returns


def tree_returns(rewards: Sequence[Tensor], children: Sequence[Tensor], discount: float) -> list[Tensor]:
    """Return of every joint action of every turn, computed from the last turn back.

    Args:
        rewards: one ``(M_t, J, N)`` tensor per turn: the reward of joint action j of node m
            for each of the N agents.
        children: one ``(M_t, J)`` long tensor per turn: the index of the node at turn t+1
            that joint action j of node m started, or -1 when the branch stopped there (last
            turn, early termination, or the environment ended it).
        discount: weight of the next turn's return, in [0, 1].

    Returns:
        One ``(M_t, J, N)`` tensor per turn: ``R = r + discount * mean_j'(R of the child's j')``
        where there is a child, ``R = r`` where there is none.
    """
    if len(rewards) != len(children):
        raise ValueError(f"{len(rewards)} turns of rewards but {len(children)} turns of children")
    returns: list[Tensor] = [None] * len(rewards)  # type: ignore[list-item]
    next_value = None  # (M_{t+1}, N): mean return over each child node's joint actions
    for t in reversed(range(len(rewards))):
        reward, child = rewards[t], children[t]
        if child.shape != reward.shape[:2]:
            raise ValueError(f"turn {t + 1}: children {tuple(child.shape)} do not match rewards {tuple(reward.shape)}")
        turn_return = reward.clone()
        has_child = child >= 0
        if has_child.any():
            if next_value is None:
                raise ValueError(f"turn {t + 1} has children but it is the last turn")
            turn_return[has_child] += discount * next_value[child[has_child]]
        returns[t] = turn_return
        next_value = turn_return.mean(dim=1)
    return returns


class TreeAdvantages(NamedTuple):
    """Returns and advantages of every turn of a rollout tree."""

    returns: list[Tensor]
    """Per turn, ``(M_t, J, N)`` return of each joint action, per agent."""
    credits: list[Tensor]
    """Per turn, ``(N, M_t, G)`` return credited to each agent's sample (mean over the joint
    actions that contain it)."""
    advantages: list[list[Tensor]]
    """``[agent][turn]`` ``(M_t * G,)`` advantage of each sample, node-major; each node's G
    samples of an agent form one group."""


def tree_advantages(
    rewards: Sequence[Tensor],
    children: Sequence[Tensor],
    joint_indices: Tensor,
    num_generations: int,
    discount: float,
    mode: str,
    normalize: bool,
) -> TreeAdvantages:
    """From the rewards of a rollout tree to each agent's group-relative advantages: returns
    over the tree (:func:`tree_returns`), credit per agent sample (:func:`per_agent_returns`),
    then a baseline per node and agent (:func:`group_advantages`)."""
    returns = tree_returns(rewards, children, discount)
    credits = [per_agent_returns(r, joint_indices, num_generations) for r in returns]
    advantages = [
        [group_advantages(c[i], mode, normalize).reshape(-1) for c in credits] for i in range(joint_indices.shape[1])
    ]
    return TreeAdvantages(returns, credits, advantages)
