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
from typing import ClassVar

from comlrl.compat.spellings import SCORING_REWARD_SPELLINGS
from comlrl.compat.trainer_attributes import IterativeAttributes
from comlrl.engine.config_checks import check_choice
from comlrl.engine.parts import MadeOnce, Schedule
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig
from comlrl.trainers.dpo.rounds import PreferenceRounds, Stream, round_generator
from comlrl.trainers.dpo.schedule import Rounds
from comlrl.trainers.rlhf.config import MARLHFConfig
from comlrl.trainers.rlhf.marlhf import MARLHFTrainer
from comlrl.trainers.rlhf.reward_model import FittedRewardModel
from comlrl.utils.config_fields import respell

__all__ = ["MARLHFIterConfig", "MARLHFIterTrainer"]


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
        respell(self, "preference_scoring_reward", SCORING_REWARD_SPELLINGS, strip=True)
        super().__post_init__()
        check_choice(self, "preference_scoring_reward", ("task", "reward_model"))


class RoundsRewardModel(FittedRewardModel):
    """MARLHFIter's reward source: phases 1-3 once per round (the rounds' consumer), the
    round's pairs and a fresh reward model fitted to them."""

    args: MARLHFIterConfig
    made_once = MadeOnce(
        "preference pairs and reward model",
        "more rounds in one run (a larger num_iterations; each round fits a reward model to fresh pairs)",
    )

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """Resuming: the reward model read back from ``checkpoint``; a new run's first round
        (the schedule's ``prepare``, before this) has fitted one."""
        return super().prepare(checkpoint) if checkpoint is not None else {}

    def start_round(self, rounds: PreferenceRounds, round_index: int) -> dict[str, float]:
        """Round ``round_index`` of ``rounds``: its pairs, and a fresh reward model fitted to
        its training pairs. A round without any keeps the previous round's reward model
        (comlrl 1.4.3 skipped the round's RL instead); round 1 without any is an error."""
        args = self.args
        if round_index == 0:  # a new run
            self.function.use(None)
            self.pairs = None
        by_reward_model = args.preference_scoring_reward == "reward_model" and round_index > 0
        pairs, metrics = rounds.start(round_index, reward=self.run.train_reward if by_reward_model else None)
        if pairs:
            self.function.use(None)  # the previous round's: fitting the next beside it would hold two
            held_out, order = (
                round_generator(args.seed, round_index, stream)
                for stream in (Stream.REWARD_MODEL_HELD_OUT, Stream.REWARD_MODEL_ORDER)
            )
            return {**metrics, **self.fit_pairs(pairs, held_out, order)}
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


class MARLHFIterTrainer(IterativeAttributes, MARLHFTrainer):
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
    reward_source_class = RoundsRewardModel
    args: MARLHFIterConfig
    schedule: Rounds

    def schedule_of(self, args: MARLHFIterConfig, reward: FittedRewardModel) -> Schedule:
        return Rounds(reward, args, schedule_per_round=False)

    @property
    def rounds(self) -> PreferenceRounds:
        """Every round's pairs, the round in progress, the comparator."""
        return self.schedule.rounds
