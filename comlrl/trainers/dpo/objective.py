"""MADPO's objective: the agents learn from preference pairs of their own joint actions,
made once when ``train()`` starts (MADPOIter: every round) from the policy as it is then,
through the joint policy's DPO loss:

    each step, on train_batch_size pairs (a new order every epoch):
        per agent, no gradient: Δ_a = log π_a(chosen_a) - log π_a(rejected_a)  [- reference's]
        per agent, micro-batch by micro-batch: -log σ(β (Δ_a + sg(Σ_{b≠a} Δ_b))) ─▶ backward
        ─▶ one optimizer step per agent
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from comlrl.algorithms.dpo import agent_dpo_losses, joint_preference, others_deltas, preference_deltas
from comlrl.checkpoint import read_state, read_tensors
from comlrl.engine import sharding
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import MadeOnce, Objective
from comlrl.engine.run import Run
from comlrl.engine.update import learner_key, micro_batches
from comlrl.models.forward import completion_logprobs
from comlrl.models.placement import map_agents
from comlrl.trainers.dpo.candidates import check_candidate_budget, sample_preference_pairs
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.pairs import PreferencePair, SequenceBatch, pair_batch
from comlrl.trainers.dpo.rounds import PreferenceRounds
from comlrl.utils import stats as metric_stats
from comlrl.utils.stats import Stat

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


class DirectPreference(Objective):
    """Preference pairs and the joint DPO loss; an epoch goes through the pairs."""

    config: MADPOConfig
    progress_metric = ("loss", "dpo/loss")
    schedule_known_at_setup = False  # the pairs, made in prepare, decide the run's length

    def __init__(self, config: MADPOConfig, made_once: MadeOnce):
        super().__init__(config)
        self.made_once = made_once
        self.pairs: list[PreferencePair] | None = None
        """The run's preference pairs (a round's, in rounds): made when ``train()`` starts."""

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        super().attach(run, inputs)
        check_candidate_budget(self.config, run.num_agents)

    def num_items(self) -> int:
        """The preference pairs (known once ``train()`` has made them)."""
        if self.pairs is None:
            raise RuntimeError("MADPO makes its preference pairs when train() starts; there are none yet")
        return len(self.pairs)

    def items_per_step(self) -> int:
        """``train_batch_size`` pairs on each data-parallel rank."""
        return self.config.pairs_per_step * self.run.parallel.world_size

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """The pairs: read from ``checkpoint`` when resuming, else made now (unless the round
        that started has made them); returns what making them found."""
        run = self.run
        if checkpoint is not None:
            self.pairs = self.read_pairs(checkpoint)
        elif self.pairs is None:
            self.pairs, metrics = sample_preference_pairs(run, self.config, run.name)
            if self.config.dpo_reference == "initial":
                self.pairs = run.parallel.gather_lists(self.with_reference(run.parallel.shard(self.pairs)))
            return metrics
        return {}

    def start_round(self, rounds: PreferenceRounds, round_index: int) -> dict[str, float]:
        """In rounds: round ``round_index`` of ``rounds`` is made, and its pairs (with DPO's
        reference margins when the loss has a reference) become the pairs to train on;
        returns the round's metrics."""
        annotate = self.with_reference if self.config.dpo_reference == "initial" else None
        self.pairs, metrics = rounds.start(round_index, annotate=annotate)
        if not self.pairs:
            warnings.warn(
                f"MADPOIter round {round_index + 1}: no preference pairs to train on (every comparison tied, "
                "and the replay found none): the round trains nothing",
                stacklevel=2,
            )
        return metrics

    def write_checkpoint(self, folder: str) -> None:
        """The run's pairs (``preference_pairs.pt``, tensors, strings and numbers only): a
        resumed run trains on the same pairs, which the policy, changed since, could not
        sample again."""
        torch.save([dataclasses.asdict(pair) for pair in self.pairs], os.path.join(folder, PAIRS_FILE))

    def with_reference(self, pairs: list[PreferencePair]) -> list[PreferencePair]:
        """``pairs`` with each agent's margin under the current policy, DPO's reference (a
        rank's share of fewer pairs than ranks may be empty)."""
        if not pairs:
            return pairs
        logps = map_agents(self.run.agents, lambda i: self.frozen_logps(i, self.batch(pairs, i)))
        per_pair = torch.stack([preference_deltas(chosen, rejected) for chosen, rejected in logps]).T.tolist()
        return [dataclasses.replace(pair, reference_deltas=deltas) for pair, deltas in zip(pairs, per_pair)]

    def step(self, items: list[int], step_number: int) -> PreferenceStep:
        """Optimizer step ``step_number`` of every agent on the pairs ``items`` (this rank's
        share of the step's), with the joint DPO loss averaged over the step's pairs on every rank."""
        run = self.run
        started = time.perf_counter()
        pairs = [self.pairs[k] for k in items]
        step_pairs = int(run.parallel.sum_values([len(pairs)])[0])
        run.learners.zero_grad()
        # The last step of an epoch may hold fewer pairs than there are ranks: a rank without
        # one adds no gradient (but passes through sharded agents as the others do).
        metrics = self.backpropagate(pairs, step_pairs) if pairs else self.no_pairs()
        norms = run.learners.step(self.config.max_grad_norm, run.parallel.sum_gradients, step_number)
        run.sync_weights()
        metrics["time/step_s"] = metric_stats.maximum(time.perf_counter() - started)
        for name, norm, rate in zip(run.learners.names, norms, run.learners.learning_rates()):
            metrics[f"{learner_key(name)}/grad_norm"] = metric_stats.same(norm)
            metrics[f"{learner_key(name)}/learning_rate"] = metric_stats.same(rate)
        return PreferenceStep(run.parallel.reduce_metrics(metrics), pairs)

    def backpropagate(self, pairs: list[PreferencePair], step_pairs: int) -> dict[str, Stat]:
        """Every agent's gradient of the joint DPO loss of ``pairs``, summed over them and
        divided by ``step_pairs`` (the step's pairs on every rank, so the ranks' gradients add
        up to the step's mean); returns the pairs' metrics."""
        args, run = self.config, self.run
        batches = [self.batch(pairs, i) for i in range(run.num_agents)]
        reference = self.reference_deltas(pairs)  # (K, P) or None
        logps = map_agents(run.agents, lambda i: self.frozen_logps(i, batches[i]))
        deltas = torch.stack(
            [
                preference_deltas(chosen, rejected, None if reference is None else reference[i])
                for i, (chosen, rejected) in enumerate(logps)
            ]
        )  # (K, P), before the update
        others = others_deltas(deltas)

        def backward(i: int) -> dict[str, Stat]:
            reference_i = None if reference is None else reference[i]
            return self.agent_backward(i, batches[i], others[i], reference_i, step_pairs)

        metrics = {key: value for agent in map_agents(run.agents, backward) for key, value in agent.items()}
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
        for i in range(run.num_agents):
            metrics[f"agent{i}/delta_mean"] = metric_stats.mean_of(deltas[i])
        return metrics

    def no_pairs(self) -> dict[str, Stat]:
        """A rank's part of a step without a pair: the passes sharded agents need of every rank."""
        run = self.run
        for i in range(run.num_agents):
            sharding.pad_passes(run.agents.trainable(i), 0, run.parallel.most)
        return {}

    def batch(self, pairs: Sequence[PreferencePair], agent: int) -> SequenceBatch:
        """Agent ``agent``'s chosen and rejected completions of ``pairs``, padded."""
        return pair_batch(pairs, agent, self.run.agents.tokenizers[agent].pad_token_id)

    def reference_deltas(self, pairs: Sequence[PreferencePair]) -> Tensor | None:
        """``(K, P)`` the reference's margins of ``pairs`` (None: reference-free)."""
        if self.config.dpo_reference == "none":
            return None
        return torch.tensor([pair.reference_deltas for pair in pairs], dtype=torch.float32).T

    def micro_batches(self, num_pairs: int) -> list[slice]:
        """Pairs per forward: ``micro_batch_size`` counts sequences, and a pair is two (its
        chosen and rejected completions, in the same forward)."""
        size = self.config.micro_batch_size
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
        token_logps = completion_logprobs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=DPO_TEMPERATURE
        )
        chosen, rejected = (token_logps * completion_mask).sum(dim=1).chunk(2)
        return chosen, rejected

    def frozen_logps(self, agent: int, batch: SequenceBatch) -> tuple[Tensor, Tensor]:
        """``(P,)`` chosen and rejected log-probs of every pair of ``batch`` under agent
        ``agent`` as it is, without gradient, on the CPU."""
        num_pairs = len(batch.prompt_ids) // 2
        with self.run.agents.frozen(agent) as model:
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
        model = self.run.agents.trainable(agent)
        total = 0.0
        pieces = self.micro_batches(len(other_deltas))
        sharding.pad_passes(model, len(pieces), self.run.parallel.most)
        for piece in pieces:
            chosen, rejected = self.sequence_logps(model, batch, piece)
            reference = None if reference_deltas is None else reference_deltas[piece].to(chosen)
            own = preference_deltas(chosen, rejected, reference)
            loss = agent_dpo_losses(own, other_deltas[piece].to(own), self.config.dpo_beta).sum() / step_pairs
            loss.backward()
            total += loss.item()
        return {f"agent{agent}/loss": metric_stats.total(total)}

    def step_samples(self, result: PreferenceStep, count: int) -> list[dict[str, Any]]:
        """The step's first ``count`` pairs: prompts, every agent's chosen and rejected completions, rewards."""
        run = self.run
        samples = []
        for pair in result.pairs[:count]:
            sample: dict[str, Any] = {"row": pair.row, "prompt": run.train_prompts.row_prompts([pair.row])[0]}
            for i in range(run.num_agents):
                sample[f"agent{i}_prompt"] = pair.prompts[i]
                sample[f"agent{i}_chosen"] = pair.chosen_texts[i]
                sample[f"agent{i}_rejected"] = pair.rejected_texts[i]
            sample["chosen_reward"], sample["rejected_reward"] = pair.chosen_reward, pair.rejected_reward
            samples.append(sample)
        return samples

    def read_pairs(self, checkpoint: str) -> list[PreferencePair]:
        """The pairs :meth:`write_checkpoint` put into ``checkpoint``, checked against this run."""
        path = os.path.join(checkpoint, PAIRS_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {checkpoint} holds no {PAIRS_FILE}: it was not written by MADPOTrainer")
        pairs = read_tensors(checkpoint, PAIRS_FILE, lambda records: [PreferencePair(**record) for record in records])
        num_agents = self.run.num_agents
        if not pairs or any(len(pair.prompt_ids) != num_agents for pair in pairs):
            raise ValueError(f"checkpoint {checkpoint}: its preference pairs are not of {num_agents} agents")
        saved = read_state(checkpoint).config
        saved_per_step = saved.get("train_batch_size") or saved.get("per_device_train_batch_size")
        if saved_per_step != self.config.pairs_per_step:
            raise ValueError(
                f"checkpoint {checkpoint} trained on {saved_per_step} pairs per step; this config has "
                f"{self.config.pairs_per_step} (train_batch_size), so the pair order cannot be continued: "
                "make them agree"
            )
        if (saved.get("dpo_reference") or "none") != self.config.dpo_reference:
            raise ValueError(
                f"checkpoint {checkpoint} was trained with dpo_reference={saved.get('dpo_reference')!r}; this config "
                f"has {self.config.dpo_reference!r}: make them agree"
            )
        return pairs
