"""LoRA adapters (PEFT) on the agents: each agent trains only its adapter.

Two layouts:
- one model per agent, each wrapped with its own adapter;
- one frozen base model shared by all agents, with one named adapter per agent
  (``agent_0``, ``agent_1``, ...): N agents cost about one model's memory. The trainer
  activates agent i's adapter before anything agent i does.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

import torch
from safetensors.torch import save_file

from comlrl.engine import sharding
from comlrl.utils.per_agent import per_agent

ADAPTER_FILE = "adapter_model.safetensors"


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("peft_config needs the peft package: pip install 'comlrl[lora]'") from None
    return peft


def adapter_name(agent: int) -> str:
    return f"agent_{agent}"


def attach_adapters(
    agents: Sequence[torch.nn.Module], peft_config: Any
) -> tuple[list[torch.nn.Module], list[str | None]]:
    """Wrap the agents with LoRA adapters.

    Args:
        agents: one model per agent; the SAME object repeated means a shared base model.
        peft_config: a ``peft`` config for every agent, or a list with one per agent.

    Returns:
        The agents' modules (the shared one repeated) and, per agent, its adapter's name in
        a shared model or None for an agent that is its own model.
    """
    peft = _peft()
    configs = per_agent(peft_config, len(agents), "peft_config")
    for i, config in enumerate(configs):
        if not isinstance(config, peft.PeftConfig):
            raise TypeError(
                f"peft_config for agent {i} must be a peft config (e.g. LoraConfig), got {type(config).__name__}"
            )
    if len({id(agent) for agent in agents}) == 1 and len(agents) > 1:
        shared = peft.get_peft_model(agents[0], configs[0], adapter_name=adapter_name(0))
        for i in range(1, len(agents)):
            shared.add_adapter(adapter_name(i), configs[i])
        return [shared] * len(agents), [adapter_name(i) for i in range(len(agents))]
    if len({id(agent) for agent in agents}) != len(agents):
        raise ValueError("with peft_config, pass either one model object per agent or the same object for every agent")
    return [peft.get_peft_model(agent, config) for agent, config in zip(agents, configs)], [None] * len(agents)


def trainable_parameters(agent: torch.nn.Module, adapter: str | None) -> list[torch.nn.Parameter]:
    """The parameters agent's optimizer updates: its adapter's in a shared model, else every
    parameter that requires a gradient."""
    if adapter is None:
        return [p for p in agent.parameters() if p.requires_grad]
    return [p for name, p in agent.named_parameters() if f".{adapter}." in name]


def is_peft_model(agent: torch.nn.Module) -> bool:
    try:
        import peft
    except ImportError:
        return False
    return isinstance(agent, peft.PeftModel)


def load_adapter_weights(agent: torch.nn.Module, weights: dict[str, torch.Tensor], adapter: str | None) -> list[str]:
    """Load saved adapter weights into ``agent``; returns the keys that did not fit. A sharded
    agent must be released (``comlrl.engine.sharding.sharded_parameters``): each rank keeps its slices."""
    if not sharding.is_sharded(agent):
        result = _peft().set_peft_model_state_dict(agent, weights, adapter_name=adapter or "default")
        return list(result.unexpected_keys)
    keys = adapter_keys(agent, adapter)
    sharding.load_whole_state_dict(agent, {keys[key]: value for key, value in weights.items() if key in keys})
    return sorted(set(weights) - set(keys))


def adapter_keys(agent: torch.nn.Module, adapter: str | None) -> dict[str, str]:
    """Each key of the adapter's saved state dict -> the name of the parameter it loads into
    (PEFT drops the adapter's name from the keys it saves)."""
    names = [name for name, _ in agent.named_parameters()]
    # PEFT's own key mapping, run on parameter indices in place of the weights.
    indices = {name: torch.tensor(k) for k, name in enumerate(names)}
    saved = _peft().get_peft_model_state_dict(agent, state_dict=indices, adapter_name=adapter or "default")
    return {key: names[int(index)] for key, index in saved.items()}


def adapter_weights(agent: torch.nn.Module, adapters: Sequence[str | None], every_rank: bool = False) -> dict:
    """These adapters' parameters of a sharded PEFT ``agent``, whole, keyed by parameter name
    (what :func:`save_adapter` takes as ``state_dict``): on rank 0, or on ``every_rank`` (a collective)."""
    names = {name for adapter in adapters for name in adapter_keys(agent, adapter).values()}
    return sharding.whole_parameters(agent, sorted(names), every_rank)


def save_adapter(
    agent: torch.nn.Module, adapter: str, folder: str, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """One adapter of a shared model as a standard PEFT folder (``adapter_model.safetensors``
    and ``adapter_config.json``), loadable with ``PeftModel.from_pretrained(base, folder)``;
    from ``state_dict`` (the model's whole weights, of a sharded model) when given."""
    weights = _peft().get_peft_model_state_dict(agent, state_dict=state_dict, adapter_name=adapter)
    os.makedirs(folder, exist_ok=True)
    save_file({key: value.contiguous() for key, value in weights.items()}, os.path.join(folder, ADAPTER_FILE))
    agent.peft_config[adapter].save_pretrained(folder)


def merged_copy(agent: torch.nn.Module, adapter: str | None, in_place: bool = False) -> torch.nn.Module:
    """A copy of the base model with the agent's adapter merged into its weights (the
    training model is left as it is; ``in_place``: ``agent`` is itself a copy, merged as it is)."""
    merged = agent if in_place else copy.deepcopy(agent)
    if adapter is None:
        return merged.merge_and_unload()
    merged.set_adapter(adapter)
    return merged.merge_and_unload(adapter_names=[adapter])


def fresh_model(agent: torch.nn.Module) -> torch.nn.Module:
    """A newly built model of ``agent``'s class, config and generation config, not sharded (a
    PEFT model: its base's, with the same adapters), for :func:`comlrl.engine.sharding.whole_copy` to
    fill. Its random init draws from a forked stream: the run's streams do not move."""
    base = agent.get_base_model() if is_peft_model(agent) else agent
    with torch.random.fork_rng(devices=[]):
        built = sharding.model_class(base)(base.config)
        built.generation_config = copy.deepcopy(base.generation_config)  # the sampling defaults
        if not is_peft_model(agent):
            return built
        names = list(agent.peft_config)
        fresh = _peft().get_peft_model(built, copy.deepcopy(agent.peft_config[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            fresh.add_adapter(name, copy.deepcopy(agent.peft_config[name]))
        return fresh
