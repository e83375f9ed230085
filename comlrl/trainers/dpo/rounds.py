"""The rounds of the iterative preference trainers (MADPOIter, MARLHFIter): each round makes
new pairs of the current policy against a comparator policy and picks the pairs the round
learns from, with earlier rounds' pairs as the replay mode says.

    round r (starts when its first epoch does, the rounds' epochs in one training loop):
        rows ─current policy─▶ N candidates per prompt and agent ─▶ joint rewards
        rows ─comparator (own random stream)─▶ M candidates ─▶ joint rewards
        current j against comparator j, j < min(N, M): strictly better wins, ties dropped
        (under torchrun each rank compares its share of the rows; every rank then holds all the pairs)
        ─pair_selection order, preference_pairs_per_sample─▶ the round's pairs (shard r)
        ─preference_replay_mode over the shards of every round so far─▶ the round's training pairs

What a trainer does with the training pairs is its own (the rounds' consumer, to which
:class:`~comlrl.trainers.dpo.schedule.Rounds` hands the rounds when one starts): MADPOIter's
objective takes DPO steps on them, MARLHFIter's reward source fits a fresh reward model to
them and the RL phase trains on its scores. The comparator
policies are in :mod:`comlrl.trainers.dpo.comparators`, the replay rules in
:mod:`comlrl.trainers.dpo.replay`, the pair order in :mod:`comlrl.trainers.dpo.pairs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from comlrl.algorithms import joint_action_indices
from comlrl.checkpoint import read_state, read_tensors, write_json
from comlrl.engine.centralized import (
    PARSE_FAILURE_METRIC,
    CentralizedComparatorAdapter,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.engine.run import Run
from comlrl.rewards import JointReward
from comlrl.rollout.backends import GenerationBackend
from comlrl.rollout.episodes import Rollout
from comlrl.rollout.tree import Turn
from comlrl.trainers.dpo.comparators import build_comparator
from comlrl.trainers.dpo.iterative_config import MADPOIterConfig
from comlrl.trainers.dpo.joint_comparator import JointComparator
from comlrl.trainers.dpo.pairs import (
    PreferencePair,
    comparison_pairs,
    joint_action,
    preference_pair,
    shared_rewards,
)
from comlrl.trainers.dpo.replay import replay_choice
from comlrl.trainers.dpo.reward_histograms import log_reward_distribution, raw_reward_range
from comlrl.utils.run_control import seeded_cuda_devices
from comlrl.utils.stats import combine, finish

ROUNDS_FILE = "preference_rounds.pt"
"""What a checkpoint holds of the rounds: the round in progress, every round's pairs, the comparator's state."""

ROUND_SETTINGS = ("num_train_epochs", "comparator_policy", "comparator_history_k")
"""The settings a run's rounds cannot be continued without: a checkpoint's must equal the config's."""


class Stream(enum.IntEnum):
    """The random streams of a round, each seeded from the run's ``seed`` and the round alone
    (and the data-parallel rank, for the streams a rank samples its share of the rows with),
    so a resumed run draws them again exactly and none depends on another."""

    PAIR_ORDER = 0
    COMPARATOR = 1
    REPLAY = 2
    REWARD_MODEL_HELD_OUT = 3
    REWARD_MODEL_ORDER = 4


def round_generator(seed: int, round_index: int, stream: Stream, rank: int = 0) -> torch.Generator:
    """The generator of ``stream`` in round ``round_index`` on data-parallel rank ``rank``;
    rank 0's is one process's, so one process draws what it drew before there were ranks."""
    entropy = [seed % 2**64, round_index, int(stream)] + ([rank] if rank else [])
    return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]))


def comparison_statistics(current: Tensor, comparator: Tensor, pairs: list[PreferencePair]) -> dict[str, float]:
    """What a round's comparisons found, from ``(rows, N)`` current and ``(rows, M)``
    comparator candidate rewards and the pairs kept."""
    met = min(current.shape[1], comparator.shape[1])
    margins = (current[:, :met] - comparator[:, :met]).double()
    decided = (margins != 0).sum().item()
    gaps = [pair.chosen_reward - pair.rejected_reward for pair in pairs]
    return {
        "iter/current_reward_mean": current.double().mean().item(),
        "iter/comparator_reward_mean": comparator.double().mean().item(),
        "iter/current_win_rate": (margins > 0).sum().item() / decided if decided else 0.0,
        "iter/tie_rate": 1.0 - decided / margins.numel(),
        "preference/reward_gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
    }


def pair_record(pair: PreferencePair) -> dict[str, Any]:
    """A pair as JSON: its token ids as lists of integers."""
    return {
        name: [ids.tolist() for ids in value] if name.endswith("_ids") else value for name, value in vars(pair).items()
    }


class PreferenceRounds:
    """The rounds of one iterative run: every round's pairs (the replay's shards), the round in
    progress, the comparator; and how a round's pairs are made and chosen.

    Arguments:
        run: the run whose agents, prompts, rollout and task reward the rounds sample with (it
            owns the agents; the comparator samples beside them).
        args: the iterative config (MADPOIterConfig, MARLHFIterConfig): rounds, comparator,
            pair selection and replay fields.
        adapter: with ``comparator_generation_mode="centralized"`` and one model per agent,
            builds the comparator's joint prompt and splits its answers (default: tagged).
    """

    def __init__(self, run: Run, args: MADPOIterConfig, adapter: CentralizedComparatorAdapter | None = None):
        self.run = run
        self.args = args
        self.reward_range = raw_reward_range(run.reward) if args.log_reward_distribution else None
        """The task reward's raw range, which the reward histograms' bins span (None: not logged)."""
        sampled = args.per_device_train_batch_size * run.num_agents * args.comparator_candidates
        if sampled > args.max_generations_per_step:
            raise ValueError(
                f"the comparator samples {sampled} completions at a time (per_device_train_batch_size="
                f"{args.per_device_train_batch_size} rows x {run.num_agents} agents x comparator_num_candidates="
                f"{args.comparator_candidates}), above max_generations_per_step={args.max_generations_per_step}: "
                "lower one of them, or raise max_generations_per_step"
            )
        self.comparator = build_comparator(
            args.comparator_policy, run.agents, run.backend, args, run.model_config.model_kwargs
        )
        self.joint = None
        """With one model per agent, a comparator writing every agent's part in one answer."""
        if args.joint_comparator:
            index = args.comparator_centralized_agent_index
            if index >= run.num_agents:
                raise ValueError(
                    f"comparator_centralized_agent_index={index}, but there are {run.num_agents} agents: "
                    f"choose one of 0..{run.num_agents - 1}, whose comparator model answers the joint prompts"
                )
            self.joint = JointComparator(adapter or TaggedCentralizedComparatorAdapter(), index)
        self.round = -1
        """The round in progress (-1: none yet)."""
        self.shards: list[list[PreferencePair]] = []
        """Each round's own pairs, oldest first."""

    @property
    def num_rounds(self) -> int:
        return self.args.num_iterations

    def round_of(self, epoch: int) -> int:
        """The round training epoch ``epoch`` belongs to."""
        return epoch // self.args.num_train_epochs

    def reset(self) -> None:
        """Forget every round: a new run starts."""
        self.round, self.shards = -1, []

    def start(
        self,
        round_index: int,
        reward: JointReward | None = None,
        annotate: Callable[[list[PreferencePair]], list[PreferencePair]] | None = None,
    ) -> tuple[list[PreferencePair], dict[str, float]]:
        """Round ``round_index``: its pairs against the comparator (candidates scored by
        ``reward``, default the task reward), passed through ``annotate`` (MADPOIter: DPO's
        reference margins) and kept as its shard; returns the pairs the round learns from,
        chosen from every shard by the replay mode (none when every comparison tied and the
        replay found none either: the consumer says what that means), and the round's metrics.

        Under torchrun every rank returns the same pairs and metrics: each makes its share of
        the comparisons and of the annotations (``annotate`` may be given an empty share), the
        ranks gather them, and every rank then draws the replay's choice from the same
        generator; only rank 0 writes the round's files."""
        if round_index != len(self.shards):
            raise RuntimeError(f"round {round_index + 1} cannot start after {len(self.shards)} rounds")
        args = self.args
        if round_index == 0:
            self.save_policy("initial")
        current, metrics, candidates_raw = self.compare(round_index, self.comparator.start_round(round_index), reward)
        parallel, output_dir = self.run.parallel, self.run.state.output_dir
        if annotate is not None and current:
            current = parallel.gather_lists(annotate(parallel.shard(current)))
        self.shards.append(current)
        self.round = round_index
        if parallel.is_main:
            self.write_shard(output_dir, round_index, current)
        chosen = replay_choice(
            args.preference_replay_mode,
            [len(shard) for shard in self.shards],
            args.preference_replay_sample_size,
            round_generator(args.seed, round_index, Stream.REPLAY),
            args.preference_replay_k,
            args.preference_replay_lambda,
        )
        pairs = [self.shards[shard][index] for shard, index in chosen]
        metrics.update(
            {
                "iter/current_iteration": float(round_index + 1),
                "iter/current_preference_pairs": float(len(current)),
                "iter/total_preference_pairs": float(sum(len(shard) for shard in self.shards)),
                "iter/train_preference_pairs": float(len(pairs)),
            }
        )
        if self.reward_range is not None:
            written_to = output_dir if parallel.is_main else None
            metrics.update(log_reward_distribution(written_to, round_index, self.reward_range, candidates_raw, pairs))
        return pairs, metrics

    def end(self, round_index: int) -> None:
        """Round ``round_index`` has taken its last step."""
        self.save_policy(f"iteration_{round_index:04d}")

    def save_policy(self, label: str) -> None:
        """The agents (as ``save_model`` writes them: rank 0 only) to ``policy_checkpoint_dir/label``, if set."""
        if self.args.policy_checkpoint_dir is not None:
            self.run.models.save(os.path.join(self.args.policy_checkpoint_dir, label))

    def compare(
        self, round_index: int, comparator: GenerationBackend, reward: JointReward | None
    ) -> tuple[list[PreferencePair], dict[str, float], tuple[Tensor, Tensor]]:
        """Round ``round_index``'s pairs: for every training prompt, the current policy's N
        candidates against the ``comparator``'s M, candidate j against candidate j; with the
        round's metrics and every candidate's raw reward (before ``reward_processor``), ``(rows, N)``
        current and ``(rows, M)`` comparator, for the reward histograms.

        Under torchrun each rank samples its share of the rows, the comparator's candidates and
        ``pair_selection="random"``'s order from its own streams of the round (the current
        candidates from its own training stream, as one process does); every rank returns all
        the pairs in row order, the rewards of every row and the metrics over all of them."""
        run, args, parallel = self.run, self.args, self.run.parallel
        count, comparator_count = args.preference_num_candidates, args.comparator_candidates
        order = round_generator(args.seed, round_index, Stream.PAIR_ORDER, parallel.rank)  # pair_selection="random"
        comparator_stream = round_generator(args.seed, round_index, Stream.COMPARATOR, parallel.rank)
        rows = parallel.shard(list(range(len(run.train_prompts))))
        chunk = args.per_device_train_batch_size
        pairs: list[PreferencePair] = []
        current_rewards, comparator_rewards = [], []
        current_raw, comparator_raw = [], []
        collaboration = run.collaboration  # centralized: one model's answers, split into roles
        unsplit: tuple[list, list] = ([], [])  # per batch of rows, current and comparator candidates
        label = f"{args.trainer_name} round {round_index + 1} pairs"
        batches = tqdm(
            range(0, len(rows), chunk), desc=label, unit="batch", dynamic_ncols=True, disable=not parallel.is_main
        )
        for first in batches:
            batch = rows[first : first + chunk]
            mine = candidates(run, batch, count, reward)
            with sampling_with(run.rollout, comparator, comparator_stream) as comparator_rollout:
                if self.joint is None:
                    theirs = candidates(run, batch, comparator_count, reward, comparator_rollout)
                else:  # one model writes every agent's part
                    theirs = self.joint.candidates(run, comparator_rollout, batch, comparator_count, reward)
            mine_rewards, their_rewards = (
                shared_rewards(mine.rewards, mine.rows),
                shared_rewards(theirs.rewards, theirs.rows),
            )
            mine_raw, their_raw = mine.raw_rewards[..., 0], theirs.raw_rewards[..., 0]  # shared, as the rewards
            for m, row in enumerate(mine.rows):
                kept = comparison_pairs(
                    mine_rewards[m], their_rewards[m], args.pair_selection, args.preference_pairs_per_sample, order
                )
                prompts = [agent_prompts[m] for agent_prompts in mine.prompts]
                for j, current_won in kept.tolist():
                    ours = joint_action(mine.agents, m * count + j, mine_rewards[m, j])
                    other = joint_action(theirs.agents, m * comparator_count + j, their_rewards[m, j])
                    pair = preference_pair(row, prompts, *((ours, other) if current_won else (other, ours)))
                    raw = dict(target_raw_reward=mine_raw[m, j].item(), comparator_raw_reward=their_raw[m, j].item())
                    pairs.append(dataclasses.replace(pair, **raw))
            current_rewards.append(mine_rewards)
            comparator_rewards.append(their_rewards)
            current_raw.append(mine_raw)
            comparator_raw.append(their_raw)
            if collaboration is not None:
                for side, turn in zip(unsplit, (mine, theirs)):
                    side.append(collaboration.parse_failure_stats(turn, run.train_prompts))
        pairs = parallel.gather_lists(pairs)
        current_rewards, comparator_rewards, current_raw, comparator_raw = (
            torch.cat(parallel.gather_lists(per_batch))
            for per_batch in (current_rewards, comparator_rewards, current_raw, comparator_raw)
        )
        metrics = comparison_statistics(current_rewards, comparator_rewards, pairs)
        if collaboration is not None:
            current, comparator = (
                finish(combine(parallel.gather_lists(side)))[PARSE_FAILURE_METRIC] for side in unsplit
            )
            metrics.update({PARSE_FAILURE_METRIC: current, "iter/comparator_parse_failure_frac": comparator})
        if self.joint is not None:
            metrics["iter/comparator_parse_failure_frac"] = self.joint.parse_failure_frac(parallel)
        return pairs, metrics, (current_raw, comparator_raw)

    def write_shard(self, output_dir: str, round_index: int, pairs: list[PreferencePair]) -> None:
        """Round ``round_index``'s pairs to ``iteration_XXXX.json`` (numbered from 1, as 1.4.3), for reading,
        in ``preference_replay_dir`` or the run's ``output_dir``."""
        folder = self.args.preference_replay_dir or os.path.join(output_dir, "preference_replay")
        record = {"iteration": round_index + 1, "num_pairs": len(pairs), "pairs": [pair_record(p) for p in pairs]}
        write_json(os.path.join(folder, f"iteration_{round_index + 1:04d}.json"), record)

    # ----------------------------------------------------------------------------------------
    # checkpoints
    # ----------------------------------------------------------------------------------------
    def write(self, folder: str) -> None:
        """``preference_rounds.pt``: the round in progress, every round's pairs, the
        comparator's state and the settings they depend on (tensors, strings and numbers only)."""
        state = {
            "round": self.round,
            "shards": [[dataclasses.asdict(pair) for pair in shard] for shard in self.shards],
            "comparator": self.comparator.state(),
            "settings": {name: getattr(self.args, name) for name in ROUND_SETTINGS},
        }
        torch.save(state, os.path.join(folder, ROUNDS_FILE))

    def read(self, checkpoint: str) -> None:
        """Put back the rounds :meth:`write` put into ``checkpoint``, after checking that this
        config can continue them."""
        if not os.path.isfile(os.path.join(checkpoint, ROUNDS_FILE)):
            raise ValueError(
                f"checkpoint {checkpoint} holds no {ROUNDS_FILE}: it was not written by {self.args.trainer_name}Trainer"
            )

        def parse(state: dict[str, Any]) -> tuple[int, list[list[PreferencePair]], dict[str, Any], dict[str, Any]]:
            shards = [[PreferencePair(**record) for record in shard] for shard in state["shards"]]
            return state["round"], shards, state["comparator"], state.get("settings") or read_state(checkpoint).config

        round_index, shards, comparator_state, saved = read_tensors(checkpoint, ROUNDS_FILE, parse)
        for name in ROUND_SETTINGS:
            if saved.get(name) != getattr(self.args, name):
                raise ValueError(
                    f"checkpoint {checkpoint} was trained with {name}={saved.get(name)!r}; this config has "
                    f"{getattr(self.args, name)!r}, so its rounds cannot be continued: make them agree"
                )
        self.round, self.shards = round_index, shards
        self.comparator.load_state(comparator_state)


def candidates(
    run: Run, rows: list[int], count: int, reward: JointReward | None = None, rollout: Rollout | None = None
) -> Turn:
    """``count`` aligned joint actions per row of ``run``'s training prompts, played out by
    ``rollout`` (default: the run's own, with the agents' backend) and scored by ``reward``
    (default: the task reward)."""
    aligned = joint_action_indices(run.num_agents, count, "aligned")
    play = run.rollout if rollout is None else rollout
    return play(run.train_prompts, rows, num_generations=count, joint_indices=aligned, reward=reward).turns[0]


@contextlib.contextmanager
def sampling_with(rollout: Rollout, backend: GenerationBackend, stream: torch.Generator) -> Iterator[Rollout]:
    """``rollout`` sampling with ``backend`` instead (a copy: nothing is changed on ``rollout``),
    inside from a seed drawn from ``stream``; torch's generators (the training's random
    stream) are left as they were."""
    with torch.random.fork_rng(devices=seeded_cuda_devices(), device_type="cuda"):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=stream)))
        yield rollout.with_backend(backend)
