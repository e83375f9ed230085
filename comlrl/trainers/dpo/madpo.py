"""MADPO: multi-agent direct preference optimisation on pairs of the agents' own joint actions.

Pairs are made once, when ``train()`` starts, from the policy as it is then; training goes
through them for ``num_train_epochs`` epochs, as the training loop goes through dataset rows
for the other trainers:

    once (seeded; or read back from the checkpoint a run resumes from):
        rows ─formatters─▶ prompts ─generate─▶ N = preference_num_candidates per prompt and agent
        ─candidate j = every agent's sample j─▶ reward_func ─reward_processor─▶ joint rewards
        ─strictly better wins, pair_selection, preference_pairs_per_sample─▶ preference pairs
        [dpo_reference="initial": each agent's margin under this policy, kept with its pair]
    each step, on train_batch_size pairs (a new order every epoch):
        per agent, no gradient: Δ_a = log π_a(chosen_a) - log π_a(rejected_a)  [- reference's]
        per agent, micro-batch by micro-batch: -log σ(β (Δ_a + sg(Σ_{b≠a} Δ_b))) ─▶ backward
        ─▶ one optimizer step per agent

With ``collaboration_mode="centralized"`` there is one agent, whose prompt asks for every
role and whose responses are split into roles for the reward (set up as centralized MAGRPO,
by :class:`~comlrl.trainers.reinforce.centralized.CentralizedSetup`): the same steps, K = 1.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from comlrl.algorithms import joint_action_indices
from comlrl.algorithms.dpo import agent_dpo_losses, joint_preference, others_deltas, preference_deltas
from comlrl.checkpoint import read_state, read_tensors
from comlrl.metrics import stats as metric_stats
from comlrl.metrics.hooks import RolloutSample
from comlrl.metrics.stats import Stat
from comlrl.models.forward import completion_logprobs
from comlrl.models.placement import map_agents
from comlrl.rollout.prompts import Formatter
from comlrl.rollout.tree import RolloutTree
from comlrl.trainers.base import MultiAgentTrainer
from comlrl.trainers.centralized import (
    CentralizedCollaboration,
    CentralizedComparatorAdapter,
    CentralizedSetup,
    refuse_unused_adapter,
)
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.pairs import (
    PreferencePair,
    SequenceBatch,
    node_pairs,
    pair_batch,
    pair_statistics,
    select_pairs,
    shared_rewards,
)
from comlrl.trainers.update import Estimate, learner_key, micro_batches

__all__ = ["MADPOConfig", "MADPOTrainer", "PreferencePair"]

DPO_TEMPERATURE = 1.0
"""The DPO loss's log-probs (policy and reference) come from the raw logits, as in comlrl
1.4.3 and TRL's DPO: DPO's implicit reward is beta * log(pi / pi_ref) of the model itself;
the sampling temperature only decides which candidates the pairs hold."""

PAIRS_FILE = "preference_pairs.pt"
"""The pairs a checkpoint holds: the policy that sampled them is gone once training starts."""


class PreferenceStep(NamedTuple):
    """One training step: its metrics and the pairs it trained on."""

    metrics: dict[str, float]
    pairs: list[PreferencePair]


class MADPOTrainer(MultiAgentTrainer):
    """Multi-Agent Direct Preference Optimization: each agent learns from pairs of joint
    actions ranked by the task reward, through the joint policy's DPO loss.

    Arguments: those of :class:`~comlrl.trainers.base.MultiAgentTrainer`, in comlrl 1.4.3's
    order; ``args`` is a :class:`MADPOConfig`. ``metrics_callback`` runs in ``evaluate()`` (a
    training step samples nothing).

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
    progress_metric = ("loss", "dpo/loss")
    args: MADPOConfig
    collaboration: CentralizedCollaboration | None
    """Centralized mode: joins the roles' prompts and splits the one model's responses; None
    with one model per agent."""

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[torch.nn.Module | str] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Any = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Formatter | Sequence[Formatter] | None = None,
        external_transition: Callable | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., dict[str, float]] | None = None,
        args: MADPOConfig | None = None,
        *,
        centralized_comparator_adapter: CentralizedComparatorAdapter | None = None,
        peft_config: Any = None,
        metrics_callback: Callable[[list[RolloutSample]], dict[str, float]] | None = None,
    ):
        args = self.accept_config(args)
        self.pairs: list[PreferencePair] | None = None
        """The run's preference pairs, made when ``train()`` starts."""
        self.pending_learners: list[tuple[Sequence[str], Sequence[Sequence[torch.nn.Parameter]], Sequence[float]]] = []
        role_arguments = {
            "num_agents": num_agents,
            "formatters": formatters,
            "reward_func": reward_func,
            "metrics_callback": metrics_callback,
        }
        setup = self.centralized_setup(args, agents, centralized_comparator_adapter, role_arguments)
        self.comparator_adapter = None if setup is not None else centralized_comparator_adapter
        """With one model per agent: the adapter of a comparator that writes every agent's part (MADPOIter)."""
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_processor=reward_processor,
            external_transition=external_transition,
            wandb_config=wandb_config,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            peft_config=peft_config,
            **({**role_arguments, "args": args} if setup is None else setup.base_arguments),
        )
        if setup is not None:
            setup.attach(self)
        check_candidate_budget(self.args, self.num_agents)

    def centralized_setup(
        self,
        args: MADPOConfig,
        agents: Any,
        adapter: CentralizedComparatorAdapter | None,
        role_arguments: dict[str, Any],
    ) -> CentralizedSetup | None:
        """The one-model set-up of ``collaboration_mode="centralized"`` from the arguments that
        speak of roles there (None: one model per agent). An adapter with nothing to split (one
        model per agent, and no comparator writing for every agent) is an error, never ignored."""
        if args.collaboration_mode == "centralized":
            return CentralizedSetup.build(
                args,
                agents=agents,
                adapter=adapter,
                trainer=f"{type(self).__name__} with collaboration_mode='centralized'",
                one_model_per_role="set collaboration_mode='decentralized'",
                **role_arguments,
            )
        refuse_unused_adapter(adapter, args)
        return None

    # ----------------------------------------------------------------------------------------
    # what the loop goes through: the pairs
    # ----------------------------------------------------------------------------------------
    @property
    def num_train_items(self) -> int:
        """The preference pairs (known once ``train()`` has made them)."""
        if self.pairs is None:
            raise RuntimeError("MADPO makes its preference pairs when train() starts; there are none yet")
        return len(self.pairs)

    @property
    def items_per_step(self) -> int:
        """``train_batch_size`` pairs on each data-parallel rank."""
        return self.args.pairs_per_step * self.parallel.world_size

    @property
    def total_optimizer_steps(self) -> int:
        return self.args.num_train_epochs * self.steps_per_epoch

    def add_learners(
        self, names: Sequence[str], parameters: Sequence[Sequence[torch.nn.Parameter]], learning_rates: Sequence[float]
    ) -> None:
        """Every rank takes rank 0's weights now, so that all ranks sample the pairs with one
        policy; the optimizers wait for ``prepare``: the learning-rate schedules span the run's
        optimizer steps, which the number of pairs decides (making them broadcasts the weights
        again, already equal)."""
        self.parallel.broadcast_parameters(p for group in parameters for p in group)
        self.pending_learners.append((names, parameters, learning_rates))

    rounds_alternative = "MADPOIterTrainer (fresh pairs of the current policy every round, num_iterations rounds)"
    """What to use for pairs of the trained policy, named in the second ``train()``'s error."""

    train_started = False
    """Whether ``train()`` was called on this trainer (pairs given before the first call count not)."""

    def start_training(self, resume_from_checkpoint: bool | str | None) -> None:
        """Once per trainer, unless resuming a checkpoint: a second ``train()`` would train on
        the first call's pairs, not on new ones of the trained policy as comlrl 1.4.3's did, so
        it is an error (:func:`raise_second_train`), raised before ``overwrite_output_dir``
        clears anything."""
        if not resume_from_checkpoint and self.train_started:
            raise_second_train(type(self).__name__, "preference pairs", self.rounds_alternative)
        self.train_started = True

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """The pairs: read from ``checkpoint`` when resuming, else made now (once per trainer);
        then the optimizers and schedules. Returns the pair-building metrics."""
        metrics: dict[str, float] = {}
        if checkpoint is not None:
            self.pairs = self.read_pairs(checkpoint)
        elif self.pairs is None:
            self.pairs, metrics = self.build_pairs()
        for request in self.pending_learners:
            super().add_learners(*request)
        self.pending_learners = []
        return metrics

    def build_pairs(self) -> tuple[list[PreferencePair], dict[str, float]]:
        """The pairs of :func:`sample_preference_pairs`, with their reference margins when the
        DPO loss has a reference (each rank computes its share's, and every rank gets them
        all); and what building them found."""
        pairs, metrics = sample_preference_pairs(self, self.args, self.algorithm_name)
        if self.args.dpo_reference == "initial":
            pairs = self.parallel.gather_lists(self.with_reference(self.parallel.shard(pairs)))
        return pairs, metrics

    def with_reference(self, pairs: list[PreferencePair]) -> list[PreferencePair]:
        """``pairs`` with each agent's margin under the current policy, DPO's reference (a
        rank's share of fewer pairs than ranks may be empty)."""
        if not pairs:
            return pairs
        logps = map_agents(self.agents, lambda i: self.frozen_logps(i, self.batch(pairs, i)))
        per_pair = torch.stack([preference_deltas(chosen, rejected) for chosen, rejected in logps]).T.tolist()
        return [dataclasses.replace(pair, reference_deltas=deltas) for pair, deltas in zip(pairs, per_pair)]

    # ----------------------------------------------------------------------------------------
    # one step
    # ----------------------------------------------------------------------------------------
    def step(self, pair_ids: list[int]) -> PreferenceStep:
        """One optimizer step per agent on the pairs ``pair_ids`` (this rank's share of the
        step's), with the joint DPO loss averaged over the step's pairs on every rank."""
        started = time.perf_counter()
        pairs = [self.pairs[k] for k in pair_ids]
        step_pairs = int(self.parallel.sum_values([len(pairs)])[0])
        self.learners.zero_grad()
        # The last step of an epoch may hold fewer pairs than there are ranks: a rank without
        # one adds no gradient.
        metrics = self.backpropagate(pairs, step_pairs) if pairs else {}
        norms = self.learners.step(self.args.max_grad_norm, self.parallel.sum_gradients, self.global_step + 1)
        for i in range(self.num_agents):
            self.backend.sync_weights(i)
        metrics["time/step_s"] = metric_stats.maximum(time.perf_counter() - started)
        for name, norm, rate in zip(self.learners.names, norms, self.learners.learning_rates()):
            metrics[f"{learner_key(name)}/grad_norm"] = metric_stats.same(norm)
            metrics[f"{learner_key(name)}/learning_rate"] = metric_stats.same(rate)
        return PreferenceStep(self.parallel.reduce_metrics(metrics), pairs)

    def backpropagate(self, pairs: list[PreferencePair], step_pairs: int) -> dict[str, Stat]:
        """Every agent's gradient of the joint DPO loss of ``pairs``, summed over them and
        divided by ``step_pairs`` (the step's pairs on every rank, so the ranks' gradients add
        up to the step's mean); returns the pairs' metrics."""
        args = self.args
        batches = [self.batch(pairs, i) for i in range(self.num_agents)]
        reference = self.reference_deltas(pairs)  # (K, P) or None
        logps = map_agents(self.agents, lambda i: self.frozen_logps(i, batches[i]))
        deltas = torch.stack(
            [
                preference_deltas(chosen, rejected, None if reference is None else reference[i])
                for i, (chosen, rejected) in enumerate(logps)
            ]
        )  # (K, P), before the update
        others = others_deltas(deltas)

        def backward(i: int) -> dict[str, Stat]:
            return self.agent_backward(
                i, batches[i], others[i], None if reference is None else reference[i], step_pairs
            )

        metrics = {key: value for agent in map_agents(self.agents, backward) for key, value in agent.items()}
        joint = joint_preference(deltas, args.dpo_beta)
        metrics.update(
            {
                "dpo/loss": metric_stats.mean_of(joint.loss),
                "dpo/accuracy": metric_stats.mean_of(joint.correct.float()),
                "dpo/margin": metric_stats.mean_of(joint.margin),
                "dpo/chosen_logp": metric_stats.mean_of(sum(chosen for chosen, _ in logps)),
                "dpo/rejected_logp": metric_stats.mean_of(sum(rejected for _, rejected in logps)),
            }
        )
        for i in range(self.num_agents):
            metrics[f"agent{i}/delta_mean"] = metric_stats.mean_of(deltas[i])
        return metrics

    def batch(self, pairs: Sequence[PreferencePair], agent: int) -> SequenceBatch:
        """Agent ``agent``'s chosen and rejected completions of ``pairs``, padded."""
        return pair_batch(pairs, agent, self.agents.tokenizers[agent].pad_token_id)

    def reference_deltas(self, pairs: Sequence[PreferencePair]) -> Tensor | None:
        """``(K, P)`` the reference's margins of ``pairs`` (None: reference-free)."""
        if self.args.dpo_reference == "none":
            return None
        return torch.tensor([pair.reference_deltas for pair in pairs], dtype=torch.float32).T

    def micro_batches(self, num_pairs: int) -> list[slice]:
        """Pairs per forward: ``micro_batch_size`` counts sequences, and a pair is two (its
        chosen and rejected completions, in the same forward)."""
        size = self.args.micro_batch_size
        return micro_batches(num_pairs, None if size is None else max(1, size // 2))

    def sequence_logps(self, model: torch.nn.Module, batch: SequenceBatch, pairs: slice) -> tuple[Tensor, Tensor]:
        """``(p,)`` summed log-probs of the chosen and of the rejected completions of the
        pairs ``pairs`` of ``batch``, in one forward: every completion token counts, EOS
        included, padding never. Temperature 1 (:data:`DPO_TEMPERATURE`), whatever the
        sampling temperature, so the loss is comlrl 1.4.3's and TRL's DPO."""
        num_pairs = len(batch.prompt_ids) // 2
        index = torch.arange(num_pairs)[pairs]
        rows = torch.cat([index, index + num_pairs])
        device = next(model.parameters()).device
        prompt_ids, prompt_mask, completion_ids, completion_mask = (part[rows].to(device) for part in batch)
        with self.agents.precision(model):
            token_logps = completion_logprobs(
                model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=DPO_TEMPERATURE
            )
        chosen, rejected = (token_logps * completion_mask).sum(dim=1).chunk(2)
        return chosen, rejected

    def frozen_logps(self, agent: int, batch: SequenceBatch) -> tuple[Tensor, Tensor]:
        """``(P,)`` chosen and rejected log-probs of every pair of ``batch`` under agent
        ``agent`` as it is, without gradient, on the CPU."""
        num_pairs = len(batch.prompt_ids) // 2
        with self.agents.frozen(agent) as model:
            parts = [self.sequence_logps(model, batch, piece) for piece in self.micro_batches(num_pairs)]
        return torch.cat([c for c, _ in parts]).cpu(), torch.cat([r for _, r in parts]).cpu()

    def agent_backward(
        self,
        agent: int,
        batch: SequenceBatch,
        other_deltas: Tensor,
        reference_deltas: Tensor | None,
        step_pairs: int,
    ) -> dict[str, Stat]:
        """Agent ``agent``'s DPO loss on ``batch`` (the other agents' margins ``other_deltas``
        held fixed), backpropagated micro-batch by micro-batch; the micro-batches' losses add
        up to the batch's summed loss divided by ``step_pairs``, the step's pairs on every
        rank (one process: the batch's, so its mean)."""
        model = self.agents.trainable(agent)
        total = 0.0
        for piece in self.micro_batches(len(other_deltas)):
            chosen, rejected = self.sequence_logps(model, batch, piece)
            reference = None if reference_deltas is None else reference_deltas[piece].to(chosen)
            own = preference_deltas(chosen, rejected, reference)
            loss = agent_dpo_losses(own, other_deltas[piece].to(own), self.args.dpo_beta).sum() / step_pairs
            loss.backward()
            total += loss.item()
        return {f"agent{agent}/loss": metric_stats.total(total)}

    def step_samples(self, result: PreferenceStep, count: int) -> list[dict[str, Any]]:
        """The step's first ``count`` pairs: prompts, every agent's chosen and rejected completions, rewards."""
        samples = []
        for pair in result.pairs[:count]:
            sample: dict[str, Any] = {"row": pair.row, "prompt": self.train_prompts.row_prompts([pair.row])[0]}
            for i in range(self.num_agents):
                sample[f"agent{i}_prompt"] = pair.prompts[i]
                sample[f"agent{i}_chosen"] = pair.chosen_texts[i]
                sample[f"agent{i}_rejected"] = pair.rejected_texts[i]
            sample["chosen_reward"], sample["rejected_reward"] = pair.chosen_reward, pair.rejected_reward
            samples.append(sample)
        return samples

    # ----------------------------------------------------------------------------------------
    # what MultiAgentTrainer asks of an algorithm
    # ----------------------------------------------------------------------------------------
    @property
    def discount(self) -> float:
        return 1.0  # single-turn: an evaluated joint action's return is its reward

    @property
    def passes(self) -> int:
        return 1

    def estimate(self, tree: RolloutTree) -> Estimate:
        raise TypeError("MADPOTrainer trains on preference pairs, not on advantages: it has no estimate")

    # ----------------------------------------------------------------------------------------
    # checkpoints: the pairs go with the weights
    # ----------------------------------------------------------------------------------------
    def write_models(self, folder: str) -> None:
        """The agents (``agent_{i}/``) and the run's pairs (``preference_pairs.pt``, tensors,
        strings and numbers only): a resumed run trains on the same pairs, which the policy,
        changed since, could not sample again."""
        super().write_models(folder)
        torch.save([dataclasses.asdict(pair) for pair in self.pairs], os.path.join(folder, PAIRS_FILE))

    def read_pairs(self, checkpoint: str) -> list[PreferencePair]:
        """The pairs :meth:`write_models` put into ``checkpoint``, checked against this trainer."""
        path = os.path.join(checkpoint, PAIRS_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {checkpoint} holds no {PAIRS_FILE}: it was not written by MADPOTrainer")
        pairs = read_tensors(checkpoint, PAIRS_FILE, lambda records: [PreferencePair(**record) for record in records])
        if not pairs or any(len(pair.prompt_ids) != self.num_agents for pair in pairs):
            raise ValueError(f"checkpoint {checkpoint}: its preference pairs are not of {self.num_agents} agents")
        saved = read_state(checkpoint).config
        saved_per_step = saved.get("train_batch_size") or saved.get("per_device_train_batch_size")
        if saved_per_step != self.args.pairs_per_step:
            raise ValueError(
                f"checkpoint {checkpoint} trained on {saved_per_step} pairs per step; this config has "
                f"{self.args.pairs_per_step} (train_batch_size), so the pair order cannot be continued: make them agree"
            )
        if (saved.get("dpo_reference") or "none") != self.args.dpo_reference:
            raise ValueError(
                f"checkpoint {checkpoint} was trained with dpo_reference={saved.get('dpo_reference')!r}; this config "
                f"has {self.args.dpo_reference!r}: make them agree"
            )
        return pairs


def raise_second_train(trainer: str, made: str, alternative: str) -> None:
    """The error of a second ``train()`` on ``trainer``, which made its ``made`` (its pairs,
    its reward model) from the policy as it was before the first call. comlrl 1.4.3 made
    them again from the trained policy on every call; training again on the old ones would
    silently mean something else, so the caller is told what to write instead."""
    raise RuntimeError(
        f"{trainer}.train() was already called on this trainer: its {made} came from the policy as it was "
        f"before that first call, and a second train() would train on them again (comlrl 1.4.3 made new ones "
        f"from the trained policy). For new {made} from the trained policy use {alternative}, or build a new "
        f"{trainer} (agents=<the trained agents>, e.g. trainer.agents[i] or save_model() folders); to continue a "
        "run from a checkpoint, pass train(resume_from_checkpoint=...)"
    )


def check_candidate_budget(config: MADPOConfig, num_agents: int) -> None:
    """Building pairs samples ``per_device_train_batch_size`` rows' candidates at a time: at
    most ``max_generations_per_step`` completions."""
    sampled = config.per_device_train_batch_size * num_agents * config.preference_num_candidates
    if sampled > config.max_generations_per_step:
        raise ValueError(
            f"building pairs samples {sampled} completions at a time (per_device_train_batch_size="
            f"{config.per_device_train_batch_size} rows x {num_agents} agents x preference_num_candidates="
            f"{config.preference_num_candidates}), above max_generations_per_step="
            f"{config.max_generations_per_step}: lower per_device_train_batch_size or preference_num_candidates, "
            "or raise max_generations_per_step"
        )


def sample_preference_pairs(
    trainer: MultiAgentTrainer, args: MADPOConfig, name: str
) -> tuple[list[PreferencePair], dict[str, float]]:
    """Sample ``preference_num_candidates`` joint actions per training prompt with
    ``trainer``'s current policy, score them with its task reward and keep the pairs
    ``pair_selection`` picks; returns them and what building them found. ``name`` (the
    trainer's: MADPO, MARLHF) labels the progress bar and the error. For a centralized
    trainer (one model writes every role), what was found includes the share of candidates
    its collaboration could not split into roles.

    Under data parallelism each rank samples its share of the rows (and draws
    ``pair_selection="random"``'s order from its own stream, as it samples from its own);
    every rank returns all the pairs, in row order, and what was found over all of them."""
    parallel, collaboration = trainer.parallel, trainer.collaboration
    count = args.preference_num_candidates
    aligned = joint_action_indices(trainer.num_agents, count, "aligned")
    order = torch.Generator().manual_seed(args.seed + parallel.rank)  # pair_selection="random"'s draws
    rows = parallel.shard(list(range(len(trainer.train_prompts))))
    chunk = args.per_device_train_batch_size
    pairs: list[PreferencePair] = []
    candidate_rewards = []
    parse_failure_stats = []  # one metric per chunk of rows, centralized only
    chunks = tqdm(
        range(0, len(rows), chunk), desc=f"{name} pairs", unit="batch", dynamic_ncols=True, disable=not parallel.is_main
    )
    for first in chunks:
        turn = trainer.rollout(
            trainer.train_prompts, rows[first : first + chunk], num_generations=count, joint_indices=aligned
        ).turns[0]
        rewards = shared_rewards(turn.rewards, turn.rows)  # (M, N)
        candidate_rewards.append(rewards)
        if collaboration is not None:
            parse_failure_stats.append(collaboration.parse_failure_stats(turn, trainer.train_prompts))
        for m, row in enumerate(turn.rows):
            ranked = select_pairs(rewards[m], args.pair_selection, args.preference_pairs_per_sample, order)
            prompts = [agent_prompts[m] for agent_prompts in turn.prompts]
            pairs.extend(node_pairs(row, prompts, turn.agents, m * count, ranked, rewards[m]))
    pairs = parallel.gather_lists(pairs)
    all_rewards = torch.cat(parallel.gather_lists(candidate_rewards))
    parse_failure_stats = parallel.gather_lists(parse_failure_stats)
    if not pairs:
        raise ValueError(
            f"{name} found no preference pairs: the {count} candidates of each of the {len(all_rewards)} training rows "
            f"all got the same reward (e.g. {all_rewards[0, 0].item():g}), so none is preferred. A constant "
            "reward_func or reward_processor does this; otherwise sample more varied candidates (more "
            "preference_num_candidates, a higher temperature)"
        )
    return pairs, {
        **pair_statistics(all_rewards, pairs),
        **metric_stats.finish(metric_stats.combine(parse_failure_stats)),
    }
