"""What the hardware can do fast, where it decides a setting's worth."""

from __future__ import annotations

import functools
import warnings

import torch

from comlrl.utils.caller import user_stacklevel

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""Linux ``/proc/cpuinfo`` flags of x86 bf16 matrix units; without one, torch emulates bf16
products, measured at about 1% of the fp32 rate on such a CPU."""


@functools.cache
def cpu_has_bf16_units() -> bool | None:
    """Whether this CPU has bf16 matrix units (None: unknown, not Linux or not x86)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:  # no x86 flags line (ARM lists "Features")
        return None
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def warn_if_bf16_is_emulated(device: torch.device) -> None:
    """``precision="bf16"`` on a CPU that emulates bf16 products: a warning that fp32 is faster."""
    if device.type == "cpu" and cpu_has_bf16_units() is False:
        warnings.warn(
            "precision='bf16' on a CPU without bf16 matrix units (no amx_bf16 or avx512_bf16 in /proc/cpuinfo): "
            "torch emulates bf16 products here, far slower than fp32; precision='fp32' is the fast choice on "
            "this machine",
            stacklevel=user_stacklevel(),
        )
