"""FSDP2 sharding (:mod:`comlrl.engine.sharding`) beyond tests/test_distributed.py's 2-rank runs:
checkpoints resumed at another number of ranks in both directions, bf16 through FSDP's mixed
precision, the config's checks, the fresh models whole copies are filled into, and a gather
that a ``state_dict()`` call cannot undo unseen."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from comlrl.engine import sharding
from comlrl.models.lora import fresh_model
from comlrl.trainers.reinforce import MAGRPOConfig

from .helpers import build_trainer, char_tokenizer, tiny_gpt2, tiny_llama, weights
from .test_distributed import torchrun


@pytest.fixture
def one_process(monkeypatch):
    """This test process is not one of torchrun's ranks (a run launched by it may be)."""
    for variable in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)


def test_a_sharded_checkpoint_resumes_on_one_process_and_back(tmp_path, one_process):
    """Two sharded ranks x 2 rows write checkpoint-2; one process x 4 rows (as many rows per
    step) resumes it, its optimizer states read from the ranks' slices, and ends where the two
    ranks did (sampling is greedy, so the rows' completions are the same). Back the other way,
    two sharded ranks resume one process's checkpoint-2, its whole optimizer states cut into
    slices, and end where that process did."""
    torchrun("magrpo", tmp_path / "ddp", ranks=2, per_device_rows=2, sharding="full_shard")
    two_ranks = torch.load(tmp_path / "ddp" / "rank0.pt")["straight"]
    one = build_trainer("magrpo", tmp_path / "ddp" / "run", per_device_rows=4)
    one.train(resume_from_checkpoint=str(tmp_path / "ddp" / "run" / "checkpoint-2"))
    for a, b in zip(weights(one), two_ranks, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)

    single = build_trainer("magrpo", tmp_path / "single" / "run", per_device_rows=4)
    single.train()
    checkpoint = tmp_path / "single" / "run" / "checkpoint-2"
    (tmp_path / "back").mkdir()
    torchrun("magrpo", tmp_path / "back", ranks=2, per_device_rows=2, sharding="full_shard", resume=checkpoint)
    for a, b in zip(torch.load(tmp_path / "back" / "rank0.pt")["resumed"], weights(single), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


def test_bf16_sharded_ranks_train_as_one_bf16_process(tmp_path, one_process):
    """precision="bf16" sharded: fp32 slices as the masters, bf16 gathers for compute, fp32
    gradient sums; one bf16 process keeps bf16 weights with fp32 masters. Their micro-batches
    differ (4 sequences a rank against 8), so their bf16 gradients round differently: the two
    updates agree within 5% (2-3% measured; a mean over the ranks instead of the sum would be
    50% off). The sharded run resumes its checkpoint exactly."""
    torchrun("magrpo_bf16", tmp_path / "ddp", ranks=2, per_device_rows=2, sharding="full_shard")
    ranks = torch.load(tmp_path / "ddp" / "rank0.pt")
    single = build_trainer("magrpo_bf16", tmp_path / "single", per_device_rows=4)
    initial = weights(single)
    single.train()
    for a, b, start in zip(ranks["straight"], weights(single), initial, strict=True):
        assert a.dtype == b.dtype == torch.bfloat16  # what samples: the gathered bf16 copies, the bf16 weights
        moved = (b.float() - start.float()).norm()
        assert moved > 1e-3
        assert (a.float() - b.float()).norm() < 0.05 * moved
    for a, b in zip(ranks["resumed"], ranks["straight"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_sharding_is_checked_in_the_config():
    choices = r"\['full_shard', 'replicate', 'shard_grad_op'\]"
    with pytest.raises(ValueError, match=rf"sharding='zero3'; expected one of {choices}"):
        MAGRPOConfig(sharding="zero3")
    with pytest.raises(ValueError, match=r"compiled_decoding=True is not supported with sharding='full_shard' yet"):
        MAGRPOConfig(sharding="full_shard", compiled_decoding=True)
    MAGRPOConfig(sharding="shard_grad_op", generation_backend="vllm")


def test_models_are_sharded_layer_by_layer():
    tok = char_tokenizer()
    llama, gpt2 = tiny_llama(tok), tiny_gpt2(tok)
    assert [type(m).__name__ for m in sharding.decoder_layers(llama)] == ["LlamaDecoderLayer"] * 2
    assert [type(m).__name__ for m in sharding.decoder_layers(gpt2)] == ["GPT2Block"] * 2
    assert sharding.model_class(llama) is type(llama) and not sharding.is_sharded(llama)
    with pytest.raises(ValueError, match=r"agent 1 \(Sequential\) names no decoder layer class"):
        sharding.shard_model(torch.nn.Sequential(torch.nn.Linear(2, 2)), "full_shard", None, "agent 1")


def test_a_fresh_model_is_built_like_the_agent_without_moving_the_streams():
    """What a sharded agent's whole copy (MADPOIter's comparators) is filled into: the same
    class, parameter names and shapes, adapters and sampling defaults, and drawing its random
    init from a forked stream, so the run samples as it would with a deep copy."""
    tok = char_tokenizer()
    base = tiny_llama(tok)
    base.generation_config.top_k = 7
    shared = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]), adapter_name="agent_0")
    shared.add_adapter("agent_1", LoraConfig(r=3, target_modules=["v_proj"]))
    for agent in (tiny_gpt2(tok), shared):
        before = torch.get_rng_state()
        fresh = fresh_model(agent)
        assert torch.equal(torch.get_rng_state(), before)
        assert type(fresh) is type(agent) and fresh is not agent
        shapes = {k: v.shape for k, v in agent.state_dict().items()}
        assert {k: v.shape for k, v in fresh.state_dict().items()} == shapes
    assert sorted(fresh.peft_config) == ["agent_0", "agent_1"]
    assert fresh.get_base_model().generation_config.top_k == 7


def test_a_state_dict_call_does_not_leave_the_sampler_on_slices(one_rank):
    """``state_dict()`` on a gathered model shards it again (FSDP's pre-save hook); the next
    gather, which comes before anything samples, makes it whole again instead of trusting
    that it still is (sampling on slices would gather per decoding step, in step with no rank)."""
    model = tiny_llama(char_tokenizer())
    sharding.shard_model(model, "full_shard", None, "agent 0")
    sharding.gather(model)
    assert not sharding.has_sharded(model.parameters())
    model.state_dict()
    assert sharding.has_sharded(model.parameters())
    sharding.gather(model)
    assert not sharding.has_sharded(model.parameters())
    sharding.release(model)
    assert sharding.has_sharded(model.parameters())
