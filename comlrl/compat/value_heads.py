"""comlrl 1.4.3's ``CausalLMWithValueHead`` (``comlrl.models.actor_critic``): a causal LM with a
value head, which its trainers took as an agent or a critic.

The engine takes plain causal LMs and keeps value heads beside them (:class:`~comlrl.models.value.Critic`),
so a wrapper is unwrapped where a trainer receives it, with the meaning 1.4.3 gave it:

- its ``.model`` is the agent's (or critic's) model, trained, saved, resumed, wrapped in LoRA
  adapters and served by vLLM as any model passed in;
- its ``.value_head`` is the critic's head where the trainer puts value heads on its agents
  (IAC without separate critics) or where it is a critic (IAC's critics, MAAC's critic): that
  very module is trained, saved (``value_head.safetensors``) and loaded on resume;
- elsewhere (the MAGRPO family, MADPO, MARLHF; IAC agents beside separate critics) the head is
  not used, as 1.4.3 left it without gradient: a warning says so.

The head is the engine's :class:`~comlrl.models.value.ValueHead` (float32, output layer starting
at zero, as every head the trainers build), not 1.4.3's module of that name.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from comlrl.engine.inputs import TrainerInputs
from comlrl.models.value import Critic, ValueHead, hidden_size
from comlrl.utils.caller import user_stacklevel


@dataclass
class ActorCriticOutput:
    """What :meth:`CausalLMWithValueHead.forward` returns, as in comlrl 1.4.3."""

    logits: Tensor
    values: Tensor | None
    """``(B, L)`` the head's value at every position, None without a head (or ``output_values=False``)."""
    hidden_states: Any
    past_key_values: Any


class CausalLMWithValueHead(nn.Module):
    """A causal LM (``.model``) with an optional value head (``.value_head``), for comlrl 1.4.3
    scripts that pass one to a trainer; write the plain model instead (``agents=[model]``): the
    actor-critic trainers add the heads (``value_head_hidden_dim``, ``critic_value_head_hidden_dim``).

    Args:
        base_model: the causal LM.
        value_head_hidden_dim: width of the head's Tanh hidden layer; None: one linear map.
        attach_value_head: False for a wrapper without a head (``.value_head`` is None).
    """

    def __init__(self, base_model: nn.Module, value_head_hidden_dim: int | None = None, attach_value_head: bool = True):
        super().__init__()
        self.model = base_model
        self.value_head = ValueHead(hidden_size(base_model), 1, value_head_hidden_dim) if attach_value_head else None
        if self.value_head is not None:
            self.value_head.to(next(base_model.parameters()).device)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_values: bool = True,
        **kwargs: Any,
    ) -> ActorCriticOutput:
        """The model's logits and, with a head, the value at every position."""
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True, **kwargs
        )
        last = outputs.hidden_states[-1]
        values = self.value_head(last).squeeze(-1) if output_values and self.value_head is not None else None
        return ActorCriticOutput(outputs.logits, values, outputs.hidden_states, outputs.past_key_values)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.generate(*args, **kwargs)


def _head(entry: Any) -> ValueHead | None:
    return entry.value_head if isinstance(entry, CausalLMWithValueHead) else None


def _plain(entry: Any) -> Any:
    return entry.model if isinstance(entry, CausalLMWithValueHead) else entry


def _warn_unused(where: str, why: str) -> None:
    warnings.warn(
        f"{where} is a CausalLMWithValueHead: its .model is used, its value head is not ({why}); it is neither "
        f"trained nor saved, as comlrl 1.4.3 left it. Pass {where}.model to silence this",
        stacklevel=user_stacklevel(),
    )


def plain_agents(agents: Sequence[Any] | None, trainer_name: str) -> Sequence[Any] | None:
    """``agents`` with each :class:`CausalLMWithValueHead` replaced by its model, for a trainer
    that puts no value heads on its agents (``trainer_name`` names it in the warning about a head)."""
    if agents is None or isinstance(agents, str | bytes) or not isinstance(agents, Sequence):
        return agents
    for i, entry in enumerate(agents):
        if _head(entry) is not None:
            _warn_unused(f"agents[{i}]", f"{trainer_name} trains no value head on its agents")
    return [_plain(entry) for entry in agents]


@dataclass
class GivenHeads:
    """The value heads of the wrappers an actor-critic trainer was given, by where they came from."""

    agents: list[ValueHead | None]
    critics: list[ValueHead | None]
    """Per entry of ``critics``, else ``critic_model``'s alone."""
    critic_argument: str
    """How errors name a critic source: ``critics[{}]`` or ``critic_model``."""

    @classmethod
    def take(cls, inputs: TrainerInputs) -> tuple[TrainerInputs, GivenHeads]:
        """``inputs`` (a trainer's) with every
        wrapper among the agents and critics replaced by its model, and the heads they held."""
        agents = inputs.agents if isinstance(inputs.agents, list | tuple) else []
        critics = inputs.critics if isinstance(inputs.critics, list | tuple) else [inputs.critic_model]
        argument = "critics[{}]" if isinstance(inputs.critics, list | tuple) else "critic_model"
        heads = cls([_head(a) for a in agents], [_head(c) for c in critics], argument)
        changes = {"critic_model": _plain(inputs.critic_model)}
        if isinstance(inputs.agents, list | tuple):
            changes["agents"] = [_plain(a) for a in inputs.agents]
        if isinstance(inputs.critics, list | tuple):
            changes["critics"] = [_plain(c) for c in inputs.critics]
        return inputs.replace(**changes), heads

    def adopt(self, critics: Sequence[Critic], trainer_name: str) -> None:
        """Make each given head the head of its critic (``critics``, as built from the plain
        models): agent i's on the critic on agent i, a critic wrapper's on that critic. An agent's
        head beside separate critics is not used (a warning)."""
        separate = all(critic.agent is None for critic in critics)
        for i, head in enumerate(self.agents):
            if head is not None and separate:
                _warn_unused(f"agents[{i}]", f"{trainer_name}'s critics are separate models")
        for c, critic in enumerate(critics):
            # Agents loaded by name (agent_model=), or a critic_model named by folder or hub id
            # (a copy per critic), come without heads.
            if critic.agent is not None:
                heads, index, where = self.agents, critic.agent, f"agents[{critic.agent}]"
            else:
                heads, index, where = self.critics, c, self.critic_argument.format(c)
            given = heads[index] if index < len(heads) else None
            if given is not None:
                critic.use_head(_fitted(given, critic, where, trainer_name))


def _fitted(given: ValueHead, critic: Critic, where: str, trainer_name: str) -> ValueHead:
    """``given``, checked against the head ``trainer_name`` built for ``critic`` from its config, on
    that head's device in float32."""
    built, setting = critic.head, critic.width_setting
    if given.num_values != built.num_values:
        raise ValueError(
            f"{where}'s value head gives one value, but {trainer_name}'s centralized critic gives one per agent "
            f"({built.num_values}): pass its model ({where}.model) for a new head, or save both "
            "(model.save_pretrained(folder); torch.save(value_head.state_dict(), folder + '/value_head.pt')) "
            "and pass critic_model=folder, which starts every agent's value from that head"
        )
    if built.hidden_dim is not None and built.hidden_dim != given.hidden_dim:
        raise ValueError(
            f"{where}'s value head has hidden width {given.hidden_dim}, but {setting}={built.hidden_dim}: "
            f"the given head is the one trained, so drop {setting} (or set it to {given.hidden_dim!r})"
        )
    return given.to(device=next(built.parameters()).device, dtype=torch.float32)
