"""MARLHFIter: MARLHF in rounds (comlrl 1.4.3's ``MARLHFIterTrainer``). Each round makes new
pairs of the current policy against a comparator policy, fits a fresh joint reward model to
the round's training pairs, then trains the agents on its scores:

    for each of num_iterations rounds (epochs r*E .. r*E+E-1 of one training loop, E = num_train_epochs):
        when its first epoch starts:
            the round's pairs, as MADPOIter's (comparator, pair_selection, replay: rounds.py), the
            candidates ranked by the task reward (or, preference_scoring_reward="reward_model",
            from round 2 on, by the previous round's reward model)
            ─a fresh JointRewardModel, Bradley-Terry fit (as MARLHF's)─▶ frozen, scores the RL rollouts
        E epochs of the RL trainer of rl_algorithm (MAGRPO family, IAC, MAAC): one optimizer,
        one learning-rate schedule and one global step across every round; evaluate() by the task reward
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from comlrl.trainers.config_checks import check_choice
from comlrl.trainers.dpo.iterative import MADPOIterConfig, respell
from comlrl.trainers.dpo.rounds import InRounds, PreferenceRounds, Stream, round_generator
from comlrl.trainers.rlhf.marlhf import (
    RL_ALGORITHMS,
    CentralizedMAGRPOOnRewardModel,
    IACOnRewardModel,
    MAACOnRewardModel,
    MAGRPOOnRewardModel,
    MARLHFConfig,
    MARLHFTrainer,
    RewardModelStage,
    RLAlgorithm,
)

__all__ = ["MARLHFIterConfig", "MARLHFIterTrainer"]

SCORING_REWARD_SPELLINGS = {
    "task": "task",
    "oracle": "task",
    "environment": "task",
    "env": "task",
    "reward_model": "reward_model",
    "model": "reward_model",
    "learned": "reward_model",
}
"""Every ``preference_scoring_reward`` comlrl 1.4.3 accepted (any letter case), and what it is here."""


@dataclass
class MARLHFIterConfig(MARLHFConfig, MADPOIterConfig):
    """Everything that shapes a MARLHFIter run: MARLHF's fields (pairs, reward model, RL phase)
    and MADPOIter's rounds, comparator and replay, with comlrl 1.4.3's MARLHFIter defaults.
    Every field is checked in ``__post_init__``."""

    num_train_epochs: int = 2
    """Passes of the RL phase over the training dataset in each round."""
    # MARLHFConfig's dataclass fields carry MADPOConfig's defaults of these: MADPOIter's are set again.
    preference_num_candidates: int = 20
    """Candidates N the current policy samples per prompt and agent each round (at least 2)."""
    preference_pairs_per_sample: int | None = 4
    """Most pairs kept per prompt and round, in ``pair_selection`` order (>= 1); ``None`` keeps all."""
    pair_selection: str = "comparator_reward"
    """Which of a prompt's comparisons become pairs first: ``comparator_reward`` (highest
    comparator reward first, then largest gap), ``reward_gap``, ``random``, ``all`` (as MADPOIter's)."""
    reward_num_train_epochs: int = 2
    """Passes over the round's training pairs when fitting its reward model."""
    preference_scoring_reward: str = "task"
    """What ranks the candidates of a round's pairs: ``task`` (``reward_func``, processed), or
    ``reward_model`` (from round 2 on, the previous round's reward model; round 1 uses the
    task reward). comlrl 1.4.3's spellings (``oracle``, ``learned``, ...) are accepted."""

    trainer_name: ClassVar[str] = "MARLHFIter"

    def __post_init__(self):
        respell(self, "preference_scoring_reward", SCORING_REWARD_SPELLINGS)
        super().__post_init__()
        check_choice(self, "preference_scoring_reward", ("task", "reward_model"))


class RoundsRewardModelStage(RewardModelStage):
    """MARLHFIter's phases 1-3, once per round: the round's pairs (``trainer.rounds``) and a
    fresh reward model fitted to them."""

    args: MARLHFIterConfig
    rounds_alternative = (
        "more rounds in one run (a larger num_iterations; each round fits a reward model to fresh pairs)"
    )

    def prepare(self, trainer: Any, checkpoint: str | None) -> dict[str, float]:
        """Resuming: the reward model and the rounds read back from ``checkpoint``; a new run
        starts round 1 (its metrics are returned)."""
        if checkpoint is not None:
            super().prepare(trainer, checkpoint)
            trainer.rounds.read(checkpoint)
            return {}
        trainer.rounds.reset()
        self.function.model, self.pairs = None, None
        return self.start_round(trainer, 0)

    def start_epoch(self, trainer: Any, epoch: int) -> dict[str, float]:
        """Start the round epoch ``epoch`` belongs to, if it is a new one; returns its metrics."""
        round_index = trainer.rounds.round_of(epoch)
        return {} if round_index == trainer.rounds.round else self.start_round(trainer, round_index)

    def start_round(self, trainer: Any, round_index: int) -> dict[str, float]:
        """Round ``round_index``'s pairs and a fresh reward model fitted to its training pairs.
        A round without any keeps the previous round's reward model (comlrl 1.4.3 skipped the
        round's RL instead); round 1 without any is an error."""
        args = self.args
        by_reward_model = args.preference_scoring_reward == "reward_model" and round_index > 0
        pairs, metrics = trainer.rounds.start(
            trainer, round_index, reward=trainer.train_reward if by_reward_model else None
        )
        if pairs:
            self.function.model = None  # the previous round's: fitting the next beside it would hold two
            held_out, order = (
                round_generator(args.seed, round_index, stream)
                for stream in (Stream.REWARD_MODEL_HELD_OUT, Stream.REWARD_MODEL_ORDER)
            )
            return {**metrics, **self.fit_pairs(trainer, pairs, held_out, order)}
        if round_index == 0:
            raise ValueError(
                "MARLHFIter round 1 found no preference pairs: every comparison of the current policy's candidates "
                "with the comparator's tied, so there is nothing to fit a reward model to. A constant reward_func or "
                "reward_processor does this; otherwise sample more varied candidates (more preference_num_candidates, "
                "a higher temperature) or another comparator_policy"
            )
        warnings.warn(
            f"MARLHFIter round {round_index + 1}: no preference pairs (every comparison tied, and the replay found "
            "none), so its RL epochs train on the previous round's reward model",
            stacklevel=2,
        )
        return metrics


class RewardModelRounds(InRounds):
    """Makes a MARLHF RL trainer (one of ``RL_ALGORITHMS``' classes) go through rounds: its
    loop is ``RoundLoop``, each round starts with the stage's new reward model, its one
    learning-rate schedule spans every round, and its checkpoints keep the rounds."""

    stage: RoundsRewardModelStage

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rounds = PreferenceRounds(self, self.stage.args, self.stage.comparator_adapter)
        """Every round's pairs, the round in progress, the comparator."""

    @property
    def total_optimizer_steps(self) -> int:
        return self.stage.args.num_iterations * super().total_optimizer_steps

    def start_epoch(self, epoch: int) -> dict[str, float]:
        return self.stage.start_epoch(self, epoch)

    def write_models(self, folder: str) -> None:
        """The RL trainer's (agents, critics, reward model) and the rounds (``preference_rounds.pt``)."""
        super().write_models(folder)
        self.rounds.write(folder)


class MAGRPOOnRewardModelRounds(RewardModelRounds, MAGRPOOnRewardModel):
    """MAGRPO, or one of its REINFORCE variants, in MARLHFIter's rounds."""


class CentralizedMAGRPOOnRewardModelRounds(RewardModelRounds, CentralizedMAGRPOOnRewardModel):
    """Centralized MAGRPO (or a REINFORCE variant) in MARLHFIter's rounds."""


class IACOnRewardModelRounds(RewardModelRounds, IACOnRewardModel):
    """IAC in MARLHFIter's rounds."""


class MAACOnRewardModelRounds(RewardModelRounds, MAACOnRewardModel):
    """MAAC in MARLHFIter's rounds."""


ROUNDS_TRAINERS = {
    MAGRPOOnRewardModel: MAGRPOOnRewardModelRounds,
    IACOnRewardModel: IACOnRewardModelRounds,
    MAACOnRewardModel: MAACOnRewardModelRounds,
}


class MARLHFIterTrainer(MARLHFTrainer):
    """Iterative MARLHF: ``num_iterations`` rounds, each making new pairs of the current policy
    against a comparator policy (as :class:`MADPOIterTrainer`), fitting a fresh joint reward
    model to the round's training pairs (as :class:`MARLHFTrainer`), then ``num_train_epochs``
    epochs of the RL trainer of ``rl_algorithm`` on its scores.

    Arguments: :class:`MARLHFTrainer`'s; ``args`` is a :class:`MARLHFIterConfig`.

    Logged per round (at the round's first step): MADPOIter's ``iter/*`` and MARLHF's
    ``reward_model/*`` (the fit and, with ``reward_eval_fraction``, its held-out prompts).
    Saved: ``output_dir/reward_model/`` (the latest round's), ``preference_replay/iteration_XXXX.json``;
    checkpoints hold the agents, the round's reward model and the rounds, so a run resumed in
    the middle of a round continues it with the same reward model, and one resumed at a
    round's end starts the next round exactly as the straight run does.

    Differences from comlrl 1.4.3's MARLHFIter: those of MARLHF and of MADPOIter; one optimizer
    and learning-rate schedule per agent across the rounds (the RL phase does not start over);
    a round whose comparisons all tie keeps the previous round's reward model and trains (1.4.3
    skipped its RL), with a warning.

    ``collaboration_mode="centralized"``: one model writes every role (as centralized MARLHF),
    its comparator too; the RL phase is centralized MAGRPO on each round's reward model.

    Under torchrun the ranks make each round's pairs as MADPOIter's do (each its share of the
    rows; every rank then holds them all), fit its reward model together as MARLHF's do, and
    run the RL phase as its trainer does; rank 0 alone writes the round files.
    """

    config_class = MARLHFIterConfig
    algorithm_name = "MARLHFIter"
    stage_class = RoundsRewardModelStage
    centralized_rl_trainer = CentralizedMAGRPOOnRewardModelRounds
    rl_algorithms: ClassVar[dict[str, RLAlgorithm]] = {
        name: RLAlgorithm(ROUNDS_TRAINERS[algorithm.trainer_class], algorithm.config_class)
        for name, algorithm in RL_ALGORITHMS.items()
    }
    args: MARLHFIterConfig
