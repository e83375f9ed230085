"""Optimizers: the fused AdamW steps like the reference one; the finiteness check finds any
bad element; parameters mapped from a model file get memory of their own before any step."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.optim import Learners, all_finite, build_optimizers, file_mapped_ranges, maps_file, own_file_mapped

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
