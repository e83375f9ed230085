"""The vllm generation backend on CPU, against a stand-in ``vllm`` module: the mapping of
Hugging Face sampling arguments, the layout of its rollouts (the hf backend's), weight sync,
engine construction and the start-up errors. A real engine needs a GPU:
benchmarks/gpu_check.py runs one."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoModelForCausalLM

import comlrl.rollout.vllm_backend as vllm_backend
from comlrl.rollout.generation import generate_group
from comlrl.rollout.vllm_backend import VLLMBackend, vllm_sampling_kwargs
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

from .helpers import LOWER, char_tokenizer, tiny_llama

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# char_tokenizer ids: <unk> 0, <eos> 1, <pad> 2, then the characters of LOWER from 3.
EOS, PAD = 1, 2


def ids(text: str) -> list[int]:
    return [LOWER.index(ch) + 3 for ch in text]


class FakeLLM:
    """Records what the backend asks of an engine; ``replies[b]`` are the token ids of the
    completions of prompt b (by default, ``n`` times "a" then EOS)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.env = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
        self.files = sorted(os.listdir(kwargs["model"]))
        self.replies = None
        self.calls = []
        self.events = []
        load = types.SimpleNamespace(load_weights=lambda weights: self.events.append(("load", weights)))
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=load))

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        replies = self.replies or [[ids("a") + [EOS]] * params.n for params in sampling_params]
        return [
            types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=tuple(tokens)) for tokens in reply])
            for reply in replies
        ]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [method(self.worker, *args, **(kwargs or {}))]

    def reset_prefix_cache(self):
        self.events.append("reset")
        return True


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.n, self.seed = kwargs["n"], kwargs["seed"]


def install_fake_vllm(monkeypatch, agents_on_gpu=True):
    """A stand-in ``vllm`` and a machine that looks like it has GPUs; with ``agents_on_gpu``,
    agent i 'sits on' cuda:i (its tensors stay on the CPU). Returns the module; ``engines``
    lists the LLMs built."""
    module = types.ModuleType("vllm")
    module.engines = []

    def make_llm(**kwargs):
        module.engines.append(FakeLLM(**kwargs))
        return module.engines[-1]

    module.LLM, module.SamplingParams = make_llm, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    if agents_on_gpu:
        monkeypatch.setattr(vllm_backend, "agent_cuda_device", lambda agent, index: torch.device("cuda", index))
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return module


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


def backend_for(num_agents=1, tokenizer=None):
    tok = tokenizer or char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(num_agents)]
    return VLLMBackend(agents, [tok] * num_agents, [None] * num_agents, 0.3)


# ---------------------------------------------------------------------------------------------
# Hugging Face generate arguments -> vLLM SamplingParams
# ---------------------------------------------------------------------------------------------
def test_sampled_arguments_map_to_sampling_params():
    sampling = {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "max_new_tokens": 32,
        "min_new_tokens": 4,
        "repetition_penalty": 1.1,
        "pad_token_id": PAD,
    }
    assert vllm_sampling_kwargs(sampling, 4, [EOS, 7]) == {
        "n": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 32,
        "min_tokens": 4,
        "repetition_penalty": 1.1,
        "stop_token_ids": [EOS, 7],
        "ignore_eos": True,
        "detokenize": False,
    }
    assert vllm_sampling_kwargs({**sampling, "top_k": 20}, 4, [EOS])["top_k"] == 20


def test_greedy_arguments_ask_for_one_greedy_completion():
    assert vllm_sampling_kwargs({"do_sample": False, "max_new_tokens": 16}, 4, [EOS]) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 16,
        "min_tokens": 0,
        "repetition_penalty": 1.0,
        "stop_token_ids": [EOS],
        "ignore_eos": True,
        "detokenize": False,
    }


def test_unsupported_arguments_fail_at_the_first_generate_naming_them(fake_vllm):
    backend = backend_for()
    sampling = {"do_sample": True, "max_new_tokens": 4, "typical_p": 0.5, "num_beams": 2}
    with pytest.raises(ValueError, match=r"\['num_beams', 'typical_p'\]; supported: \['do_sample'.*'pad_token_id'\]"):
        backend.generate(0, ["ab"], 2, sampling)
    assert fake_vllm.engines[0].calls == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        vllm_sampling_kwargs({"do_sample": True}, 2, [EOS])


# ---------------------------------------------------------------------------------------------
# vLLM outputs -> AgentRollout
# ---------------------------------------------------------------------------------------------
def test_outputs_become_a_rollout_laid_out_like_generate_group(fake_vllm):
    backend = backend_for()
    engine = fake_vllm.engines[0]
    engine.replies = [[ids("cat") + [EOS], ids("dogs")], [ids("hi") + [EOS], [EOS]]]
    rollout = backend.generate(0, ["ab", "hello"], 2, {"do_sample": True, "max_new_tokens": 4})

    prompts, params = engine.calls[0]
    assert prompts == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [10, 7, 14, 14, 17]}]
    assert [p.kwargs["stop_token_ids"] for p in params] == [[EOS], [EOS]]  # the model's EOS by default
    left_padded = [[PAD, PAD, PAD, 3, 4], [10, 7, 14, 14, 17]]
    assert rollout.prompt_ids.tolist() == [left_padded[0]] * 2 + [left_padded[1]] * 2
    assert rollout.prompt_mask.tolist() == [[0, 0, 0, 1, 1]] * 2 + [[1, 1, 1, 1, 1]] * 2
    # "cat" + EOS, "dogs" (cut), "hi" + EOS, EOS: right-padded with PAD to the longest.
    assert rollout.completion_ids.tolist() == [
        [5, 3, 22, EOS],
        [6, 17, 9, 21],
        [10, 11, EOS, PAD],
        [EOS, PAD, PAD, PAD],
    ]
    assert rollout.completion_mask.tolist() == [
        [True, True, True, True],
        [True, True, True, True],
        [True, True, True, False],
        [True, False, False, False],
    ]
    assert rollout.texts == ["cat", "dogs", "hi", ""]
    assert rollout.truncated.tolist() == [False, True, False, False]
    assert rollout.lengths.tolist() == [4, 4, 3, 1]
    assert rollout.completion_ids.device == next(backend.agents[0].parameters()).device


def test_rollout_equals_generate_group_on_the_same_tokens(fake_vllm):
    """The hf backend samples; the engine is made to return exactly its tokens; both rollouts
    must then agree in every field (padding, masks, texts, truncation)."""
    tok = char_tokenizer()
    backend = backend_for(tokenizer=tok)
    model = backend.agents[0]
    prompts = ["hello there:", "a cat", "tell me, why?"]
    # A caller's EOS ids, frequent enough that some completions end and some are cut.
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}
    sampling["eos_token_id"] = tok.convert_tokens_to_ids(["e", "a", " "])
    torch.manual_seed(3)
    hf = generate_group(model, tok, prompts, 4, sampling)
    assert hf.truncated.any() and not hf.truncated.all()
    owned = [ids[:n] for ids, n in zip(hf.completion_ids.tolist(), hf.lengths.tolist())]
    fake_vllm.engines[0].replies = [owned[b * 4 : (b + 1) * 4] for b in range(len(prompts))]

    rollout = backend.generate(0, prompts, 4, sampling)

    for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(rollout, field), getattr(hf, field)), field
    assert rollout.texts == hf.texts
    params = fake_vllm.engines[0].calls[0][1]
    assert params[0].kwargs["stop_token_ids"] == sampling["eos_token_id"]


@pytest.mark.parametrize("model_top_k, expected", [(7, 7), (None, 50)])
def test_no_top_k_takes_the_models_generation_config_as_generate_does(fake_vllm, model_top_k, expected):
    backend = backend_for()
    backend.agents[0].generation_config.top_k = model_top_k
    fake_vllm.engines[0].replies = [[[EOS], [EOS]]]
    backend.generate(0, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4})
    backend.generate(0, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4, "top_k": 0})
    assert [call[1][0].kwargs["top_k"] for call in fake_vllm.engines[0].calls] == [expected, -1]


def test_greedy_generation_repeats_the_one_completion(fake_vllm):
    backend = backend_for()
    engine = fake_vllm.engines[0]
    engine.replies = [[ids("cat")], [ids("hi") + [EOS]]]
    rollout = backend.generate(0, ["ab", "hello"], 3, {"do_sample": False, "max_new_tokens": 3})
    params = engine.calls[0][1]
    assert [(p.n, p.seed, p.kwargs["temperature"]) for p in params] == [(1, None, 0.0), (1, None, 0.0)]
    assert rollout.completion_ids.tolist() == [[5, 3, 22]] * 3 + [[10, 11, EOS]] * 3
    assert rollout.texts == ["cat"] * 3 + ["hi"] * 3
    assert rollout.truncated.tolist() == [True] * 3 + [False] * 3


def test_seeds_come_from_the_agents_generator_or_torchs_so_seeded_runs_repeat(fake_vllm):
    backend = backend_for()
    engine = fake_vllm.engines[0]
    sampling = {"do_sample": True, "max_new_tokens": 2}
    torch.manual_seed(5)
    base = int(torch.randint(0, 2**31 - 1, ()).item())
    for _ in range(2):
        torch.manual_seed(5)
        backend.generate(0, ["ab", "hello", "cat"], 2, sampling)
    backend.generate(0, ["ab", "hello", "cat"], 2, sampling, torch.Generator().manual_seed(5))
    first, second, from_generator = ([p.seed for p in params] for _, params in engine.calls)
    # vLLM seeds sample k of a prompt with seed + k: prompts are G apart, so no two samples share one.
    assert first == [base, base + 2, base + 4]
    assert second == first
    assert from_generator == first, "an agent's generator seeds like torch's default one seeded alike"


# ---------------------------------------------------------------------------------------------
# weight sync and construction
# ---------------------------------------------------------------------------------------------
def test_sync_weights_hands_the_engine_the_agents_current_state_dict(fake_vllm):
    backend = backend_for(num_agents=2)
    agent = backend.agents[1]
    with torch.no_grad():
        agent.model.embed_tokens.weight.add_(1.0)
    expected = {name: tensor.clone() for name, tensor in agent.state_dict().items()}

    backend.sync_weights(1)

    (load, weights), reset = fake_vllm.engines[1].events
    assert (load, reset) == ("load", "reset")  # the prefix cache is dropped after the new weights
    assert [name for name, _ in weights] == list(expected)
    for name, tensor in weights:
        assert torch.equal(tensor, expected[name]), name
    assert fake_vllm.engines[0].events == []


def test_each_agent_gets_an_engine_built_from_its_weights(fake_vllm):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=0), tiny_llama(tok, seed=1).to(torch.bfloat16)]
    backend = VLLMBackend(agents, [tok, tok], [None, None], 0.25)

    for i, (agent, engine) in enumerate(zip(agents, fake_vllm.engines)):
        kwargs = engine.kwargs
        assert kwargs["dtype"] == ["float32", "bfloat16"][i]
        assert kwargs["gpu_memory_utilization"] == 0.25
        assert kwargs["distributed_executor_backend"] == "external_launcher"
        assert kwargs["enforce_eager"] is True
        # In this process, on the agent's GPU (cuda:i here), as a one-process world.
        assert {k: engine.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} == {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": str(i),
        }
        assert engine.env["MASTER_ADDR"] and engine.env["MASTER_PORT"]
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(engine.files)
        saved = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=next(agent.parameters()).dtype)
        for name, tensor in agent.state_dict().items():
            assert torch.equal(saved.state_dict()[name], tensor), name
    assert backend.devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert all(name not in os.environ for name in LAUNCH_VARIABLES)  # restored after construction


def test_under_torchrun_the_engine_keeps_the_launchers_process_group(fake_vllm, monkeypatch):
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    backend_for()
    # Only the GPU is the agent's (cuda:0 here); the rest is torchrun's, restored afterwards.
    assert fake_vllm.engines[0].env == {**torchrun, "LOCAL_RANK": "0"}
    assert {name: os.environ[name] for name in torchrun} == torchrun


def test_engines_run_one_at_a_time_even_when_called_from_threads(fake_vllm):
    backend = backend_for(num_agents=2)
    running, seen = [0], []

    def slowed(generate):
        def slow_generate(*args, **kwargs):
            running[0] += 1
            seen.append(running[0])
            time.sleep(0.05)
            running[0] -= 1
            return generate(*args, **kwargs)

        return slow_generate

    for engine in fake_vllm.engines:
        engine.generate = slowed(engine.generate)
    sampling = {"do_sample": True, "max_new_tokens": 2}
    with ThreadPoolExecutor(max_workers=2) as pool:
        rollouts = list(pool.map(lambda agent: backend.generate(agent, ["ab"], 2, sampling), range(2)))
    assert seen == [1, 1]
    assert [r.texts for r in rollouts] == [["a", "a"], ["a", "a"]]


def test_trainer_samples_through_the_engines_and_syncs_every_agent_after_a_step(fake_vllm, tmp_path):
    tok = char_tokenizer()
    config = MAGRPOConfig(
        num_train_epochs=1,
        num_generations=2,
        max_new_tokens=4,
        logging_steps=1,
        agent_learning_rate=1e-2,
        output_dir=str(tmp_path / "run"),
        generation_backend="vllm",
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=[{"prompt": "hello"}],
        # Different rewards for the two samples, so the step changes the weights.
        reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
        args=config,
    )
    assert isinstance(trainer.backend, VLLMBackend)
    for engine in fake_vllm.engines:
        engine.replies = [[ids("a") + [EOS], ids("aaa") + [EOS]]]
    before = [trainer.agents[i].lm_head.weight.detach().clone() for i in range(2)]

    trainer.train()

    for i, engine in enumerate(fake_vllm.engines):
        assert len(engine.calls) == 1
        (load, weights), reset = engine.events
        assert (load, reset) == ("load", "reset")
        synced = dict(weights)["lm_head.weight"]
        assert torch.equal(synced, trainer.agents[i].lm_head.weight)
        assert not torch.equal(synced, before[i])


# ---------------------------------------------------------------------------------------------
# start-up errors
# ---------------------------------------------------------------------------------------------
def test_missing_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[vllm\]'.*generation_backend='hf'"):
        backend_for()


def test_no_gpu_says_to_use_the_hf_backend(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"needs a CUDA GPU.*generation_backend='hf'"):
        backend_for()
    assert fake_vllm.engines == []


def test_lora_agents_are_refused(fake_vllm):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    with pytest.raises(ValueError, match=r"agents \[1\] train LoRA adapters.*generation_backend='hf'"):
        VLLMBackend(agents, [tok, tok], [None, "agent_1"], 0.3)
    assert fake_vllm.engines == []


def test_an_agent_off_the_gpu_is_named(monkeypatch):
    fake = install_fake_vllm(monkeypatch, agents_on_gpu=False)
    tok = char_tokenizer()
    model = tiny_llama(tok)
    with pytest.raises(ValueError, match=r"agent 3 is on cpu.*move agent 3 to a CUDA device.*generation_backend='hf'"):
        vllm_backend.agent_cuda_device(model, 3)
    with pytest.raises(ValueError, match=r"agent 0 is on cpu"):
        VLLMBackend([model], [tok], [None], 0.3)
    assert fake.engines == []
