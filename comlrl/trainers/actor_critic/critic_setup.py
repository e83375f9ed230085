"""Building the critics of IAC and MAAC from a trainer's critic arguments: value heads on the
agents' models (IAC's default), or separate critic models from ``critic_model`` /
``critics``, each with a value head that continues the one saved in its folder, if any.

:func:`build_critics` is the one entry point (and :func:`critic_learning_rates` their rates);
it reads of the run only its agents, config, loading arguments and data parallelism, so
any constructor can call it once the agents are built. comlrl 1.4.3's critic folders, value
heads and ``model_config`` keys are read by :mod:`comlrl.compat.actor_critic`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from comlrl.compat.actor_critic import (
    CriticModelConfig,
    check_same_model,
    critic_device_list,
    critic_model_argument,
    lacks_tokenizer,
    warn_if_original_head,
)
from comlrl.compat.fields import warn_ignored
from comlrl.engine.agents import Agents, prepare_for_training
from comlrl.engine.distributed import DataParallel
from comlrl.engine.optim import per_agent_learning_rates
from comlrl.engine.run import Run
from comlrl.models.loading import check_agents, load_agents, resolve_tokenizers
from comlrl.models.placement import same_device
from comlrl.models.value import Critic, ValueHead, hidden_size, saved_head_file
from comlrl.models.vocabulary import TokenizedModel, fit_embeddings
from comlrl.trainers.actor_critic.config import ActorCriticConfig

CriticSource = str | os.PathLike[str] | torch.nn.Module
"""A critic model as given: a folder or hub id, or a causal LM instance."""


@dataclass(frozen=True)
class _Setup:
    """What building the critics reads of its trainer."""

    agents: Agents
    args: ActorCriticConfig
    num_agents: int
    model_kwargs: dict[str, Any]
    tokenizer_kwargs: dict[str, Any]
    parallel: DataParallel
    centralized: bool
    """One critic for all agents (MAAC) instead of one per agent (IAC)."""

    @property
    def num_critics(self) -> int:
        return 1 if self.centralized else self.num_agents

    @property
    def kind(self) -> str:
        return "MAAC's centralized critic" if self.centralized else "IAC (one critic per agent)"


def build_critics(
    run: Run,
    trainer_name: str,
    critic_model: CriticSource | None,
    critics: Sequence[CriticSource] | None,
    critic_tokenizer: Any,
    critic_config: CriticModelConfig,
    special_tokens: dict[str, Any],
    *,
    centralized: bool,
    config: ActorCriticConfig,
) -> list[Critic]:
    """Value heads on the ``run``'s agents (IAC), or separate critic models from
    ``critic_model`` / ``critics`` read with ``critic_tokenizer``; one critic for all agents
    when ``centralized`` (MAAC), else one per agent. ``critic_config`` holds ``model_config``'s
    critic keys, ``special_tokens`` its special tokens (which grew the agents' tokenizers);
    ``config`` is the actor-critic config (the trainer's, or MARLHF's RL phase's);
    ``trainer_name`` names the trainer in warnings."""
    setup = _Setup(
        run.agents,
        config,
        run.num_agents,
        run.model_config.model_kwargs,
        run.model_config.tokenizer_kwargs,
        run.parallel,
        centralized,
    )
    critic_model = critic_model_argument(critic_model, config)
    separate = _uses_separate_critics(setup, critic_model is not None or critics is not None)
    # IAC's two layouts had both head widths in the original library, which ignored the one not in use.
    as_in_original = not centralized and (separate or config.use_separate_critic is False)
    width = critic_config.resolve_head_width(setup.args.value_head_width(separate, as_in_original), centralized)
    if critic_config.model_kwargs and not separate:
        warn_ignored(
            trainer_name,
            "model_config['critic_model_kwargs']",
            "model_config['critic_model_kwargs'] has no effect: no critic model is loaded (the value heads sit on "
            "the agents' models); drop it",
        )
    if separate:
        built = _separate_critics(setup, critic_model, critics, critic_tokenizer, critic_config, special_tokens, width)
    else:
        built = _heads_on_agents(setup, width)
    _check_critic_devices(setup, built)
    return built


def critic_learning_rates(num_agents: int, critics: Sequence[Critic], args: ActorCriticConfig) -> list[float]:
    """A value head on an agent trains at that agent's rate (and, as every learner, on the
    config's schedule), as comlrl 1.4.3 trained it inside the agent's optimizer; separate
    critics at ``critic_learning_rate`` (of ``args``, the actor-critic config)."""
    agent_rates = per_agent_learning_rates(args.agent_learning_rate, num_agents)
    return [
        agent_rates[critic.agent] if critic.agent is not None else args.separate_critic_learning_rate()
        for critic in critics
    ]


def _heads_on_agents(setup: _Setup, width: int | None) -> list[Critic]:
    """IAC without a separate critic: a value head on each agent's own model; an agent saved
    with its head keeps it."""
    built = [
        _critic(setup, f"critic {i}", agent, setup.agents.tokenizers[i], width, agent=i)
        for i, agent in enumerate(setup.agents)
    ]
    for critic, agent in zip(built, setup.agents):
        if getattr(agent, "name_or_path", ""):
            _load_saved_head(critic, agent.name_or_path)
    return built


def _separate_critics(
    setup: _Setup,
    critic_model: CriticSource | None,
    critics: Sequence[CriticSource] | None,
    tokenizer: Any,
    config: CriticModelConfig,
    special_tokens: dict[str, Any],
    width: int | None,
) -> list[Critic]:
    """The critic models, loaded by name (with ``model_config``'s arguments, and the critic
    keys' over them) or as given, set up as the agents are, each with a value head."""
    sources = _critic_sources(setup, critic_model, critics)
    if config.model_kwargs and not any(isinstance(source, str) for source in sources):
        warn_ignored(
            type(setup.args).__name__,
            "model_config['critic_model_kwargs']",
            "model_config['critic_model_kwargs'] has no effect: the critics are given as models, not loaded; drop it",
        )
    model_kwargs = {**setup.model_kwargs, **config.model_kwargs}
    argument = "critics[{}]" if critics is not None else "critic_model"
    models = [
        load_agents(source, 1, model_kwargs, argument=argument.format(c))[0] if isinstance(source, str) else source
        for c, source in enumerate(sources)
    ]
    _prepare_critic_models(setup, models)
    tokenizers = _critic_tokenizers(setup, models, tokenizer)
    if special_tokens:
        _fit_critic_embeddings(setup, models, tokenizers, sources)
    built = [_critic(setup, f"critic {c}", model, tok, width) for c, (model, tok) in enumerate(zip(models, tokenizers))]
    for critic, source in zip(built, sources):
        if isinstance(source, str):
            _load_saved_head(critic, source)
    return built


def _prepare_critic_models(setup: _Setup, models: list[torch.nn.Module]) -> None:
    """Check the separate critic models, and place and set them up as the agents are."""
    check_agents(models)
    agent_ids = {id(agent) for agent in setup.agents}
    for c, model in enumerate(models):
        if id(model) in agent_ids:
            raise ValueError(
                f"critics[{c}] is an agent's model; for value heads on the agents, pass no critic_model/critics"
            )
        if setup.agents.placed:  # a separate critic follows its agent (MAAC's, agent 0)
            model.to(setup.agents.device(c))
        prepare_for_training(model, setup.args)


def _uses_separate_critics(setup: _Setup, given: bool) -> bool:
    """Separate critic models when some are given, checked against ``use_separate_critic``
    (comlrl 1.4.3's switch, whose True required them and False refused them)."""
    flag = setup.args.use_separate_critic
    if setup.centralized and flag is False:
        raise ValueError(
            "use_separate_critic=False, but MAAC's centralized critic is always a separate model "
            "(critic_model=...): drop use_separate_critic"
        )
    if setup.centralized and not given:
        raise ValueError(
            "MAAC needs a centralized critic model: critic_model=<folder or hub id or model> or critics=[model]"
        )
    if flag and not given:
        raise ValueError(
            "use_separate_critic=True needs the critics: critic_model=<folder or hub id> (a copy per agent) or "
            "critics=[one per agent]; for value heads on the agents' models, drop use_separate_critic"
        )
    if flag is False:
        if given:
            warn_ignored(
                type(setup.args).__name__,
                "use_separate_critic",
                "critic_model/critics has no effect with use_separate_critic=False: the value heads sit on the "
                "agents' models and no critic model is loaded; drop critic_model/critics, or use_separate_critic",
            )
        return False
    if not given:
        setup.args.check_heads_learning_rate("no critic_model/critics given", as_in_original=False)
    return given


def _critic_sources(
    setup: _Setup, critic_model: CriticSource | None, critics: Sequence[CriticSource] | None
) -> list[str | torch.nn.Module]:
    """One source (folder, hub id or model) per critic."""
    count = setup.num_critics
    if critics is None:
        if isinstance(critic_model, str | os.PathLike):
            return [os.fspath(critic_model)] * count
        if count != 1:
            raise ValueError(
                f"critic_model is one model instance but {setup.kind} needs {count}: pass critics=[...] with one "
                "per agent, or critic_model=<folder or hub id> to load a copy per agent"
            )
        return [critic_model]
    if isinstance(critics, str | bytes | os.PathLike):
        raise TypeError(
            f"critics={critics!r} is one name; pass critics=[one per critic], or critic_model={critics!r} "
            "for a copy per critic"
        )
    critics = [os.fspath(c) if isinstance(c, os.PathLike) else c for c in critics]
    if len(critics) != count:
        raise ValueError(f"critics holds {len(critics)} models; {setup.kind} needs {count}")
    if critic_model is not None:
        check_same_model(critic_model, critics)
    return critics


def _critic_tokenizers(setup: _Setup, models: list[torch.nn.Module], tokenizer: Any) -> list[Any]:
    """``critic_tokenizer``, else each critic's own from where it was loaded; a critic from a
    folder without one (:func:`~comlrl.compat.actor_critic.lacks_tokenizer`) reads with its
    agent's (MAAC: agent 0's)."""
    if setup.centralized and isinstance(tokenizer, list | tuple):
        raise ValueError(f"critic_tokenizer is a list of {len(tokenizer)}; MAAC's one critic takes one tokenizer")
    if tokenizer is None and any(lacks_tokenizer(model) for model in models):
        tokenizer = [
            setup.agents.tokenizers[0 if setup.centralized else c]
            if lacks_tokenizer(model)
            else resolve_tokenizers(None, [model], setup.tokenizer_kwargs, role="critic")[0]
            for c, model in enumerate(models)
        ]
    return resolve_tokenizers(tokenizer, models, setup.tokenizer_kwargs, role="critic")


def _fit_critic_embeddings(
    setup: _Setup, models: list[torch.nn.Module], tokenizers: list[Any], sources: list[str | torch.nn.Module]
) -> None:
    """A separate critic that reads with an agent's tokenizer (``critic_tokenizer`` is the
    agents', or a comlrl 1.4.3 critic folder holds none) reads ``model_config``'s special
    tokens too: its model is resized as the agents' are when loaded by name, and refused when
    passed in. A critic with a tokenizer of its own is left as it is: the special tokens never
    reach its tokenizer, which reads them in a prompt as the text they spell."""
    agent_tokenizers = {id(tok) for tok in setup.agents.tokenizers}
    fit_embeddings(
        [
            TokenizedModel("critic", c, model, tok, isinstance(source, str))
            for c, (model, tok, source) in enumerate(zip(models, tokenizers, sources))
            if id(tok) in agent_tokenizers
        ]
    )


def _critic(
    setup: _Setup, name: str, backbone: torch.nn.Module, tokenizer: Any, width: int | None, agent: int | None = None
) -> Critic:
    """A critic with a new value head (one value per agent for MAAC's), on its backbone's device."""
    num_values = setup.num_agents if setup.centralized else 1
    head = ValueHead(hidden_size(backbone), num_values, width)
    head.to(next(backbone.parameters()).device)
    return Critic(name, backbone, head, tokenizer, agent)


def _load_saved_head(critic: Critic, source: str) -> None:
    """A critic (or an agent holding its value head) loaded from a folder that holds a value
    head continues from it."""
    folder = os.path.expanduser(source)
    path = saved_head_file(folder) if os.path.isdir(folder) else None
    if path is None:
        return
    critic.head.load(folder, critic.width_setting)
    warn_if_original_head(critic.name, path)


def _check_critic_devices(setup: _Setup, critics: list[Critic]) -> None:
    """comlrl 1.4.3's ``critic_devices`` must say where the critics are anyway: each with its
    agent when ``agent_devices`` places them (MAAC's with agent 0), else where it was given."""
    spec = setup.args.critic_devices
    if spec is None:
        return
    asked = critic_device_list(spec, len(critics), setup.parallel.local_rank if setup.parallel.enabled else None)
    for critic, device in zip(critics, asked):
        actual = next(critic.backbone.parameters()).device
        if not same_device(device, actual) and setup.args.use_separate_critic is False:  # ignored there
            warn_ignored(
                type(setup.args).__name__,
                "critic_devices",
                f"critic_devices={spec!r} has no effect with value heads on the agents: each head lives with its "
                "agent; drop critic_devices",
            )
        elif not same_device(device, actual):
            raise ValueError(
                f"critic_devices={spec!r} puts {critic.name} on {device}, but it is on {actual}: here a critic "
                "lives with its agent (MAAC's with agent 0); drop critic_devices and place the agents with "
                "agent_devices"
            )
