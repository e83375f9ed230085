"""The comparator policies MADPOIter's current policy is measured against each round: what
samples the comparator's candidates, and what of it a checkpoint keeps.

    comparator_policy   samples with                                      a checkpoint keeps
    current             the live agents (their own random stream)         nothing
    current_copy        a frozen copy of the agents, made at each round's  nothing (remade at the
                        start (on comparator_devices)                       next round's start)
    model               frozen models loaded once by name                  nothing (loaded again)
    history             a frozen copy of the policy k rounds earlier       the snapshots later
                        (snapshots kept in memory, on the CPU)              rounds will compare with
    api                 an HTTP endpoint (comparator_api_url), its text    nothing (no key: it stays
                        answers tokenized with the agents' tokenizers       in the environment)

Every comparator answers :meth:`Comparator.start_round` with the generation backend of that
round's comparator candidates; the rounds sample them with the run's rollout, through that
backend and with the agents' tokenizers, so the pairs hold the tokens exactly as sampled
(``api``: as its answers tokenize, EOS appended).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import AutoTokenizer

from comlrl.engine import sharding
from comlrl.engine.agents import Agents
from comlrl.models.folders import check_model_source
from comlrl.models.loading import load_agents
from comlrl.models.lora import fresh_model, is_peft_model, merged_copy
from comlrl.models.placement import resolve_agent_devices
from comlrl.rollout.backends import GenerationBackend, HFBackend
from comlrl.trainers.dpo.api_comparator import ApiBackend, ApiClient
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig


class Comparator(Protocol):
    def start_round(self, round_index: int) -> GenerationBackend:
        """What samples round ``round_index``'s comparator candidates (called once per round,
        in order, before the agents change in that round)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint must keep to continue the rounds exactly (tensors, numbers, lists)."""
        ...

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state` returned."""
        ...


# ------------------------------------------------------------------------------------------
# copies of the policy
# ------------------------------------------------------------------------------------------
def comparator_devices(spec: str | Sequence[str] | None, agents: Agents) -> list[torch.device]:
    """One device per agent for the comparator's models: ``spec`` as ``agent_devices`` reads
    it (``None``: each agent's own device)."""
    if spec is None:
        return [agents.device(i) for i in range(len(agents))]
    return resolve_agent_devices(spec, len(agents), field="comparator_devices")


def policy_copy(agents: Agents, agent: int) -> torch.nn.Module:
    """Agent ``agent``'s policy as it is now, as a model of its own (an adapter is merged into
    the copy's weights; a sharded agent's whole weights are gathered: a collective)."""
    model, adapter = agents[agent], agents.adapters[agent]
    if sharding.is_sharded(model):  # built anew from the gathered slices: already a copy
        built = sharding.whole_copy(model, fresh_model(model))
        return merged_copy(built, adapter, in_place=True) if is_peft_model(built) else built
    return merged_copy(model, adapter) if is_peft_model(model) else copy.deepcopy(model)


def frozen_copy(agents: Agents, agent: int, device: torch.device) -> torch.nn.Module:
    """:func:`policy_copy` on ``device``, frozen."""
    return policy_copy(agents, agent).to(device).eval().requires_grad_(False)


def policy_weights(agents: Agents, agent: int) -> dict[str, torch.Tensor]:
    """The weights :func:`frozen_copy` would give agent ``agent``'s copy now, on the CPU."""
    model = agents[agent]
    if is_peft_model(model):
        state = policy_copy(agents, agent).state_dict()
    elif sharding.is_sharded(model):  # read from the slices, without building a model around them
        dtype = sharding.sampling_dtype(model)
        state = {name: t.to(dtype) for name, t in sharding.whole_state_dict(model, every_rank=True).items()}
    else:
        state = model.state_dict()
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def frozen_backend(models: Sequence[torch.nn.Module], agents: Agents) -> HFBackend:
    """Sampling with ``models`` (one per agent, frozen, no adapters) and the agents' tokenizers."""
    return HFBackend(models, agents.tokenizers, lambda agent: None)


# ------------------------------------------------------------------------------------------
# the comparators
# ------------------------------------------------------------------------------------------
class Stateless:
    """A comparator a checkpoint keeps nothing of: it is rebuilt from the config and the agents."""

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass


class LiveAgents(Stateless):
    """``current``: the agents themselves; the rounds draw their comparator candidates from a
    random stream of their own, so they are not the current candidates again."""

    def __init__(self, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]):
        self.backend = backend

    def start_round(self, round_index: int) -> GenerationBackend:
        return self.backend


class RoundCopy(Stateless):
    """``current_copy``: a frozen copy of the agents made at the start of each round, on
    ``comparator_devices``; it stays as it was while the agents train, until the next round
    replaces it."""

    def __init__(self, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]):
        self.agents = agents
        self.devices = comparator_devices(args.comparator_devices, agents)
        self.models: list[torch.nn.Module] = []

    def start_round(self, round_index: int) -> GenerationBackend:
        self.models = []  # the previous round's copy goes before the new one is made
        self.models = [frozen_copy(self.agents, i, device) for i, device in enumerate(self.devices)]
        return frozen_backend(self.models, self.agents)


class ExternalModels(Stateless):
    """``model``: frozen models loaded once, by name (``comparator_model_name`` for every
    agent, one shared model, or ``comparator_agents``, one per agent). They sample with the
    agents' tokenizers, so each must share its agent's vocabulary."""

    def __init__(self, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]):
        names = args.comparator_agents or [args.comparator_model_name] * len(agents)
        if len(names) != len(agents):
            raise ValueError(
                f"comparator_agents names {len(names)} models for {len(agents)} agents: give one per agent"
            )
        arguments = (
            [f"comparator_agents[{i}]" for i in range(len(names))]
            if args.comparator_agents
            else ["comparator_model_name"] * len(names)
        )
        devices = comparator_devices(args.comparator_devices, agents)
        loaded: dict[tuple[str, torch.device], torch.nn.Module] = {}
        self.models = []
        for i, (name, argument, device) in enumerate(zip(names, arguments, devices)):
            check_vocabulary(name, argument, agents.tokenizers[i], i)
            if (name, device) not in loaded:  # a frozen model serves every agent that names it
                model = load_agents(name, 1, model_kwargs, argument=argument)[0]
                loaded[name, device] = model.to(device).eval().requires_grad_(False)
            self.models.append(loaded[name, device])
        self.backend = frozen_backend(self.models, agents)

    def start_round(self, round_index: int) -> GenerationBackend:
        return self.backend


def check_vocabulary(name: str, argument: str, tokenizer: Any, agent: int) -> None:
    """The model ``name`` must come with agent ``agent``'s vocabulary: its samples train the agent token by token."""
    theirs = AutoTokenizer.from_pretrained(check_model_source(name, argument))
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"{argument}={name!r} has another vocabulary than agent {agent}'s tokenizer; MADPOIter trains each "
            "agent on the comparator's sampled tokens, so the comparator must share the agent's tokenizer"
        )


def history_source(round_index: int, k: int) -> int:
    """The round whose starting policy round ``round_index`` compares with: ``k`` rounds
    earlier, the initial policy for the first ``k`` rounds."""
    return max(round_index - k, 0)


def history_kept(round_index: int, k: int, num_rounds: int) -> set[int]:
    """The rounds whose starting policies must be kept once round ``round_index`` has started:
    those a later round compares with."""
    return {history_source(later, k) for later in range(round_index + 1, num_rounds)}


class History:
    """``history``: the policy as it was when round ``r - k`` started (the initial policy for
    the first ``k`` rounds), never the current one. The starting weights of the rounds later
    rounds will need are kept on the CPU (``comparator_history_k`` snapshots at most) and
    loaded into one frozen model per agent on ``comparator_devices`` when a round starts."""

    def __init__(self, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]):
        self.agents = agents
        self.k, self.num_rounds = args.history_k, args.num_iterations
        self.devices = comparator_devices(args.comparator_devices, agents)
        self.snapshots: dict[int, list[dict[str, torch.Tensor]]] = {}
        """Round -> each agent's weights when that round started."""
        self.models: list[torch.nn.Module] = []

    def start_round(self, round_index: int) -> GenerationBackend:
        source = history_source(round_index, self.k)
        if round_index == source or round_index in history_kept(round_index, self.k, self.num_rounds):
            self.snapshots[round_index] = [policy_weights(self.agents, i) for i in range(len(self.agents))]
        if not self.models:
            self.models = [frozen_copy(self.agents, i, device) for i, device in enumerate(self.devices)]
        for model, weights in zip(self.models, self.snapshots[source]):
            model.load_state_dict(weights)
        kept = history_kept(round_index, self.k, self.num_rounds)
        self.snapshots = {r: weights for r, weights in self.snapshots.items() if r in kept}
        return frozen_backend(self.models, self.agents)

    def state(self) -> dict[str, Any]:
        return {"snapshots": [[r, weights] for r, weights in sorted(self.snapshots.items())]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.snapshots = {r: weights for r, weights in state["snapshots"]}


class HttpEndpoint(Stateless):
    """``api``: an HTTP endpoint asked for each prompt's candidates (the ``comparator_api_*``
    fields; :mod:`comlrl.trainers.dpo.api_comparator`). A checkpoint keeps nothing of
    it, and above all not its key, which is read from the environment at each request."""

    def __init__(self, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]):
        self.backend = ApiBackend(ApiClient.from_config(args), agents)

    def start_round(self, round_index: int) -> GenerationBackend:
        return self.backend


COMPARATORS: dict[str, type] = {
    "current": LiveAgents,
    "current_copy": RoundCopy,
    "model": ExternalModels,
    "history": History,
    "api": HttpEndpoint,
}
"""``comparator_policy`` -> its class; each is built from ``(agents, the agents' generation
backend, the config, from_pretrained keyword arguments)``. Its keys are the config's
:data:`~comlrl.trainers.dpo.iterative_config.COMPARATOR_POLICIES`."""


def build_comparator(
    policy: str, agents: Agents, backend: GenerationBackend, args: MADPOIterConfig, model_kwargs: dict[str, Any]
) -> Comparator:
    """The comparator ``policy`` (a key of ``COMPARATORS``)."""
    if policy not in COMPARATORS:
        raise ValueError(f"comparator_policy={policy!r}; expected one of {sorted(COMPARATORS)}")
    return COMPARATORS[policy](agents, backend, args, model_kwargs)
