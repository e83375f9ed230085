"""MADPO's pure parts by hand: the joint DPO loss, margins and accuracy (reference-free and
with a reference), each agent's gradient equal to the joint loss's, and how pairs are chosen,
recorded and padded."""

import math

import pytest
import torch

from comlrl.algorithms import agent_dpo_losses, joint_preference, others_deltas, preference_deltas
from comlrl.rollout import AgentRollout
from comlrl.trainers.dpo.pairs import (
    PreferencePair,
    node_pairs,
    pair_batch,
    pair_statistics,
    select_pairs,
    shared_rewards,
)


def neg_log_sigmoid(x):
    return math.log1p(math.exp(-x))


# ------------------------------------------------------------------------------ the loss
def test_reference_free_margin_is_chosen_minus_rejected():
    deltas = preference_deltas(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]))
    assert torch.equal(deltas, torch.tensor([1.0, -2.0]))


def test_a_reference_margin_is_subtracted():
    deltas = preference_deltas(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([0.5, -1.0]))
    assert torch.equal(deltas, torch.tensor([0.5, -1.0]))


def test_joint_loss_margin_and_accuracy_by_hand():
    deltas = torch.tensor([[1.0, -2.0, 0.0], [0.5, 1.0, 0.0]])  # 2 agents, 3 pairs
    joint = joint_preference(deltas, beta=0.5)
    assert torch.equal(joint.margin, torch.tensor([1.5, -1.0, 0.0]))
    expected = [neg_log_sigmoid(0.75), neg_log_sigmoid(-0.5), math.log(2)]
    torch.testing.assert_close(joint.loss, torch.tensor(expected))
    assert joint.correct.tolist() == [True, False, False]  # a tie is not ranked right


def test_with_a_reference_the_joint_margin_is_over_the_references():
    chosen, rejected = torch.tensor([[-1.0], [-4.0]]), torch.tensor([[-3.0], [-4.5]])  # (agents, pairs)
    reference = torch.tensor([[2.5], [0.0]])
    deltas = torch.stack([preference_deltas(c, r, ref) for c, r, ref in zip(chosen, rejected, reference)])
    joint = joint_preference(deltas, beta=1.0)
    assert joint.margin.tolist() == [0.0]  # (2 - 2.5) + (0.5 - 0)
    torch.testing.assert_close(joint.loss, torch.tensor([math.log(2)]))


def test_others_deltas_by_hand():
    deltas = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    assert torch.equal(others_deltas(deltas), torch.tensor([[110.0, 220.0], [101.0, 202.0], [11.0, 22.0]]))


def test_each_agents_loss_is_the_joint_loss():
    deltas = torch.tensor([[1.0, -2.0, 0.3], [0.5, 1.0, -0.1], [-0.2, 0.0, 0.4]])
    others = others_deltas(deltas)
    joint = joint_preference(deltas, beta=0.7).loss
    for a in range(3):
        torch.testing.assert_close(agent_dpo_losses(deltas[a], others[a], beta=0.7), joint)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_agents_gradient_is_the_joint_losss(seed):
    """Δ_a is a nonlinear function of agent a's parameters; the gradient agent a gets from its
    own loss (the others' margins fixed) equals the joint loss's gradient, and nothing flows
    into the other agents' parameters through it."""
    torch.manual_seed(seed)
    num_agents, num_pairs, dim = 3, 5, 4
    features = torch.randn(num_agents, num_pairs, dim)
    weights = [torch.randn(dim, requires_grad=True) for _ in range(num_agents)]

    def margins():
        return torch.stack([3 * torch.tanh(features[a] @ weights[a]) for a in range(num_agents)])

    joint_loss = joint_preference(margins(), beta=0.3).loss.mean()
    joint_grads = torch.autograd.grad(joint_loss, weights)

    for a in range(num_agents):
        live = margins()  # others computed WITH a graph: the loss itself must stop their gradient
        loss = agent_dpo_losses(live[a], others_deltas(live)[a], beta=0.3).mean()
        grads = torch.autograd.grad(loss, weights, allow_unused=True)
        torch.testing.assert_close(grads[a], joint_grads[a])
        for b in range(num_agents):
            if b != a:
                assert grads[b] is None or torch.count_nonzero(grads[b]) == 0


# ------------------------------------------------------------------------------ choosing pairs
REWARDS = [1.0, 2.0, 2.0, 0.0]
GENERATOR = torch.Generator().manual_seed(0)


def test_strict_wins_only_ties_and_self_pairs_dropped():
    pairs = select_pairs(REWARDS, "all", None, GENERATOR).tolist()
    assert pairs == [[0, 3], [1, 0], [1, 3], [2, 0], [2, 3]]  # (winner, loser) index order; 1 and 2 tie


def test_reward_gap_order_keeps_index_order_for_equal_gaps_and_caps():
    assert select_pairs(REWARDS, "reward_gap", None, GENERATOR).tolist() == [[1, 3], [2, 3], [0, 3], [1, 0], [2, 0]]
    assert select_pairs(REWARDS, "reward_gap", 3, GENERATOR).tolist() == [[1, 3], [2, 3], [0, 3]]


def test_random_order_is_seeded_and_capped():
    rewards = list(range(6))  # 15 pairs

    def draw(seed, limit=None):
        return select_pairs(rewards, "random", limit, torch.Generator().manual_seed(seed)).tolist()

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    assert sorted(draw(3)) == select_pairs(rewards, "all", None, GENERATOR).tolist()
    assert draw(3, limit=4) == draw(3)[:4]


def test_all_tied_gives_no_pair():
    assert select_pairs([0.5, 0.5, 0.5], "reward_gap", 16, GENERATOR).shape == (0, 2)


def test_unknown_selection_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"pair_selection='best'; expected one of \['all', 'random', 'reward_gap'\]"):
        select_pairs(REWARDS, "best", None, GENERATOR)


def test_rewards_must_be_shared_by_the_agents():
    rewards = torch.tensor([[[1.0, 1.0], [2.0, 2.0]], [[3.0, 3.0], [4.0, 5.0]]])  # (M=2, N=2, K=2)
    with pytest.raises(ValueError, match=r"different rewards \[4.0, 5.0\] for candidate 1 of dataset row 7"):
        shared_rewards(rewards, [6, 7])
    assert torch.equal(shared_rewards(rewards[:1], [6]), torch.tensor([[1.0, 2.0]]))


# ------------------------------------------------------------------------------ what a pair holds
EOS, PAD = 1, 0


def rollout(prompt, completions, texts):
    """One prompt's candidates as a rollout holds them: prompt left-padded by one, completions
    padded after EOS."""
    width = max(len(c) for c in completions)
    count = len(completions)
    return AgentRollout(
        prompt_ids=torch.tensor([[PAD, *prompt]] * count),
        prompt_mask=torch.tensor([[0] + [1] * len(prompt)] * count),
        completion_ids=torch.tensor([c + [PAD] * (width - len(c)) for c in completions]),
        completion_mask=torch.tensor([[True] * len(c) + [False] * (width - len(c)) for c in completions]),
        texts=texts,
        truncated=torch.zeros(count, dtype=torch.bool),
    )


def test_a_pair_holds_the_tokens_as_sampled_eos_included():
    agents = [
        rollout([5, 6], [[7, EOS], [8, 9, EOS], [7, 7, 7]], ["a", "bc", "aaa"]),
        rollout([4], [[9, EOS], [EOS], [6, 6, EOS]], ["x", "", "yy"]),
    ]
    rewards = torch.tensor([0.0, 3.0, 1.0])
    ranked = select_pairs(rewards, "reward_gap", 2, GENERATOR)  # (1, 0) gap 3, (1, 2) gap 2
    pairs = node_pairs(row=4, prompts=["p0", "p1"], rollouts=agents, first=0, ranked=ranked, rewards=rewards)
    assert len(pairs) == 2
    first = pairs[0]
    assert (first.row, first.prompts, first.chosen_reward, first.rejected_reward) == (4, ["p0", "p1"], 3.0, 0.0)
    assert [ids.tolist() for ids in first.prompt_ids] == [[5, 6], [4]]
    assert [ids.tolist() for ids in first.chosen_ids] == [[8, 9, EOS], [EOS]]
    assert [ids.tolist() for ids in first.rejected_ids] == [[7, EOS], [9, EOS]]
    assert (first.chosen_texts, first.rejected_texts) == (["bc", ""], ["a", "x"])
    assert [ids.tolist() for ids in pairs[1].rejected_ids] == [[7, 7, 7], [6, 6, EOS]]


def test_pair_batch_pads_prompts_left_and_completions_right():
    def pair(prompt, chosen, rejected):
        ids = [torch.tensor(prompt)], [torch.tensor(chosen)], [torch.tensor(rejected)]
        return PreferencePair(0, ["p"], *ids, ["c"], ["r"], 1.0, 0.0)

    batch = pair_batch([pair([5, 6], [7, EOS], [8]), pair([4], [9, 9, EOS], [EOS])], agent=0, pad_id=PAD)
    assert batch.prompt_ids.tolist() == [[5, 6], [PAD, 4], [5, 6], [PAD, 4]]
    assert batch.prompt_mask.tolist() == [[1, 1], [0, 1], [1, 1], [0, 1]]
    assert batch.completion_ids.tolist() == [[7, EOS, PAD], [9, 9, EOS], [8, PAD, PAD], [EOS, PAD, PAD]]
    assert batch.completion_mask.sum(dim=1).tolist() == [2, 3, 1, 1]


def test_pair_statistics_by_hand():
    def pair(chosen, rejected):
        return PreferencePair(0, [], [], [], [], [], [], chosen, rejected)

    rewards = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 3.0]])  # the second row is all ties
    stats = pair_statistics(rewards, [pair(2.0, 0.0), pair(1.0, 0.0), pair(2.0, 1.0)])
    assert stats == {
        "preference/num_pairs": 3.0,
        "preference/rows_without_pairs": 1.0,
        "preference/reward_gap_mean": pytest.approx(4 / 3),
        "preference/candidate_reward_mean": pytest.approx(2.0),
    }
