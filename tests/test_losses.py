"""policy_gradient_loss with each loss_type's token weights, clipping and the KL term against hand numbers."""

import math

import pytest
import torch

from comlrl.algorithms.losses import (
    LOSS_AGGREGATIONS,
    TURN_WEIGHTINGS,
    k3_kl,
    policy_gradient_loss,
    token_weights,
    turn_token_weights,
)
from comlrl.algorithms.policy_terms import micro_batch_policy_terms
from comlrl.algorithms.sampler_correction import SamplerCorrection
from comlrl.algorithms.surrogates import PolicyObjective
from comlrl.trainers.reinforce import MAGRPOConfig

# S = 2 sequences, T = 3 tokens; the third token of sequence 0 is padding.
LOGPS = [[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]]
ADVANTAGES = [2.0, -1.0]
MASK = [[True, True, False], [True, True, True]]
MAX_NEW_TOKENS = 4  # > T, so dr_grpo's constant differs from the padded width
# Without old log-probs the ratio is 1 (against the detached current log-probs), so the
# per-token loss value is -A and its gradient is that of -A * logp:
#   seq 0: [-2, -2, (pad)] -> masked sum -4, 2 tokens
#   seq 1: [1, 1, 1]       -> masked sum 3,  3 tokens
EXPECTED = {
    "grpo": (-4 / 2 + 3 / 3) / 2,  # (-2 + 1) / 2 = -0.5
    "dapo": (-4 + 3) / (2 + 3),  # -1 / 5 = -0.2
    "dr_grpo": (-4 + 3) / (2 * MAX_NEW_TOKENS),  # -1 / 8 = -0.125
}
# d loss / d logp[s, t] = -A_s * mask[s, t] * weight
EXPECTED_GRAD = {
    # weight 1 / (tokens_s * S): seq 0: -2 / (2 * 2) = -0.5; seq 1: 1 / (3 * 2) = 1/6
    "grpo": [[-0.5, -0.5, 0.0], [1 / 6, 1 / 6, 1 / 6]],
    # weight 1 / 5: seq 0: -2 / 5 = -0.4; seq 1: 1 / 5 = 0.2
    "dapo": [[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]],
    # weight 1 / 8: seq 0: -2 / 8 = -0.25; seq 1: 1 / 8 = 0.125
    "dr_grpo": [[-0.25, -0.25, 0.0], [0.125, 0.125, 0.125]],
}


def weights_of(mask, loss_type, max_new_tokens=MAX_NEW_TOKENS):
    """``loss_type``'s token weight of each sequence over this batch alone (completion tokens
    counted from ``mask``), as the trainer passes them to ``policy_gradient_loss``."""
    return token_weights(torch.as_tensor(mask, dtype=torch.float32).sum(dim=1), loss_type, max_new_tokens)


def loss(loss_type, logps=LOGPS, mask=MASK):
    return policy_gradient_loss(
        torch.as_tensor(logps),
        torch.tensor(ADVANTAGES),
        torch.tensor(mask),
        weights_of(mask, loss_type),
    ).loss


@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_hand_values(loss_type):
    torch.testing.assert_close(loss(loss_type), torch.tensor(EXPECTED[loss_type]))


def test_loss_types_differ_on_the_example():
    values = {t: loss(t).item() for t in EXPECTED}
    assert len(set(values.values())) == 3, values


@pytest.mark.parametrize("loss_type", list(EXPECTED))
@pytest.mark.parametrize("garbage", [1e30, -1e30, 0.0, 123.0])
def test_padding_never_counts(loss_type, garbage):
    logps = [row[:] for row in LOGPS]
    logps[0][2] = garbage
    torch.testing.assert_close(loss(loss_type, logps), torch.tensor(EXPECTED[loss_type]))


@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_float_mask_equals_bool_mask(loss_type):
    float_mask = [[float(m) for m in row] for row in MASK]
    torch.testing.assert_close(loss(loss_type, mask=float_mask), loss(loss_type))


@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_gradient_by_hand(loss_type):
    logps = torch.tensor(LOGPS, requires_grad=True)
    loss(loss_type, logps).backward()
    torch.testing.assert_close(logps.grad, torch.tensor(EXPECTED_GRAD[loss_type]))


def test_bad_loss_type():
    with pytest.raises(ValueError, match=r"'ppo'.*\['dapo', 'dr_grpo', 'grpo'\]"):
        loss("ppo")


def test_loss_types_table():
    assert sorted(LOSS_AGGREGATIONS) == sorted(EXPECTED)


# ------------------------------------------------------------------------------ clipping
# old log-probs 0 and log-probs log(r) give the ratios r directly. epsilon 0.2, epsilon_high
# 0.3: the clip range is [0.8, 1.3].
#   seq 0, A = +1, r = [1.5, 0.7]: min(1.5, 1.3) = 1.3 (clipped, no gradient);
#                                  min(0.7, 0.8) = 0.7 (unclipped: the pessimistic side)
#   seq 1, A = -1, r = [1.5, 0.7]: min(-1.5, -1.3) = -1.5 (unclipped);
#                                  min(-0.7, -0.8) = -0.8 (clipped, no gradient)
# per-token loss [-1.3, -0.7], [1.5, 0.8]; dapo: 0.3 / 4 = 0.075; clip fraction 2 / 4
# gradient of -A * r wrt logp = -A * r / 4 where unclipped: [0, -0.175], [0.375, 0]
RATIOS = [[1.5, 0.7], [1.5, 0.7]]


def clipped(logps, **kwargs):
    return policy_gradient_loss(
        logps,
        torch.tensor([1.0, -1.0]),
        torch.ones(2, 2, dtype=torch.bool),
        weights_of(torch.ones(2, 2), "dapo"),  # 1 / 4 tokens each
        old_logps=torch.zeros(2, 2),
        objective=PolicyObjective(epsilon=0.2, **kwargs),
    )


def test_clipping_on_both_sides_by_hand():
    logps = torch.tensor(RATIOS).log().requires_grad_()
    out = clipped(logps, epsilon_high=0.3)
    torch.testing.assert_close(out.loss, torch.tensor(0.075))
    torch.testing.assert_close(out.clip_fraction, torch.tensor(0.5))
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -0.175], [0.375, 0.0]]))


def test_epsilon_high_defaults_to_epsilon():
    # clip range [0.8, 1.2]: token (0, 0) becomes 1.2 instead of 1.3 -> loss (0.3 + 0.1) / 4
    out = clipped(torch.tensor(RATIOS).log())
    torch.testing.assert_close(out.loss, torch.tensor(0.1))


def test_first_pass_of_several_has_the_plain_policy_gradient():
    # old log-probs equal to the current ones (the first of num_iterations passes): ratio 1,
    # nothing clipped, the gradient of -A * logp, as without old log-probs.
    grads = []
    for old in (None, torch.tensor(LOGPS)):
        logps = torch.tensor(LOGPS, requires_grad=True)
        out = policy_gradient_loss(
            logps, torch.tensor(ADVANTAGES), torch.tensor(MASK), weights_of(MASK, "grpo"), old_logps=old
        )
        out.loss.backward()
        assert out.clip_fraction.item() == 0.0
        grads.append(logps.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], torch.tensor(EXPECTED_GRAD["grpo"]))


# ------------------------------------------------------------------------------ KL (k3)
def test_k3_kl_by_hand():
    # k3 = exp(ref - logp) - (ref - logp) - 1
    #   pi 0.5, ref 0.25: 0.5 - ln 0.5 - 1 = ln 2 - 0.5 = 0.19315
    #   pi = ref: 0;  pi 0.25, ref 0.5: 2 - ln 2 - 1 = 0.30685
    logps = torch.tensor([[0.5, 0.3, 0.25]]).log()
    ref = torch.tensor([[0.25, 0.3, 0.5]]).log()
    torch.testing.assert_close(k3_kl(logps, ref), torch.tensor([[math.log(2) - 0.5, 0.0, 1 - math.log(2)]]))


def test_kl_term_is_weighted_by_beta_and_masked():
    # zero advantages: the loss is beta * token-mean KL over the 2 unmasked tokens;
    # the padded third token's huge KL never counts
    logps = torch.tensor([[0.5, 0.3, 0.9]]).log()
    ref = torch.tensor([[0.25, 0.3, 1e-9]]).log()
    mask = torch.tensor([[True, True, False]])
    out = policy_gradient_loss(logps, torch.zeros(1), mask, weights_of(mask, "dapo", 3), ref_logps=ref, beta=0.1)
    kl_mean = (math.log(2) - 0.5) / 2
    torch.testing.assert_close(out.kl, torch.tensor(kl_mean))
    torch.testing.assert_close(out.loss, torch.tensor(0.1 * kl_mean))


# ------------------------------------------------------------------------------ pieces
@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_weights_over_the_whole_batch_let_pieces_add_up(loss_type):
    # Per-sequence token weights of the example: grpo 1 / (tokens_s * S) = [1/4, 1/6];
    # dapo 1 / 5 each; dr_grpo 1 / (S * MAX_NEW_TOKENS) = 1/8 each.
    lengths = torch.tensor(MASK).sum(dim=1)
    expected = {"grpo": [1 / 4, 1 / 6], "dapo": [1 / 5, 1 / 5], "dr_grpo": [1 / 8, 1 / 8]}
    weights = token_weights(lengths, loss_type, MAX_NEW_TOKENS)
    torch.testing.assert_close(weights, torch.tensor(expected[loss_type]))
    # Each sequence on its own, with the whole batch's weights: the partial losses and their
    # gradients add up to those of the whole batch.
    logps = torch.tensor(LOGPS, requires_grad=True)
    total = sum(
        policy_gradient_loss(
            logps[s : s + 1],
            torch.tensor(ADVANTAGES[s : s + 1]),
            torch.tensor(MASK[s : s + 1]),
            sequence_weights=weights[s : s + 1],
        ).loss
        for s in range(2)
    )
    total.backward()
    torch.testing.assert_close(total, torch.tensor(EXPECTED[loss_type]))
    torch.testing.assert_close(logps.grad, torch.tensor(EXPECTED_GRAD[loss_type]))


# ------------------------------------------------------------------------------ turns
# One dataset row, G = 2, aligned joint mode: J = 2 joint actions per node, one agent's
# sequences. Turn 1: 1 node, 2 sequences of 2 and 4 tokens (6 tokens). Turn 2, full tree:
# 2 nodes (one per joint action), 4 sequences of 1, 3, 2, 2 tokens (8 tokens); T = 2,
# f_1 = 1 / 1 = 1, f_2 = 2 / (1 * 2) = 1.
# Ended: joint action 1 ended its branch, turn 2 holds 1 of 2 nodes, 2 sequences of 1 and 3
# tokens (4 tokens); f_2 = 1 / (1 * 2) = 1/2.
FULL = ([2, 4], [1, 3, 2, 2]), [1, 2]
ENDED = ([2, 4], [1, 3]), [1, 1]
TURN_EXPECTED = {
    ("full", "episode", "dapo"): (
        [1 / 6 / 2] * 2,  # 1 / turn tokens, times f_1 / T = 1/2: 1/12
        [1 / 8 / 2] * 4,  # 1/16
    ),
    ("full", "episode", "grpo"): (
        [1 / (2 * 2) / 2, 1 / (4 * 2) / 2],  # 1 / (len * S_1), S_1 = 2, times 1/2: 1/8, 1/16
        [1 / (1 * 4) / 2, 1 / (3 * 4) / 2, 1 / (2 * 4) / 2, 1 / (2 * 4) / 2],  # S_2 = 4: 1/8, 1/24, 1/16, 1/16
    ),
    ("full", "sequence", "dapo"): ([1 / 14] * 2, [1 / 14] * 4),  # 6 + 8 tokens pooled
    ("full", "sequence", "grpo"): (  # 2 + 4 sequences pooled: 1 / (len * 6)
        [1 / 12, 1 / 24],
        [1 / 6, 1 / 18, 1 / 12, 1 / 12],
    ),
    ("ended", "episode", "dapo"): (
        [1 / 6 / 2] * 2,  # 1/12
        [1 / 4 * (1 / 2) / 2] * 2,  # 1 / 4 tokens, times f_2 / T = (1/2) / 2: 1/16
    ),
    ("ended", "episode", "grpo"): (
        [1 / 8, 1 / 16],
        [1 / (1 * 2) / 4, 1 / (3 * 2) / 4],  # S_2 = 2, times 1/4: 1/8, 1/24
    ),
    ("ended", "sequence", "dapo"): ([1 / 10] * 2, [1 / 10] * 2),  # 6 + 4 tokens
    ("ended", "sequence", "grpo"): ([1 / 8, 1 / 16], [1 / 4, 1 / 12]),  # 2 + 2 sequences: 1 / (len * 4)
}
TREES = {"full": FULL, "ended": ENDED}


def turn_weights(tree, weighting, loss_type, totals=None):
    lengths, nodes = TREES[tree]
    return turn_token_weights(
        [torch.tensor(x) for x in lengths], nodes, 2, loss_type, MAX_NEW_TOKENS, weighting, totals=totals
    )


@pytest.mark.parametrize("tree,weighting,loss_type", list(TURN_EXPECTED))
def test_turn_weights_by_hand(tree, weighting, loss_type):
    got = turn_weights(tree, weighting, loss_type)
    for turn, expected in zip(got, TURN_EXPECTED[tree, weighting, loss_type], strict=True):
        torch.testing.assert_close(turn, torch.tensor(expected))


@pytest.mark.parametrize("tree,f_2", [("full", 1.0), ("ended", 0.5)])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_episode_turn_sums_are_the_played_share_over_the_turns(tree, f_2, loss_type):
    # sum over a turn's tokens of their weight: f_t / T with T = 2
    lengths, _ = TREES[tree]
    got = turn_weights(tree, "episode", loss_type)
    sums = [(w * torch.tensor(x)).sum().item() for w, x in zip(got, lengths)]
    assert sums == pytest.approx([1.0 / 2, f_2 / 2], rel=1e-6)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_sequence_weighting_is_the_pooled_token_weights(tree, loss_type):
    lengths, _ = TREES[tree]
    pooled = token_weights(torch.tensor([n for turn in lengths for n in turn]), loss_type, MAX_NEW_TOKENS)
    got = torch.cat(turn_weights(tree, "sequence", loss_type))
    assert torch.equal(got, pooled)


@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_episode_loss_is_the_mean_of_played_shares_of_turn_losses(loss_type):
    # (1/T) sum_t f_t L_t, with L_t the loss_type loss of turn t alone (ended tree: f = 1, 1/2)
    lengths, _ = ENDED
    gen = torch.Generator().manual_seed(0)
    per_turn = []
    for turn in lengths:
        mask = torch.arange(4).unsqueeze(0) < torch.tensor(turn).unsqueeze(1)
        per_turn.append((torch.randn(len(turn), 4, generator=gen), torch.randn(len(turn), generator=gen), mask))
    weights = turn_weights("ended", "episode", loss_type)
    pieces = sum(
        policy_gradient_loss(logps, adv, mask, sequence_weights=w).loss
        for (logps, adv, mask), w in zip(per_turn, weights)
    )
    alone = [policy_gradient_loss(logps, adv, mask, weights_of(mask, loss_type)).loss for logps, adv, mask in per_turn]
    torch.testing.assert_close(pieces, (1.0 * alone[0] + 0.5 * alone[1]) / 2)


@pytest.mark.parametrize("weighting", list(TURN_WEIGHTINGS))
@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_one_turn_is_token_weights(weighting, loss_type):
    lengths = torch.tensor([2, 4, 1, 5])
    (got,) = turn_token_weights([lengths], [2], 2, loss_type, MAX_NEW_TOKENS, weighting)
    assert torch.equal(got, token_weights(lengths, loss_type, MAX_NEW_TOKENS))


@pytest.mark.parametrize("weighting", list(TURN_WEIGHTINGS))
@pytest.mark.parametrize("loss_type", list(EXPECTED))
def test_totals_is_called_once_and_its_sums_are_used(weighting, loss_type):
    calls = []

    def two_identical_ranks(numbers):
        calls.append(list(numbers))
        return [2 * n for n in numbers]

    got = turn_weights("ended", weighting, loss_type, totals=two_identical_ranks)
    # sequences per turn, tokens per turn, nodes per turn
    assert calls == [[2.0, 2.0, 6.0, 4.0, 1.0, 1.0]]
    # twice the sequences and tokens (f_t unchanged): every weight, per global token or
    # sequence, is halved
    for turn, alone in zip(got, turn_weights("ended", weighting, loss_type)):
        torch.testing.assert_close(turn, alone / 2)


def test_played_share_counts_every_rank_nodes():
    # This rank: turn 2 holds 1 of its 2 possible nodes; another rank's full tree adds 1 root,
    # 2 turn-2 nodes, 2 + 4 sequences of 6 + 8 tokens: f_2 = (1 + 2) / ((1 + 1) * 2) = 3/4.
    other = [2.0, 4.0, 6.0, 8.0, 1.0, 2.0]
    got = turn_weights("ended", "episode", "dapo", totals=lambda xs: [a + b for a, b in zip(xs, other)])
    # turn 1: 1 / 12 tokens / T; turn 2: 1 / 12 tokens * (3/4) / T
    torch.testing.assert_close(got[0], torch.full((2,), 1 / 12 / 2))
    torch.testing.assert_close(got[1], torch.full((2,), 1 / 12 * 0.75 / 2))


def test_cross_mode_joint_actions_set_the_possible_nodes():
    # J = 4 (G = 2, N = 2 cross): one root, 2 of 4 possible turn-2 nodes: f_2 = 1/2; dapo
    lengths = [torch.tensor([3, 3]), torch.tensor([1, 1, 1, 1])]
    got = turn_token_weights(lengths, [1, 2], 4, "dapo", MAX_NEW_TOKENS)
    torch.testing.assert_close(got[1], torch.full((4,), 1 / 4 * 0.5 / 2))


def test_a_turn_no_node_reached_weighs_nothing_and_keeps_t():
    # turn 2 was never reached: it contributes nothing, and T stays 2 (turn 1 weighs 1/2)
    lengths = [torch.tensor([2, 4]), torch.tensor([], dtype=torch.long)]
    for loss_type in EXPECTED:
        first, second = turn_token_weights(lengths, [1, 0], 2, loss_type, MAX_NEW_TOKENS)
        assert second.numel() == 0
        torch.testing.assert_close(first, token_weights(lengths[0], loss_type, MAX_NEW_TOKENS) / 2)


def test_bad_turn_weighting():
    with pytest.raises(ValueError, match=r"turn_weighting='turn'; expected one of \['episode', 'sequence'\]"):
        turn_token_weights([torch.tensor([1])], [1], 2, "dapo", MAX_NEW_TOKENS, "turn")
    with pytest.raises(ValueError, match=r"turn_weighting='turn'; expected one of \['episode', 'sequence'\]"):
        MAGRPOConfig(turn_weighting="turn")
    assert MAGRPOConfig().turn_weighting == "episode"


def test_micro_batch_terms_weight_each_token_by_the_capped_sampler_ratio_by_hand():
    """One completion of two tokens, advantage 2, learner probabilities (0.5, 0.25), sampler's
    (0.25, 0.5), cap 1.5: ratios to the sampler 2 and 0.5 -> weights (1.5, 0.5), one capped;
    gap |ln 2| + |ln 0.5| = 2 ln 2 over 2 tokens; loss -2 * (1.5 + 0.5) = -4, gradient -2 * w."""
    token_logps = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.tensor([[True, True]])
    terms = micro_batch_policy_terms(
        token_logps,
        torch.tensor([2.0]),
        mask,
        torch.ones(1),
        sampler_logps=sampler,
        sampler_correction=SamplerCorrection(cap=1.5),
    )
    terms.loss.loss.backward()
    assert terms.loss.loss.item() == pytest.approx(-4.0)
    assert token_logps.grad[0].tolist() == pytest.approx([-3.0, -1.0])
    assert terms.sampler_gap.item() == pytest.approx(2 * math.log(2))
    assert (terms.sampler_tokens.item(), terms.corrected.item()) == (2, 1)


def test_micro_batch_terms_without_sampler_logprobs_are_the_plain_loss_and_no_gap():
    """Without the sampler's log-probs nothing is weighted (loss -2 per token) and the gap's sums are 0."""
    token_logps = torch.log(torch.tensor([[0.5, 0.25]]))
    terms = micro_batch_policy_terms(
        token_logps,
        torch.tensor([2.0]),
        torch.tensor([[True, True]]),
        torch.ones(1),
        sampler_correction=SamplerCorrection(cap=1.5),
    )
    assert terms.loss.loss.item() == pytest.approx(-4.0)
    assert (terms.sampler_gap.item(), terms.sampler_tokens.item(), terms.corrected.item()) == (0.0, 0.0, 0.0)
