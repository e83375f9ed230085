"""MADPOIter: MADPO in rounds, each on fresh pairs of the current policy against a comparator
policy (comlrl 1.4.3's ``comlrl.trainers.dpo.iterative``).

    for each of num_iterations rounds (epochs r*E .. r*E+E-1 of the training loop, E = num_train_epochs):
        when its first epoch starts:
            rows ─current policy─▶ N candidates per prompt and agent ─▶ joint rewards
            rows ─comparator (own random stream)─▶ M candidates ─▶ joint rewards
            current j against comparator j, j < min(N, M): strictly better wins, ties dropped
            ─pair_selection order, preference_pairs_per_sample─▶ this round's pairs (shard r)
            ─preference_replay_mode over the shards of every round so far─▶ the round's training pairs
        E epochs of MADPO's DPO steps on them (global step, optimizers and logs carry on)

Its config is in :mod:`comlrl.trainers.dpo.iterative_config`, the rounds in
:mod:`comlrl.trainers.dpo.rounds` (as a schedule: :mod:`comlrl.trainers.dpo.schedule`), the
comparator policies in :mod:`comlrl.trainers.dpo.comparators`, the replay rules in
:mod:`comlrl.trainers.dpo.replay`, the pair order in :mod:`comlrl.trainers.dpo.pairs`.
"""

from __future__ import annotations

from comlrl.compat.trainer_attributes import IterativeAttributes
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import MadeOnce, Parts, TaskReward
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig
from comlrl.trainers.dpo.madpo import MADPOTrainer
from comlrl.trainers.dpo.objective import DirectPreference
from comlrl.trainers.dpo.rounds import PreferenceRounds
from comlrl.trainers.dpo.schedule import Rounds

__all__ = ["MADPOIterConfig", "MADPOIterTrainer"]

ONCE = MadeOnce(
    "preference pairs",
    "more rounds in one run (a larger num_iterations; each round samples fresh pairs of the current policy)",
)
"""MADPOIter's rounds start from the policy before the first ``train()``; what to use instead."""


class MADPOIterTrainer(IterativeAttributes, MADPOTrainer):
    """Iterative MADPO: ``num_iterations`` rounds, each making new pairs of the current policy
    against a comparator policy and training on them (with earlier rounds' pairs, as
    ``preference_replay_mode`` says) with MADPO's joint DPO loss.

    Arguments: MADPOTrainer's; ``args`` is a :class:`MADPOIterConfig`.

    Differences from comlrl 1.4.3's MADPOIter: the pairs hold the tokens as sampled (1.4.3
    re-tokenized the text and lost the EOS); the ``history`` comparator is really
    ``comparator_history_k`` rounds old, kept in memory (1.4.3's k=1 was the current policy,
    reloaded from disk for every prompt); ``nearest_k`` counts rounds, not rounds with pairs;
    ``checkpoint_interval`` counts rounds and a checkpoint taken in the middle of a round
    resumes exactly. A round's learning-rate schedule spans that round's steps (its pairs are
    only known when it starts). The ``api`` comparator's key is read only from the environment
    variable ``comparator_api_key_env`` (1.4.3's literal ``comparator_api_key`` is refused),
    and its text answers are tokenized with the agents' tokenizers, EOS appended; so are the
    parts of a comparator's joint answer (``comparator_generation_mode="centralized"`` with one
    model per agent), whose unsplittable answers give empty parts (1.4.3 stopped training).

    ``collaboration_mode="centralized"`` (with ``centralized_comparator_adapter``, as MADPO's):
    one model writes every role, and so does its comparator (1.4.3 forced
    ``comparator_generation_mode="centralized"`` there too); a round logs the share of either
    side's candidates the adapter could not split.

    Under torchrun each rank compares its share of the rows, the comparator's candidates
    drawn from a stream of its own (derived from ``seed``, the round and the rank), and every
    rank then holds the round's pairs in row order, with their reference margins (computed
    share by share), and the same metrics and training pairs; rank 0 alone writes the round
    files and policies. The pairs differ from one process's, whose streams are other.

    A checkpoint holds, beside MADPO's, every round's pairs, the round in progress and the
    comparator's state: nothing for ``current`` (its random stream is derived from ``seed``
    and the round), ``current_copy`` (a copy is made when a round starts, and checkpoints
    come after), ``model`` (loaded again by name) and ``api`` (asked again); for ``history``, the starting weights
    of the rounds later rounds will compare with (up to ``comparator_history_k`` copies of
    the agents' weights).
    """

    config_class = MADPOIterConfig
    algorithm_name = "MADPOIter"
    args: MADPOIterConfig
    schedule: Rounds

    def parts(self, args: MADPOIterConfig, inputs: TrainerInputs) -> Parts:
        objective = DirectPreference(args, ONCE)
        return Parts(objective, TaskReward(), Rounds(objective, args, schedule_per_round=True), inputs)

    @property
    def rounds(self) -> PreferenceRounds:
        """Every round's pairs, the round in progress, the comparator."""
        return self.schedule.rounds
