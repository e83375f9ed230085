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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl.algorithms import per_agent_returns
from comlrl.algorithms.critic import whiten
from comlrl.algorithms.returns import tree_lambda_returns, tree_returns
from comlrl.checkpoint import load_weights
from comlrl.models.loading import (
    check_agents,
    enable_activation_checkpointing,
    load_agents,
    resolve_tokenizers,
    split_model_config,
)
from comlrl.models.modes import disable_dropout
from comlrl.models.placement import same_device
from comlrl.models.value import ORIGINAL_VALUE_HEAD_FILE, Critic, EncodedInputs, ValueHead, hidden_size, saved_head_file
from comlrl.models.vocabulary import TokenizedModel, fit_embeddings
from comlrl.optim import per_agent_learning_rates
from comlrl.rollout.tree import RolloutTree, Turn
from comlrl.trainers.actor_critic.config import ActorCriticConfig, IACConfig, MAACConfig
from comlrl.trainers.actor_critic.critics import (
    CentralizedCritic,
    CriticEstimate,
    CriticLayout,
    CriticLoss,
    CriticModelConfig,
    IndependentCritics,
    check_same_model,
    critic_device_list,
    frozen_values,
    joint_critic_text,
    lacks_tokenizer,
    split_critic_model_config,
)
from comlrl.trainers.base import MultiAgentTrainer
from comlrl.utils.caller import user_stacklevel


class ActorCriticTrainer(MultiAgentTrainer):
    """What IAC and MAAC share. Arguments: those of
    :class:`~comlrl.trainers.base.MultiAgentTrainer` (the positional ones in the order of
    comlrl 1.4.3's IAC and MAAC, the rest by keyword), plus

    Args:
        critic_model: a separate critic model: a folder or hub id (loaded once per critic
            with ``model_config``), or a causal LM instance when there is one critic.
        critics: separate critic models, a list with one per critic: causal LM instances,
            folders or hub ids. With ``critic_model`` too (comlrl 1.4.3's consistency check),
            every entry must name ``critic_model``'s model, and ``critics`` is used.
        critic_tokenizer: the separate critics' tokenizer (one, or one per critic); None loads
            each critic's from where it was loaded, or takes its agent's (MAAC: agent 0's) when
            that folder holds none (a critic saved by comlrl 1.4.3).

    A critic given as a folder that holds a value head (``value_head.safetensors``, or 1.4.3's
    ``value_head.pt``) starts from that head. ``model_config`` may also hold 1.4.3's
    ``critic_model_kwargs`` (the critics' ``from_pretrained`` arguments, over the agents') and,
    for MAAC, ``critic_value_head_hidden_dim``.
    """

    config_class: type[ActorCriticConfig] = ActorCriticConfig
    args: ActorCriticConfig
    centralized = False
    """One critic for all agents (MAAC) instead of one per agent (IAC)."""

    actor_critic_reward_calls = True

    def __init__(
        self,
        agent_model: str | None = None,
        critic_model: str | os.PathLike[str] | torch.nn.Module | None = None,
        tokenizer: Any = None,
        reward_func: Any = None,
        reward_processor: Any = None,
        formatters: Any = None,
        args: ActorCriticConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        model_config: dict[str, Any] | None = None,
        wandb_config: dict[str, Any] | None = None,
        metrics_callback: Any = None,
        external_transition: Any = None,
        agents: Sequence[torch.nn.Module | str] | None = None,
        critics: Sequence[str | torch.nn.Module] | None = None,
        *,
        critic_tokenizer: Any = None,
        **kwargs: Any,
    ):
        model_config, critic_config = split_critic_model_config(model_config)
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
            args=args,
            metrics_callback=metrics_callback,
            **kwargs,
        )
        args = self.args
        special_tokens = split_model_config(model_config).special_tokens
        self.critics = self._build_critics(critic_model, critics, critic_tokenizer, critic_config, special_tokens)
        layout = CentralizedCritic if self.centralized else IndependentCritics
        self.layout: CriticLayout = layout(self.num_agents, args.critic_type)
        self.add_learners(
            [critic.name for critic in self.critics],
            [critic.parameters() for critic in self.critics],
            self._critic_learning_rates(),
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
    def _critic_learning_rates(self) -> list[float]:
        """A value head on an agent trains at that agent's rate (and, as every learner, on the
        config's schedule), as comlrl 1.4.3 trained it inside the agent's optimizer; separate
        critics at ``critic_learning_rate``."""
        agent_rates = per_agent_learning_rates(self.args.agent_learning_rate, self.num_agents)
        return [
            agent_rates[critic.agent] if critic.agent is not None else self.args.separate_critic_learning_rate()
            for critic in self.critics
        ]

    @property
    def num_critics(self) -> int:
        return 1 if self.centralized else self.num_agents

    @property
    def _kind(self) -> str:
        return "MAAC's centralized critic" if self.centralized else "IAC (one critic per agent)"

    def _build_critics(
        self,
        critic_model: str | os.PathLike[str] | torch.nn.Module | None,
        critics: Sequence[str | torch.nn.Module] | None,
        tokenizer: Any,
        config: CriticModelConfig,
        special_tokens: dict[str, Any],
    ) -> list[Critic]:
        """Value heads on the agents (IAC), or separate critic models from ``critic_model`` /
        ``critics``, each with a value head that continues the one saved in its folder, if any.
        ``special_tokens`` (``model_config``'s) grew the agents' tokenizers."""
        separate = self._uses_separate_critics(critic_model is not None or critics is not None)
        width = self._head_width(separate, config.head_width)
        if not separate:
            # IAC without a separate critic: a value head on each agent's own model.
            built = [
                self._critic(f"critic {i}", agent, self.agents.tokenizers[i], width, agent=i)
                for i, agent in enumerate(self.agents)
            ]
            for critic, agent in zip(built, self.agents):  # an agent saved with its head keeps it
                if getattr(agent, "name_or_path", ""):
                    self._load_saved_head(critic, agent.name_or_path)
            self._check_critic_devices(built)
            return built
        sources = self._critic_sources(critic_model, critics)
        model_kwargs = {**self.model_kwargs, **config.model_kwargs}
        argument = "critics[{}]" if critics is not None else "critic_model"
        models = [
            load_agents(source, 1, model_kwargs, argument=argument.format(c))[0] if isinstance(source, str) else source
            for c, source in enumerate(sources)
        ]
        self._prepare_critic_models(models)
        tokenizers = self._critic_tokenizers(models, tokenizer)
        if special_tokens:
            self._fit_critic_embeddings(models, tokenizers, sources)
        built = [
            self._critic(f"critic {c}", model, tok, width) for c, (model, tok) in enumerate(zip(models, tokenizers))
        ]
        for critic, source in zip(built, sources):
            if isinstance(source, str):
                self._load_saved_head(critic, source)
        self._check_critic_devices(built)
        return built

    def _prepare_critic_models(self, models: list[torch.nn.Module]) -> None:
        """Check the separate critic models, and place and set them up as the agents are."""
        check_agents(models)
        agent_ids = {id(agent) for agent in self.agents}
        for c, model in enumerate(models):
            if id(model) in agent_ids:
                raise ValueError(
                    f"critics[{c}] is an agent's model; for value heads on the agents, pass no critic_model/critics"
                )
            if self.agents.placed:  # a separate critic follows its agent (MAAC's, agent 0)
                model.to(self.agents.device(c))
            if self.args.gradient_checkpointing:
                enable_activation_checkpointing(model)
            if self.args.disable_dropout:
                disable_dropout(model)

    def _uses_separate_critics(self, given: bool) -> bool:
        """Separate critic models when some are given, checked against ``use_separate_critic``
        (comlrl 1.4.3's switch, whose True required them and False refused them)."""
        flag = self.args.use_separate_critic
        if self.centralized and flag is False:
            raise ValueError(
                "use_separate_critic=False, but MAAC's centralized critic is always a separate model "
                "(critic_model=...): drop use_separate_critic"
            )
        if self.centralized and not given:
            raise ValueError(
                "MAAC needs a centralized critic model: critic_model=<folder or hub id or model> or critics=[model]"
            )
        if flag and not given:
            raise ValueError(
                "use_separate_critic=True needs the critics: critic_model=<folder or hub id> (a copy per agent) or "
                "critics=[one per agent]; for value heads on the agents' models, drop use_separate_critic"
            )
        if flag is False and given:
            raise ValueError(
                "use_separate_critic=False puts value heads on the agents' models, but critic_model/critics is "
                "given: drop one of the two"
            )
        if not given:
            self.args.check_heads_learning_rate("no critic_model/critics given")
        return given

    def _head_width(self, separate: bool, from_model_config: int | None) -> int | None:
        """The value heads' hidden width: the config's for the layout in use, or 1.4.3 MAAC's
        ``model_config["critic_value_head_hidden_dim"]`` (1.4.3's IAC ignored that key)."""
        width = self.args.value_head_width(separate)
        if from_model_config is None:
            return width
        if not self.centralized:
            raise ValueError(
                "model_config['critic_value_head_hidden_dim'] was comlrl 1.4.3 MAAC's setting (its IAC ignored it); "
                "write IACConfig(critic_value_head_hidden_dim=...) for separate critics, or drop it"
            )
        if width is not None and width != from_model_config:
            raise ValueError(
                f"model_config['critic_value_head_hidden_dim']={from_model_config} and "
                f"critic_value_head_hidden_dim={width} disagree: set only critic_value_head_hidden_dim"
            )
        return from_model_config

    def _critic_sources(
        self, critic_model: str | os.PathLike[str] | torch.nn.Module | None, critics: Sequence[Any] | None
    ) -> list[str | torch.nn.Module]:
        """One source (folder, hub id or model) per critic."""
        count = self.num_critics
        if critics is None:
            if isinstance(critic_model, str | os.PathLike):
                return [os.fspath(critic_model)] * count
            if count != 1:
                raise ValueError(
                    f"critic_model is one model instance but {self._kind} needs {count}: pass critics=[...] with one "
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
            raise ValueError(f"critics holds {len(critics)} models; {self._kind} needs {count}")
        if critic_model is not None:
            check_same_model(critic_model, critics)
        return critics

    def _critic_tokenizers(self, models: list[torch.nn.Module], tokenizer: Any) -> list[Any]:
        """``critic_tokenizer``, else each critic's own from where it was loaded; a critic from
        a folder without one (saved by comlrl 1.4.3) reads with its agent's (MAAC: agent 0's),
        the tokenizer every 1.4.3 critic read with."""
        if self.centralized and isinstance(tokenizer, list | tuple):
            raise ValueError(f"critic_tokenizer is a list of {len(tokenizer)}; MAAC's one critic takes one tokenizer")
        if tokenizer is None and any(lacks_tokenizer(model) for model in models):
            tokenizer = [
                self.agents.tokenizers[0 if self.centralized else c]
                if lacks_tokenizer(model)
                else resolve_tokenizers(None, [model], self.tokenizer_kwargs, role="critic")[0]
                for c, model in enumerate(models)
            ]
        return resolve_tokenizers(tokenizer, models, self.tokenizer_kwargs, role="critic")

    def _fit_critic_embeddings(
        self, models: list[torch.nn.Module], tokenizers: list[Any], sources: list[str | torch.nn.Module]
    ) -> None:
        """A separate critic that reads with an agent's tokenizer (``critic_tokenizer`` is the
        agents', or a comlrl 1.4.3 critic folder holds none) reads ``model_config``'s special
        tokens too: its model is resized as the agents' are when loaded by name, and refused
        when passed in. A critic with a tokenizer of its own is left as it is: the special tokens
        never reach its tokenizer, which reads them in a prompt as the text they spell."""
        agent_tokenizers = {id(tok) for tok in self.agents.tokenizers}
        fit_embeddings(
            [
                TokenizedModel("critic", c, model, tok, isinstance(source, str))
                for c, (model, tok, source) in enumerate(zip(models, tokenizers, sources))
                if id(tok) in agent_tokenizers
            ]
        )

    def _load_saved_head(self, critic: Critic, source: str) -> None:
        """A critic (or an agent holding its value head) loaded from a folder that holds a value
        head continues from it. comlrl 1.4.3 gave such a critic a fresh head, so loading its
        file is said."""
        folder = os.path.expanduser(source)
        path = saved_head_file(folder) if os.path.isdir(folder) else None
        if path is None:
            return
        critic.head.load(folder, self._width_setting(critic))
        if path.endswith(ORIGINAL_VALUE_HEAD_FILE):
            warnings.warn(
                f"{critic.name} starts from comlrl 1.4.3's value head {path} (1.4.3 gave a critic loaded from a "
                "folder a fresh head; pass the model instance for one)",
                stacklevel=user_stacklevel(),
            )

    def _check_critic_devices(self, critics: list[Critic]) -> None:
        """comlrl 1.4.3's ``critic_devices`` must say where the critics are anyway: each with
        its agent when ``agent_devices`` places them (MAAC's with agent 0), else where it was given."""
        spec = self.args.critic_devices
        if spec is None:
            return
        asked = critic_device_list(spec, len(critics), self.parallel.local_rank if self.parallel.enabled else None)
        for critic, device in zip(critics, asked):
            actual = next(critic.backbone.parameters()).device
            if not same_device(device, actual):
                raise ValueError(
                    f"critic_devices={spec!r} puts {critic.name} on {device}, but it is on {actual}: here a critic "
                    "lives with its agent (MAAC's with agent 0); drop critic_devices and place the agents with "
                    "agent_devices"
                )

    def _check_first_turn_inputs(self) -> None:
        """Encode every training row's first-turn prompts with each separate critic's
        tokenizer, so a critic that cannot read them fails here, before any training."""
        rows = list(range(len(self.train_prompts)))
        prompts = [self.train_prompts.agent_prompts(i, rows) for i in range(self.num_agents)]
        for c, critic in enumerate(self.critics):
            if critic.agent is None:
                texts = [joint_critic_text(joint) for joint in zip(*prompts)] if self.centralized else prompts[c]
                critic.encode(texts, lambda k: f"dataset row {k} (turn 1)")

    def _critic(
        self, name: str, backbone: torch.nn.Module, tokenizer: Any, width: int | None, agent: int | None = None
    ) -> Critic:
        num_values = self.num_agents if self.centralized else 1
        head = ValueHead(hidden_size(backbone), num_values, width)
        head.to(next(backbone.parameters()).device)
        return Critic(name, backbone, head, tokenizer, agent)

    @staticmethod
    def _width_setting(critic: Critic) -> str:
        """The config field that sizes ``critic``'s value head."""
        return "value_head_hidden_dim" if critic.agent is not None else "critic_value_head_hidden_dim"

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
            critic.head.load(os.path.join(path, folder), self._width_setting(critic))


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
