"""The actor-critic objective (IAC, MAAC; MARLHF's iac / maac): the policy-gradient step with
critics. Rollouts, rewards, the policy loss, logging and checkpoints are the engine's and the
policy-gradient objective's; this module adds the critics.

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

import torch

from comlrl.algorithms import per_agent_returns
from comlrl.algorithms.critic import whiten
from comlrl.algorithms.returns import tree_lambda_returns, tree_returns
from comlrl.checkpoint import load_weights
from comlrl.compat.actor_critic import CriticModelConfig, split_critic_model_config
from comlrl.compat.value_heads import GivenHeads
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.run import Run
from comlrl.engine.saving import Writer
from comlrl.metrics.hooks import ActorCriticCallback, MetricsCallback, StepValues
from comlrl.models.loading import split_model_config
from comlrl.models.value import Critic, EncodedInputs
from comlrl.rollout.prompts import PromptTable
from comlrl.rollout.tree import RolloutTree, Turn
from comlrl.trainers.actor_critic.config import ActorCriticConfig
from comlrl.trainers.actor_critic.critic_setup import build_critics, critic_learning_rates
from comlrl.trainers.actor_critic.critics import (
    CentralizedCritic,
    CriticEstimate,
    CriticLayout,
    CriticLoss,
    IndependentCritics,
    frozen_values,
    joint_critic_text,
)
from comlrl.trainers.reinforce.objective import PolicyGradient


class ActorCritic(PolicyGradient):
    """Values and GAE: the advantages come from critics, trained beside the agents.

    Args:
        config: the actor-critic config (``gamma``, ``gae_lambda``, ``ppo_epochs``, the critics').
        centralized: one critic for all agents (MAAC) instead of one per agent (IAC).
        critic_config: ``model_config``'s critic keys.
        given_heads: the value heads of comlrl 1.4.3 wrappers among the agents and critics.
    """

    config: ActorCriticConfig
    actor_critic_reward_calls = True
    critics: list[Critic]
    """The critics, in the order of their learners (after the agents')."""

    def __init__(
        self,
        config: ActorCriticConfig,
        centralized: bool,
        critic_config: CriticModelConfig,
        given_heads: GivenHeads,
        trainer_name: str,
    ):
        super().__init__(config)
        self.trainer_name = trainer_name
        """How errors about the critics name the trainer."""
        self.centralized = centralized
        self.critic_config = critic_config
        self.given_heads = given_heads
        self.records_steps = False
        self.step_tree: RolloutTree | None = None
        self.step_values: StepValues | None = None
        """The last training step's tree and values, recorded for a ``metrics_callback`` only."""

    @property
    def discount(self) -> float:
        """``gamma``: the discount of the returns logged and evaluated."""
        return self.config.gamma

    @property
    def passes(self) -> int:
        return self.config.ppo_epochs

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        """The critics from the inputs, their learners, and their loss in the update."""
        super().attach(run, inputs)
        config = self.config
        self.agents, self.parallel = run.agents, run.parallel
        special_tokens = split_model_config(inputs.model_config).special_tokens
        self.critics = build_critics(
            run,
            self.trainer_name,
            inputs.critic_model,
            inputs.critics,
            inputs.critic_tokenizer,
            self.critic_config,
            special_tokens,
            centralized=self.centralized,
            config=config,
        )
        self.given_heads.adopt(self.critics, self.trainer_name)
        layout = CentralizedCritic if self.centralized else IndependentCritics
        self.layout: CriticLayout = layout(run.num_agents, config.critic_type)
        run.learners.wait(
            [critic.name for critic in self.critics],
            [critic.parameters() for critic in self.critics],
            critic_learning_rates(run.num_agents, self.critics, config),
        )
        self.update.auxiliary.append(
            CriticLoss(
                self.critics,
                run.agents,
                run.parallel,
                config.value_clip_range,
                config.value_loss_coef,
                config.micro_batch_size,
            )
        )
        self.check_first_turn_inputs(run.train_prompts)

    def metrics_callback(self, callback: MetricsCallback) -> MetricsCallback:
        """A callback sees actor-critic samples (with values and log-probs), recorded by each step."""
        if callback.callback is None:
            return callback
        self.records_steps = True
        return ActorCriticCallback(callback.callback, self)

    def check_first_turn_inputs(self, table: PromptTable) -> None:
        """Encode every training row's first-turn prompts (of ``table``) with each separate
        critic's tokenizer, so a critic that cannot read them fails here, before any training."""
        rows = list(range(len(table)))
        prompts = [table.agent_prompts(i, rows) for i in range(self.run.num_agents)]
        for c, critic in enumerate(self.critics):
            if critic.agent is None:
                texts = [joint_critic_text(joint) for joint in zip(*prompts)] if self.centralized else prompts[c]
                critic.encode(texts, lambda k: f"dataset row {k} (turn 1)")

    def estimate(self, tree: RolloutTree) -> CriticEstimate:
        config, agents = self.config, self.agents
        inputs: list[list[EncodedInputs]] = [[] for _ in self.critics]
        old_values: list[list[torch.Tensor]] = [[] for _ in self.critics]
        node_values = []
        for turn in tree.turns:
            texts = self.layout.texts(turn, tree.joint_indices)
            for c, critic in enumerate(self.critics):
                encoded = critic.encode(texts[c], functools.partial(describe_input, turn, len(texts[c])))
                inputs[c].append(encoded)
                old_values[c].append(frozen_values(critic, agents, encoded, config.micro_batch_size).cpu())
            node_values.append(self.layout.node_values([v[-1] for v in old_values], turn))
        rewards = [turn.rewards for turn in tree.turns]
        children = [turn.children for turn in tree.turns]
        lambda_returns = tree_lambda_returns(rewards, children, node_values, config.gamma, config.gae_lambda)
        credits = [per_agent_returns(g, tree.joint_indices, tree.num_generations) for g in lambda_returns]
        advantages = [
            [(credit[i] - values[:, i : i + 1]).reshape(-1) for credit, values in zip(credits, node_values)]
            for i in range(len(agents))
        ]
        if config.advantage_normalization:
            reduce = self.parallel.sum_values
            advantages = [list(whiten(torch.cat(a), reduce=reduce).split([x.numel() for x in a])) for a in advantages]
        if self.records_steps:  # before the update changes the agents
            self.step_tree = tree
            self.step_values = StepValues(node_values, self.sampled_logprobs(tree), advantages)
        targets_per_turn = [self.layout.targets(g, credit) for g, credit in zip(lambda_returns, credits)]
        return CriticEstimate(
            returns=tree_returns(rewards, children, config.gamma),
            credits=credits,
            advantages=advantages,
            inputs=inputs,
            old_values=old_values,
            targets=[[turn_targets[c] for turn_targets in targets_per_turn] for c in range(len(self.critics))],
        )

    def sampled_logprobs(self, tree: RolloutTree) -> list[list[torch.Tensor]]:
        """``[agent][turn]`` ``(M * G,)`` each completion's summed log-prob under its agent as it is
        now (before the update: as it sampled); an extra forward pass, made for the callback only."""
        per_token = self.update.frozen_logprobs(tree, reference=False)
        return [
            [(logprobs * turn.agents[i].own_mask.to(logprobs)).sum(dim=1) for logprobs, turn in zip(agent, tree.turns)]
            for i, agent in enumerate(per_token)
        ]

    # ----------------------------------------------------------------------------------------
    # saving and loading
    # ----------------------------------------------------------------------------------------
    def write_with_agent(self, agent: int, folder: str) -> None:
        """The value head of a critic that sits on agent ``agent``'s model (``value_head.safetensors``)."""
        for critic in self.critics:
            if critic.agent == agent:
                critic.head.save(folder)

    def writers(self) -> list[Writer]:
        """Each separate critic's model, tokenizer and value head, in ``critic_{c}/``."""
        return [
            (f"critic_{c}", functools.partial(write_critic, critic))
            for c, critic in enumerate(self.critics)
            if critic.agent is None
        ]

    def load(self, path: str) -> None:
        separate = [critic for critic in self.critics if critic.agent is None]
        load_weights(path, [critic.backbone for critic in separate], [None] * len(separate), prefix="critic")
        for c, critic in enumerate(self.critics):
            folder = f"agent_{critic.agent}" if critic.agent is not None else f"critic_{c}"
            critic.head.load(os.path.join(path, folder), critic.width_setting)


def describe_input(turn: Turn, count: int, k: int) -> str:
    """Which turn, dataset row (and agent) critic input ``k`` of a turn comes from."""
    per_node = count // turn.num_nodes
    return f"turn {turn.number}, dataset row {turn.rows[k // per_node]}"


def write_critic(critic: Critic, folder: str) -> None:
    """A separate critic's model, tokenizer and value head into ``folder``."""
    critic.backbone.save_pretrained(folder)
    critic.tokenizer.save_pretrained(folder)
    critic.head.save(folder)


def actor_critic_parts(
    config: ActorCriticConfig, inputs: TrainerInputs, centralized: bool, trainer_name: str
) -> tuple[ActorCritic, TrainerInputs]:
    """The objective of an actor-critic run (of the trainer class ``trainer_name``), and the
    inputs as the engine reads them:
    ``model_config`` without its critic keys, and plain models for comlrl 1.4.3's
    ``CausalLMWithValueHead`` wrappers, whose critic keys and value heads the objective keeps."""
    model_config, critic_config = split_critic_model_config(inputs.model_config)
    inputs, given_heads = GivenHeads.take(inputs.replace(model_config=model_config))
    return ActorCritic(config, centralized, critic_config, given_heads, trainer_name), inputs
