"""tree_returns against hand computations on a 2-turn tree, with discount and cut branches."""

import pytest
import torch

from comlrl.algorithms.returns import tree_returns


def test_two_turn_tree_by_hand():
    # One root with J = 2 joint actions, one agent. Joint action 0 started node 0 of turn 2,
    # joint action 1 started nothing (the branch ended). Turn 2: node 0, joint actions 3 and 5.
    rewards = [torch.tensor([[[1.0], [2.0]]]), torch.tensor([[[3.0], [5.0]]])]
    children = [torch.tensor([[0, -1]]), torch.tensor([[-1, -1]])]
    first, second = tree_returns(rewards, children, discount=0.5)
    # turn 2: leaves keep their rewards; turn 1: 1 + 0.5 * mean(3, 5) = 3; 2 (no child)
    torch.testing.assert_close(second, rewards[1])
    torch.testing.assert_close(first, torch.tensor([[[3.0], [2.0]]]))


def test_three_turns_two_agents_and_two_roots():
    # Two roots (two dataset rows) x J = 2; per-agent rewards differ (mixed setting).
    # Turn 3 holds one node, child of turn-2 node 1 joint action 0.
    rewards = [
        torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 2.0], [4.0, 4.0]]]),
        torch.tensor([[[1.0, 1.0], [3.0, 3.0]], [[0.0, 2.0], [2.0, 0.0]]]),
        torch.tensor([[[8.0, 4.0], [0.0, 0.0]]]),
    ]
    children = [torch.tensor([[0, -1], [-1, 1]]), torch.tensor([[-1, -1], [0, -1]]), torch.tensor([[-1, -1]])]
    first, second, third = tree_returns(rewards, children, discount=0.9)
    # turn 3: leaves. Node mean: (4, 2).
    # turn 2 node 1, joint 0: (0, 2) + 0.9 * (4, 2) = (3.6, 3.8); joint 1 = (2, 0).
    expected_second = torch.tensor([[[1.0, 1.0], [3.0, 3.0]], [[3.6, 3.8], [2.0, 0.0]]])
    torch.testing.assert_close(second, expected_second)
    # turn 1 row 0, joint 0: child node 0 mean (2, 2): (1, 0) + 0.9 * (2, 2) = (2.8, 1.8)
    # turn 1 row 1, joint 1: child node 1 mean ((3.6 + 2) / 2, (3.8 + 0) / 2) = (2.8, 1.9):
    #   (4, 4) + 0.9 * (2.8, 1.9) = (6.52, 5.71)
    expected_first = torch.tensor([[[2.8, 1.8], [0.0, 1.0]], [[2.0, 2.0], [6.52, 5.71]]])
    torch.testing.assert_close(first, expected_first)
    torch.testing.assert_close(third, rewards[2])


@pytest.mark.parametrize("discount", [0.0, 1.0])
def test_discount_bounds(discount):
    rewards = [torch.tensor([[[1.0]]]), torch.tensor([[[10.0]]])]
    first, _ = tree_returns(rewards, [torch.tensor([[0]]), torch.tensor([[-1]])], discount)
    assert first.item() == 1.0 + discount * 10.0


def test_children_on_the_last_turn_are_an_error():
    with pytest.raises(ValueError, match="turn 1 has children but it is the last turn"):
        tree_returns([torch.zeros(1, 2, 1)], [torch.tensor([[0, -1]])], 1.0)
