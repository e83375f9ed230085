"""group_advantages against hand computations and a slow loop reference."""

import itertools
import math

import pytest
import torch

from comlrl.algorithms.advantages import BASELINES, batch_scaled, group_advantages
from comlrl.trainers.reinforce import MAGRPOConfig
from tests.helpers import content_score, make_trainer, small_config, snapshot, unchanged

MODES = ["mean", "rloo", "max", "raw"]

# Two groups of G = 3.
#   group 0: [1, 2, 6]   sum 9, mean 3, max 6, deviations [-2, -1, 3],
#            unbiased var (4 + 1 + 9) / 2 = 7, std sqrt(7) = 2.6457513
#   group 1: [-3, 1, -1] sum -3, mean -1, max 1, deviations [-2, 2, 0],
#            unbiased var (4 + 4 + 0) / 2 = 4, std 2
RETURNS = torch.tensor([[1.0, 2.0, 6.0], [-3.0, 1.0, -1.0]])
S7 = math.sqrt(7.0)

UNNORMALIZED = {
    # r - mean: [1-3, 2-3, 6-3]; [-3+1, 1+1, -1+1]
    "mean": [[-2.0, -1.0, 3.0], [-2.0, 2.0, 0.0]],
    # rloo baseline (sum - r) / 2: [(9-1)/2, (9-2)/2, (9-6)/2] = [4, 3.5, 1.5]
    #                              [(-3+3)/2, (-3-1)/2, (-3+1)/2] = [0, -2, -1]
    "rloo": [[1 - 4.0, 2 - 3.5, 6 - 1.5], [-3 - 0.0, 1 + 2.0, -1 + 1.0]],
    # r - max: [1-6, 2-6, 6-6]; [-3-1, 1-1, -1-1]
    "max": [[-5.0, -4.0, 0.0], [-4.0, 0.0, -2.0]],
    # no baseline
    "raw": [[1.0, 2.0, 6.0], [-3.0, 1.0, -1.0]],
}
NORMALIZED = {
    # divide group 0 by sqrt(7), group 1 by 2 (both above the default std floor 0.01)
    "mean": [[-2 / S7, -1 / S7, 3 / S7], [-1.0, 1.0, 0.0]],
    "rloo": [[-3 / S7, -1.5 / S7, 4.5 / S7], [-1.5, 1.5, 0.0]],
    "max": [[-5 / S7, -4 / S7, 0.0], [-2.0, 0.0, -1.0]],
    "raw": [[1 / S7, 2 / S7, 6 / S7], [-1.5, 0.5, -0.5]],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [False, True])
def test_hand_two_groups(mode, normalize):
    expected = torch.tensor((NORMALIZED if normalize else UNNORMALIZED)[mode])
    got = group_advantages(RETURNS, mode=mode, normalize=normalize)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_std_floor_replaces_a_smaller_std(mode):
    # [0, 2]: std = sqrt(((-1)^2 + 1^2) / 1) = sqrt(2) = 1.414 < floor 2, so the divisor is 2
    returns = torch.tensor([[0.0, 2.0]])
    unnormalized = {"mean": [-1.0, 1.0], "rloo": [-2.0, 2.0], "max": [-2.0, 0.0], "raw": [0.0, 2.0]}
    got = group_advantages(returns, mode=mode, normalize=True, std_floor=2.0)
    torch.testing.assert_close(got, torch.tensor([unnormalized[mode]]) / 2.0)
    # a floor below the std changes nothing: divided by sqrt(2) itself
    got = group_advantages(returns, mode=mode, normalize=True, std_floor=1.0)
    torch.testing.assert_close(got, torch.tensor([unnormalized[mode]]) / math.sqrt(2.0))


def test_near_constant_raw_group_is_bounded_by_the_floor():
    # [1, 1, 1, 1 + d], d = 0.001: mean d/4, deviations (-d/4, -d/4, -d/4, 3d/4),
    # unbiased var (3 d^2/16 + 9 d^2/16) / 3 = d^2/4, std d/2 = 5e-4 < floor 1e-2.
    # Divided by the floor: returns * 100 = [100, 100, 100, 100.1] (by the std: ~2000 each).
    returns = torch.tensor([[1.0, 1.0, 1.0, 1.001]])
    got = group_advantages(returns, mode="raw", normalize=True, std_floor=1e-2)
    torch.testing.assert_close(got, torch.tensor([[100.0, 100.0, 100.0, 100.1]]))
    assert (got.abs() <= returns.abs() / 1e-2 * (1 + 1e-6)).all()
    # mean mode: (r - mean) / floor = (-d/4, -d/4, -d/4, 3d/4) * 100 = (-0.025, ..., 0.075)
    # (by the std d/2 these would be (-0.5, -0.5, -0.5, 1.5), a full unit-scale update)
    got = group_advantages(returns, mode="mean", normalize=True, std_floor=1e-2)
    torch.testing.assert_close(got, torch.tensor([[-0.025, -0.025, -0.025, 0.075]]), rtol=1e-3, atol=1e-6)


def test_default_floor_is_one_hundredth():
    # std 5e-4 as above: the default floor 0.01 applies, not the std
    returns = torch.tensor([[1.0, 1.0, 1.0, 1.001]])
    torch.testing.assert_close(group_advantages(returns, mode="raw"), returns / 1e-2)


def test_default_is_mean_normalized():
    torch.testing.assert_close(group_advantages(RETURNS), torch.tensor(NORMALIZED["mean"]), rtol=1e-5, atol=1e-5)


def test_normalization_only_rescales():
    """No re-centring: max stays <= 0 with its best sample at 0, raw keeps its sign."""
    returns = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)) * 3 + 1
    std = returns.std(dim=-1, keepdim=True)
    for mode in MODES:
        plain = group_advantages(returns, mode=mode, normalize=False)
        # every std is far above the floor: plain std division
        assert (std > 1e-2).all()
        scaled = group_advantages(returns, mode=mode, normalize=True)
        torch.testing.assert_close(scaled, plain / std)
    max_adv = group_advantages(returns, mode="max", normalize=True)
    assert (max_adv <= 0).all()
    assert (max_adv.max(dim=-1).values == 0).all()
    raw_adv = group_advantages(returns, mode="raw", normalize=True)
    assert torch.equal(raw_adv.sign(), returns.sign())


@pytest.mark.parametrize("normalize", [False, True])
def test_modes_are_pairwise_different(normalize):
    # Re-centring after the baseline would make all four identical to "mean".
    results = {m: group_advantages(RETURNS, mode=m, normalize=normalize) for m in MODES}
    for a, b in itertools.combinations(MODES, 2):
        assert not torch.allclose(results[a], results[b], atol=1e-3), (a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [False, True])
def test_constant_group(mode, normalize):
    # Values whose float32 mean is not exact (100.3 * 8 / 8 rounds); the last group is
    # not constant and must be unaffected by its neighbours.
    returns = torch.tensor([[0.1] * 8, [100.3] * 8, [0.0] * 8, [0.0] * 7 + [8.0]])
    got = group_advantages(returns, mode=mode, normalize=normalize)
    assert torch.isfinite(got).all()
    if mode != "raw":
        assert torch.equal(got[:3], torch.zeros(3, 8))
    # last group: mean 1, max 8, rloo baseline 8/7 for the zeros and 0 for the 8,
    # unbiased std sqrt((7 * 1 + 49) / 7) = sqrt(8)
    last = {
        "mean": [-1.0] * 7 + [7.0],
        "rloo": [-8 / 7] * 7 + [8.0],
        "max": [-8.0] * 7 + [0.0],
        "raw": [0.0] * 7 + [8.0],
    }[mode]
    expected = torch.tensor(last) / (math.sqrt(8.0) if normalize else 1.0)
    torch.testing.assert_close(got[3], expected)


@pytest.mark.parametrize("std_floor", [1e-2, 1.0, 100.0])
def test_constant_groups_are_unscaled_whatever_the_floor(std_floor):
    # a constant group has no spread: raw keeps its returns (not returns / floor), the
    # centred modes give exactly 0
    returns = torch.tensor([[100.3] * 4, [0.1] * 4])
    raw = group_advantages(returns, mode="raw", normalize=True, std_floor=std_floor)
    assert torch.equal(raw, returns)
    for mode in ("mean", "rloo", "max"):
        assert torch.equal(group_advantages(returns, mode=mode, normalize=True, std_floor=std_floor), torch.zeros(2, 4))


def test_bad_mode():
    with pytest.raises(ValueError, match=r"'median'.*\['max', 'mean', 'raw', 'rloo'\]"):
        group_advantages(RETURNS, mode="median")


@pytest.mark.parametrize("shape", [(6,), (2, 3, 1)])
def test_bad_shape(shape):
    with pytest.raises(ValueError, match=r"\(num_groups, G\)"):
        group_advantages(torch.zeros(shape))


def test_modes_table():
    assert sorted(BASELINES) == sorted(MODES)


def loop_reference(returns, mode, normalize, std_floor):
    out = []
    for group in returns.tolist():
        g = len(group)
        total = sum(group)
        mean = total / g
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (g - 1))
        row = []
        for r in group:
            baseline = {
                "mean": mean,
                "rloo": (total - r) / (g - 1),
                "max": max(group),
                "raw": 0.0,
            }[mode]
            a = r - baseline
            row.append(a / max(std, std_floor) if normalize else a)
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("std_floor", [1e-3, 8.0])  # 8: above most of these groups' std (~5)
def test_against_loop_reference(seed, mode, normalize, std_floor):
    gen = torch.Generator().manual_seed(seed)
    num_groups = int(torch.randint(1, 6, (1,), generator=gen))
    group_size = int(torch.randint(2, 9, (1,), generator=gen))
    returns = torch.randn(num_groups, group_size, generator=gen) * 5 - 1
    got = group_advantages(returns, mode=mode, normalize=normalize, std_floor=std_floor)
    expected = loop_reference(returns, mode, normalize, std_floor)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_constant_group_in_raw_mode_is_left_unscaled():
    # std = 0: normalising would divide by the floor alone (100 x); the group keeps its returns.
    got = group_advantages(torch.tensor([[100.3, 100.3, 100.3], [1.0, 2.0, 3.0]]), mode="raw", normalize=True)
    torch.testing.assert_close(got[0], torch.tensor([100.3, 100.3, 100.3]))
    # the other group is divided by its std, 1
    torch.testing.assert_close(got[1], torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("mode,normalize", [("mean", False), ("rloo", False), ("max", True), ("raw", True)])
def test_groups_of_one_are_refused_where_a_group_is_needed(mode, normalize):
    with pytest.raises(ValueError, match="needs groups of at least 2 samples, got 1"):
        group_advantages(torch.tensor([[1.0], [2.0]]), mode=mode, normalize=normalize)


def test_groups_of_one_in_raw_mode_without_normalisation_are_the_returns():
    torch.testing.assert_close(
        group_advantages(torch.tensor([[1.0], [2.0]]), mode="raw", normalize=False), torch.tensor([[1.0], [2.0]])
    )


@pytest.mark.parametrize("value", [0.0, -1e-2, float("nan"), float("inf"), True, "0.01", None])
def test_config_std_floor_must_be_a_positive_number(value):
    with pytest.raises(
        ValueError, match=r"advantage_std_floor must be a (finite number > 0 \(reward units\)|number), got"
    ):
        MAGRPOConfig(advantage_std_floor=value)


def test_config_std_floor_default():
    assert MAGRPOConfig().advantage_std_floor == 1e-2
    assert MAGRPOConfig(advantage_std_floor=0.5).advantage_std_floor == 0.5


# ------------------------------------------------------------------------------ batch scaling
def test_batch_scaling_divides_by_the_std_of_every_return_of_the_step():
    # one agent, one turn, 2 nodes x G = 2, returns (1, 3) and (5, 5): mean-baseline advantages
    # (-1, 1), (0, 0); the batch's returns 1, 3, 5, 5 have mean 3.5 and unbiased variance
    # (6.25 + 0.25 + 2.25 + 2.25) / 3 = 11 / 3
    credits = [torch.tensor([[[1.0, 3.0], [5.0, 5.0]]])]
    advantages = [[torch.tensor([-1.0, 1.0, 0.0, 0.0])]]
    scaled = batch_scaled(advantages, credits)
    std = math.sqrt(11 / 3)
    torch.testing.assert_close(scaled[0][0], torch.tensor([-1 / std, 1 / std, 0.0, 0.0]))


def test_batch_scaling_over_two_processes_is_the_one_process_figure():
    """Each process holds one node; ``totals`` sums their counts: the same std as one process."""
    first, second = [torch.tensor([[[1.0, 3.0]]])], [torch.tensor([[[5.0, 5.0]]])]
    advantages = [[torch.tensor([-1.0, 1.0])]]
    sent = []  # what the second process gives the all-reduce
    batch_scaled([[torch.zeros(2)]], second, totals=lambda local: sent.append(local) or local)
    scaled = batch_scaled(advantages, first, totals=lambda local: [a + b for a, b in zip(local, sent[0])])
    std = math.sqrt(11 / 3)  # the std of 1, 3, 5, 5, as in the one-process test
    torch.testing.assert_close(scaled[0][0], torch.tensor([-1 / std, 1 / std]))


def test_batch_scaling_leaves_a_constant_batch_and_pads_missing_turns():
    credits = [torch.full((1, 2, 2), 4.0)]
    advantages = [[torch.zeros(4)]]
    seen = []
    scaled = batch_scaled(advantages, credits, num_turns=3, totals=lambda local: seen.append(len(local)) or local)
    assert torch.equal(scaled[0][0], torch.zeros(4)) and seen == [9]  # 3 numbers for each of the 3 turns


def test_scale_rewards_batch_changes_a_magrpo_run_and_group_is_the_default(tmp_path):
    trained = {}
    for scale in ("group", "batch"):
        torch.manual_seed(0)
        args = small_config(tmp_path / scale, seed=3, scale_rewards=scale)
        trainer = make_trainer(tmp_path / scale, args=args, reward_func=content_score)
        trainer.train()
        trained[scale] = trainer
    assert MAGRPOConfig().scale_rewards == "group"
    assert not unchanged(snapshot(trained["group"].agents), trained["batch"].agents)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"scale_rewards": "none"}, "scale_rewards='none' is TRL's: write advantage_normalization=False"),
        ({"scale_rewards": "batch", "advantage_normalization": False}, "advantage_normalization is False"),
        ({"scale_rewards": "global"}, r"scale_rewards='global'; expected one of \['batch', 'group'\]"),
    ],
)
def test_bad_scale_rewards_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(**overrides)
