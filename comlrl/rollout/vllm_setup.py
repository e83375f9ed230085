"""Starting the ``vllm`` backend's engines: where each goes, how much memory each may take,
what folder it loads (:mod:`comlrl.rollout.vllm_backend`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.33 accepts."""

_GIB = 2**30


def agent_cuda_device(agent: torch.nn.Module, index: int) -> torch.device:
    """The CUDA device agent ``index`` sits on: its engine goes there too."""
    device = next(agent.parameters()).device
    if device.type != "cuda":
        raise ValueError(
            f"agent {index} is on {device}, but generation_backend='vllm' runs each agent's engine on the "
            f"agent's own GPU: move agent {index} to a CUDA device (model.to('cuda')) or use generation_backend='hf'"
        )
    return device


def check_memory_budget(devices: Sequence[torch.device], budget: float) -> dict[torch.device, float]:
    """Each engine's ``gpu_memory_utilization``: ``budget`` of every GPU, split evenly between
    the engines on it (one per entry of ``devices``). vLLM reserves that share of the GPU's
    whole memory for each engine and refuses to start one when less is free, so the sum is
    checked against what is free now, before any engine starts, with the numbers named."""
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


@contextlib.contextmanager
def visible_device(device: torch.device) -> Iterator[None]:
    """Start an engine process on ``device``: it inherits ``CUDA_VISIBLE_DEVICES`` when it is
    spawned, and sees that one GPU as its ``cuda:0``. Restored afterwards."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = saved.split(",") if saved else None
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[device.index] if visible else str(device.index)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
