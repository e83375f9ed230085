"""Generation backends: what samples the agents' completions.

The trainer asks a backend for ``G`` completions of each prompt by one agent
(:meth:`GenerationBackend.generate`) and tells it after every update (the optimizer steps
of a training step) that an agent's weights changed (:meth:`GenerationBackend.sync_weights`).
``hf`` samples with the training model itself through Hugging Face ``generate``; ``vllm``
(optional, GPU) keeps an inference engine per agent beside the training model and copies the
weights into it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from comlrl.rollout.generation import AgentRollout, generate_group

BACKENDS = ("hf", "vllm")


class GenerationBackend(Protocol):
    def generate(self, agent: int, prompts: list[str], num_generations: int, sampling: dict[str, Any]) -> AgentRollout:
        """Agent ``agent``'s ``num_generations`` completions of every prompt, in one batched
        call; ``sampling`` holds Hugging Face ``generate`` keyword arguments."""
        ...

    def sync_weights(self, agent: int) -> None:
        """Agent ``agent``'s training weights changed (called once per update, after its
        last optimizer step): the next ``generate`` must use them."""
        ...


class HFBackend:
    """Sampling with the training models' own ``generate``: nothing to synchronise."""

    def __init__(
        self,
        agents: Sequence[torch.nn.Module],
        tokenizers: Sequence[Any],
        activate: Callable[[int], None],
        precision: Callable[[torch.nn.Module], contextlib.AbstractContextManager],
    ):
        self.agents, self.tokenizers = agents, tokenizers
        self.activate, self.precision = activate, precision

    def generate(self, agent: int, prompts: list[str], num_generations: int, sampling: dict[str, Any]) -> AgentRollout:
        self.activate(agent)
        with self.precision(self.agents[agent]):
            return generate_group(self.agents[agent], self.tokenizers[agent], prompts, num_generations, sampling)

    def sync_weights(self, agent: int) -> None:
        pass
