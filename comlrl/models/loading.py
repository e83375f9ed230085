"""Building the agents and their tokenizers from what the user passed."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models.folders import check_model_source, load_errors
from comlrl.utils.per_agent import per_agent


class ModelConfig(NamedTuple):
    """What a trainer's ``model_config`` says, by destination."""

    model_kwargs: dict[str, Any]
    """``from_pretrained`` keyword arguments of the models."""
    tokenizer_kwargs: dict[str, Any]
    """``from_pretrained`` keyword arguments of the tokenizers loaded by name."""
    special_tokens: dict[str, Any]
    """``add_special_tokens`` argument applied to every agent's tokenizer (see :func:`add_special_tokens`)."""


def split_model_config(model_config: dict[str, Any] | None) -> ModelConfig:
    """``model_config`` by destination.

    Flat keys (``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``) are for the models;
    comlrl 1.4.3's sections are accepted beside them: ``model_kwargs`` (merged over the flat
    keys), ``tokenizer_kwargs`` and ``special_tokens``. A key given flat and in
    ``model_kwargs`` with different values is an error.
    """
    if model_config is not None and not isinstance(model_config, Mapping):
        raise TypeError(f"model_config must be a dict, got {type(model_config).__name__}")
    config = dict(model_config or {})
    sections = {}
    for name in ModelConfig._fields:
        section = config.pop(name, None) or {}
        if not isinstance(section, Mapping):
            raise TypeError(f"model_config[{name!r}] must be a dict, got {type(section).__name__}")
        sections[name] = dict(section)
    clash = sorted(
        key for key in set(config) & set(sections["model_kwargs"]) if config[key] != sections["model_kwargs"][key]
    )
    if clash:
        raise ValueError(f"model_config gives {clash} both flat and in model_kwargs, with different values: keep one")
    sections["model_kwargs"] = {**config, **sections["model_kwargs"]}
    return ModelConfig(**sections)


def load_agents(
    agent_model: str | os.PathLike[str],
    num_agents: int,
    model_kwargs: dict[str, Any],
    argument: str = "agent_model",
) -> list[torch.nn.Module]:
    """``num_agents`` independent copies of the model ``agent_model`` (a folder or hub id).

    ``argument`` is the trainer argument the value came from ("agent_model", "critic_model"),
    so that an error names what the user wrote.
    """
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise ValueError(f"num_agents must be an integer >= 1, got {num_agents!r}")
    if isinstance(agent_model, os.PathLike):
        agent_model = os.fspath(agent_model)
    if not isinstance(agent_model, str):
        raise TypeError(f"{argument} must be a folder or a hub id (str), got {type(agent_model).__name__}")
    source = check_model_source(agent_model, argument)
    with load_errors(agent_model, argument):
        return [AutoModelForCausalLM.from_pretrained(source, **model_kwargs) for _ in range(num_agents)]


def model_sources(
    agents: Sequence[Any], agent_model: str | os.PathLike[str] | None, model_kwargs: dict[str, Any]
) -> list[torch.nn.Module]:
    """The agents given as a list, each entry a model or a folder / hub id to load (as
    comlrl 1.4.3 accepted). With ``agent_model`` as well, every entry must be that model
    (its name, or a model loaded from it): the two arguments then say the same thing."""
    if isinstance(agents, str | bytes | os.PathLike) or not isinstance(agents, Sequence):
        raise TypeError(f"agents must be a list of models or model names, got {type(agents).__name__}")
    if agent_model is not None:
        wanted = os.fspath(agent_model)
        for i, entry in enumerate(agents):
            name = os.fspath(entry) if isinstance(entry, str | os.PathLike) else getattr(entry, "name_or_path", None)
            if name != wanted:
                raise ValueError(
                    f"agent_model={wanted!r} and agents[{i}] ({name!r}) disagree: "
                    "pass only one of agent_model and agents"
                )
    return [
        load_agents(entry, 1, model_kwargs, argument=f"agents[{i}]")[0]
        if isinstance(entry, str | os.PathLike)
        else entry
        for i, entry in enumerate(agents)
    ]


def check_agents(agents: Sequence[torch.nn.Module], shared_base_allowed: bool = False) -> list[torch.nn.Module]:
    """Each agent must be its own generating model: two agents sharing one object would
    share parameters while two optimizers update them. With adapters
    (``shared_base_allowed``), the same object for EVERY agent is one shared base model."""
    agents = list(agents)
    if not agents:
        raise ValueError("agents is empty: pass at least one model (or agent_model=<name> and num_agents)")
    seen: dict[int, int] = {}
    for i, agent in enumerate(agents):
        if not isinstance(agent, torch.nn.Module) or not hasattr(agent, "generate"):
            raise TypeError(f"agents[{i}] must be a causal LM with .generate(), got {type(agent).__name__}")
        if id(agent) in seen and not (shared_base_allowed and len({id(a) for a in agents}) == 1):
            raise ValueError(
                f"agents[{i}] is the same object as agents[{seen[id(agent)]}]; each agent needs its own model instance"
            )
        seen[id(agent)] = i
    return agents


def resolve_tokenizers(
    tokenizer: Any,
    agents: Sequence[torch.nn.Module],
    tokenizer_kwargs: dict[str, Any] | None = None,
    role: str = "agent",
) -> list[Any]:
    """One tokenizer per agent (or per ``role``: "critic"), each able to pad.

    ``tokenizer`` may be one tokenizer for all agents, a list with one per agent, or None
    (each agent's tokenizer is then loaded from the folder or id it was loaded from).
    A tokenizer without a pad token pads with its EOS token; this is said once per tokenizer.
    """
    if tokenizer is None:
        tokenizers = []
        for i, agent in enumerate(agents):
            source = getattr(agent, "name_or_path", "") or ""
            if not source:
                raise ValueError(
                    f"tokenizer is None and {role}s[{i}] does not say where it was loaded from; pass a tokenizer"
                )
            tokenizers.append(AutoTokenizer.from_pretrained(source, **(tokenizer_kwargs or {})))
    else:
        tokenizers = per_agent(tokenizer, len(agents), "tokenizers" if role == "agent" else f"{role} tokenizers")
    fixed: set[int] = set()
    for i, tok in enumerate(tokenizers):
        if tok.pad_token_id is not None or id(tok) in fixed:
            continue
        if tok.eos_token is None:
            raise ValueError(f"the tokenizer of {role} {i} has neither a pad token nor an EOS token")
        warnings.warn(
            f"the tokenizer of {role} {i} has no pad token; padding with its EOS token {tok.eos_token!r}",
            stacklevel=3,
        )
        tok.pad_token = tok.eos_token
        fixed.add(id(tok))
    return tokenizers


def enable_activation_checkpointing(agent: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (non-reentrant: works with frozen bases and
    adapters). transformers 5.x renamed gradient checkpointing to activation checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(agent, "activation_checkpointing_enable"):
        agent.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        agent.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
