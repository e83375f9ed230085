"""Where each agent lives (``agent_devices``) and its frozen reference (``reference_devices``),
and running per-agent work concurrently when the agents sit on different GPUs, or share the
CPU's cores."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from comlrl.engine.sharding import is_sharded

T = TypeVar("T")


def resolve_agent_devices(
    spec: str | Sequence[str] | None, num_agents: int, local_rank: int | None = None, field: str = "agent_devices"
) -> list[torch.device] | None:
    """One device per agent from ``agent_devices``, or None to leave the agents where they are.

    Args:
        spec: None (leave them; under data parallelism on GPUs, the rank's GPU), ``"auto"``
            (round-robin over the visible GPUs; this rank's GPU under data parallelism; the CPU
            when there is no GPU), one device for every agent (``"cuda:1"``), or a list with one
            device per agent.
        num_agents: N.
        local_rank: this process's rank on its machine under data parallelism, else None.
        field: the config field ``spec`` came from, which the errors name (``reference_devices``
            is read the same way).
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec is None or spec == "auto":
        if gpus and local_rank is not None:
            return [torch.device("cuda", local_rank)] * num_agents
        if spec is None:
            return None
        return (
            [torch.device("cuda", i % gpus) for i in range(num_agents)] if gpus else [torch.device("cpu")] * num_agents
        )
    names = [spec] * num_agents if isinstance(spec, str) else list(spec)
    if len(names) != num_agents:
        raise ValueError(
            f"{field} lists {len(names)} devices for {num_agents} agents; give one per agent, one for all, or 'auto'"
        )
    devices = []
    for i, name in enumerate(names):
        where = field if isinstance(spec, str) else f"{field}[{i}]"
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"{where}={name!r} is not a device ({error})") from error
        if device.type == "cuda" and (device.index or 0) >= gpus:
            visible = f"{gpus} CUDA devices are visible" if gpus else "no CUDA device is visible"
            raise ValueError(f"{where}={name!r} but {visible}")
        devices.append(device)
    return devices


def place_agents(agents: Sequence[torch.nn.Module], spec: str | Sequence[str] | None, local_rank: int | None) -> bool:
    """Move each agent to its device from ``agent_devices`` (see :func:`resolve_agent_devices`);
    returns whether any placement was asked for. Agents sharing one base model (adapters)
    must share one device."""
    devices = resolve_agent_devices(spec, len(agents), local_rank)
    if devices is None:
        return False
    placed: dict[int, torch.device] = {}
    for i, (agent, device) in enumerate(zip(agents, devices)):
        if placed.setdefault(id(agent), device) != device:
            raise ValueError(
                f"agents share one base model, so they need one device; agent_devices puts agent {i} on {device} "
                f"and an earlier agent on {placed[id(agent)]}"
            )
        agent.to(device)
    return True


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:<current>`` are one device."""

    def index(device: torch.device) -> int:
        if device.index is not None:
            return device.index
        return torch.cuda.current_device() if device.type == "cuda" else 0

    return a.type == b.type and index(a) == index(b)


def frozen_copy_on(model: torch.nn.Module, device: torch.device | None) -> torch.nn.Module:
    """A copy of ``model`` in eval mode without gradient, on ``device`` (None: beside ``model``).

    Each weight and buffer is copied straight onto ``device`` (through ``deepcopy``'s memo):
    copying the whole model where it is and then moving it would hold a second copy on the
    model's device for a while, the memory a reference placed elsewhere is there to spare.
    Tied weights stay tied: one copy per tensor.
    """
    memo: dict[int, torch.Tensor] = {}
    if device is not None:
        memo = {id(p): torch.nn.Parameter(p.detach().to(device, copy=True)) for p in model.parameters()}
        memo.update({id(b): b.detach().to(device, copy=True) for b in model.buffers()})
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


def map_agents(agents: Sequence[torch.nn.Module], work: Callable[[int], T], cpu_threads: bool = False) -> list[T]:
    """``[work(i) for each agent i]``, in threads when the agents sit on two or more different
    GPUs (their kernels then run at the same time; the GIL is released while they do).

    With ``cpu_threads``, agents that are distinct models on the CPU also run in threads, the
    CPU's intra-op threads split between them: small matrix products (decoding a few rows)
    use one core each better than two cores together. The caller vouches that ``work`` is
    safe and reproducible in threads (no shared generator, no shared module state).
    """
    if any(map(is_sharded, agents)):  # their collectives must come in the same order on every rank
        return [work(i) for i in range(len(agents))]
    devices = [next(agent.parameters()).device for agent in agents]
    gpus = {device for device in devices if device.type == "cuda"}
    if len(gpus) >= 2:
        with ThreadPoolExecutor(max_workers=len(agents)) as pool:
            return list(pool.map(work, range(len(agents))))
    distinct = len({id(agent) for agent in agents}) == len(agents)
    workers = min(len(agents), torch.get_num_threads())
    if not (cpu_threads and distinct and workers >= 2 and all(device.type == "cpu" for device in devices)):
        return [work(i) for i in range(len(agents))]
    total = torch.get_num_threads()

    def on_share(i: int) -> T:
        torch.set_num_threads(total // workers)  # this thread's own setting under OpenMP
        return work(i)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(on_share, range(len(agents))))
    finally:
        torch.set_num_threads(total)  # in case a build's setting is process-wide
