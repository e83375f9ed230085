"""Optimizers: the fused AdamW steps like the reference one, and so does one whose state was
allocated before its first step; the finiteness check finds any bad element; parameters
mapped from a model file get memory of their own before any step."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.engine.optim import (
    Learners,
    all_finite,
    allocate_adamw_state,
    build_optimizers,
    file_mapped_ranges,
    maps_file,
    own_file_mapped,
)

from .helpers import MIXED, char_tokenizer, tiny_gpt2


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


def file_mapped(tensor: torch.Tensor) -> bool:
    return maps_file(file_mapped_ranges(), tensor.data_ptr())


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="only Linux says which memory maps a file")
def test_parameters_mapped_from_the_model_file_are_copied_before_the_optimizer_writes_them(tmp_path):
    tiny_gpt2(char_tokenizer(MIXED)).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert any(file_mapped(p) for p in model.parameters()), "the test needs from_pretrained to map the file"
    Learners().add(["agent 0"], [list(model.parameters())], [1e-3], 0.0, "constant", 0.0, 1)
    assert not any(file_mapped(p) for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight, "tied embeddings stay tied"
    for name, p in model.named_parameters():
        assert torch.equal(p, expected[name]), name
    assert own_file_mapped(model.parameters()) == 0, "nothing left to copy"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="only Linux says which memory maps a file")
def test_parameters_sharing_one_mapped_storage_stay_tied(tmp_path):
    path = tmp_path / "weights.bin"
    torch.arange(12, dtype=torch.float32).numpy().tofile(path)
    storage = torch.from_file(str(path), shared=False, size=12)
    whole = torch.nn.Parameter(storage.view(3, 4))
    row = torch.nn.Parameter(storage[:4])  # a second parameter over the same memory
    lone = torch.nn.Parameter(torch.from_file(str(path), shared=False, size=12))
    assert file_mapped(whole) and file_mapped(lone)
    assert own_file_mapped([whole, row, lone, lone]) == 1
    assert not file_mapped(lone) and file_mapped(whole)
    with torch.no_grad():
        whole[0, 0] = 100.0
    assert row[0] == 100.0, "still tied"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adamw_state_allocated_before_the_first_step_steps_as_the_lazy_one(fused, amsgrad):
    torch.manual_seed(0)
    weights = [torch.randn(5, 3), torch.randn(7), torch.randn(2)]
    eager = [torch.nn.Parameter(w.clone()) for w in weights]
    lazy = [torch.nn.Parameter(w.clone()) for w in weights]
    options = dict(lr=1e-2, weight_decay=0.1, fused=fused or None, amsgrad=amsgrad)
    eager_optimizer, lazy_optimizer = torch.optim.AdamW(eager, **options), torch.optim.AdamW(lazy, **options)
    allocate_adamw_state(eager_optimizer)
    state = eager_optimizer.state[eager[0]]
    moments = {"exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad else set())
    assert set(state) == {"step"} | moments and float(state["step"]) == 0
    assert all(not state[name].any() for name in moments)
    for step in range(3):
        gradients = [torch.randn_like(w) for w in weights]
        for params, optimizer in ((eager, eager_optimizer), (lazy, lazy_optimizer)):
            for p, g in zip(params[:2], gradients):  # the last parameter never gets a gradient
                p.grad = g.clone()
            optimizer.step()
        if step == 0:
            allocate_adamw_state(eager_optimizer)  # a second call leaves the state as it is
    for got, want in zip(eager, lazy):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    for got, want in zip(eager[:2], lazy[:2]):
        for name, value in lazy_optimizer.state[want].items():
            torch.testing.assert_close(eager_optimizer.state[got][name], value, atol=0, rtol=0)
    assert float(eager_optimizer.state[eager[2]]["step"]) == 0


def test_learners_allocate_state_fills_only_what_is_missing():
    model = torch.nn.Linear(3, 2)
    learners = Learners()
    learners.add(["agent0"], [list(model.parameters())], [1e-3], 0.0, "constant", 0.0, 4)
    (optimizer,) = learners.optimizers
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    moments = {p: optimizer.state[p]["exp_avg"] for p in model.parameters()}
    learners.allocate_state()
    assert all(optimizer.state[p]["exp_avg"] is moments[p] for p in model.parameters())
    assert all(float(optimizer.state[p]["step"]) == 1 for p in model.parameters())
