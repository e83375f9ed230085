"""GDPO's per-reward-function normalisation (``multi_objective_aggregation="normalize_then_sum"``):
by hand on tiny tensors, the paper's motivating case, through a seeded MAGRPO run, and every
setting it refuses."""

import math

import pytest
import torch

from comlrl.algorithms.advantages import batch_scaled, decoupled_advantages, group_advantages
from comlrl.algorithms.joint import aligned_indices
from comlrl.algorithms.returns import function_credits, tree_decoupled_advantages
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig
from tests.helpers import content_score, length_sum, make_trainer, small_config, snapshot, unchanged

SQRT3 = math.sqrt(3)


def shared(*values):
    """``(N=2, 1 node, G)`` credits: both agents' samples get ``values``."""
    return torch.tensor([[values], [values]], dtype=torch.float64)


# ------------------------------------------------------------------------------ by hand
def test_two_functions_two_agents_by_hand():
    """One node, G = 3, weights (2, 0.5). Function 1 gives both agents (1, 0, 0); function 2
    gives agent 0 (0, 2, 4) and agent 1 (4, 4, 4), a flat group that adds nothing."""
    f1 = shared(1.0, 0.0, 0.0)
    f2 = torch.tensor([[[0.0, 2.0, 4.0]], [[4.0, 4.0, 4.0]]], dtype=torch.float64)
    got = decoupled_advantages([[f1], [f2]], [2.0, 0.5])
    # f1: mean 1/3, unbiased std 1/sqrt(3): (2, -1, -1) / sqrt(3); f2 agent 0: mean 2, std 2: (-1, 0, 1)
    agent0 = [4 / SQRT3 - 0.5, -2 / SQRT3, -2 / SQRT3 + 0.5]
    agent1 = [4 / SQRT3, -2 / SQRT3, -2 / SQRT3]
    # the step's std of each agent's sums (their mean is 0): agent 0 sqrt((8.5 - 2 sqrt 3) / 2), agent 1 2
    std0, std1 = math.sqrt((8.5 - 2 * SQRT3) / 2), 2.0
    torch.testing.assert_close(got[0][0], torch.tensor([a / std0 for a in agent0], dtype=torch.float64))
    torch.testing.assert_close(got[1][0], torch.tensor([a / std1 for a in agent1], dtype=torch.float64))


def test_a_near_constant_function_is_divided_by_the_std_floor_in_its_own_unit():
    """Function 2 of node 1 spreads (4, 4, 4.003): std sqrt(3)e-3 < floor 0.01, so its
    advantages are (-0.001, -0.001, 0.002) / 0.01, not a unit spread."""
    f1 = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]] * 2, dtype=torch.float64)
    f2 = torch.tensor([[[0.0, 0.0, 0.0], [4.0, 4.0, 4.003]]] * 2, dtype=torch.float64)
    got = decoupled_advantages([[f1], [f2]], [1.0, 1.0], std_floor=0.01)
    sums = [2 / SQRT3, -1 / SQRT3, -1 / SQRT3, -0.1, -0.1, 0.2]  # node 0: f1's z-scores; node 1: f2 floored
    std = math.sqrt(sum(s * s for s in sums) / 5)  # the sums' mean is 0
    torch.testing.assert_close(got[0][0], torch.tensor([s / std for s in sums], dtype=torch.float64))


def test_multi_turn_returns_per_function_by_hand():
    """Turn 1: one node, G = 3, aligned; joint action 0 starts a child node at turn 2; discount 0.5.
    f1: turn 1 (1, 0, 0), child (2, 0, 1) (mean 1): returns (1.5, 0, 0).
    f2: turn 1 (0, 1, 2), child (0, 3, 0) (mean 1): returns (0.5, 1, 2)."""
    per_function = [
        torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0]]).reshape(2, 1, 3, 1).expand(2, 1, 3, 2),
        torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 0.0]]).reshape(2, 1, 3, 1).expand(2, 1, 3, 2),
    ]
    weights = [2.0, 0.5]
    rewards = [sum(w * f for w, f in zip(weights, turn)) for turn in per_function]
    children = [torch.tensor([[0, -1, -1]]), torch.tensor([[-1, -1, -1]])]
    joint = aligned_indices(2, 3)
    credits = function_credits(per_function, children, joint, 3, 0.5)
    torch.testing.assert_close(credits[0][0][0, 0], torch.tensor([1.5, 0.0, 0.0]))
    torch.testing.assert_close(credits[1][0][0, 0], torch.tensor([0.5, 1.0, 2.0]))
    estimate = tree_decoupled_advantages(rewards, per_function, children, joint, 3, 0.5, "mean", weights)
    # the summed reward's returns are logged: 2 * f1 + 0.5 * f2
    torch.testing.assert_close(estimate.returns[0][0, :, 0], torch.tensor([3.25, 0.5, 1.0]))
    # turn 1: f1 (1, -0.5, -0.5) / sqrt(0.75); f2 (-2/3, -1/6, 5/6) / sqrt(7/12)
    a1 = [x / math.sqrt(0.75) for x in (1.0, -0.5, -0.5)]
    a2 = [x / math.sqrt(7 / 12) for x in (-2 / 3, -1 / 6, 5 / 6)]
    sums = [2 * x + 0.5 * y for x, y in zip(a1, a2)]
    std = math.sqrt(sum(s * s for s in sums) / 2)
    for agent in range(2):
        torch.testing.assert_close(estimate.advantages[agent][0], torch.tensor([s / std for s in sums]))


def test_two_processes_compute_the_one_process_figure():
    """Each process holds one of the two nodes; ``totals`` sums their counts."""
    f1 = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 3.0]]] * 2)
    f2 = torch.tensor([[[0.0, 2.0, 4.0], [5.0, 1.0, 1.0]]] * 2)
    whole = decoupled_advantages([[f1], [f2]], [1.0, -0.5])
    sent = []  # what the second process gives the all-reduce
    decoupled_advantages([[f1[:, 1:]], [f2[:, 1:]]], [1.0, -0.5], totals=lambda local: sent.append(local) or local)
    first = decoupled_advantages(
        [[f1[:, :1]], [f2[:, :1]]], [1.0, -0.5], totals=lambda local: [a + b for a, b in zip(local, sent[0])]
    )
    for agent in range(2):
        torch.testing.assert_close(first[agent][0], whole[agent][0][:3])


def test_one_function_is_its_group_z_scores_divided_by_their_step_std():
    credits = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 3.0]]] * 2)
    z = [[group_advantages(credits[i]).reshape(-1)] for i in range(2)]
    expected = batch_scaled(z, [torch.stack([z[i][0].reshape(2, 3) for i in range(2)])])
    got = decoupled_advantages([[credits]], [3.0])  # a positive weight cancels in the step's std
    for agent in range(2):
        torch.testing.assert_close(got[agent][0], expected[agent][0])


def test_weights_must_match_the_functions():
    with pytest.raises(ValueError, match="2 reward functions' credits for 1 weights"):
        decoupled_advantages([[shared(1.0, 0.0)], [shared(0.0, 1.0)]], [1.0])


# ------------------------------------------------------------------------------ GDPO's motivating case
def test_sum_then_normalize_collapses_distinct_reward_combinations():
    """Two binary rewards, G = 2, three groups (nodes): (f1, f2) per sample is
    {(0,0), (1,0)}, {(0,0), (1,1)}, {(1,0), (1,1)}: summed rewards (0,1), (0,2), (1,2). The
    group z-score of the sum is (-1, 1) / sqrt 2 for all three; GDPO gives the group where
    the better sample wins on both rewards twice the others' advantages."""
    f1 = torch.tensor([[[0.0, 1.0], [0.0, 1.0], [1.0, 1.0]]] * 2)
    f2 = torch.tensor([[[0.0, 0.0], [0.0, 1.0], [0.0, 1.0]]] * 2)
    summed = group_advantages((f1 + f2)[0]).reshape(3, 2)
    assert torch.equal(summed[0], summed[1]) and torch.equal(summed[1], summed[2])
    gdpo = decoupled_advantages([[f1], [f2]], [1.0, 1.0])[0][0].reshape(3, 2)
    torch.testing.assert_close(gdpo[1], 2 * gdpo[0])
    torch.testing.assert_close(gdpo[2], gdpo[0])
    assert gdpo[0, 1] > 0 > gdpo[0, 0]


# ------------------------------------------------------------------------------ through a MAGRPO run
def recorded_run(tmp_path, **overrides):
    """A seeded MAGRPO run of two reward functions; each step's estimate is recorded."""
    torch.manual_seed(0)
    args = small_config(tmp_path, seed=3, reward_weights=[1.0, 0.5], **overrides)
    trainer = make_trainer(tmp_path, args=args, reward_func=[length_sum, content_score])
    estimates, estimate = [], trainer.objective.estimate
    trainer.objective.estimate = lambda tree: estimates.append(estimate(tree)) or estimates[-1]
    trainer.train()
    return trainer, estimates


def test_normalize_then_sum_trains_with_other_advantages_than_the_default(tmp_path):
    default, default_steps = recorded_run(tmp_path / "sum")
    gdpo, gdpo_steps = recorded_run(tmp_path / "gdpo", multi_objective_aggregation="normalize_then_sum")
    assert len(gdpo_steps) == len(default_steps) > 0
    first, base = gdpo_steps[0], default_steps[0]
    # the same first rollout: the summed reward's returns are logged unchanged ...
    for turn, base_turn in zip(first.returns, base.returns):
        torch.testing.assert_close(turn, base_turn)
    # ... the advantages are GDPO's: other than the default's, unit std over the step per agent
    for agent in range(2):
        assert not torch.allclose(first.advantages[agent][0], base.advantages[agent][0])
        assert first.advantages[agent][0].std().item() == pytest.approx(1.0, abs=1e-5)
    assert not unchanged(snapshot(default.agents), gdpo.agents)
    assert (tmp_path / "gdpo" / "run" / "metrics.jsonl").read_text().count('"agent0/advantage_std"') == len(gdpo_steps)


def test_one_reward_function_is_allowed(tmp_path):
    args = small_config(tmp_path, multi_objective_aggregation="normalize_then_sum")
    trainer = make_trainer(tmp_path, args=args, reward_func=content_score)
    before = snapshot(trainer.agents)
    trainer.train()
    assert trainer.objective.reward_weights == (1.0,)
    assert not unchanged(before, trainer.agents)


# ------------------------------------------------------------------------------ what is refused
@pytest.mark.parametrize(
    ("config_class", "overrides", "message"),
    [
        (MAGRPOConfig, {"advantage_normalization": False}, "advantage_normalization=False turns the division off"),
        (MAGRPOConfig, {"advantage_mode": "raw"}, "advantage_mode='raw' has no baseline"),
        (MAREINFORCEConfig, {}, "advantage_normalization=False turns the division off"),
        (MAREINFORCEConfig, {"advantage_normalization": True}, "advantage_mode='raw' has no baseline"),
        (MAGRPOConfig, {"scale_rewards": "batch"}, "scale_rewards='batch' would say each function is scaled"),
        (MAGRPOConfig, {"reference_kl_enabled": True}, "penalties of reference_kl_enabled change only the summed"),
        (MAGRPOConfig, {"overlong_buffer": 4}, "penalties of overlong_buffer change only the summed reward"),
        (
            MAGRPOConfig,
            {"overlong_buffer": 4, "reference_kl_enabled": True},
            "drop reference_kl_enabled and overlong_buffer",
        ),
        (CentralizedMAGRPOConfig, {"advantage_mode": "raw"}, "advantage_mode='raw' has no baseline"),
        (MAGRPOConfig, {"multi_objective_aggregation": "gdpo"}, "multi_objective_aggregation='gdpo'; expected"),
    ],
)
def test_settings_that_cannot_mean_what_was_written_are_named(config_class, overrides, message):
    values = {"multi_objective_aggregation": "normalize_then_sum", **overrides}
    with pytest.raises(ValueError, match=message):
        config_class(**values)


def test_the_family_baselines_with_normalisation_are_accepted():
    assert MARLOOConfig(advantage_normalization=True, multi_objective_aggregation="normalize_then_sum")
    assert MAGRPOConfig(advantage_mode="max", multi_objective_aggregation="normalize_then_sum")
    assert MAGRPOConfig(reference_kl_enabled=True).multi_objective_aggregation == "sum_then_normalize"


def test_a_reward_processor_is_refused_before_training(tmp_path):
    args = small_config(tmp_path, multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="reward_processor .* acts on their weighted sum only"):
        make_trainer(tmp_path, args=args, reward_func=[length_sum, content_score], reward_processor=math.tanh)
    # the default aggregation takes it
    make_trainer(tmp_path / "sum", args=small_config(tmp_path / "sum"), reward_processor=math.tanh)
