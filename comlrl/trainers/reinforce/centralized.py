"""Centralized MAGRPO: MAGRPO for ONE model that writes every role's output in one tagged
response; the collaboration (prompts joined, responses split into roles) is
:mod:`comlrl.trainers.centralized`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.metrics.hooks import RolloutSample
from comlrl.rollout.prompts import Formatter
from comlrl.trainers.base import StepResult
from comlrl.trainers.centralized import (
    CentralizedCollaboration,
    CentralizedComparatorAdapter,
    CentralizedSetup,
)
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.trainer import MAGRPOTrainer

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """MAGRPO's config for one model that writes every role; single-turn only."""

    num_agents: int | None = None
    """How many roles the one model writes (comlrl 1.4.3's meaning here); ``None``: the
    trainer's ``num_agents``, else 2."""
    collaboration_mode: str = "centralized"
    """comlrl 1.4.3's switch; only ``centralized`` (one model writes every role) exists here."""

    def __post_init__(self):
        super().__post_init__()
        if self.collaboration_mode != "centralized":
            raise ValueError(
                f"collaboration_mode={self.collaboration_mode!r}; CentralizedMAGRPOConfig allows only "
                "'centralized'. For one model per role, use MAGRPOConfig and MAGRPOTrainer"
            )
        if self.num_turns != 1:
            raise ValueError(
                f"num_turns={self.num_turns}: centralized MAGRPO does not support multi-turn episodes; set num_turns=1"
            )


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """MAGRPO for ONE model that writes the output of every role in one response.

    Arguments are :class:`~comlrl.trainers.base.MultiAgentTrainer`'s, in its order, with these
    meanings here:

    Args:
        agent_model / agents: the one model: ``agent_model``, or ``agents=[model]``.
        num_agents: how many roles it writes (default: the config's ``num_agents``, else 2).
        reward_func: written as for MAGRPO with one model per role: one list of texts per
            role, any of MAGRPO's calling conventions; one value per joint action.
        formatters: each role's prompt (one callable for every role, or one per role); the
            adapter joins them into the model's prompt.
        external_transition: not supported (single-turn only).
        eval_logger: gets ``agent_completions_turns`` as ``[role][row][turn]`` texts.
        metrics_callback: gets one sample per role (``agent_idx`` the role).
        centralized_adapter: builds the joint prompt and splits responses into roles
            (default :class:`TaggedCentralizedComparatorAdapter`).
        train_reward_func: scores the training rollouts' joint responses in place of
            ``reward_func`` (as :class:`~comlrl.trainers.base.MultiAgentTrainer`'s; MARLHF's
            reward model reads the joint prompt and the joint response, unsplit).

    A joint response the adapter cannot split is scored as empty roles; the share of such
    responses is logged as ``centralized/parse_failure_frac`` (and under ``eval/``).
    ``save_model(dir)`` writes the one model to ``dir/agent_0``.
    """

    config_class = CentralizedMAGRPOConfig
    algorithm_name = "CentralizedMAGRPO"

    args: CentralizedMAGRPOConfig
    collaboration: CentralizedCollaboration
    """Joins the roles' prompts into the one model's and splits its responses into roles."""
    num_roles: int
    """How many roles the one model writes (``num_agents`` counts the models: 1)."""

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[Any] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable | Sequence[Callable] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Formatter | Sequence[Formatter] | None = None,
        external_transition: Callable | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., dict[str, float]] | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        *,
        centralized_adapter: CentralizedComparatorAdapter | None = None,
        peft_config: Any = None,
        metrics_callback: Callable[[list[RolloutSample]], dict[str, float]] | None = None,
        train_reward_func: Callable | None = None,
    ):
        args = self.accept_config(args)
        if external_transition is not None:
            raise ValueError(
                "CentralizedMAGRPOTrainer does not support multi-turn episodes, so it takes no "
                "external_transition: drop it"
            )
        setup = CentralizedSetup.build(
            args,
            num_agents=num_agents,
            agents=agents,
            formatters=formatters,
            reward_func=reward_func,
            metrics_callback=metrics_callback,
            adapter=centralized_adapter,
            trainer="CentralizedMAGRPOTrainer",
            one_model_per_role="use MAGRPOTrainer",
        )
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_processor=reward_processor,
            wandb_config=wandb_config,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            peft_config=peft_config,
            train_reward_func=train_reward_func,
            **setup.base_arguments,
        )
        setup.attach(self)

    def step(self, row_ids: list[int]) -> StepResult:
        """MAGRPO's step, plus the share of its joint responses the adapter could not split."""
        result = super().step(row_ids)
        stats = self.collaboration.parse_failure_stats(result.tree.turns[0], self.train_prompts)
        result.metrics.update(self.parallel.reduce_metrics(stats))
        return result
