"""selective_log_softmax and head_log_softmax against log_softmax + gather (values and gradients) and hand examples."""

import math

import pytest
import torch

from comlrl.algorithms.logprobs import head_log_softmax, selective_log_softmax


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


# ---------------------------------------------------------------- the LM head in chunks
def test_head_hand_example():
    # hidden [1, 0] against head rows [0, 0], [0, 0], [ln 2, 0]: logits [0, 0, ln 2] -> p = [1/4, 1/4, 1/2]
    hidden = torch.tensor([[[1.0, 0.0]]])
    weight = torch.tensor([[0.0, 0.0], [0.0, 0.0], [math.log(2), 0.0]])
    got = head_log_softmax(hidden, weight, torch.tensor([[2]]))
    torch.testing.assert_close(got, torch.tensor([[-math.log(2)]]))


@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000], ids=["one token", "uneven chunks", "one chunk"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("kept", [True, False], ids=["probabilities kept", "recomputed"])
def test_head_values_and_gradients_match_the_logits_path(monkeypatch, chunk_tokens, temperature, kept):
    vocabulary = 13
    monkeypatch.setattr("comlrl.algorithms.logprobs.HEAD_CHUNK_ELEMENTS", chunk_tokens * vocabulary)
    monkeypatch.setattr("comlrl.algorithms.logprobs.HEAD_KEPT_ELEMENTS", 10**6 if kept else 0)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 6, 8, generator=gen, requires_grad=True)  # 6 positions, 5 completion tokens
    weight = torch.randn(vocabulary, 8, generator=gen, requires_grad=True)
    token_ids = torch.randint(0, vocabulary, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, generator=gen)
    got = head_log_softmax(hidden, weight, token_ids, temperature)
    torch.autograd.backward(got, upstream)
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected = reference(hidden[:, :5] @ weight.T / temperature, token_ids)
    torch.autograd.backward(expected, upstream)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-6, rtol=1e-6)
    assert grads[0][:, 5].eq(0).all()  # the last position predicts nothing
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-6, rtol=1e-6)


def test_head_backward_twice_gives_the_same_gradients():
    # The kept probabilities become the first backward's logit gradient: a second backward
    # (retain_graph) must recompute them, not reuse what the first overwrote.
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 4, 8, generator=gen, requires_grad=True)
    weight = torch.randn(11, 8, generator=gen, requires_grad=True)
    got = head_log_softmax(hidden, weight, torch.randint(0, 11, (2, 4), generator=gen), 0.7)
    got.sum().backward(retain_graph=True)
    first = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got.sum().backward()
    torch.testing.assert_close(hidden.grad, first[0])
    torch.testing.assert_close(weight.grad, first[1])


@pytest.mark.parametrize("kept", [True, False], ids=["probabilities kept", "recomputed"])
def test_head_in_bf16_gives_float32_log_probs_and_bf16_gradients(monkeypatch, kept):
    monkeypatch.setattr("comlrl.algorithms.logprobs.HEAD_KEPT_ELEMENTS", 10**6 if kept else 0)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 4, 8, generator=gen).bfloat16().requires_grad_()
    weight = torch.randn(11, 8, generator=gen).bfloat16().requires_grad_()
    token_ids = torch.randint(0, 11, (2, 4), generator=gen)
    got = head_log_softmax(hidden, weight, token_ids)
    got.sum().backward()
    assert got.dtype == torch.float32 and hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    grads = hidden.grad, weight.grad
    hidden.grad = weight.grad = None
    expected = reference(hidden @ weight.T, token_ids)
    expected.sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grads[0], hidden.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grads[1], weight.grad, atol=2e-2, rtol=2e-2)
