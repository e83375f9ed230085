"""Policy-gradient loss (a surrogate of :mod:`~comlrl.algorithms.surrogates`, with an
optional KL term) and the ways to normalise it over tokens.

Every aggregation takes the completion lengths ``(S,)``, ``max_new_tokens`` and the batch's
totals (sequences and tokens, which may span several processes) and gives the weight of each
sequence's tokens, so ``loss_type`` is chosen through one table and the loss of a batch can
be computed in pieces. Over the turns of a multi-turn rollout, a turn weighting (one table
too) decides which of those totals each turn is normalised by and how much the turn weighs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from comlrl.algorithms.surrogates import PolicyObjective, policy_surrogate


def sequence_mean(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """GRPO (Shao et al., 2024): mean over each sequence's tokens, then over sequences.

    Each sequence weighs the same whatever its length, so a token of a long completion
    counts less than a token of a short one.
    """
    return 1.0 / (lengths.clamp(min=1) * num_sequences)


def token_mean(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """DAPO (Yu et al., 2025): mean over all completion tokens of the batch; every token
    weighs the same, which removes the length bias of the per-sequence mean."""
    return torch.full_like(lengths, 1.0 / max(num_tokens, 1))


def constant_normalizer(lengths: Tensor, max_new_tokens: int, num_sequences: float, num_tokens: float) -> Tensor:
    """Dr. GRPO (Liu et al., 2025): sum over tokens divided by a constant,
    ``num_sequences * max_new_tokens``, so no length enters the normaliser."""
    return torch.full_like(lengths, 1.0 / (num_sequences * max_new_tokens))


LOSS_AGGREGATIONS = {
    "grpo": sequence_mean,
    "dapo": token_mean,
    "dr_grpo": constant_normalizer,
}


def token_weights(
    lengths: Tensor,
    loss_type: str,
    max_new_tokens: int,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """``(S,)`` weight of each token of each sequence, such that the loss is the weighted sum
    of the per-token losses.

    Computed once over all of an agent's sequences of a step, the weights let the loss be
    split into micro-batches (and turns) whose partial losses add up to the whole one.

    Args:
        lengths: ``(S,)`` completion tokens counted by the loss in each sequence.
        loss_type: key of ``LOSS_AGGREGATIONS``.
        max_new_tokens: the constant of ``dr_grpo``.
        num_sequences: sequences of the whole batch when ``lengths`` are a share of it (one
            process's, in data-parallel training); default ``S``.
        num_tokens: tokens of the whole batch; default ``lengths.sum()``.
    """
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_type={loss_type!r}; expected one of {sorted(LOSS_AGGREGATIONS)}")
    num_sequences = lengths.numel() if num_sequences is None else num_sequences
    num_tokens = lengths.sum().item() if num_tokens is None else num_tokens
    return LOSS_AGGREGATIONS[loss_type](lengths.double(), max_new_tokens, num_sequences, num_tokens).float()


class TurnTotals(NamedTuple):
    """Per turn, counts over every data-parallel process of one agent's sequences of a step."""

    sequences: list[float]
    tokens: list[float]
    nodes: list[float]


class TurnNormalizer(NamedTuple):
    """How one turn's sequences are weighed: :func:`token_weights` with these batch totals,
    times ``scale``."""

    scale: float
    num_sequences: float
    num_tokens: float


def episode_weighting(totals: TurnTotals, joint_actions: int) -> list[TurnNormalizer]:
    """``(1 / T) * sum_t f_t * L_t``: each turn is normalised over its own sequences, as the
    policy gradient of an episode sums one mean over the samples of each turn, and weighs
    ``f_t = nodes_t / (nodes_1 * J**(t-1))``, the share of its possible nodes that were played.
    A branch that ended early contributes nothing; it does not re-weight the survivors."""
    num_turns = len(totals.nodes)
    roots = totals.nodes[0] if num_turns else 0.0
    normalizers = []
    for t in range(num_turns):
        possible = roots * joint_actions**t
        played = totals.nodes[t] / possible if possible else 0.0
        normalizers.append(TurnNormalizer(played / num_turns, totals.sequences[t], totals.tokens[t]))
    return normalizers


def sequence_weighting(totals: TurnTotals, joint_actions: int) -> list[TurnNormalizer]:
    """All turns' sequences pooled and normalised together (the single-batch loss): a turn
    weighs as many sequences (or tokens) as it holds, so a later turn, up to J times wider
    (a node per joint action), outweighs the decisions that led to it."""
    pooled = TurnNormalizer(1.0, sum(totals.sequences), sum(totals.tokens))
    return [pooled] * len(totals.nodes)


TURN_WEIGHTINGS: dict[str, Callable[[TurnTotals, int], list[TurnNormalizer]]] = {
    "episode": episode_weighting,
    "sequence": sequence_weighting,
}


def turn_token_weights(
    lengths: Sequence[Tensor],
    nodes: Sequence[int],
    joint_actions: int,
    loss_type: str,
    max_new_tokens: int,
    turn_weighting: str = "episode",
    totals: Callable[[list[float]], list[float]] | None = None,
) -> list[Tensor]:
    """Per turn, ``(S_t,)`` token weight of each of one agent's sequences of a multi-turn step
    (what :func:`token_weights` gives for one batch), so that the agent's loss is the
    weighted sum of its per-token losses over every turn.

    With ``episode`` weighting the turn-t weights sum, over the turn's tokens, to ``f_t / T``
    for ``grpo`` and ``dapo`` (``dr_grpo``: times the mean length over ``max_new_tokens``).
    With a single turn both weightings give exactly :func:`token_weights`.

    Args:
        lengths: per turn, ``(S_t,)`` completion tokens counted by the loss in each of this
            process's sequences of the agent at that turn. ``T = len(lengths)``: pass every
            turn of the tree (one that no node reached as an empty tensor and 0 nodes), so the
            weighting does not depend on how many branches ended (and every process gives
            ``totals`` a list of the same length).
        nodes: per turn, this process's nodes of the tree at that turn.
        joint_actions: J, the joint actions of a node (``G`` aligned, ``G**N`` cross).
        loss_type: key of ``LOSS_AGGREGATIONS``.
        max_new_tokens: the constant of ``dr_grpo``.
        turn_weighting: key of ``TURN_WEIGHTINGS``.
        totals: sums a list of numbers over the processes of a data-parallel run; called
            once, with every turn's sequences, tokens and nodes. ``None``: this process only.
    """
    if turn_weighting not in TURN_WEIGHTINGS:
        raise ValueError(f"turn_weighting={turn_weighting!r}; expected one of {sorted(TURN_WEIGHTINGS)}")
    if len(lengths) != len(nodes):
        raise ValueError(f"{len(lengths)} turns of lengths but {len(nodes)} turns of nodes")
    num_turns = len(lengths)
    local = [float(x.numel()) for x in lengths] + [float(x.sum().item()) for x in lengths] + [float(n) for n in nodes]
    summed = list(totals(local)) if totals is not None else local
    if len(summed) != len(local):
        raise ValueError(f"totals gave {len(summed)} numbers for {len(local)}")
    counts = TurnTotals(*(summed[i * num_turns : (i + 1) * num_turns] for i in range(3)))
    weights = []
    for turn_lengths, normalizer in zip(lengths, TURN_WEIGHTINGS[turn_weighting](counts, joint_actions)):
        if not normalizer.num_sequences:
            # No process has a sequence at this turn: nothing to weigh (dr_grpo would divide by 0).
            weights.append(torch.zeros_like(turn_lengths, dtype=torch.float32))
            continue
        turn = token_weights(turn_lengths, loss_type, max_new_tokens, normalizer.num_sequences, normalizer.num_tokens)
        weights.append(turn * normalizer.scale)
    return weights


class PolicyLoss(NamedTuple):
    """The loss of one agent's batch and what to log about it."""

    loss: Tensor
    """Scalar to minimise."""
    clip_fraction: Tensor
    """Fraction of completion tokens the surrogate held back (their ratio clipped, their
    weight capped, or their gradient halved by a soft gate)."""
    kl: Tensor
    """Mean k3 KL to the reference over completion tokens (0 without a reference)."""
    entropy: Tensor
    """Mean entropy of the policy over completion tokens (0 when not given)."""


def k3_kl(token_logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token KL(pi || ref) estimate ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's
    k3, http://joschu.net/blog/kl-approx.html): unbiased, and never negative."""
    log_ratio = ref_logps - token_logps
    return torch.exp(log_ratio) - log_ratio - 1


def policy_gradient_loss(
    token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    sequence_weights: Tensor,
    old_logps: Tensor | None = None,
    objective: PolicyObjective | None = None,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    pg_weights: Tensor | None = None,
) -> PolicyLoss:
    """Policy-gradient loss over the completion tokens (the PPO / GRPO surrogate by default).

    Per token: ``s(r, A) * w + beta * KL - entropy_coef * H``, where ``s`` is the surrogate
    ``objective`` names (:func:`~comlrl.algorithms.surrogates.policy_surrogate`; by default
    ``-min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A)`` with ``r = exp(logp - old_logp)``)
    and ``w`` the token's ``pg_weights`` (1 without). Without ``old_logps`` the ratio is taken
    against the detached current log-probs: r = 1, nothing is clipped, and every surrogate's
    gradient is exactly that of REINFORCE, ``-A * grad log pi``.

    Args:
        token_logps: ``(S, T)`` log-probabilities of the generated tokens under the policy
            being trained (with gradient).
        advantages: ``(S,)`` one advantage per completion, shared by all its tokens.
        mask: ``(S, T)`` bool, True on tokens the policy generated (see ``completion_mask``).
        sequence_weights: ``(S,)`` token weight of each sequence: :func:`token_weights` (or
            :func:`turn_token_weights`) over the whole batch this one is a piece of, which
            applies the ``loss_type``; ``token_weights(mask.sum(dim=1), loss_type,
            max_new_tokens)`` for this batch alone.
        old_logps: ``(S, T)`` log-probs recorded when the completions were sampled.
        objective: the surrogate, its importance-sampling level and its ranges (None: ``PolicyObjective()``,
            PPO's clip).
        ref_logps: ``(S, T)`` log-probs under the frozen reference model, for the KL term.
        beta: weight of the KL term.
        entropy: ``(S, T)`` entropy of the policy at each completion token (with gradient),
            for the entropy bonus.
        entropy_coef: weight of the entropy bonus.
        pg_weights: ``(S, T)`` weights of each token's policy-gradient term (not of the KL or
            entropy terms, nor of the normalisation), without gradient: the sampler
            correction's importance weights (:mod:`~comlrl.algorithms.sampler_correction`), 0
            on tokens below the entropy quantile (:func:`~comlrl.algorithms.masks.top_entropy_mask`).
    """
    weights = mask.to(token_logps.dtype)
    old_logps = token_logps.detach() if old_logps is None else old_logps
    surrogate = policy_surrogate(token_logps, old_logps, advantages, mask, objective or PolicyObjective())
    per_token_loss = surrogate.loss
    if pg_weights is not None:
        per_token_loss = per_token_loss * pg_weights
    kl = torch.zeros_like(token_logps) if ref_logps is None else k3_kl(token_logps, ref_logps)
    if beta:
        per_token_loss = per_token_loss + beta * kl
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy of each token")
        per_token_loss = per_token_loss - entropy_coef * entropy
    loss = (per_token_loss * weights * sequence_weights.to(weights.dtype).unsqueeze(1)).sum()
    tokens = weights.sum().clamp(min=1)
    clip_fraction = (surrogate.held.to(weights.dtype) * weights).sum() / tokens
    mean_entropy = torch.zeros(()) if entropy is None else ((entropy * weights).sum() / tokens).detach()
    return PolicyLoss(loss, clip_fraction.detach(), ((kl * weights).sum() / tokens).detach(), mean_entropy)
