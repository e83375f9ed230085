"""Generation backends: what samples the agents' completions.

The trainer asks a backend for ``G`` completions of each prompt by one agent
(:meth:`GenerationBackend.generate`), drawn from that agent's own ``torch.Generator`` so that
agents can sample in parallel threads reproducibly, and tells it after every update (the
optimizer steps of a training step) that an agent's weights changed
(:meth:`GenerationBackend.sync_weights`). ``hf`` samples with the training model itself
(in bf16 with ``precision="bf16"``), through the lean loop of
:mod:`comlrl.rollout.decoding` (or Hugging Face ``generate`` for settings outside it);
``vllm`` (optional, GPU) keeps an inference engine per base model beside the training models
and copies the new weights into it (:mod:`comlrl.rollout.vllm_backend`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from comlrl.models.placement import map_agents
from comlrl.rollout.decoding import decoding_settings
from comlrl.rollout.generation import AgentRollout, generate_group

BACKENDS = ("hf", "vllm")


class GenerationBackend(Protocol):
    def generate(
        self,
        agent: int,
        prompts: list[str] | list[list[int]],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        """Agent ``agent``'s ``num_generations`` completions of every prompt (text, or token ids:
        a conversation continued after a tool's result), in one batched call; ``sampling`` holds
        Hugging Face ``generate`` keyword arguments; randomness comes from ``generator`` where
        :meth:`uses_generators` says so."""
        ...

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        """Whether every agent's sampling with these settings draws from the ``generator``
        passed to :meth:`generate` only (so agents may sample in parallel threads)."""
        ...

    def sync_weights(self, agent: int) -> None:
        """Agent ``agent``'s training weights changed (called once per update, after its
        last optimizer step): the next ``generate`` must use them."""
        ...


class ServedAgents(Protocol):
    """The agents a backend samples from, a sequence of models (:class:`~comlrl.engine.agents.Agents`)."""

    tokenizers: Sequence[Any]
    """One per agent."""
    adapters: Sequence[str | None]
    """Per agent, its adapter's name in a shared base model, or None."""

    def __len__(self) -> int: ...

    def __getitem__(self, agent: int) -> torch.nn.Module: ...

    def for_sampling(self, agent: int) -> None:
        """Make agent ``agent`` ready to sample (its adapter active, its weights gathered if sharded)."""
        ...


def build_backend(
    name: str,
    agents: ServedAgents,
    vllm_gpu_memory_utilization: float,
    sampler_logprobs: bool = False,
    compiled: bool = False,
    rollout_dtype: torch.dtype | None = None,
) -> GenerationBackend:
    """The backend ``name`` (a key of ``BACKENDS``) for ``agents`` (the trainer's
    :class:`~comlrl.engine.agents.Agents`: models, tokenizers, adapters); for ``hf``,
    ``sampler_logprobs``: keep the log-probs the sampler gave its tokens, ``compiled``: the
    compiled decoding step; for ``vllm``, ``rollout_dtype``: the engines' dtype (None: each
    agent's), and the sampler's log-probs are always kept (an engine is never exactly the
    learner)."""
    if name == "vllm":
        from comlrl.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(
            agents, agents.tokenizers, agents.adapters, agents.for_sampling, vllm_gpu_memory_utilization, rollout_dtype
        )
    return HFBackend(agents, agents.tokenizers, agents.for_sampling, sampler_logprobs, compiled)


def sync_every_agent(backend: GenerationBackend, num_agents: int) -> None:
    """Every agent's weights into ``backend`` (after an update, or a load)."""
    for agent in range(num_agents):
        backend.sync_weights(agent)


def generate_agents(
    backend: GenerationBackend,
    agents: Sequence[torch.nn.Module],
    prompts: Sequence[list[str]],
    num_generations: int,
    sampling: dict[str, Any],
    generators: Sequence[torch.Generator | None],
) -> list[AgentRollout]:
    """Every agent's rollout of its ``prompts[i]``: in one call where the backend serves
    agents together (``generate_agents``: the vllm backend's adapters on one engine), else one
    :meth:`GenerationBackend.generate` per agent, in threads where
    :func:`~comlrl.models.placement.map_agents` allows it."""
    together = getattr(backend, "generate_agents", None)
    if together is not None:
        return together(range(len(agents)), prompts, num_generations, sampling, generators)

    def one(i: int) -> AgentRollout:
        return backend.generate(i, prompts[i], num_generations, sampling, generators[i])

    return map_agents(agents, one, cpu_threads=backend.uses_generators(sampling))


class HFBackend:
    """Sampling with the training models themselves, each made ready by ``activate(agent)``
    (its adapter active, its weights gathered if sharded). ``sampler_logprobs``: keep the log-probs
    the sampler gave its tokens, for the update to measure (and correct) how far the learner's
    differ: in bf16 a one-token decoding step and the update's forward over the whole
    sequence round differently, so the sampler is not exactly the learner. ``compiled``: the
    compiled decoding step (:mod:`comlrl.rollout.compiled_decoding`) where a model supports it."""

    def __init__(
        self,
        agents: Sequence[torch.nn.Module],
        tokenizers: Sequence[Any],
        activate: Callable[[int], None],
        sampler_logprobs: bool = False,
        compiled: bool = False,
    ):
        self.agents, self.tokenizers = agents, tokenizers
        self.activate = activate
        self.sampler_logprobs, self.compiled = sampler_logprobs, compiled

    def generate(
        self,
        agent: int,
        prompts: list[str],
        num_generations: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        self.activate(agent)
        return generate_group(
            self.agents[agent],
            self.tokenizers[agent],
            prompts,
            num_generations,
            sampling,
            generator,
            with_logprobs=self.sampler_logprobs,
            compiled=self.compiled,
        )

    def uses_generators(self, sampling: dict[str, Any]) -> bool:
        # Hugging Face generate draws from torch's default generator.
        return all(decoding_settings(agent, sampling) is not None for agent in self.agents)

    def sync_weights(self, agent: int) -> None:
        pass
