"""MARLHF: multi-agent RLHF. A joint reward model learns from pairs of the agents' own joint
actions ranked by the task reward (:mod:`comlrl.trainers.rlhf.reward_model`: phases 1-3, when
``train()`` starts); then the agents are trained with the objective of ``rl_algorithm``
(MAGRPO, MAREINFORCE, MAReMax, MARLOO, IAC, MAAC) on the reward model's scores: the
engine's loop, the RL objective's steps, the reward model as the reward source. ``evaluate()``
scores with the task reward.
"""

from __future__ import annotations

import os
from typing import Any

from comlrl.compat.entry import OriginalCalls
from comlrl.compat.trainer_attributes import MARLHFAttributes, PreferenceAttributes
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.inputs import CRITIC_INPUTS, TrainerInputs
from comlrl.engine.parts import Objective, Parts, Schedule
from comlrl.models.folders import check_model_source
from comlrl.models.loading import split_model_config
from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.actor_critic.objective import actor_critic_parts
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.trainers.reinforce.trainer import GroupAdvantages
from comlrl.trainers.rlhf.config import MAGRPO_BASELINES, MARLHFConfig
from comlrl.trainers.rlhf.reward_model import FittedRewardModel

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]


class MARLHFTrainer(PreferenceAttributes, MARLHFAttributes, OriginalCalls, MultiAgentTrainer):
    """Multi-Agent RLHF: a joint reward model fitted to preference pairs of the agents' own
    joint actions, then online RL on its scores (module docstring: the four phases).

    Arguments: :class:`~comlrl.engine.inputs.TrainerInputs`, with
    ``centralized_comparator_adapter`` and, for ``rl_algorithm`` iac / maac, ``critic_model``,
    ``critics``, ``critic_tokenizer``; ``args`` is a :class:`MARLHFConfig`. The trainer is
    the RL phase's (its objective: that algorithm's, with the config
    :meth:`MARLHFConfig.rl_config`), on the reward source :class:`FittedRewardModel`.

    Rewards: ``reward_func`` (with ``reward_processor`` and ``reward_weights``) ranks the
    candidates of the pairs and scores every evaluation; the RL phase trains on the reward
    model's raw scores: ``reward_processor`` and ``reward_weights`` are not applied to them (a
    processor written for the task reward's scale means nothing on a learned score; comlrl
    1.4.3 skipped it too, silently). Training's ``reward/mean`` is therefore in reward-model
    units, ``eval/reward_mean`` in the task's.

    Saved: ``output_dir/reward_model/`` once fitted (:meth:`JointRewardModel.load` reads it);
    checkpoints and ``save_model(dir)`` hold ``reward_model/`` beside ``agent_{i}/``, so a
    resumed run reads its reward model back and never fits it again. A run stopped while the
    reward model is being fitted has no checkpoint yet and starts over.

    Differences from 1.4.3's MARLHF: the reward model runs no LM head and lives with agent 0 by
    default (1.4.3: ``"cuda:0"``, which fails without a GPU); its fit is logged
    (``reward_model/loss``, ``accuracy``, and ``eval_*`` on held-out prompts); the RL phase is
    comlrl's own trainer with its fixes (see those trainers); the pairs are MADPO's.

    Under torchrun every rank holds the same pairs (as MADPO's: each rank samples its share of
    the rows), and the ranks fit one reward model together: each computes the Bradley-Terry
    loss of its share of every batch of ``reward_train_batch_size`` pairs and the gradients
    are summed, so every rank holds the model one process would fit on those pairs (and logs
    its metrics); rank 0 writes it. The RL phase runs as its trainer does under torchrun.
    MARLHFIter runs under torchrun too, its rounds' pairs made as MADPOIter's.

    Centralized collaboration (``collaboration_mode="centralized"``, comlrl 1.4.3's): one
    model writes every role through ``centralized_comparator_adapter`` (as
    :class:`~comlrl.trainers.reinforce.CentralizedMAGRPOTrainer`); its pairs are its joint
    responses ranked by the task reward over the roles, the reward model reads the joint
    prompt and the joint response as one block, and the RL phase is centralized MAGRPO (with
    the baseline of a MAGRPO-family ``rl_algorithm``; ``iac`` / ``maac`` are refused).
    """

    config_class = MARLHFConfig
    optional_inputs = CRITIC_INPUTS | {"centralized_comparator_adapter"}
    reward_source_class: type[FittedRewardModel] = FittedRewardModel
    """Phases 1-3 (MARLHFIter: in rounds)."""
    args: MARLHFConfig
    reward_source: FittedRewardModel

    def keeps_value_heads(self, args: Any) -> bool:
        """An actor-critic ``rl_algorithm`` takes the value heads of 1.4.3's wrapped agents."""
        config = self.config_class if args is None else args  # the class holds the field's default
        return getattr(config, "rl_algorithm", None) in ("iac", "maac")

    def parts(self, args: MARLHFConfig, inputs: TrainerInputs) -> Parts:
        self.algorithm_name = f"{args.trainer_name}-{args.rl_algorithm.upper()}"
        source = model_name(args.reward_model_name, inputs.agent_model, inputs.agents, "reward_model_name")
        reward = self.reward_source_class(
            args, check_model_source(source, "reward_model_name"), split_model_config(inputs.model_config).model_kwargs
        )
        objective, inputs = rl_objective(args, inputs, type(self).__name__)
        return Parts(objective, reward, self.schedule_of(args, reward), inputs)

    def schedule_of(self, args: MARLHFConfig, reward: FittedRewardModel) -> Schedule:
        """One run of the RL phase for config ``args`` (MARLHFIter: rounds, each fitting ``reward`` anew)."""
        return Schedule()

    @property
    def reward_model(self) -> JointRewardModel | None:
        """The fitted (or read back) reward model; None before ``train()``."""
        return self.reward_source.reward_model

    @property
    def pairs(self) -> list[PreferencePair] | None:
        """The preference pairs the reward model was fitted to in this process."""
        return self.reward_source.pairs


def rl_objective(args: MARLHFConfig, inputs: TrainerInputs, trainer_name: str) -> tuple[Objective, TrainerInputs]:
    """The RL phase's objective (with ``rl_config()``) and the inputs as it reads them: the
    critics' for iac / maac (named by the inputs, ``critic_model_name``, or the agents' model),
    refused for the MAGRPO family, which has none. ``trainer_name`` (the trainer class's)
    names it in the critics' warnings."""
    if args.rl_algorithm in MAGRPO_BASELINES:
        for name in ("critic_model", "critics", "critic_tokenizer"):
            if getattr(inputs, name) is not None:
                raise ValueError(
                    f"{name} is given, but rl_algorithm={args.rl_algorithm!r} has no critic: "
                    "drop it, or choose rl_algorithm='iac' or 'maac'"
                )
        return GroupAdvantages(args.rl_config()), inputs
    critic = critic_source(args, inputs.critic_model, inputs.critics, inputs.agent_model, inputs.agents)
    config, centralized = args.rl_config(), args.rl_algorithm == "maac"
    return actor_critic_parts(config, inputs.replace(critic_model=critic), centralized, trainer_name)


def model_name(name: str | None, agent_model: Any, agents: Any, field: str, other_choice: str = "") -> str:
    """``name`` if set, else the agents' model: ``agent_model``, or the one folder or hub id
    every entry of ``agents`` names. ``field`` is the setting named in the error, and
    ``other_choice`` (", or ...") any other way out it offers."""
    if name is not None:
        return name
    if isinstance(agent_model, str | os.PathLike):
        return os.fspath(agent_model)
    named = agents is not None and all(isinstance(a, str | os.PathLike) for a in agents)
    names = sorted({os.fspath(a) for a in agents}) if named else []
    if len(names) == 1:
        return names[0]
    given = f"as different models {names}" if named else "as model objects"
    raise ValueError(
        f"{field} is None and the agents were given {given}, so there is no one model name to load it from: "
        f"set MARLHFConfig({field}=<folder or hub id>){other_choice}"
    )


def critic_source(args: MARLHFConfig, critic_model: Any, critics: Any, agent_model: Any, agents: Any) -> Any:
    """The separate critics' model: ``critic_model`` or ``critics`` as given, else
    ``critic_model_name``, else, where a separate critic is needed (maac; iac unless
    ``use_separate_critic=False``, as comlrl 1.4.3's), the agents' model; None: value heads
    on the agents (iac with ``use_separate_critic=False``)."""
    if critic_model is not None or critics is not None:
        if args.critic_model_name is not None:
            raise ValueError(
                f"critic_model_name={args.critic_model_name!r} and the trainer's critic_model / critics both name "
                "the critics: keep one"
            )
        return critic_model
    if args.critic_model_name is not None:  # else its faults would be named critic_model, the RL trainer's
        check_model_source(args.critic_model_name, "critic_model_name")
    if args.critic_model_name is not None or args.rl_algorithm == "maac" or args.use_separate_critic:
        heads = ", or use_separate_critic=False for value heads on the agents" if args.rl_algorithm == "iac" else ""
        return model_name(args.critic_model_name, agent_model, agents, "critic_model_name", heads)
    return None
