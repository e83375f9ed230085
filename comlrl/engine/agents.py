"""The agents and what they carry: models, tokenizers, LoRA adapters, frozen references,
devices, the active adapter, precision, train/eval mode and saving.

:class:`Agents` is a sequence of the agents' models (``agents[i]`` is agent i's module, the
shared base model for every agent when they share one), with everything else the trainer
needs to know about them beside it. It imports nothing of the trainers above it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from comlrl.checkpoint import describe_agent, load_weights
from comlrl.engine import sharding
from comlrl.engine.config import TrainerConfig
from comlrl.models.loading import (
    ModelConfig,
    check_agents,
    enable_activation_checkpointing,
    load_agents,
    model_sources,
    resolve_tokenizers,
)
from comlrl.models.lora import (
    adapter_weights,
    attach_adapters,
    fresh_model,
    is_peft_model,
    merged_copy,
    save_adapter,
    trainable_parameters,
)
from comlrl.models.modes import disable_dropout, frozen
from comlrl.models.placement import frozen_copy_on, place_agents, resolve_agent_devices, same_device
from comlrl.models.precision import cast_parameters
from comlrl.models.vocabulary import add_special_tokens


class Agents(Sequence[torch.nn.Module]):
    """N agents: ``agents[i]`` is agent i's model.

    Attributes:
        tokenizers: one per agent.
        adapters: per agent, its adapter's name in a shared base model, or None.
        parameters: per agent, what its optimizer trains.
        references: per agent, a frozen copy of its initial weights for the KL terms (on its
            ``reference_devices`` entry, else beside the agent), or None (no KL term, or an
            adapter: its base model without the adapter is the reference).
        placed: whether ``agent_devices`` (or torchrun on GPUs) chose the devices.

    With ``sharding_mode`` other than ``"replicate"`` the models are sharded over the ranks
    (:mod:`comlrl.engine.sharding`): whole for sampling and every forward without gradient
    (:meth:`frozen`, :meth:`for_sampling`), sharded for their gradient passes (:meth:`trainable`).
    """

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        tokenizers: Sequence[Any],
        adapters: Sequence[str | None],
        placed: bool,
        with_references: bool,
        reference_devices: Sequence[torch.device] | None = None,
        sharding_mode: str = "replicate",
        bf16: bool = False,
    ):
        self.models = list(models)
        self.tokenizers = list(tokenizers)
        self.adapters = list(adapters)
        self.placed = placed
        devices = reference_devices or [None] * len(self.models)
        self.references = [
            frozen_copy_on(model, device) if with_references and not is_peft_model(model) else None
            for model, device in zip(self.models, devices)
        ]
        if sharding_mode != "replicate":
            # The references stay whole (frozen: nothing to shard but their weights).
            for reference in self.references:
                if reference is not None and bf16:
                    cast_parameters(reference, torch.bfloat16)
            for model in unique(self.models):
                if not sharding.is_sharded(model):  # a model an earlier trainer sharded stays so
                    what = f"agent {self.models.index(model)}"
                    sharding.shard_model(model, sharding_mode, torch.bfloat16 if bf16 else None, what)
        self.parameters = [trainable_parameters(m, a) for m, a in zip(self.models, self.adapters)]
        for model in unique(self.models):  # whole until a gradient pass (comlrl.engine.sharding)
            sharding.gather(model)
        self._whole: dict[int, dict[str, torch.Tensor]] = {}

    @classmethod
    def build(
        cls,
        agents: Sequence[torch.nn.Module] | None,
        agent_model: str | None,
        num_agents: int | None,
        tokenizer: Any,
        model_config: ModelConfig,
        peft_config: Any,
        args: TrainerConfig,
        local_rank: int | None,
        with_references: bool = False,
        reference_devices: Any = None,
        sharding_mode: str = "replicate",
    ) -> Agents:
        """The agents from the trainer's arguments: loaded by name or given, checked, placed
        on their devices, wrapped in adapters, with activation checkpointing and without dropout
        as the config says, each with a tokenizer that can pad and, ``with_references``, a
        frozen reference (on ``reference_devices``: the config's); sharded over the ranks
        unless ``sharding_mode`` is ``"replicate"``."""
        if agents is None and agent_model is None:
            raise ValueError("no agents: pass agents=[model, ...] or agent_model=<folder or hub id>")
        if None not in (num_agents, args.num_agents) and num_agents != args.num_agents:
            raise ValueError(
                f"num_agents={num_agents} but the config's num_agents={args.num_agents}: set one, or make them agree"
            )
        count = num_agents if num_agents is not None else args.num_agents
        model_kwargs = model_config.model_kwargs
        if agents is not None:
            given = agents
            agents = model_sources(given, agent_model, model_kwargs)
            if count is not None and len(agents) != count:
                raise ValueError(f"agents holds {len(agents)} models but num_agents={count}: make them agree")
            loaded = [isinstance(entry, str | os.PathLike) for entry in given]
        else:
            count = 2 if count is None else count
            # With adapters, one base model serves every agent.
            agents = load_agents(agent_model, 1 if peft_config is not None else count, model_kwargs)
            agents = agents * count if peft_config is not None else agents
            loaded = [True] * count
        models = check_agents(agents, shared_base_allowed=peft_config is not None)
        tokenizers = resolve_tokenizers(tokenizer, models, model_config.tokenizer_kwargs)
        # Before adapters and references: a LoRA wrapper and the reference copies (made in
        # __init__) must see the grown vocabulary.
        add_special_tokens(tokenizers, models, model_config.special_tokens, loaded)
        placed = place_agents(models, args.agent_devices, local_rank)
        adapters: list[str | None] = [None] * len(models)
        if peft_config is not None:
            models, adapters = attach_adapters(models, peft_config)
        sharded = sharding_mode != "replicate"
        for model in unique(models):  # before the references: they are copies of the learner
            prepare_for_training(model, args, sharded=sharded)
        references = reference_placement(reference_devices, models, local_rank)
        bf16 = args.precision == "bf16"
        return cls(models, tokenizers, adapters, placed, with_references, references, sharding_mode, bf16)

    def __len__(self) -> int:
        return len(self.models)

    def __getitem__(self, index):  # type: ignore[override]
        return self.models[index]

    def device(self, agent: int) -> torch.device:
        return next(self.models[agent].parameters()).device

    def activate(self, agent: int) -> None:
        """Make agent ``agent``'s adapter the active one when agents share a base model."""
        if self.adapters[agent] is not None:
            self.models[agent].set_adapter(self.adapters[agent])

    def for_sampling(self, agent: int) -> None:
        """Agent ``agent`` ready to sample: its adapter active, its weights whole."""
        self.activate(agent)
        sharding.gather(self.models[agent])

    @contextlib.contextmanager
    def frozen(self, agent: int, reference: bool = False) -> Iterator[torch.nn.Module]:
        """Agent ``agent``'s model (or its frozen reference) in eval mode without gradient,
        its adapter active (or, for the reference of an adapter, disabled); everything is
        put back on the way out, an exception included."""
        self.activate(agent)
        model = self.models[agent]
        if reference and self.references[agent] is not None:
            model = self.references[agent]
        without_adapter = model.disable_adapter() if reference and model is self.models[agent] else None
        sharding.gather(model)
        with frozen(model), without_adapter or contextlib.nullcontext():
            yield model

    def trainable(self, agent: int) -> torch.nn.Module:
        """Agent ``agent``'s model, its adapter active, in train mode (activation checkpointing
        runs only in train mode; dropout was turned off at construction unless asked not to),
        sharded again if it was gathered."""
        # Released first: FSDP takes requires_grad from the sharded parameters at each gather,
        # so the adapter switch must set theirs, not those of the gathered copies.
        sharding.release(self.models[agent])
        self.activate(agent)
        return self.models[agent].train()

    @contextlib.contextmanager
    def whole_weights(self, merge_adapters: bool = False) -> Iterator[None]:
        """Within it, :meth:`write` can save sharded agents: each one's whole weights (a LoRA
        model's adapters only, unless ``merge_adapters``) are gathered on rank 0 first (a
        collective: every rank enters it)."""
        self._whole = {
            id(m): self.whole_state_dict(m, with_base=merge_adapters)
            for m in unique(self.models)
            if sharding.is_sharded(m)
        }
        try:
            yield
        finally:
            self._whole = {}

    def whole_state_dict(self, model: torch.nn.Module, with_base: bool = False) -> dict[str, torch.Tensor]:
        """A sharded model's whole weights on rank 0 (a collective): a LoRA model's adapters
        only, unless ``with_base``."""
        if with_base or not is_peft_model(model):
            return sharding.whole_state_dict(model)
        return adapter_weights(model, [a for m, a in zip(self.models, self.adapters) if m is model])

    def describe(self) -> list[dict[str, Any]]:
        """What a checkpoint records of each agent, to refuse resuming with other ones."""
        return [describe_agent(model) for model in self.models]

    def write(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer into ``folder``."""
        model = self.models[agent]
        whole = None
        if sharding.is_sharded(model):
            if id(model) not in self._whole:
                raise RuntimeError(f"agent {agent} is sharded: write it within whole_weights()")
            whole = self._whole[id(model)]
        if merge_adapters and is_peft_model(model):
            if whole is None:
                model = merged_copy(model, self.adapters[agent])
            else:  # rank 0 builds the sharded model whole from its gathered weights, and merges that
                built = fresh_model(model)
                built.load_state_dict(whole)
                model, whole = merged_copy(built, self.adapters[agent], in_place=True), None
        if self.adapters[agent] is not None and not merge_adapters:
            save_adapter(model, self.adapters[agent], folder, state_dict=whole)
        else:
            model.save_pretrained(folder, state_dict=whole)
        self.tokenizers[agent].save_pretrained(folder)

    def load(self, checkpoint: str) -> None:
        """The weights :meth:`write` put into ``checkpoint/agent_{i}``, loaded in place."""
        load_weights(checkpoint, self.models, self.adapters)


def reference_placement(
    spec: str | Sequence[str] | None, models: Sequence[torch.nn.Module], local_rank: int | None
) -> list[torch.device] | None:
    """One device per agent's reference from ``reference_devices``, read as ``agent_devices``
    is; None: each reference beside its agent. An adapter's reference is its base model with
    the adapter disabled, the agent's own module, so it cannot live anywhere else."""
    if spec is None:
        return None
    devices = resolve_agent_devices(spec, len(models), local_rank, field="reference_devices")
    for i, (model, device) in enumerate(zip(models, devices)):
        agent_device = next(model.parameters()).device
        if is_peft_model(model) and not same_device(device, agent_device):
            where = "reference_devices" if isinstance(spec, str) else f"reference_devices[{i}]"
            raise ValueError(
                f"{where} puts agent {i}'s reference on {device}, but agent {i} is a LoRA adapter on {agent_device}: "
                "its reference is its own base model with the adapter disabled, which lives where the agent does; "
                f"leave reference_devices=None (or name {agent_device})"
            )
    return devices


def prepare_for_training(model: torch.nn.Module, args: TrainerConfig, sharded: bool = False) -> None:
    """What the config asks of a model that learns (an agent, a separate critic): activation
    checkpointing, no dropout, bf16 parameters (``precision="bf16"``; a model to be sharded
    keeps fp32 ones, its masters, and computes in bf16 by FSDP's mixed precision)."""
    if args.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if args.disable_dropout:
        disable_dropout(model)
    if args.precision == "bf16" and not sharded:
        cast_parameters(model, torch.bfloat16)


def unique(models: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Each module once (agents sharing a base model hold the same one)."""
    return list({id(model): model for model in models}.values())
