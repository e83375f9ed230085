"""Actor-critic trainers with PPO-style updates: IAC (one critic per agent) and MAAC (one
centralized critic). Rollouts, rewards, the policy loss, logging and checkpoints are
``MultiAgentTrainer``'s; this module adds the critics.

One training step:

    rollout tree (as MAGRPO: G completions per prompt and agent, joint actions, turns)
    ─critic (no gradient)─▶ value of every node V (a Q-critic: of every action; V = their mean)
    ─GAE over the tree (gamma, gae_lambda)─▶ lambda-returns G of the joint actions
    ─credit per agent sample, minus V of its node─▶ advantages (whitened per agent)
    ─ppo_epochs passes: clipped policy loss per agent + clipped value loss per critic
      ─▶ one optimizer step per actor and per critic each pass
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl.algorithms import per_agent_returns
from comlrl.algorithms.critic import whiten
from comlrl.algorithms.returns import tree_lambda_returns, tree_returns
from comlrl.checkpoint import load_weights
from comlrl.models.loading import check_agents, enable_activation_checkpointing, load_agents, resolve_tokenizers
from comlrl.models.modes import disable_dropout
from comlrl.models.value import Critic, EncodedInputs, ValueHead, hidden_size
from comlrl.rollout.tree import RolloutTree, Turn
from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.critics import (
    CentralizedCritic,
    CriticEstimate,
    CriticLayout,
    CriticLoss,
    IndependentCritics,
    frozen_values,
    joint_critic_text,
)
from comlrl.trainers.base import MultiAgentTrainer


class ActorCriticTrainer(MultiAgentTrainer):
    """What IAC and MAAC share. Arguments: those of
    :class:`~comlrl.trainers.base.MultiAgentTrainer`, plus

    Args:
        critic_model: a separate critic model: a folder or hub id (loaded once per critic
            with ``model_config``), or a causal LM instance when there is one critic.
        critics: separate critic models, a list with one causal LM per critic.
        critic_tokenizer: the separate critics' tokenizer (one, or one per critic); None loads
            each critic's from where it was loaded.
    """

    config_class: type[ActorCriticConfig] = ActorCriticConfig
    args: ActorCriticConfig
    centralized = False
    """One critic for all agents (MAAC) instead of one per agent (IAC)."""

    def __init__(
        self,
        *args: Any,
        critic_model: str | torch.nn.Module | None = None,
        critics: Sequence[torch.nn.Module] | None = None,
        critic_tokenizer: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        args = self.args
        self.critics = self._build_critics(critic_model, critics, critic_tokenizer)
        layout = CentralizedCritic if self.centralized else IndependentCritics
        self.layout: CriticLayout = layout(self.num_agents, args.critic_type)
        self.add_learners(
            [critic.name for critic in self.critics],
            [critic.parameters() for critic in self.critics],
            [args.critic_learning_rate] * len(self.critics),
        )
        self.update.auxiliary.append(
            CriticLoss(
                self.critics,
                self.agents,
                self.parallel,
                args.value_clip_range,
                args.value_loss_coef,
                args.micro_batch_size,
            )
        )
        self._check_first_turn_inputs()

    @property
    def discount(self) -> float:
        """``gamma``: the discount of the returns logged and evaluated."""
        return self.args.gamma

    @property
    def passes(self) -> int:
        return self.args.ppo_epochs

    # ----------------------------------------------------------------------------------------
    # critics
    # ----------------------------------------------------------------------------------------
    @property
    def num_critics(self) -> int:
        return 1 if self.centralized else self.num_agents

    def _build_critics(
        self, critic_model: str | torch.nn.Module | None, critics: Sequence[torch.nn.Module] | None, tokenizer: Any
    ) -> list[Critic]:
        count = self.num_critics
        kind = "MAAC's centralized critic" if self.centralized else "IAC (one critic per agent)"
        if critic_model is not None and critics is not None:
            raise ValueError("pass either critic_model or critics, not both")
        if critics is not None:
            critics = list(critics)
            if len(critics) != count:
                raise ValueError(f"critics holds {len(critics)} models; {kind} needs {count}")
        elif isinstance(critic_model, str):
            critics = load_agents(critic_model, count, self.model_kwargs, argument="critic_model")
        elif critic_model is not None:
            if count != 1:
                raise ValueError(
                    f"critic_model is one model instance but {kind} needs {count}: pass critics=[...] with one "
                    "per agent, or critic_model=<folder or hub id> to load a copy per agent"
                )
            critics = [critic_model]
        elif self.centralized:
            raise ValueError(
                "MAAC needs a centralized critic model: critic_model=<folder or hub id or model> or critics=[model]"
            )
        if critics is None:
            # IAC without a separate critic: a value head on each agent's own model.
            return [
                self._critic(f"critic {i}", agent, self.agents.tokenizers[i], agent=i)
                for i, agent in enumerate(self.agents)
            ]
        critics = check_agents(critics)
        agent_ids = {id(agent) for agent in self.agents}
        for c, model in enumerate(critics):
            if id(model) in agent_ids:
                raise ValueError(
                    f"critics[{c}] is an agent's model; for value heads on the agents, pass no critic_model/critics"
                )
        if self.centralized and isinstance(tokenizer, list | tuple):
            raise ValueError(f"critic_tokenizer is a list of {len(tokenizer)}; MAAC's one critic takes one tokenizer")
        tokenizers = resolve_tokenizers(tokenizer, critics, self.tokenizer_kwargs, role="critic")
        for c, model in enumerate(critics):
            if self.agents.placed:  # a separate critic follows its agent (MAAC's, agent 0)
                model.to(self.agents.device(c))
            if self.args.gradient_checkpointing:
                enable_activation_checkpointing(model)
            if self.args.disable_dropout:
                disable_dropout(model)
        return [self._critic(f"critic {c}", model, tok) for c, (model, tok) in enumerate(zip(critics, tokenizers))]

    def _check_first_turn_inputs(self) -> None:
        """Encode every training row's first-turn prompts with each separate critic's
        tokenizer, so a critic that cannot read them fails here, before any training."""
        rows = list(range(len(self.train_prompts)))
        prompts = [self.train_prompts.agent_prompts(i, rows) for i in range(self.num_agents)]
        for c, critic in enumerate(self.critics):
            if critic.agent is None:
                texts = [joint_critic_text(joint) for joint in zip(*prompts)] if self.centralized else prompts[c]
                critic.encode(texts, lambda k: f"dataset row {k} (turn 1)")

    def _critic(self, name: str, backbone: torch.nn.Module, tokenizer: Any, agent: int | None = None) -> Critic:
        num_values = self.num_agents if self.centralized else 1
        head = ValueHead(hidden_size(backbone), num_values, self.args.value_head_hidden_dim)
        head.to(next(backbone.parameters()).device)
        return Critic(name, backbone, head, tokenizer, agent)

    # ----------------------------------------------------------------------------------------
    # the estimate
    # ----------------------------------------------------------------------------------------
    def estimate(self, tree: RolloutTree) -> CriticEstimate:
        args = self.args
        inputs: list[list[EncodedInputs]] = [[] for _ in self.critics]
        old_values: list[list[torch.Tensor]] = [[] for _ in self.critics]
        node_values = []
        for turn in tree.turns:
            texts = self.layout.texts(turn, tree.joint_indices)
            for c, critic in enumerate(self.critics):
                encoded = critic.encode(texts[c], functools.partial(self._describe_input, turn, len(texts[c])))
                inputs[c].append(encoded)
                old_values[c].append(frozen_values(critic, self.agents, encoded, args.micro_batch_size).cpu())
            node_values.append(self.layout.node_values([v[-1] for v in old_values], turn))
        rewards = [turn.rewards for turn in tree.turns]
        children = [turn.children for turn in tree.turns]
        lambda_returns = tree_lambda_returns(rewards, children, node_values, args.gamma, args.gae_lambda)
        credits = [per_agent_returns(g, tree.joint_indices, tree.num_generations) for g in lambda_returns]
        advantages = [
            [(credit[i] - values[:, i : i + 1]).reshape(-1) for credit, values in zip(credits, node_values)]
            for i in range(self.num_agents)
        ]
        if args.advantage_normalization:
            advantages = [
                list(whiten(torch.cat(a), reduce=self.parallel.sum_values).split([x.numel() for x in a]))
                for a in advantages
            ]
        targets_per_turn = [self.layout.targets(g, credit) for g, credit in zip(lambda_returns, credits)]
        return CriticEstimate(
            returns=tree_returns(rewards, children, args.gamma),
            credits=credits,
            advantages=advantages,
            inputs=inputs,
            old_values=old_values,
            targets=[[turn_targets[c] for turn_targets in targets_per_turn] for c in range(len(self.critics))],
        )

    def _describe_input(self, turn: Turn, count: int, k: int) -> str:
        """Which turn, dataset row (and agent) critic input ``k`` of a turn comes from."""
        per_node = count // turn.num_nodes
        return f"turn {turn.number}, dataset row {turn.rows[k // per_node]}"

    # ----------------------------------------------------------------------------------------
    # saving and loading
    # ----------------------------------------------------------------------------------------
    def write_agent(self, agent: int, folder: str, merge_adapters: bool = False) -> None:
        """Agent ``agent``'s weights (or adapter) and tokenizer, and its value head when the
        critic sits on the agent's model (``value_head.safetensors``)."""
        super().write_agent(agent, folder, merge_adapters)
        for critic in self.critics:
            if critic.agent == agent:
                critic.head.save(folder)

    def write_critic(self, index: int, folder: str) -> None:
        """A separate critic's model, tokenizer and value head into ``folder``."""
        critic = self.critics[index]
        critic.backbone.save_pretrained(folder)
        critic.tokenizer.save_pretrained(folder)
        critic.head.save(folder)

    def model_writers(self, merge_adapters: bool = False) -> list[tuple[str, Callable[[str], None]]]:
        separate = [
            (f"critic_{c}", functools.partial(self.write_critic, c))
            for c, critic in enumerate(self.critics)
            if critic.agent is None
        ]
        return super().model_writers(merge_adapters) + separate

    def load_models(self, path: str) -> None:
        super().load_models(path)
        separate = [critic for critic in self.critics if critic.agent is None]
        load_weights(path, [critic.backbone for critic in separate], [None] * len(separate), prefix="critic")
        for c, critic in enumerate(self.critics):
            folder = f"agent_{critic.agent}" if critic.agent is not None else f"critic_{c}"
            critic.head.load(os.path.join(path, folder))


class IACTrainer(ActorCriticTrainer):
    """Independent actor-critic: each agent has its own critic, a value head on the agent's
    model (the default) or a separate critic model (``critic_model`` / ``critics``), that
    reads only that agent's prompt (and, with ``critic_type="q"``, its completion)."""

    config_class = IACConfig
    algorithm_name = "IAC"


class MAACTrainer(ActorCriticTrainer):
    """Multi-agent actor-critic with one centralized critic (``critic_model`` / ``critics``)
    that reads every agent's prompt (and, with ``critic_type="q"``, the joint action) and
    gives one value per agent."""

    config_class = MAACConfig
    algorithm_name = "MAAC"
    centralized = True


__all__ = ["ActorCriticTrainer", "CriticEstimate", "IACTrainer", "MAACTrainer", "joint_critic_text"]
