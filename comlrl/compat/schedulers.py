"""comlrl 1.4.3's ``comlrl.schedulers``: ``DeviceScheduler`` (its trainers' device placement) and
``normalize_parallel_training``, with the results they gave, for scripts that call them to
choose devices. The trainers here place agents from the config's ``agent_devices`` themselves
(:mod:`comlrl.models.placement`); these answer what 1.4.3 would have chosen.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from comlrl.engine.config import PARALLEL_TRAINING_SPELLINGS
from comlrl.models.placement import resolve_agent_devices

DeviceSpec = str | Sequence[str]


def normalize_parallel_training(mode: object) -> str:
    """``parallel_training`` as ``"none"`` or ``"mp"`` (any case, blanks around it; ``"null"`` is ``"none"``)."""
    text = str(mode).strip().lower()
    text = PARALLEL_TRAINING_SPELLINGS.get(text, text)
    if text not in ("none", "mp"):
        raise ValueError("parallel_training only supports: none, mp.")
    return text


class DeviceScheduler:
    """comlrl 1.4.3's device choices: ``"auto"`` (or None) is one GPU per agent in order when
    there are enough, else ``cuda:0`` for all, else the CPU; a device name is that device for
    all; a list holds one device, or one per agent."""

    @staticmethod
    def assign_devices(
        num_agents: int,
        agent_devices: DeviceSpec | None,
        critic_devices: DeviceSpec | None,
        *,
        use_separate_critic: bool,
    ) -> tuple[list[torch.device], list[torch.device]]:
        """The agents' and critics' devices (separate critics default to the agents' spec)."""
        agents = DeviceScheduler.resolve_devices(agent_devices, num_agents, kind="agent_devices")
        if not use_separate_critic:
            return agents, list(agents)
        spec = agent_devices if critic_devices is None else critic_devices
        return agents, DeviceScheduler.resolve_devices(spec, num_agents, kind="critic_devices")

    @staticmethod
    def assign_shared_critic_device(
        agent_devices: Sequence[torch.device], critic_devices: DeviceSpec | None
    ) -> torch.device:
        """A shared critic's device: ``critic_devices``' first, else agent 0's."""
        if critic_devices is None:
            return agent_devices[0]
        return DeviceScheduler.resolve_devices(critic_devices, 1, kind="critic_devices")[0]

    @staticmethod
    def resolve_devices(spec: DeviceSpec | None, num_devices: int, *, kind: str = "devices") -> list[torch.device]:
        """``num_devices`` devices from ``spec``."""
        if num_devices < 1:
            raise ValueError(f"{kind} count must be >= 1.")
        if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
            return DeviceScheduler._auto_devices(num_devices)
        if isinstance(spec, str):
            return [torch.device(spec)] * num_devices
        if not isinstance(spec, Sequence):
            raise ValueError(f"Unsupported {kind} spec: {spec!r}.")
        if not spec:
            raise ValueError(f"{kind} must be a non-empty list or 'auto'.")
        if len(spec) not in (1, num_devices):
            raise ValueError(f"{kind} length ({len(spec)}) must be 1 or {num_devices}.")
        return [torch.device(name) for name in (list(spec) * num_devices if len(spec) == 1 else spec)]

    @staticmethod
    def resolve_single_device(*specs: DeviceSpec | None) -> torch.device:
        """The first given spec's (first) device; ``"auto"`` or none given: the first automatic one."""
        for spec in specs:
            if spec is None:
                continue
            if isinstance(spec, str):
                first = spec
            elif isinstance(spec, Sequence):
                if not spec:
                    raise ValueError("Device spec list must be non-empty.")
                first = spec[0]
            else:
                raise ValueError(f"Unsupported device spec: {spec!r}.")
            if isinstance(first, str) and first.lower() == "auto":
                break
            return torch.device(first)
        return DeviceScheduler._auto_devices(1)[0]

    @staticmethod
    def _auto_devices(num_devices: int) -> list[torch.device]:
        """One GPU per device in order when there are enough (as our ``agent_devices="auto"``),
        else ``cuda:0`` for all (where ours goes round the GPUs), else the CPU."""
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if 0 < gpus < num_devices:
            return [torch.device("cuda:0")] * num_devices
        return resolve_agent_devices("auto", num_devices)
