"""Agents sampling in parallel threads on the CPU: split cores, the caller's vouching, and the
same completions and weights as one agent after the other."""

import threading

import pytest
import torch

import comlrl.rollout.backends as backends_module
from comlrl.models.placement import map_agents

from .helpers import char_tokenizer, make_trainer, tiny_llama


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def where_it_ran(i):
    return i, threading.current_thread() is threading.main_thread(), torch.get_num_threads()


def test_cpu_agents_run_in_threads_with_the_cores_split_between_them(two_threads):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, 0), tiny_llama(tok, 1)]
    assert map_agents(agents, where_it_ran, cpu_threads=True) == [(0, False, 1), (1, False, 1)]
    assert torch.get_num_threads() == 2, "the calling thread keeps its own setting"


def test_cpu_agents_run_one_after_the_other_unless_vouched_for_and_distinct(two_threads):
    tok = char_tokenizer()
    model = tiny_llama(tok)
    one_by_one = [(0, True, 2), (1, True, 2)]
    assert map_agents([model, tiny_llama(tok, 1)], where_it_ran) == one_by_one
    assert map_agents([model, model], where_it_ran, cpu_threads=True) == one_by_one, "one shared base model"


def train_and_collect(tmp_path, monkeypatch, parallel):
    if not parallel:
        real = backends_module.map_agents
        monkeypatch.setattr(backends_module, "map_agents", lambda agents, work, cpu_threads=False: real(agents, work))
    trainer = make_trainer(tmp_path)
    texts = []
    for rows in ([0, 1], [2, 0], [1, 2]):
        tree = trainer.rollout(trainer.train_prompts, rows)
        texts.append([agent.texts for turn in tree.turns for agent in turn.agents])
        trainer.objective.update(tree, trainer.objective.estimate(tree), trainer.objective.update.frozen(tree), 1)
    monkeypatch.undo()
    return texts, [p.detach().clone() for agent in trainer.agents for p in agent.parameters()]


def test_parallel_sampling_draws_what_one_agent_after_the_other_draws(tmp_path, monkeypatch, two_threads):
    calls = []
    real = backends_module.map_agents
    monkeypatch.setattr(backends_module, "map_agents", lambda *a, **k: calls.append(k) or real(*a, **k))
    parallel = train_and_collect(tmp_path / "parallel", monkeypatch, parallel=True)
    assert {"cpu_threads": True} in calls, "the trainer asks for parallel sampling"
    sequential = train_and_collect(tmp_path / "sequential", monkeypatch, parallel=False)
    assert parallel[0] == sequential[0]
    for a, b in zip(parallel[1], sequential[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
