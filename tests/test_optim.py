"""Optimizers: the fused AdamW takes the same steps as the reference implementation."""

import torch

from comlrl.optim import build_optimizers


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
