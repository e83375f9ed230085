"""RewardProcessors: each factory by hand, composition order, names, bad arguments."""

import pytest

from comlrl.utils.reward_processor import RewardProcessors as RP

CASES = [
    # processor, input, expected output (by hand)
    (RP.identity(), -1.5, -1.5),
    (RP.scale(3.0), -1.5, -4.5),  # -1.5 * 3
    (RP.scale(), 2.0, 2.0),  # default factor 1
    (RP.shift(0.25), -1.5, -1.25),  # -1.5 + 0.25
    (RP.shift(), 2.0, 2.0),  # default value 0
    (RP.clamp(0.0, 1.0), -1.5, 0.0),  # below the min
    (RP.clamp(0.0, 1.0), 0.5, 0.5),  # inside
    (RP.clamp(0.0, 1.0), 7.0, 1.0),  # above the max
    (RP.clamp(min_value=0.0), 7.0, 7.0),  # no max
    (RP.clamp(max_value=1.0), -7.0, -7.0),  # no min
    (RP.clamp(), -7.0, -7.0),  # neither bound
    (RP.clamp(2.0, 2.0), 5.0, 2.0),  # equal bounds are allowed
    # compose applies left to right: (1.5 - 0.5) * 2 = 2 vs 1.5 * 2 - 0.5 = 2.5
    (RP.compose(RP.shift(-0.5), RP.scale(2.0)), 1.5, 2.0),
    (RP.compose(RP.scale(2.0), RP.shift(-0.5)), 1.5, 2.5),
    # (5 * 10 = 50) clamped to 20, then + 1 = 21
    (RP.compose(RP.scale(10), RP.clamp(max_value=20), RP.shift(1)), 5.0, 21.0),
    (RP.compose(), 3.0, 3.0),  # empty composition is the identity
    (RP.compose(lambda r: r * r, RP.shift(1)), -3.0, 10.0),  # plain callables work: 9 + 1
]


@pytest.mark.parametrize("processor, reward, expected", CASES)
def test_by_hand(processor, reward, expected):
    assert processor(reward) == pytest.approx(expected)


@pytest.mark.parametrize(
    "processor, name",
    [
        (RP.identity(), "identity()"),
        (RP.scale(2), "scale(factor=2.0)"),
        (RP.shift(-0.5), "shift(value=-0.5)"),
        (RP.clamp(0, 1), "clamp(min_value=0, max_value=1)"),
        (RP.clamp(max_value=1), "clamp(min_value=None, max_value=1)"),
        (
            RP.compose(RP.shift(-0.5), RP.scale(2)),
            "compose(shift(value=-0.5), scale(factor=2.0))",
        ),
    ],
)
def test_repr_names(processor, name):
    assert repr(processor) == name


def test_bad_clamp_bounds():
    with pytest.raises(ValueError, match=r"min_value \(1\.0\) must be <= max_value \(0\.0\)"):
        RP.clamp(1.0, 0.0)


def test_compose_rejects_non_callable():
    with pytest.raises(TypeError, match=r"processor 1 is not callable \(2\.0\)"):
        RP.compose(RP.identity(), 2.0)
