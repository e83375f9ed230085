"""Returns over a multi-turn rollout tree.

Turn t of a step holds M_t nodes; each node has J joint actions with a reward each, and a
joint action may have one child node at turn t+1 (the branch it started). The return of a
joint action is its reward plus the discounted mean return of its child's joint actions;
GAE's lambda-return mixes that mean with the critic's value of the child.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from torch import Tensor

from comlrl.algorithms.advantages import decoupled_advantages, group_advantages
from comlrl.algorithms.joint import per_agent_returns


def tree_lambda_returns(
    rewards: Sequence[Tensor], children: Sequence[Tensor], values: Sequence[Tensor], gamma: float, lam: float
) -> list[Tensor]:
    """GAE's lambda-return of every joint action, computed from the last turn back.

    ``G = r + gamma * ((1 - lam) * V(child) + lam * mean_j'(G of the child's j'))`` where the
    joint action started a child node, ``G = r`` where its branch stopped. ``G - V(node)`` is
    then exactly GAE's advantage, ``delta + gamma * lam * mean_j'(advantage of the child's j')``
    with ``delta = r + gamma * V(child) - V(node)``; ``lam = 1`` gives the Monte-Carlo return
    (:func:`tree_returns`), ``lam = 0`` the one-step TD target.

    Args:
        rewards: per turn, ``(M_t, J, N)`` reward of each joint action, per agent.
        children: per turn, ``(M_t, J)`` long index of the node at turn t+1 that the joint
            action started, -1 for none (last turn, early termination, or the environment
            ended the branch).
        values: per turn, ``(M_t, N)`` the critic's value of each node, per agent; with
            ``lam = 1`` they are multiplied by 0 and only their shape matters.
        gamma: discount of the next turn, in [0, 1].
        lam: GAE's lambda, in [0, 1].

    Returns:
        Per turn, ``(M_t, J, N)`` lambda-returns (the value targets).
    """
    if not (len(rewards) == len(children) == len(values)):
        raise ValueError(f"{len(rewards)} turns of rewards, {len(children)} of children, {len(values)} of values")
    returns: list[Tensor] = [None] * len(rewards)  # type: ignore[list-item]
    next_value = next_return = None  # (M_{t+1}, N)
    for t in reversed(range(len(rewards))):
        reward, child, value = rewards[t], children[t], values[t]
        if reward.dim() != 3 or child.shape != reward.shape[:2] or value.shape != (reward.shape[0], reward.shape[2]):
            raise ValueError(
                f"turn {t + 1}: rewards {tuple(reward.shape)}, children {tuple(child.shape)} and values "
                f"{tuple(value.shape)} do not fit (M, J, N), (M, J), (M, N)"
            )
        turn_return = reward.clone()
        has_child = child >= 0
        if has_child.any():
            if next_value is None:
                raise ValueError(f"turn {t + 1} has children but it is the last turn")
            nodes = child[has_child]
            bootstrap = (1 - lam) * next_value[nodes] + lam * next_return[nodes]
            turn_return[has_child] += gamma * bootstrap
        returns[t] = turn_return
        next_value, next_return = value, turn_return.mean(dim=1)
    return returns


def tree_returns(rewards: Sequence[Tensor], children: Sequence[Tensor], discount: float) -> list[Tensor]:
    """Monte-Carlo return of every joint action of every turn: :func:`tree_lambda_returns`
    with ``lam = 1``, so no critic value enters (zeros stand in for them).

    Args:
        rewards: one ``(M_t, J, N)`` tensor per turn: the reward of joint action j of node m
            for each of the N agents.
        children: one ``(M_t, J)`` long tensor per turn: the index of the node at turn t+1
            that joint action j of node m started, or -1 when the branch stopped there.
        discount: weight of the next turn's return, in [0, 1].

    Returns:
        One ``(M_t, J, N)`` tensor per turn: ``R = r + discount * mean_j'(R of the child's j')``
        where there is a child, ``R = r`` where there is none.
    """
    # (1 - 1) * 0 + 1 * R is R exactly, so these returns are bit-identical to a loop of their own.
    no_values = [reward.new_zeros(reward.shape[0], reward.shape[-1]) for reward in rewards]
    return tree_lambda_returns(rewards, children, no_values, discount, 1.0)


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
    std_floor: float = 1e-2,
) -> TreeAdvantages:
    """From the rewards of a rollout tree to each agent's group-relative advantages: returns
    over the tree (:func:`tree_returns`), credit per agent sample (:func:`per_agent_returns`),
    then a baseline per node and agent (:func:`group_advantages`, whose ``std_floor``, in the
    reward's unit, bounds the scale-up of a near-constant group at ``1 / std_floor``)."""
    returns = tree_returns(rewards, children, discount)
    credits = [per_agent_returns(r, joint_indices, num_generations) for r in returns]
    advantages = [
        [group_advantages(c[i], mode, normalize, std_floor).reshape(-1) for c in credits]
        for i in range(joint_indices.shape[1])
    ]
    return TreeAdvantages(returns, credits, advantages)


def function_credits(
    per_function_rewards: Sequence[Tensor],
    children: Sequence[Tensor],
    joint_indices: Tensor,
    num_generations: int,
    discount: float,
) -> list[list[Tensor]]:
    """Each reward function's own credits over a rollout tree: its unweighted rewards' returns
    (:func:`tree_returns`), credited to each agent's samples (:func:`per_agent_returns`).

    Args:
        per_function_rewards: per turn, ``(F, M_t, J, N)`` what each function returned.
        children: per turn, ``(M_t, J)`` the node each joint action started at turn t+1, -1 for none.
        joint_indices: ``(J, N)`` sample of each agent in each joint action.
        num_generations: G.
        discount: weight of the next turn's return, in [0, 1].

    Returns:
        ``[function][turn]`` ``(N, M_t, G)`` credits.
    """
    return [
        [
            per_agent_returns(r, joint_indices, num_generations)
            for r in tree_returns([turn[f] for turn in per_function_rewards], children, discount)
        ]
        for f in range(per_function_rewards[0].shape[0])
    ]


def tree_decoupled_advantages(
    rewards: Sequence[Tensor],
    per_function_rewards: Sequence[Tensor],
    children: Sequence[Tensor],
    joint_indices: Tensor,
    num_generations: int,
    discount: float,
    mode: str,
    weights: Sequence[float],
    std_floor: float = 1e-2,
    num_turns: int | None = None,
    totals: Callable[[list[float]], list[float]] | None = None,
) -> TreeAdvantages:
    """GDPO over a rollout tree: the returns and credits of the summed reward ``rewards`` (what is
    logged, as :func:`tree_advantages` gives them), and advantages from each function's own
    credits (:func:`function_credits` of ``per_function_rewards``, per turn ``(F, M_t, J, N)``,
    unweighted) through :func:`~comlrl.algorithms.advantages.decoupled_advantages` with the F
    ``weights``. Returns are linear in the rewards, so without a processor or shaping the
    weighted sum of the functions' returns is the summed reward's return."""
    if per_function_rewards[0].shape[0] != len(weights):
        raise ValueError(f"{per_function_rewards[0].shape[0]} reward functions' rewards for {len(weights)} weights")
    returns = tree_returns(rewards, children, discount)
    credits = [per_agent_returns(r, joint_indices, num_generations) for r in returns]
    per_function = function_credits(per_function_rewards, children, joint_indices, num_generations, discount)
    advantages = decoupled_advantages(per_function, weights, mode, std_floor, num_turns, totals)
    return TreeAdvantages(returns, credits, advantages)
