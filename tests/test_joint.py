"""Joint-action indices and the credit of joint rewards back to each agent's samples."""

import pytest
import torch

from comlrl.algorithms.joint import JOINT_MODES, joint_action_indices, per_agent_returns

INDICES = {
    # (mode, N, G): rows are joint actions, column i is agent i's sample
    ("aligned", 2, 2): [[0, 0], [1, 1]],
    ("aligned", 3, 2): [[0, 0, 0], [1, 1, 1]],
    # Cartesian product, last agent fastest
    ("cross", 2, 2): [[0, 0], [0, 1], [1, 0], [1, 1]],
    ("cross", 3, 2): [
        [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1],
        [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 1, 1],
    ],
}  # fmt: skip


@pytest.mark.parametrize("mode, num_agents, num_generations", list(INDICES))
def test_indices_by_hand(mode, num_agents, num_generations):
    got = joint_action_indices(num_agents, num_generations, mode)
    assert got.dtype == torch.long
    assert got.tolist() == INDICES[(mode, num_agents, num_generations)]


def test_aligned_returns_are_the_joint_rewards():
    rewards = torch.tensor([[1.0, -2.0, 3.5], [0.0, 4.0, 7.0]])  # B=2, G=J=3
    for num_agents in (1, 2, 3):
        indices = joint_action_indices(num_agents, 3, "aligned")
        got = per_agent_returns(rewards, indices, 3)
        assert got.shape == (num_agents, 2, 3)
        for agent in range(num_agents):
            torch.testing.assert_close(got[agent], rewards)


def test_cross_two_agents_by_hand():
    # joint actions in order (0,0), (0,1), (1,0), (1,1): rewards [r00, r01, r10, r11]
    rewards = torch.tensor([[1.0, 2.0, 4.0, 8.0], [0.0, -6.0, 10.0, 3.0]])
    got = per_agent_returns(rewards, joint_action_indices(2, 2, "cross"), 2)
    expected = torch.tensor(
        [
            # agent 0: [mean(r00, r01), mean(r10, r11)]
            [[(1 + 2) / 2, (4 + 8) / 2], [(0 - 6) / 2, (10 + 3) / 2]],
            # agent 1: [mean(r00, r10), mean(r01, r11)]
            [[(1 + 4) / 2, (2 + 8) / 2], [(0 + 10) / 2, (-6 + 3) / 2]],
        ]
    )  # = [[[1.5, 6], [-3, 6.5]], [[2.5, 5], [5, -1.5]]]; a sum would double these
    torch.testing.assert_close(got, expected)


def test_cross_three_agents_against_loop():
    num_agents, num_generations, num_rows = 3, 3, 2
    indices = joint_action_indices(num_agents, num_generations, "cross")
    rewards = torch.randn(num_rows, len(indices), generator=torch.Generator().manual_seed(0))
    got = per_agent_returns(rewards, indices, num_generations)
    expected = torch.zeros(num_agents, num_rows, num_generations)
    for i in range(num_agents):
        for b in range(num_rows):
            for k in range(num_generations):
                chosen = [rewards[b, j] for j in range(len(indices)) if indices[j, i] == k]
                assert len(chosen) == num_generations ** (num_agents - 1)
                expected[i, b, k] = sum(chosen) / len(chosen)
    torch.testing.assert_close(got, expected)


def test_bad_mode():
    with pytest.raises(ValueError, match=r"'pairwise'.*\['aligned', 'cross'\]"):
        joint_action_indices(2, 2, "pairwise")


def test_modes_table():
    assert sorted(JOINT_MODES) == ["aligned", "cross"]


def test_per_agent_rewards_in_cross_mode_by_hand():
    # N = 2, G = 2, one row; joint actions (0,0), (0,1), (1,0), (1,1) with rewards per agent
    #   agent 0 gets [1, 2, 3, 4], agent 1 gets [10, 20, 30, 40]
    # agent 0, sample k: mean over its joint actions (k,0), (k,1): [1.5, 3.5]
    # agent 1, sample k: mean over (0,k), (1,k) of ITS rewards: [(10+30)/2, (20+40)/2] = [20, 30]
    rewards = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]])
    got = per_agent_returns(rewards, joint_action_indices(2, 2, "cross"), 2)
    torch.testing.assert_close(got, torch.tensor([[[1.5, 3.5]], [[20.0, 30.0]]]))
