"""MADPO: multi-agent direct preference optimisation on pairs of the agents' own joint actions.

Pairs are made once, when ``train()`` starts, from the policy as it is then; training goes
through them for ``num_train_epochs`` epochs, as the training loop goes through dataset rows
for the other trainers:

    once (seeded; or read back from the checkpoint a run resumes from):
        rows ─formatters─▶ prompts ─generate─▶ N = preference_num_candidates per prompt and agent
        ─candidate j = every agent's sample j─▶ reward_func ─reward_processor─▶ joint rewards
        ─strictly better wins, pair_selection, preference_pairs_per_sample─▶ preference pairs
        [dpo_reference="initial": each agent's margin under this policy, kept with its pair]
    each step: the joint DPO loss (:mod:`comlrl.trainers.dpo.objective`)

With ``collaboration_mode="centralized"`` there is one agent, whose prompt asks for every
role and whose responses are split into roles for the reward (set up as every centralized
trainer, by :class:`~comlrl.engine.centralized.CentralizedSetup`): the same steps, K = 1.
"""

from __future__ import annotations

from comlrl.compat.entry import OriginalCalls
from comlrl.compat.trainer_attributes import PreferenceAttributes
from comlrl.engine.base import MultiAgentTrainer
from comlrl.engine.centralized import CentralizedCollaboration
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import MadeOnce, Parts, Schedule, TaskReward
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.objective import DirectPreference
from comlrl.trainers.dpo.pairs import PreferencePair

__all__ = ["MADPOConfig", "MADPOTrainer", "PreferencePair"]

ONCE = MadeOnce(
    "preference pairs", "MADPOIterTrainer (fresh pairs of the current policy every round, num_iterations rounds)"
)
"""MADPO's pairs come from the policy before the first ``train()``; what to use for new ones."""


class MADPOTrainer(PreferenceAttributes, OriginalCalls, MultiAgentTrainer):
    """Multi-Agent Direct Preference Optimization: each agent learns from pairs of joint
    actions ranked by the task reward, through the joint policy's DPO loss.

    Arguments: :class:`~comlrl.engine.inputs.TrainerInputs` (with
    ``centralized_comparator_adapter``); ``args`` is a :class:`MADPOConfig`.
    ``metrics_callback`` runs in ``evaluate()`` (a training step samples nothing).

    Under torchrun each rank samples the candidates of its share of the rows, from its own
    random stream, and every rank then holds the same pairs, in row order (one process's
    order; the candidates equal one process's only where sampling is deterministic). Each
    step takes ``train_batch_size`` pairs per rank (else ``per_device_train_batch_size``),
    each rank training on its own; the loss is the mean over the step's
    pairs of every rank, so K ranks compute the gradient one process would on those pairs.
    MADPOIter's rounds make their pairs the same way under torchrun (see its docstring).

    Centralized collaboration (``collaboration_mode="centralized"``, comlrl 1.4.3's): ONE model
    (``agents=[model]`` or ``agent_model``) writes every role in one response, as in
    :class:`~comlrl.trainers.reinforce.CentralizedMAGRPOTrainer`: ``num_agents`` counts the
    roles, ``formatters`` give each role's prompt, ``centralized_comparator_adapter`` (default
    :class:`~comlrl.trainers.reinforce.centralized.TaggedCentralizedComparatorAdapter`) joins
    them into the model's prompt and splits its responses, and ``reward_func`` scores the
    roles' texts as with one model per role. The pairs are the one model's joint responses,
    and the loss is single-agent DPO on them (every token of the joint response counts); a
    response the adapter cannot split scores as empty roles, and the share of such candidates
    is logged as ``centralized/parse_failure_frac`` with the pair metrics (and under ``eval/``).
    ``eval_logger`` gets ``[role][row][turn]`` texts, ``metrics_callback`` one sample per role;
    ``save_model(dir)`` writes the one model to ``dir/agent_0``.

    The DPO log-probs (the policy's and, with ``dpo_reference="initial"``, the reference's)
    are those of the raw logits, temperature 1, as in comlrl 1.4.3 and TRL's DPO: the
    sampling ``temperature`` only shapes which candidates are drawn, not the loss.

    ``train()`` runs once per trainer (or resumes a checkpoint): a second call is an error,
    since the pairs came from the policy before the first call (see :meth:`train`).

    Differences from 1.4.3's MADPO: every completion token counts, the last (EOS) included;
    the pairs hold the tokens as sampled, never re-tokenized text; the loss, accuracy and
    margins are logged; a reference policy is available (``dpo_reference``); and the pairs
    are kept in checkpoints, so a resumed run continues exactly.
    """

    config_class = MADPOConfig
    algorithm_name = "MADPO"
    optional_inputs = frozenset({"centralized_comparator_adapter"})
    args: MADPOConfig
    objective: DirectPreference
    collaboration: CentralizedCollaboration | None
    """Centralized mode: joins the roles' prompts and splits the one model's responses; None
    with one model per agent."""

    def parts(self, args: MADPOConfig, inputs: TrainerInputs) -> Parts:
        return Parts(DirectPreference(args, ONCE), TaskReward(), Schedule(), inputs)

    @property
    def pairs(self) -> list[PreferencePair] | None:
        """The run's preference pairs, made when ``train()`` starts (None before)."""
        return self.objective.pairs
