"""Preference pairs from the agents' own samples: which candidates beat which, which pairs a
prompt keeps, what a pair holds, and pairs as padded token batches. Pure functions of rewards
and sampled tokens; no models.

    N candidates per prompt (candidate j: every agent's sample j), one joint reward each
    ─every ordered (winner, loser) with a strictly higher reward (ties dropped)─▶
    ─pair_selection order, at most preference_pairs_per_sample─▶ PreferencePair records

Against a comparator policy (MADPOIter), candidate j of the current policy meets only
candidate j of the comparator (:func:`comparison_pairs`), as in comlrl 1.4.3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from comlrl.rollout import AgentRollout


def by_reward_gap(gaps: Tensor, comparator_rewards: Tensor | None, generator: torch.Generator) -> Tensor:
    """Largest gap first; a stable sort keeps equal gaps in index order."""
    return torch.sort(gaps, descending=True, stable=True).indices


def shuffled(gaps: Tensor, comparator_rewards: Tensor | None, generator: torch.Generator) -> Tensor:
    """A random order drawn from ``generator``."""
    return torch.randperm(len(gaps), generator=generator)


def in_index_order(gaps: Tensor, comparator_rewards: Tensor | None, generator: torch.Generator) -> Tensor:
    """(winner, loser) index order."""
    return torch.arange(len(gaps))


def by_comparator_reward(gaps: Tensor, comparator_rewards: Tensor | None, generator: torch.Generator) -> Tensor:
    """Highest comparator reward first, then largest gap, then index order (comlrl 1.4.3's
    ``comparator_reward``): a pair that beats a strong comparator sample, or loses to one, is
    kept first. Two stable sorts: by the second key, then by the first."""
    by_gap = torch.sort(gaps, descending=True, stable=True).indices
    return by_gap[torch.sort(comparator_rewards[by_gap], descending=True, stable=True).indices]


PairOrder = Callable[[Tensor, Tensor | None, torch.Generator], Tensor]
"""``(gaps (P,), comparator_rewards (P,) or None, generator) -> (P,)`` the order in which a
prompt's pairs are kept; ``comparator_rewards`` (the comparator side's reward of each pair)
exists only for pairs against a comparator policy."""

PAIR_SELECTIONS: dict[str, PairOrder] = {
    "reward_gap": by_reward_gap,
    "random": shuffled,
    "all": in_index_order,
}
"""``pair_selection`` -> the order in which a prompt's pairs (within one policy's candidates) are kept."""

COMPARISON_SELECTIONS: dict[str, PairOrder] = {**PAIR_SELECTIONS, "comparator_reward": by_comparator_reward}
"""``pair_selection`` -> the order in which a prompt's pairs against a comparator are kept."""


def shared_rewards(rewards: Tensor, rows: Sequence[int]) -> Tensor:
    """``(M, N, K) -> (M, N)``: the joint reward of each of the N candidates of M prompts,
    which the K agents must share (one reward cannot rank joint actions for agents that each
    get their own). ``rows`` name the prompts' dataset rows in the error."""
    differ = (rewards != rewards[..., :1]).any(dim=-1).nonzero()
    if len(differ):
        node, candidate = differ[0].tolist()
        raise ValueError(
            f"reward_func gave the agents different rewards {rewards[node, candidate].tolist()} for candidate "
            f"{candidate} of dataset row {rows[node]}: MADPO ranks joint actions by one reward shared by every "
            "agent; return one number per joint action"
        )
    return rewards[..., 0]


def select_pairs(
    rewards: Sequence[float] | Tensor, selection: str, limit: int | None, generator: torch.Generator
) -> Tensor:
    """``(P, 2)`` (winner, loser) candidate indices of one prompt's kept pairs.

    Every ordered pair whose winner's reward is STRICTLY higher is a candidate pair (ties and
    self-pairs are dropped; a candidate may appear in several pairs); they are ordered by
    ``PAIR_SELECTIONS[selection]`` and the first ``limit`` kept (None: all).

    Args:
        rewards: ``(N,)`` joint reward of each candidate.
        selection: a key of ``PAIR_SELECTIONS``.
        limit: most pairs kept, or None.
        generator: draws ``random``'s order.
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection={selection!r}; expected one of {sorted(PAIR_SELECTIONS)}")
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    wins = (rewards.unsqueeze(1) > rewards.unsqueeze(0)).nonzero()  # (Q, 2), row-major: index order
    gaps = rewards[wins[:, 0]] - rewards[wins[:, 1]]
    return wins[PAIR_SELECTIONS[selection](gaps, None, generator)][:limit]


def comparison_pairs(
    current_rewards: Sequence[float] | Tensor,
    comparator_rewards: Sequence[float] | Tensor,
    selection: str,
    limit: int | None,
    generator: torch.Generator,
) -> Tensor:
    """``(P, 2)`` rows ``(j, current_won)`` of one prompt's kept pairs against a comparator.

    Current candidate j meets comparator candidate j only, for ``j < min(N, M)``; the STRICTLY
    better one wins and ties are dropped. The pairs are ordered by
    ``COMPARISON_SELECTIONS[selection]`` and the first ``limit`` kept (None: all).

    Args:
        current_rewards: ``(N,)`` joint reward of each current candidate.
        comparator_rewards: ``(M,)`` joint reward of each comparator candidate.
        selection: a key of ``COMPARISON_SELECTIONS``.
        limit: most pairs kept, or None.
        generator: draws ``random``'s order.
    """
    if selection not in COMPARISON_SELECTIONS:
        raise ValueError(f"pair_selection={selection!r}; expected one of {sorted(COMPARISON_SELECTIONS)}")
    current = torch.as_tensor(current_rewards, dtype=torch.float64)
    comparator = torch.as_tensor(comparator_rewards, dtype=torch.float64)
    met = min(len(current), len(comparator))
    margins = current[:met] - comparator[:met]
    decided = margins.nonzero().squeeze(1)  # ties dropped; index order
    order = COMPARISON_SELECTIONS[selection](margins[decided].abs(), comparator[decided], generator)
    kept = decided[order][:limit]
    return torch.stack([kept, (margins[kept] > 0).long()], dim=1)


@dataclass(frozen=True)
class PreferencePair:
    """One prompt's joint action that beat another: every agent's part of both, as sampled."""

    row: int
    """The dataset row."""
    prompts: list[str]
    """Each agent's prompt."""
    prompt_ids: list[Tensor]
    """Each agent's prompt tokens as the agent saw them (no padding)."""
    chosen_ids: list[Tensor]
    """Each agent's completion in the winning joint action: its tokens as sampled, EOS
    included (never re-tokenized from text), no padding."""
    rejected_ids: list[Tensor]
    """Each agent's completion in the losing joint action, likewise."""
    chosen_texts: list[str]
    """Each agent's winning completion as text (for reading)."""
    rejected_texts: list[str]
    """Each agent's losing completion as text."""
    chosen_reward: float
    """The winning joint action's (processed) reward."""
    rejected_reward: float
    """The losing joint action's reward, strictly lower."""
    reference_deltas: list[float] | None = None
    """Each agent's margin (chosen minus rejected log-prob) under the policy that sampled the
    pair, when the DPO loss has that reference; None: reference-free."""
    target_raw_reward: float | None = None
    """Against a comparator (MADPOIter, MARLHFIter): the current policy's joint action's
    reward before ``reward_processor``, winner or loser (comlrl 1.4.3's field, which its
    reward histograms count); None in pairs within one policy's candidates."""
    comparator_raw_reward: float | None = None
    """The comparator's joint action's reward before ``reward_processor``, likewise."""


def unpadded(ids: Tensor, mask: Tensor) -> Tensor:
    """The tokens of one padded row that ``mask`` marks, on the CPU."""
    return ids[mask.bool()].cpu()


class JointAction(NamedTuple):
    """One candidate of one prompt: every agent's part as sampled, and its joint reward."""

    prompt_ids: list[Tensor]
    """Each agent's prompt tokens (no padding)."""
    completion_ids: list[Tensor]
    """Each agent's completion tokens as sampled, EOS included, no padding."""
    texts: list[str]
    """Each agent's completion as text."""
    reward: float
    """The joint reward."""


def joint_action(rollouts: Sequence[AgentRollout], index: int, reward: float | Tensor) -> JointAction:
    """Row ``index`` of every agent's rollout, unpadded and on the CPU, with its joint ``reward``."""
    return JointAction(
        [unpadded(r.prompt_ids[index], r.prompt_mask[index]) for r in rollouts],
        [unpadded(r.completion_ids[index], r.completion_mask[index]) for r in rollouts],
        [r.texts[index] for r in rollouts],
        float(reward),
    )


def preference_pair(row: int, prompts: Sequence[str], chosen: JointAction, rejected: JointAction) -> PreferencePair:
    """The record of ``chosen`` beating ``rejected`` at dataset row ``row`` (each agent's ``prompts``)."""
    return PreferencePair(
        row=row,
        prompts=list(prompts),
        prompt_ids=chosen.prompt_ids,
        chosen_ids=chosen.completion_ids,
        rejected_ids=rejected.completion_ids,
        chosen_texts=chosen.texts,
        rejected_texts=rejected.texts,
        chosen_reward=chosen.reward,
        rejected_reward=rejected.reward,
    )


def node_pairs(
    row: int,
    prompts: Sequence[str],
    rollouts: Sequence[AgentRollout],
    first: int,
    ranked: Tensor,
    rewards: Tensor,
) -> list[PreferencePair]:
    """The pairs ``ranked`` of one prompt as records.

    Args:
        row: the prompt's dataset row.
        prompts: each agent's prompt.
        rollouts: each agent's rollout; its rows ``first + j`` hold candidate j.
        first: the prompt's first row in the rollouts.
        ranked: ``(P, 2)`` (winner, loser) candidate indices (:func:`select_pairs`).
        rewards: ``(N,)`` joint reward of each candidate.
    """
    return [
        preference_pair(
            row,
            prompts,
            joint_action(rollouts, first + winner, rewards[winner]),
            joint_action(rollouts, first + loser, rewards[loser]),
        )
        for winner, loser in ranked.tolist()
    ]


def pair_statistics(candidate_rewards: Tensor, pairs: Sequence[PreferencePair]) -> dict[str, float]:
    """What pair building found, from ``(rows, N)`` candidate rewards and the pairs kept: the
    pair count, rows with no pair (all their candidates tied), the mean reward gap of the kept
    pairs and the candidates' mean reward."""
    tied = candidate_rewards.amax(dim=1) == candidate_rewards.amin(dim=1)
    gaps = [pair.chosen_reward - pair.rejected_reward for pair in pairs]
    return {
        "preference/num_pairs": float(len(pairs)),
        "preference/rows_without_pairs": float(tied.sum()),
        "preference/reward_gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
        "preference/candidate_reward_mean": candidate_rewards.double().mean().item(),
    }


class SequenceBatch(NamedTuple):
    """Prompts and completions of one agent, padded as a rollout's: row ``p`` is pair p's chosen
    completion, row ``P + p`` its rejected one."""

    prompt_ids: Tensor
    """``(2P, Lp)`` left-padded prompt tokens."""
    prompt_mask: Tensor
    """``(2P, Lp)`` 1 on prompt tokens."""
    completion_ids: Tensor
    """``(2P, Lc)`` right-padded completion tokens."""
    completion_mask: Tensor
    """``(2P, Lc)`` bool, True on completion tokens (EOS included)."""


def padded(sequences: Sequence[Tensor], pad_id: int, left: bool) -> tuple[Tensor, Tensor]:
    """``(B, L)`` ids and bool mask of ``sequences`` padded with ``pad_id`` to the longest."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for b, sequence in enumerate(sequences):
        span = slice(width - len(sequence), width) if left else slice(0, len(sequence))
        ids[b, span], mask[b, span] = sequence, True
    return ids, mask


def pair_batch(pairs: Sequence[PreferencePair], agent: int, pad_id: int) -> SequenceBatch:
    """Agent ``agent``'s chosen then rejected completions of ``pairs``, each after its prompt."""
    prompts = [pair.prompt_ids[agent] for pair in pairs] * 2
    completions = [pair.chosen_ids[agent] for pair in pairs] + [pair.rejected_ids[agent] for pair in pairs]
    prompt_ids, prompt_mask = padded(prompts, pad_id, left=True)
    completion_ids, completion_mask = padded(completions, pad_id, left=False)
    return SequenceBatch(prompt_ids, prompt_mask.long(), completion_ids, completion_mask)
