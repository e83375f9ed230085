"""``reference_devices`` with comlrl 1.4.3's meaning: each agent's frozen reference (the KL
terms' ``beta`` and ``reference_kl_enabled``) on a device of its own, its log-probs computed
there and brought back to the agent. On the CPU the numbers are those of a reference beside
its agent; other devices are ``"meta"`` (placement without computing) or CUDA counts
monkeypatched (names resolved, nothing moved)."""

import pytest
import torch
from peft import get_peft_model

from comlrl.engine import update as update_module
from comlrl.engine.agents import reference_placement
from comlrl.models.placement import frozen_copy_on
from comlrl.trainers import IACConfig, IACTrainer, MAGRPOConfig
from comlrl.trainers.dpo import MADPOConfig
from tests.helpers import (
    DATA,
    char_tokenizer,
    length_sum,
    log_lines,
    lora,
    make_trainer,
    small_config,
    tiny_gpt2,
    tiny_llama,
    weights,
)


def devices_of(model):
    return {p.device for p in model.parameters()} | {b.device for b in model.buffers()}


@pytest.fixture
def two_gpus(monkeypatch):
    """torch believes 2 GPUs are visible (device names resolve; no tensor may go there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# ------------------------------------------------------------------------------ same numbers
@pytest.mark.parametrize(
    "kl, metric", [({"beta": 0.1}, "agent0/kl"), ({"reference_kl_enabled": True}, "turn_1/reference_kl_mean")]
)
def test_a_reference_on_a_device_of_its_own_trains_as_one_beside_its_agent(tmp_path, kl, metric):
    def run(name, spec):
        trainer = make_trainer(tmp_path, args=small_config(tmp_path / name, reference_devices=spec, **kl))
        trainer.train()
        return weights(trainer), log_lines(tmp_path / name / "run", "metrics.jsonl")

    beside, beside_log = run("beside", None)
    assert beside_log[-1][metric] > 0, "after an update the agents differ from their references"
    for name, spec in [("one", "cpu"), ("listed", ["cpu", "cpu"])]:
        placed, placed_log = run(name, spec)
        assert all(torch.equal(a, b) for a, b in zip(beside, placed))
        assert placed_log == beside_log


# ------------------------------------------------------------------------------ placement
def test_references_are_copied_onto_their_devices(tmp_path):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, beta=0.1, reference_devices=["cpu", "meta"]))
    first, second = trainer.agents.references
    assert devices_of(first) == {torch.device("cpu")} and devices_of(second) == {torch.device("meta")}
    assert all(devices_of(agent) == {torch.device("cpu")} for agent in trainer.agents)
    assert all(not p.requires_grad for p in second.parameters()) and not second.training


def test_iac_and_maac_configs_have_the_field_with_the_same_meaning(tmp_path):
    tok = char_tokenizer()
    args = IACConfig(
        num_train_epochs=1,
        num_generations=2,
        max_new_tokens=6,
        beta=0.1,
        reference_devices="meta",
        output_dir=str(tmp_path / "run"),
    )
    trainer = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        args=args,
    )
    assert [devices_of(reference) for reference in trainer.agents.references] == [{torch.device("meta")}] * 2


def test_a_frozen_copy_on_a_device_keeps_tied_weights_tied_and_shares_no_storage():
    model = tiny_gpt2(char_tokenizer())
    on_meta = frozen_copy_on(model, torch.device("meta"))
    assert on_meta.lm_head.weight is on_meta.transformer.wte.weight
    assert devices_of(on_meta) == {torch.device("meta")} and devices_of(model) == {torch.device("cpu")}
    on_cpu = frozen_copy_on(model, torch.device("cpu"))
    assert on_cpu.lm_head.weight is on_cpu.transformer.wte.weight
    stored = {p.data_ptr() for p in model.parameters()}
    assert all(p.data_ptr() not in stored for p in on_cpu.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), on_cpu.parameters()))


def test_cuda_names_resolve_against_the_visible_gpus(two_gpus):
    tok = char_tokenizer()
    models = [tiny_llama(tok, seed=i) for i in range(2)]
    assert reference_placement("cuda:1", models, None) == [torch.device("cuda", 1)] * 2
    assert reference_placement(["cpu", "cuda:0"], models, None) == [torch.device("cpu"), torch.device("cuda", 0)]
    assert reference_placement(None, models, None) is None


@pytest.mark.parametrize(
    "spec, match",
    [
        (["cpu"], r"reference_devices lists 1 devices for 2 agents"),
        (["cpu", "tpu:9"], r"reference_devices\[1\]='tpu:9' is not a device"),
        (["cpu", "cuda:2"], r"reference_devices\[1\]='cuda:2' but 2 CUDA devices are visible"),
        ("cuda:5", r"reference_devices='cuda:5' but 2 CUDA devices are visible"),
    ],
)
def test_bad_reference_devices_are_named_with_their_index(spec, match, two_gpus):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=match):
        reference_placement(spec, [tiny_llama(tok, seed=i) for i in range(2)], None)


@pytest.mark.parametrize(
    "spec, match",
    [
        (["cpu", "cpu", "cpu"], r"reference_devices lists 3 devices for 2 agents"),
        (["cpu", "gpu"], r"reference_devices\[1\]='gpu' is not a device"),
        ("cuda:0", r"reference_devices='cuda:0' but no CUDA device is visible"),
    ],
)
def test_the_trainer_refuses_bad_reference_devices(tmp_path, monkeypatch, spec, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=match):
        make_trainer(tmp_path, args=small_config(tmp_path, beta=0.1, reference_devices=spec))


def test_the_config_checks_the_type():
    with pytest.raises(ValueError, match=r"reference_devices must be None, 'auto', a device name or a list .*got \[\]"):
        MAGRPOConfig(reference_devices=[])


# ------------------------------------------------------------------------------ adapters
def test_an_adapters_reference_can_only_be_beside_its_agent(tmp_path):
    tok = char_tokenizer()

    def lora_trainer(spec):
        agents = [tiny_llama(tok, seed=i) for i in range(2)]
        args = small_config(tmp_path, beta=0.1, reference_devices=spec)
        return make_trainer(tmp_path, agents=agents, tokenizer=tok, peft_config=lora(), args=args)

    assert lora_trainer("cpu").agents.references == [None, None]  # its base model, without the adapter
    match = r"reference_devices\[1\] puts agent 1's reference on meta, but agent 1 is a LoRA adapter on cpu: its "
    with pytest.raises(ValueError, match=match + r"reference is its own base model with the adapter disabled"):
        lora_trainer(["cpu", "meta"])


def test_an_adapter_on_a_gpu_named_otherwise_is_refused_before_anything_moves(two_gpus):
    model = get_peft_model(tiny_llama(char_tokenizer()), lora())
    match = r"reference_devices puts agent 0's reference on cuda:1, but agent 0 is a LoRA adapter on cpu"
    with pytest.raises(ValueError, match=match):
        reference_placement("cuda:1", [model], None)


# ------------------------------------------------------------------------------ where the log-probs are computed
def test_reference_logprobs_are_computed_on_the_references_device(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, beta=0.1, reference_devices="meta"))
    tree = trainer.rollout(trainer.train_prompts, [0], reward=trainer.train_reward)
    seen = []

    def spy(model, prompt_ids, prompt_mask, completion_ids, completion_mask, **kwargs):
        seen.append({next(model.parameters()).device} | {t.device for t in (prompt_ids, completion_mask)})
        return torch.zeros(completion_ids.shape)  # a meta model cannot compute: only where it was asked counts

    monkeypatch.setattr(update_module, "completion_logprobs", spy)
    logps = trainer.objective.update.frozen_logprobs(tree, reference=True)
    assert seen and all(devices == {torch.device("meta")} for devices in seen)
    assert all(t.device == torch.device("cpu") for agent in logps for t in agent)


def test_reference_logprobs_come_back_to_the_agents_device(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, beta=0.1, reference_devices="cpu"))
    tree = trainer.rollout(trainer.train_prompts, [0], reward=trainer.train_reward)
    monkeypatch.setattr(trainer.agents, "device", lambda agent: torch.device("meta"))  # as if on another device
    logps = trainer.objective.update.frozen_logprobs(tree, reference=True)
    assert all(t.device == torch.device("meta") for agent in logps for t in agent)


# ------------------------------------------------------------------------------ trainers without a reference
def test_madpo_keeps_no_reference_and_refuses_the_field():
    with pytest.raises(ValueError, match=r"reference_devices='cpu' has no effect in MADPO .*keeps no reference model"):
        MADPOConfig(reference_devices="cpu")
