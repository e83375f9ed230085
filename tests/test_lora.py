"""LoRA adapters: only adapters train, agents sharing one base keep separate adapters, saving
writes adapters (or merged models), and checkpoints carry the adapters."""

import sys

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import char_tokenizer, content_score, interrupting_reward, lora, make_trainer, small_config, tiny_llama


def base_and_adapters(model):
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return base, adapters


def changed(before, model):
    now = dict(model.named_parameters())
    return {name for name, value in before.items() if not torch.equal(value, now[name])}


def separate_lora_agents(tmp_path, tok, **config):
    """Two tiny agents, each its own model with a LoRA adapter, rewarded by content_score."""
    agents = [tiny_llama(tok, i) for i in range(2)]
    args = small_config(tmp_path, **config)
    return make_trainer(
        tmp_path, agents=agents, tokenizer=tok, reward_func=content_score, peft_config=lora(), args=args
    )


def test_separate_agents_train_only_their_adapters_and_save_them(tmp_path):
    tok = char_tokenizer()
    trainer = separate_lora_agents(tmp_path, tok)
    before = [base_and_adapters(agent) for agent in trainer.agents]
    trainer.training_step([0, 1])
    for (base, adapters), agent in zip(before, trainer.agents):
        assert not changed(base, agent), "the base model must stay frozen"
        assert changed(adapters, agent), "the adapter must learn"
    folders = trainer.save_model(str(tmp_path / "out"))
    ids = torch.tensor([[3, 4, 5, 6]])
    for i, folder in enumerate(folders):
        loaded = PeftModel.from_pretrained(tiny_llama(tok, i), folder).eval()
        trainer.agents[i].eval()
        torch.testing.assert_close(loaded(ids).logits, trainer.agents[i](ids).logits)
    merged = trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
    plain = AutoModelForCausalLM.from_pretrained(merged[0]).eval()
    torch.testing.assert_close(plain(ids).logits, trainer.agents[0](ids).logits, atol=1e-5, rtol=1e-5)
    assert isinstance(trainer.agents[0], PeftModel), "merging for the save must not change the training model"


def test_agents_sharing_one_base_keep_separate_adapters(tmp_path):
    tok = char_tokenizer()
    base = tiny_llama(tok, 0)

    def agent0_only(a, b):  # agent 1's reward is constant: its advantages, and so its update, are 0
        return [[score, 0.0] for score in content_score(a, b)]

    trainer = make_trainer(
        tmp_path,
        agents=[base, base],
        tokenizer=tok,
        reward_func=agent0_only,
        peft_config=lora(),
        args=small_config(tmp_path),
    )
    assert trainer.agents[0] is trainer.agents[1] and trainer.agents.adapters == ["agent_0", "agent_1"]
    shared = trainer.agents[0]
    frozen, adapters = base_and_adapters(shared)
    trainer.training_step([0, 1])
    moved = changed(adapters, shared)
    assert moved and all(".agent_0." in name for name in moved), moved
    assert not changed(frozen, shared)
    trainer.backend.generate(1, ["ab"], 1, {"do_sample": False, "max_new_tokens": 2})
    assert shared.active_adapter == "agent_1"
    # One base in memory: the shared model holds the base once plus two small adapters.
    base_size = sum(p.numel() for p in tiny_llama(tok, 0).parameters())
    adapter_size = sum(p.numel() for n, p in shared.named_parameters() if ".agent_0." in n)
    assert sum(p.numel() for p in shared.parameters()) == base_size + 2 * adapter_size


def test_agent_model_with_adapters_loads_one_base(tmp_path):
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    trainer = MAGRPOTrainer(
        agent_model=str(tmp_path / "base"),
        num_agents=3,
        train_dataset=[{"prompt": "ab"}],
        reward_func=lambda a, b, c: [1.0] * len(a),
        peft_config=lora(),
        args=small_config(tmp_path),
    )
    assert len({id(agent) for agent in trainer.agents}) == 1 and trainer.agents.adapters == [
        "agent_0",
        "agent_1",
        "agent_2",
    ]


def test_kl_reference_of_an_adapter_is_its_base_model(tmp_path):
    trainer = separate_lora_agents(tmp_path, char_tokenizer(), beta=0.1)
    assert trainer.agents.references == [None, None], "no copy of the model is made for the reference"
    metrics = trainer.training_step([0])
    assert metrics["agent0/kl"] == pytest.approx(0.0, abs=1e-6)  # a fresh LoRA adapter is the identity
    metrics = trainer.training_step([1])
    assert metrics["agent0/kl"] > 0


def test_shared_base_resumes_exactly(tmp_path):
    def run(folder, reward, resume=False):
        tok = char_tokenizer()
        base = tiny_llama(tok, 0)
        args = small_config(folder, num_train_epochs=2, per_device_train_batch_size=2)
        trainer = make_trainer(
            folder, agents=[base, base], tokenizer=tok, reward_func=reward, peft_config=lora(), args=args
        )
        return trainer, trainer.train(resume_from_checkpoint=resume or None)

    straight, _ = run(tmp_path / "a", content_score)
    _, stopped = run(tmp_path / "b", interrupting_reward(2, content_score))
    assert stopped.interrupted
    resumed, result = run(tmp_path / "b", content_score, resume=True)
    assert result.global_step == 4
    # LoRA's B matrices start at 0: non-zero ones show the adapters did train
    assert all(p.abs().sum() > 0 for n, p in straight.agents[0].named_parameters() if "lora_B" in n)
    for (name, a), (_, b) in zip(straight.agents[0].named_parameters(), resumed.agents[0].named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


def test_missing_peft_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[lora\]'"):
        make_trainer(tmp_path, peft_config=object())


def test_same_object_for_some_agents_only_is_refused(tmp_path):
    tok = char_tokenizer()
    a, b = tiny_llama(tok, 0), tiny_llama(tok, 1)
    with pytest.raises(ValueError, match="agents\\[2\\] is the same object as agents\\[0\\]"):
        make_trainer(tmp_path, agents=[a, b, a], tokenizer=tok, peft_config=lora())
