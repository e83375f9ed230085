"""policy_gradient_loss for each loss_type against hand numbers."""

import pytest
import torch

from comlrl.algorithms.losses import LOSS_AGGREGATIONS, policy_gradient_loss

# S = 2 sequences, T = 3 tokens; the third token of sequence 0 is padding.
LOGPS = [[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]]
ADVANTAGES = [2.0, -1.0]
MASK = [[True, True, False], [True, True, True]]
MAX_NEW_TOKENS = 4  # > T, so dr_grpo's constant differs from the padded width
# per-token loss -A * logp:  seq 0: [2, 4, (6)]  -> masked sum 6,   2 tokens
#                            seq 1: [-4, -5, -6] -> masked sum -15, 3 tokens
EXPECTED = {
    "grpo": (6 / 2 + -15 / 3) / 2,  # (3 + -5) / 2 = -1
    "dapo": (6 - 15) / (2 + 3),  # -9 / 5 = -1.8
    "dr_grpo": (6 - 15) / (2 * MAX_NEW_TOKENS),  # -9 / 8 = -1.125
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


def loss(loss_type, logps=LOGPS, mask=MASK):
    return policy_gradient_loss(
        torch.as_tensor(logps),
        torch.tensor(ADVANTAGES),
        torch.tensor(mask),
        loss_type=loss_type,
        max_new_tokens=MAX_NEW_TOKENS,
    )


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
