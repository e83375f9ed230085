"""A bf16 copy of each agent's model that samples its rollouts, while the fp32 model learns.

Decoding reads every weight once per token, so it runs at the speed of memory: a copy with
half the bytes per weight samples up to twice as fast, and on CPUs with bf16 matrix units
(and GPUs) its products run at the bf16 rate. Autocast over an fp32 model would re-cast every
weight at every token instead, which costs more than it saves.

The copy is refreshed from the learner before every sampling call (only the parameters its
optimizer trains: for a LoRA agent, the adapter), so it can never be stale, whatever called
the optimizer. Buffers keep their dtype: rotary frequencies in bf16 would shift positions.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch


def low_precision_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen eval-mode copy of ``model`` whose floating-point parameters are in ``dtype``."""
    clone = copy.deepcopy(model).eval().requires_grad_(False)
    for parameter in clone.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    return clone


class RolloutCopies:
    """One low-precision copy per distinct model of ``models`` (agents sharing a base model
    share its copy, each with its own adapter), kept equal to the learners' weights."""

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        trainable: Sequence[Sequence[torch.nn.Parameter]],
        adapters: Sequence[str | None],
        dtype: torch.dtype = torch.bfloat16,
    ):
        copies: dict[int, torch.nn.Module] = {}
        for model in models:
            if id(model) not in copies:
                copies[id(model)] = low_precision_copy(model, dtype)
        self.copies = [copies[id(model)] for model in models]
        self.adapters = list(adapters)
        self.pairs = []
        """Per agent, (learner parameter, its copy) for every parameter the agent's optimizer trains."""
        for model, clone, parameters in zip(models, self.copies, trainable):
            name_of = {id(p): name for name, p in model.named_parameters()}
            clone_parameters = dict(clone.named_parameters())
            self.pairs.append([(p, clone_parameters[name_of[id(p)]]) for p in parameters])

    @torch.no_grad()
    def refresh(self, agent: int) -> None:
        """Copy agent ``agent``'s trained parameters into its copy (cast to the copy's dtype)."""
        for parameter, clone in self.pairs[agent]:
            clone.copy_(parameter)

    def model(self, agent: int) -> torch.nn.Module:
        """Agent ``agent``'s copy, refreshed, with its adapter active."""
        self.refresh(agent)
        clone = self.copies[agent]
        if self.adapters[agent] is not None:
            clone.set_adapter(self.adapters[agent])
        return clone
