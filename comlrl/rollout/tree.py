"""Multi-turn rollouts as a tree, generated one turn (tree level) at a time.

Each dataset row is the root of a tree. At every node each agent samples G completions, the
joint actions (aligned: G, cross: G**N) are scored, and each joint action may start a child
node at the next turn, whose prompts ``external_transition`` writes from that joint action.
All nodes of one turn, over all rows of the step, are generated together: ONE ``generate``
call per agent per turn, however wide the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from comlrl.rewards.joint_reward import JointReward
from comlrl.rollout.generation import AgentRollout, join_rollouts
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.transition import Transition

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
        of each later turn in their order here and ``children`` pointing at them."""
        turns, nodes = [], list(roots)
        for turn in self.turns:
            if not nodes:
                break
            index = torch.tensor(nodes, dtype=torch.long)
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


def build_tree(
    prompts: PromptTable,
    row_ids: Sequence[int],
    generate: GenerateFn,
    reward: JointReward,
    joint_indices: Tensor,
    num_generations: int,
    num_turns: int = 1,
    transition: Transition | None = None,
    prompt_passthrough: bool = False,
    early_termination_threshold: float | None = None,
    written_prompts: bool = False,
) -> RolloutTree:
    """Sample, score and expand the rollout tree of ``row_ids`` turn by turn.

    Args:
        prompts: the dataset's rows and the agents' first-turn prompts.
        row_ids: the dataset rows of this step (one tree each).
        generate: every agent's ``num_generations`` completions of each of its prompts of a
            turn (``prompts[i]``: agent i's), as one rollout per agent.
        reward: scores joint actions, given agent 0's prompt of the turn and the dataset row of
            each; functions that ask for it get the turn and the histories.
        joint_indices: ``(J, N)`` sample of each agent in each joint action.
        num_generations: G.
        num_turns: depth of the tree.
        transition: writes the next turn's prompts; required when ``num_turns > 1``.
        prompt_passthrough: use the transition's prompts as they are, instead of formatting
            them (the ``prompt`` column of the row replaced by them) with each agent's formatter.
        early_termination_threshold: a node whose mean reward is above it is not expanded.
        written_prompts: at later turns, give the reward functions' ``prompts`` and the
            transition's ``prompt_history_per_agent`` the prompts as the transition wrote them,
            before the formatters, as comlrl 1.4.3's MAGRPO did (its actor-critic trainers gave
            the formatted prompts: False). The agents always read the formatted ones, and so do
            the reward context's histories.
    """
    if num_turns > 1 and transition is None:
        raise ValueError("num_turns > 1 needs an external_transition to write the next turns' prompts")
    num_agents = joint_indices.shape[1]
    num_joint = joint_indices.shape[0]
    rows = list(row_ids)
    turn_prompts = [prompts.agent_prompts(i, rows) for i in range(num_agents)]
    prompt_history = [[[turn_prompts[i][m]] for i in range(num_agents)] for m in range(len(rows))]
    # The histories the rewards and the transition see (see written_prompts); the first turn's are formatted.
    stated_history = [[list(prompts) for prompts in history] for history in prompt_history]
    response_history: list[list[list[str]]] = [[[] for _ in range(num_agents)] for _ in rows]
    turns: list[Turn] = []
    transition_calls = 0
    names: list[str] = []
    for number in range(1, num_turns + 1):
        agents = generate(turn_prompts)
        num_nodes = len(rows)
        # completions[i][m*J + j]: agent i's part of joint action j at node m
        sample = (torch.arange(num_nodes).unsqueeze(1) * num_generations).unsqueeze(2) + joint_indices  # (M, J, N)
        sample = sample.reshape(-1, num_agents).tolist()
        completions = [[agents[i].texts[s[i]] for s in sample] for i in range(num_agents)]
        joint_rows = [row for row in rows for _ in range(num_joint)]
        joint_nodes = [m for m in range(num_nodes) for _ in range(num_joint)]
        joint_responses = [
            [response_history[m][i] + [completions[i][k]] for i in range(num_agents)] for k, m in enumerate(joint_nodes)
        ]
        context = {
            "turn": number,
            "prompt_history_per_agent": [prompt_history[m] for m in joint_nodes],
            "response_history_per_agent": joint_responses,
        }
        # Agent 0's prompt of this turn, and the dataset row, of each joint action (the reward's ``prompts``).
        joint_prompts = [stated_history[m][0][-1] for m in joint_nodes]
        batch_items = [prompts.rows[row] for row in joint_rows]
        scored = reward(joint_prompts, completions, joint_rows, context, batch_items)
        names = scored.names
        shape = (num_nodes, num_joint, num_agents)
        rewards = scored.processed.reshape(shape)
        children = torch.full((num_nodes, num_joint), -1, dtype=torch.long)

        next_rows: list[int] = []
        next_texts: list[list[str]] = []
        next_prompt_history: list[list[list[str]]] = []
        next_stated_history: list[list[list[str]]] = []
        next_response_history: list[list[list[str]]] = []
        if number < num_turns:
            node_means = rewards.mean(dim=(1, 2)).tolist()
            for k, (m, row) in enumerate(zip(joint_nodes, joint_rows)):
                if early_termination_threshold is not None and node_means[m] > early_termination_threshold:
                    continue
                texts = transition(
                    turn=number,
                    row_id=row,
                    dataset=prompts.name,
                    row=prompts.rows[row],
                    prompt=prompts.rows[row].get("prompt", ""),  # "" for a dataset without the column
                    agent_completions=[completions[i][k] for i in range(num_agents)],
                    prompt_history_per_agent=stated_history[m],
                    response_history_per_agent=joint_responses[k],
                )
                transition_calls += 1
                if texts is None:
                    continue
                children[m, k % num_joint] = len(next_rows)
                next_rows.append(row)
                next_texts.append(texts)
                next_response_history.append(joint_responses[k])
                next_prompt_history.append(prompt_history[m])
                next_stated_history.append(stated_history[m])

        turns.append(
            Turn(
                number=number,
                rows=rows,
                prompts=turn_prompts,
                prompt_history=prompt_history,
                response_history=response_history,
                agents=agents,
                rewards=rewards,
                raw_rewards=scored.raw.reshape(shape),
                per_function_rewards=scored.per_function.reshape(-1, *shape),
                children=children,
            )
        )
        if not next_rows:
            break
        next_prompts = [
            [
                texts[i] if prompt_passthrough else prompts.format_turn(i, row, texts[i], number + 1)
                for row, texts in zip(next_rows, next_texts)
            ]
            for i in range(num_agents)
        ]
        rows, turn_prompts, response_history = next_rows, next_prompts, next_response_history
        prompt_history = [
            [history[i] + [next_prompts[i][m]] for i in range(num_agents)]
            for m, history in enumerate(next_prompt_history)
        ]
        stated = [[texts[i] for texts in next_texts] for i in range(num_agents)] if written_prompts else next_prompts
        stated_history = [
            [history[i] + [stated[i][m]] for i in range(num_agents)] for m, history in enumerate(next_stated_history)
        ]
    return RolloutTree(
        turns=turns,
        joint_indices=joint_indices,
        num_generations=num_generations,
        reward_names=names,
        transition_calls=transition_calls,
    )
