"""Tiny offline models and tokenizers for fast trainer tests."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, decoders, models
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

LOWER = "abcdefghijklmnopqrstuvwxyz .,:!?"
MIXED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'-"


def char_tokenizer(alphabet: str = LOWER, pad: bool = True) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``alphabet``, plus specials."""
    specials = ["<unk>", "<eos>"] + (["<pad>"] if pad else [])
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(alphabet)))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<pad>" if pad else None,
    )


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def tiny_gpt2(tokenizer, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return GPT2LMHeadModel(config)


def with_lora(build):
    """``build``'s model under a LoRA adapter that changes its outputs (B not zero). The
    wrapper's forward names few arguments and passes the others on to the base model."""

    def wrapped(tok):
        model = build(tok)
        targets = ["c_attn"] if hasattr(model, "transformer") else ["q_proj", "v_proj"]
        return get_peft_model(model, LoraConfig(r=4, target_modules=targets, init_lora_weights=False))

    return wrapped


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def prompts_dataset():
    return [{"prompt": "hello there:"}, {"prompt": "a cat"}, {"prompt": "tell me, why?"}]


def load_example(filename: str) -> types.ModuleType:
    """A script of ``examples/`` (their names have dashes) imported as a module."""
    path = Path(__file__).resolve().parents[1] / "examples" / filename
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_wandb(monkeypatch):
    """Installs a stand-in ``wandb`` module; returns what it was called with:
    ``init`` (the keyword arguments), ``log`` (a list of (metrics, step); a table is logged
    as ``{"samples": (columns, rows)}``) and ``finished``."""
    calls = {"log": [], "finished": False}

    class Run:
        def log(self, metrics, step):
            calls["log"].append((metrics, step))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    def table(columns, data, allow_mixed_types=False):
        return (columns, data)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Table=table))
    return calls
