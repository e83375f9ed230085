"""The ``vllm`` generation backend: one vLLM engine per base model, on its agent's GPU.

Install with ``pip install 'comlrl[vllm]'`` (it pins vLLM 0.33.0, whose own pins then
decide the torch and transformers versions: install it in an environment of its own); needs
a CUDA GPU. Written against vLLM 0.33.0's API and verified against it on the CPU only, with a
stand-in that follows its signatures (``tests/test_vllm_backend.py``); ``benchmarks/vllm_check.py``
runs the real engine on a GPU.

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
  given the new ones: the trainable parameters only (a LoRA base is frozen: only the
  adapters are written, each sync under a fresh adapter id, the old one removed), copied into
  the engine through :class:`comlrl.rollout.vllm_worker.WorkerExtension`.
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
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl.engine import sharding
from comlrl.models.lora import adapter_weights, save_adapter
from comlrl.rollout.decoding import generation_default
from comlrl.rollout.generation import AgentRollout, build_rollout, completion_eos_ids, encode_prompts
from comlrl.rollout.sampler_logprobs import learner_support_log_mass
from comlrl.rollout.vllm_setup import (
    agent_cuda_device,
    check_memory_budget,
    lora_rank_slot,
    save_base_model,
    visible_device,
)

VLLM_VERSION = "0.33.0"
"""The vLLM release whose API this backend follows (and the ``vllm`` extra pins)."""

WORKER_EXTENSION = "comlrl.rollout.vllm_worker.WorkerExtension"

SUPPORTED_SAMPLING = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "min_new_tokens",
    "repetition_penalty",
    "eos_token_id",
    "pad_token_id",
)
"""The Hugging Face ``generate`` arguments this backend can reproduce with vLLM."""

_INSTALL = "pip install 'comlrl[vllm]'"


def vllm_sampling_kwargs(
    sampling: dict[str, Any], num_generations: int, eos_ids: Sequence[int], logprobs: bool = False
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments equivalent to Hugging Face ``generate``'s
    ``sampling`` (a trainer's ``SamplingSpec.generate_kwargs()``), for ``num_generations``
    samples; with ``logprobs``, the log-prob of each drawn token is returned too.

    Greedy decoding asks for one completion (vLLM refuses ``n > 1`` without sampling; the G
    greedy completions are identical anyway). Completions stop at exactly ``eos_ids``
    (``ignore_eos`` keeps vLLM from also stopping at the tokenizer's EOS when the caller
    chose others), and ``min_tokens`` holds those same ids back, as Hugging Face does. No
    seed: the engine's worker is seeded once per call (:meth:`VLLMBackend.generate_agents`).
    """
    unsupported = sorted(set(sampling) - set(SUPPORTED_SAMPLING))
    if unsupported:
        raise ValueError(
            f"generation_backend='vllm' cannot apply the generation arguments {unsupported}; "
            f"supported: {list(SUPPORTED_SAMPLING)}. Remove them from generation_kwargs or use "
            "generation_backend='hf'"
        )
    if "max_new_tokens" not in sampling:
        raise ValueError("generation_backend='vllm' needs max_new_tokens in the sampling arguments")
    greedy = not sampling.get("do_sample", False)
    kwargs = {
        "n": 1 if greedy else num_generations,
        "temperature": 0.0 if greedy else float(sampling.get("temperature", 1.0)),
        "top_p": 1.0 if greedy else float(sampling.get("top_p", 1.0)),
        # Hugging Face and vLLM 0.33 both turn top-k off with 0.
        "top_k": 0 if greedy or not sampling.get("top_k") else int(sampling["top_k"]),
        "max_tokens": int(sampling["max_new_tokens"]),
        "min_tokens": int(sampling.get("min_new_tokens", 0)),
        "repetition_penalty": float(sampling.get("repetition_penalty", 1.0)),
        "stop_token_ids": list(eos_ids),
        "ignore_eos": True,
        # Texts are decoded here with the agent's tokenizer, as the hf backend decodes them.
        "detokenize": False,
    }
    if logprobs:
        kwargs["logprobs"] = 0  # the drawn token's own log-prob, no alternatives
    return kwargs


def prompt_token_ids(encoded: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each prompt's token ids without the left padding: what vLLM is given."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]


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
        except ImportError as error:
            raise ImportError(
                f"generation_backend='vllm' needs vLLM, which is not installed: {_INSTALL} "
                "(it needs a CUDA GPU), or use generation_backend='hf'"
            ) from error
        if getattr(vllm, "__version__", None) != VLLM_VERSION:
            raise ImportError(
                f"generation_backend='vllm' is written against vLLM {VLLM_VERSION}, but vLLM "
                f"{getattr(vllm, '__version__', '?')} is installed: pip install 'vllm=={VLLM_VERSION}' "
                "(or 'comlrl[vllm]'), or use generation_backend='hf'"
            )
        if not torch.cuda.is_available():
            raise ValueError(
                "generation_backend='vllm' needs a CUDA GPU and none is available; use generation_backend='hf'"
            )
        self.vllm = vllm
        self.agents, self.tokenizers, self.adapters, self.ready = agents, tokenizers, list(adapters), ready
        self.sampler_logprobs = sampler_logprobs
        self.dtypes = [dtype or next(agent.parameters()).dtype for agent in agents]
        devices = [agent_cuda_device(agent, i) for i, agent in enumerate(agents)]
        # One engine per distinct model object: agents sharing one are adapters on its base.
        members: dict[int, list[int]] = {}
        for i, agent in enumerate(agents):
            members.setdefault(id(agent), []).append(i)
        groups = list(members.values())
        shares = check_memory_budget([devices[group[0]] for group in groups], gpu_memory_utilization)
        # vLLM loads a model (and an adapter) from a folder: they are written here, kept as
        # long as the backend (an engine may read them again).
        self._folder = tempfile.TemporaryDirectory(prefix="comlrl-vllm-")
        self._adapter_ids = itertools.count(1)
        self._locks = {device: threading.Lock() for device in shares}
        self.engines = [self._start_engine(group, devices[group[0]], shares[devices[group[0]]]) for group in groups]
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
            model.save_pretrained(folder, state_dict=whole)
        del whole
        self.tokenizers[first].save_pretrained(folder)
        kwargs: dict[str, Any] = {
            "model": folder,
            "dtype": str(self.dtypes[first]).removeprefix("torch."),
            "gpu_memory_utilization": share,
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if lora:
            ranks = [model.peft_config[self.adapters[i]].r for i in group]
            kwargs.update(enable_lora=True, max_loras=len(group), max_lora_rank=lora_rank_slot(ranks))
        with visible_device(device):
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
            eos_ids=kwargs["stop_token_ids"],
        )

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        return True

    # ------------------------------------------------------------------------------------
    # weights
    # ------------------------------------------------------------------------------------
    def sync_weights(self, agent: int) -> None:
        """Agent ``agent``'s weights changed (an update, a load): give its engine the new
        ones. An adapter is written to a new folder and published under a fresh adapter id
        (the old one removed); a whole model's trainable parameters are copied into the
        engine's in the engine's dtype, and its cached prompt prefixes, computed with the old
        weights, dropped."""
        engine = self.engine_of[agent]
        if engine.lora:
            self._publish_adapter(engine, agent)
            return
        dtype = self.dtypes[agent]
        self.ready(agent)  # a sharded model's parameters are then its whole ones
        weights = [
            (name, parameter.detach().to("cpu", dtype))
            for name, parameter in self.agents[agent].named_parameters()
            if parameter.requires_grad
        ]
        with self._locks[engine.device]:
            engine.llm.collective_rpc("comlrl_load_weights", args=(weights,))
            engine.llm.reset_prefix_cache()

    def _publish_adapter(self, engine: Engine, agent: int) -> None:
        adapter_id = next(self._adapter_ids)
        folder = os.path.join(self._folder.name, f"adapter_{agent}_{adapter_id}")
        model, adapter = self.agents[agent], self.adapters[agent]
        whole = adapter_weights(model, [adapter], every_rank=True) if sharding.is_sharded(model) else None
        save_adapter(model, adapter, folder, state_dict=whole)
        name = f"agent{agent}-{adapter_id}"
        request = self.vllm.LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=folder)
        old = engine.adapter_requests.get(agent)
        engine.adapter_requests[agent] = request
        if old is not None:
            with self._locks[engine.device]:
                engine.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
