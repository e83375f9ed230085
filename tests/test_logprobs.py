"""selective_log_softmax against log_softmax + gather (values and gradients) and a hand example."""

import math

import pytest
import torch

from comlrl.algorithms.logprobs import selective_log_softmax


def reference(logits, token_ids):
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("token, expected", [(0, -math.log(4)), (1, -math.log(4)), (2, -math.log(2))])
def test_hand_example(token, expected):
    # logits [0, 0, ln 2] -> exp: [1, 1, 2], sum 4 -> p = [1/4, 1/4, 1/2]
    logits = torch.tensor([[[0.0, 0.0, math.log(2)]]])
    got = selective_log_softmax(logits, torch.tensor([[token]]))
    assert got.shape == (1, 1)
    torch.testing.assert_close(got, torch.tensor([[expected]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
def test_matches_log_softmax_gather(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 5, 50, generator=gen) * 4).to(dtype)
    token_ids = torch.randint(0, 50, (3, 5), generator=gen)
    got = selective_log_softmax(logits, token_ids)
    assert got.shape == (3, 5)
    assert got.dtype == torch.float32  # computed in float32 even for bf16 logits
    torch.testing.assert_close(got, reference(logits, token_ids), rtol=1e-5, atol=1e-5)


def test_gradient_matches_reference():
    logits = torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(0))
    token_ids = torch.randint(0, 10, (2, 4), generator=torch.Generator().manual_seed(1))
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    selective_log_softmax(a, token_ids).sum().backward()
    reference(b, token_ids).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_tempered_values_and_gradients_of_a_sliced_view_match_the_plain_computation(dtype, temperature):
    gen = torch.Generator().manual_seed(0)
    # (S, T+1, V) logits of a model that kept T+1 positions, as the trainer's forward gives
    # them, cut from a wider tensor so the input is a non-contiguous view.
    wide = (torch.randn(3, 9, 40, generator=gen) * 3).to(dtype)
    token_ids = torch.randint(0, 40, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, generator=gen)  # unequal weights per token, as a loss gives
    ours, plain = wide.clone().requires_grad_(), wide.clone().requires_grad_()
    got = selective_log_softmax(ours[:, 3:], token_ids, temperature)
    expected = reference(plain[:, 3:8].float() / temperature, token_ids)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    (got * upstream).sum().backward()
    (expected * upstream).sum().backward()
    assert ours.grad.dtype == dtype
    torch.testing.assert_close(ours.grad.float(), plain.grad.float(), rtol=1e-5, atol=1e-5)
    assert (ours.grad[:, 8:] == 0).all() and (ours.grad[:, :3] == 0).all(), "unused positions get no gradient"
