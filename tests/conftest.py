"""Pytest fixtures shared by the test modules; the helpers they build on live in tests/helpers.py."""

import os
import sys
import types

import pytest
import torch
import torch.distributed as dist

from tests.helpers import char_tokenizer, tiny_llama

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # `make test` runs one pytest worker per core: each takes its share of the cores, rather
    # than every worker running torch's default of one thread per core (oversubscribed, slower).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone, for FSDP to shard over (each slice is whole)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def model_folder(tmp_path):
    """A tiny Llama and its tokenizer saved as a model folder, to load by path."""
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    return str(tmp_path / "model")


@pytest.fixture
def prompts_dataset():
    return [{"prompt": "hello there:"}, {"prompt": "a cat"}, {"prompt": "tell me, why?"}]


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
