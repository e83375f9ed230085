"""Optimizers: the fused AdamW steps like the reference one; the finiteness check finds any bad element."""

import pytest
import torch

from comlrl.optim import all_finite, build_optimizers


def test_fused_adamw_on_the_cpu_steps_like_the_reference_adamw():
    torch.manual_seed(0)
    weights = [torch.randn(5, 3), torch.randn(7)]
    ours = [torch.nn.Parameter(w.clone()) for w in weights]
    reference = [torch.nn.Parameter(w.clone()) for w in weights]
    (optimizer,) = build_optimizers([ours], [1e-2], weight_decay=0.1)
    expected = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.1, foreach=False)
    assert optimizer.defaults["fused"]
    for _ in range(3):
        gradients = [torch.randn_like(w) for w in weights]
        for params, opt in ((ours, optimizer), (reference, expected)):
            for p, g in zip(params, gradients):
                p.grad = g.clone()
            opt.step()
    for got, want in zip(ours, reference):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_finite_finds_one_bad_element(bad, dtype):
    tensors = [torch.randn(4, 3, dtype=dtype), torch.empty(0, dtype=dtype), torch.randn(5, dtype=dtype)]
    assert all_finite(tensors)
    tensors[2][3] = bad
    assert not all_finite(tensors)


def test_all_finite_takes_large_and_empty_tensors():
    assert all_finite([torch.full((1000,), 3e38), torch.full((2,), -3e38)])  # a sum or 2-norm would overflow
    assert all_finite([torch.empty(0)]) and all_finite([])
