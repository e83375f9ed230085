"""Multi-turn rollouts as a tree, generated one turn (tree level) at a time.

Each dataset row is the root of a tree. At every node each agent samples G completions, the
joint actions (aligned: G, cross: G**N) are played in the environment
(:mod:`comlrl.environments`: scored, and given the next prompts), and each joint action may
start a child node at the next turn, from the prompts and state its step returned.
All nodes of one turn, over all rows of the step, are generated together: ONE ``generate``
call per agent per turn, however wide the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from comlrl.environments.base import JointActions, Proceed, TreeEnvironment
from comlrl.rollout.generation import AgentRollout, join_rollouts

GenerateFn = Callable[[list[list[str]]], list[AgentRollout]]
"""``generate(agent, prompts)``: G completions of each prompt by agent ``agent``, in one call."""


@dataclass
class Turn:
    """Every node of one turn, over all the rows of a step; M nodes, J joint actions each."""

    number: int
    """1 for the first turn."""
    rows: list[int]
    """``M`` dataset row of each node."""
    prompts: list[list[str]]
    """``[agent][node]`` the prompt each agent saw at each node."""
    prompt_history: list[list[list[str]]]
    """``[node][agent]`` the agent's prompts on this branch, turns 1 to this one."""
    response_history: list[list[list[str]]]
    """``[node][agent]`` the agent's responses on this branch before this turn."""
    agents: list[AgentRollout]
    """One per agent: ``M*G`` completions, node-major (row ``m*G + k`` is sample k at node m)."""
    rewards: Tensor
    """``(M, J, N)`` processed reward of each joint action, per agent."""
    raw_rewards: Tensor
    """``(M, J, N)`` the rewards before the processor."""
    per_function_rewards: Tensor
    """``(F, M, J, N)`` what each reward function returned."""
    children: Tensor
    """``(M, J)`` index of the node each joint action started at the next turn, -1 for none."""
    tool_calls: Tensor | None = None
    """``(N, M*G)`` tool calls each completion made (an environment's tools); None: no tools."""
    tool_errors: Tensor | None = None
    """``(N, M*G)`` of those, the calls whose result was an error."""

    @property
    def num_nodes(self) -> int:
        return len(self.rows)


@dataclass
class RolloutTree:
    """The turns of one step's rollout and what building them cost."""

    turns: list[Turn]
    joint_indices: Tensor
    """``(J, N)`` sample of each agent in each joint action (the same at every node)."""
    num_generations: int
    """G: samples per agent at each node."""
    reward_names: list[str]
    """F names of the reward functions, for logging."""
    transition_calls: int

    @property
    def generate_calls(self) -> int:
        """One batched call per agent and turn, however many nodes the turn holds."""
        return len(self.turns) * self.joint_indices.shape[1]

    def select_roots(self, roots: Sequence[int]) -> RolloutTree:
        """The tree of first-turn nodes ``roots`` (in that order) and their branches, the nodes
        of each later turn in their order here and ``children`` pointing at them;
        ``transition_calls`` stays this tree's (the calls that were made)."""
        turns, nodes = [], list(roots)
        for turn in self.turns:
            if not nodes:
                break
            index = torch.tensor(nodes, dtype=torch.long)
            samples = torch.tensor([m * self.num_generations + k for m in nodes for k in range(self.num_generations)])
            children = turn.children[index]
            kept = children[children >= 0]  # the next turn's nodes, in their order (build_tree numbers them so)
            renumber = torch.full((int(turn.children.max()) + 2,), -1, dtype=torch.long)
            renumber[kept] = torch.arange(len(kept))
            turns.append(
                Turn(
                    number=turn.number,
                    rows=[turn.rows[m] for m in nodes],
                    prompts=[[prompts[m] for m in nodes] for prompts in turn.prompts],
                    prompt_history=[turn.prompt_history[m] for m in nodes],
                    response_history=[turn.response_history[m] for m in nodes],
                    agents=[agent.select(nodes, self.num_generations) for agent in turn.agents],
                    rewards=turn.rewards[index],
                    raw_rewards=turn.raw_rewards[index],
                    per_function_rewards=turn.per_function_rewards[:, index],
                    children=torch.where(children >= 0, renumber[children.clamp(min=0)], -1),
                    tool_calls=None if turn.tool_calls is None else turn.tool_calls[:, samples],
                    tool_errors=None if turn.tool_errors is None else turn.tool_errors[:, samples],
                )
            )
            nodes = kept.tolist()
        return RolloutTree(turns, self.joint_indices, self.num_generations, self.reward_names, self.transition_calls)


def join_trees(trees: Sequence[RolloutTree]) -> RolloutTree:
    """The rollout trees of several row lists as the one tree of those rows in that order
    (each turn's nodes tree by tree, ``children`` shifted to match); ``transition_calls`` summed."""
    first = trees[0]
    turns = []
    for t in range(max(len(tree.turns) for tree in trees)):
        parts = [tree.turns[t] for tree in trees if len(tree.turns) > t]
        shifted, offset = [], 0
        for part in parts:  # a tree without turn t+1 has no children at turn t: offsets stay right
            shifted.append(torch.where(part.children >= 0, part.children + offset, -1))
            offset += int((part.children >= 0).sum())
        turns.append(
            Turn(
                number=parts[0].number,
                rows=[row for part in parts for row in part.rows],
                prompts=[[p for part in parts for p in part.prompts[i]] for i in range(len(parts[0].prompts))],
                prompt_history=[h for part in parts for h in part.prompt_history],
                response_history=[h for part in parts for h in part.response_history],
                agents=[join_rollouts([part.agents[i] for part in parts]) for i in range(len(parts[0].agents))],
                rewards=torch.cat([part.rewards for part in parts]),
                raw_rewards=torch.cat([part.raw_rewards for part in parts]),
                per_function_rewards=torch.cat([part.per_function_rewards for part in parts], dim=1),
                children=torch.cat(shifted),
                tool_calls=joined_counts([part.tool_calls for part in parts], parts),
                tool_errors=joined_counts([part.tool_errors for part in parts], parts),
            )
        )
    calls = sum(tree.transition_calls for tree in trees)
    return RolloutTree(turns, first.joint_indices, first.num_generations, first.reward_names, calls)


@dataclass(frozen=True)
class TreeSize:
    """The most a step's tree can hold (no branch ended early)."""

    nodes: int
    joint_actions: int
    generations: int
    """Completions sampled, all agents and turns together."""
    transition_calls: int


def tree_size(num_rows: int, num_agents: int, num_generations: int, num_joint: int, num_turns: int) -> TreeSize:
    """Worst-case size of a step's rollout tree: turn t (from 0) holds ``num_rows * J**t`` nodes."""
    nodes_per_row = sum(num_joint**t for t in range(num_turns))
    nodes = num_rows * nodes_per_row
    return TreeSize(
        nodes=nodes,
        joint_actions=nodes * num_joint,
        generations=nodes * num_agents * num_generations,
        transition_calls=num_rows * (nodes_per_row - 1),
    )


def check_tree_budget(
    num_rows: int, num_agents: int, num_generations: int, num_joint: int, num_turns: int, joint_mode: str, limit: int
) -> None:
    """Refuse a config whose rollout tree could sample more than ``limit`` completions per step,
    naming the numbers and the knobs that lower them."""
    size = tree_size(num_rows, num_agents, num_generations, num_joint, num_turns)
    if size.generations > limit:
        raise ValueError(
            f"this config's rollout tree samples up to {size.generations} completions per step "
            f"({size.nodes} nodes x {num_agents} agents x {num_generations} generations; {num_rows} rows, "
            f"{num_turns} turns, joint_mode={joint_mode!r} with {num_joint} joint actions per node), above "
            f"max_generations_per_step={limit}. Lower num_generations, num_turns or per_device_train_batch_size, "
            "use joint_mode='aligned', or raise max_generations_per_step"
        )


def joined_counts(counts: Sequence[Tensor | None], parts: Sequence[Turn]) -> Tensor | None:
    """Per-completion counts of turns joined one after the other (zeros for a part without)."""
    if all(count is None for count in counts):
        return None
    return torch.cat(
        [
            torch.zeros(len(part.agents), len(part.agents[0].texts)) if count is None else count
            for count, part in zip(counts, parts)
        ],
        dim=1,
    )


def build_tree(
    environment: TreeEnvironment,
    row_ids: Sequence[int],
    generate: GenerateFn,
    joint_indices: Tensor,
    num_generations: int,
    num_turns: int = 1,
    proceed: Proceed | None = None,
) -> RolloutTree:
    """Sample, score and expand the rollout tree of ``row_ids`` turn by turn.

    Args:
        environment: starts each row's episode and plays each turn's joint actions, batched
            over the tree level (the reward function and transition, or an environment).
        row_ids: the dataset rows of this step (one tree each).
        generate: every agent's ``num_generations`` completions of each of its prompts of a
            turn (``prompts[i]``: agent i's), as one rollout per agent.
        joint_indices: ``(J, N)`` sample of each agent in each joint action.
        num_generations: G.
        num_turns: depth of the tree.
        proceed: continues an agent's completions after its tools' results (an environment
            with tools): one continuation of each prompt given as token ids.
    """
    num_agents = joint_indices.shape[1]
    num_joint = joint_indices.shape[0]
    rows = list(row_ids)
    starts = environment.start(rows)
    states = [start.state for start in starts]
    turn_prompts = [[start.observations[i] for start in starts] for i in range(num_agents)]
    prompt_history = [[[turn_prompts[i][m]] for i in range(num_agents)] for m in range(len(rows))]
    response_history: list[list[list[str]]] = [[[] for _ in range(num_agents)] for _ in rows]
    turns: list[Turn] = []
    transition_calls = 0
    names: list[str] = []
    for number in range(1, num_turns + 1):
        acted = environment.act(generate(turn_prompts), states, num_generations, proceed or no_tools)
        agents = acted.rollouts
        num_nodes = len(rows)
        # completions[i][m*J + j]: agent i's part of joint action j at node m
        sample = (torch.arange(num_nodes).unsqueeze(1) * num_generations).unsqueeze(2) + joint_indices  # (M, J, N)
        sample = sample.reshape(-1, num_agents).tolist()
        actions = [[agents[i].texts[s[i]] for i in range(num_agents)] for s in sample]
        joint_nodes = [m for m in range(num_nodes) for _ in range(num_joint)]
        joint_responses = [
            [response_history[m][i] + [actions[k][i]] for i in range(num_agents)] for k, m in enumerate(joint_nodes)
        ]
        played = environment.play(
            JointActions(
                turn=number,
                row_ids=[rows[m] for m in joint_nodes],
                states=[states[m] for m in joint_nodes],
                actions=actions,
                nodes=joint_nodes,
                num_joint=num_joint,
                prompt_history=[prompt_history[m] for m in joint_nodes],
                response_history=joint_responses,
                last=number == num_turns,
            )
        )
        transition_calls += played.transition_calls
        names = played.rewards.names
        shape = (num_nodes, num_joint, num_agents)
        children = torch.full((num_nodes, num_joint), -1, dtype=torch.long)
        going_on = [(k, start) for k, start in enumerate(played.next) if start is not None]
        for child, (k, _) in enumerate(going_on):
            children[joint_nodes[k], k % num_joint] = child
        turns.append(
            Turn(
                number=number,
                rows=rows,
                prompts=turn_prompts,
                prompt_history=prompt_history,
                response_history=response_history,
                agents=agents,
                rewards=played.rewards.processed.reshape(shape),
                raw_rewards=played.rewards.raw.reshape(shape),
                per_function_rewards=played.rewards.per_function.reshape(-1, *shape),
                children=children,
                tool_calls=acted.tool_calls,
                tool_errors=acted.tool_errors,
            )
        )
        if not going_on:
            break
        rows = [rows[joint_nodes[k]] for k, _ in going_on]
        states = [start.state for _, start in going_on]
        turn_prompts = [[start.observations[i] for _, start in going_on] for i in range(num_agents)]
        prompt_history = [
            [prompt_history[joint_nodes[k]][i] + [start.observations[i]] for i in range(num_agents)]
            for k, start in going_on
        ]
        response_history = [joint_responses[k] for k, _ in going_on]
    return RolloutTree(
        turns=turns,
        joint_indices=joint_indices,
        num_generations=num_generations,
        reward_names=names,
        transition_calls=transition_calls,
    )


def no_tools(agent: int, prompts: list[list[int]]) -> AgentRollout:
    """The continuation of a tree built without a backend to continue with: none is wanted."""
    raise RuntimeError(f"agent {agent} called tools, but this rollout tree was built without a way to continue")
