"""Centralized MAGRPO: MAGRPO for ONE model that writes every role's output in one tagged
response; the collaboration (prompts joined, responses split into roles) is
:mod:`comlrl.engine.centralized`'s."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.engine.centralized import CentralizedCollaboration
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

    @property
    def centralized(self) -> bool:
        return True

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

    Its inputs (:class:`~comlrl.engine.inputs.TrainerInputs`) mean here:

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
        centralized_comparator_adapter: builds the joint prompt and splits responses into
            roles (default :class:`TaggedCentralizedComparatorAdapter`); also by the name
            ``centralized_adapter``.
        train_reward_func: scores the training rollouts' joint responses in place of
            ``reward_func`` (MARLHF's reward model reads the joint prompt and the joint
            response, unsplit).

    A joint response the adapter cannot split is scored as empty roles; the share of such
    responses is logged as ``centralized/parse_failure_frac`` (and under ``eval/``).
    ``save_model(dir)`` writes the one model to ``dir/agent_0``.
    """

    config_class = CentralizedMAGRPOConfig
    algorithm_name = "CentralizedMAGRPO"
    optional_inputs = frozenset({"train_reward_func", "centralized_comparator_adapter"})
    centralized_label = "CentralizedMAGRPOTrainer"
    one_model_per_role = "use MAGRPOTrainer"

    args: CentralizedMAGRPOConfig
    collaboration: CentralizedCollaboration
    """Joins the roles' prompts into the one model's and splits its responses into roles."""
    num_roles: int
    """How many roles the one model writes (``num_agents`` counts the models: 1)."""
