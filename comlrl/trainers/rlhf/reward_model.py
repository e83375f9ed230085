"""MARLHF's reward model: fitted to preference pairs of the agents' own joint actions, frozen,
and the reward source of the RL phase.

    train() starts (seeded; a resumed run reads the reward model from its checkpoint instead):
        1. pairs, exactly as MADPO's: N candidates per prompt, task reward, strict wins, pair_selection
        2. the pairs of reward_eval_fraction of the prompts held out; a fresh JointRewardModel
           ─Bradley-Terry loss, AdamW, shuffled batches, reward_num_train_epochs─▶ fitted
        3. frozen, written to output_dir/reward_model/ (and into every checkpoint)
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from comlrl.algorithms.reward_model import bradley_terry_loss, pair_accuracy
from comlrl.checkpoint import write_folders
from comlrl.engine.distributed import DataParallel
from comlrl.engine.inputs import TrainerInputs
from comlrl.engine.parts import MadeOnce, RewardSource, Writer
from comlrl.engine.run import RewardMaker, Run
from comlrl.models.modes import disable_dropout
from comlrl.models.reward_model import JointRewardModel, RewardModelFunction, joint_reward_text
from comlrl.rewards import JointReward
from comlrl.trainers.dpo.candidates import check_candidate_budget, sample_preference_pairs
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.trainers.rlhf.config import MARLHFConfig

REWARD_MODEL_FOLDER = "reward_model"
"""Where the fitted reward model goes: in ``output_dir``, in every checkpoint, in ``save_model``'s folder."""

ONE_PROCESS = DataParallel()
"""No data parallelism, every collective a no-op: what the reward model is fitted on unless told otherwise."""


# ----------------------------------------------------------------------------------------------
def held_out_rows(rows: Sequence[int], fraction: float, generator: torch.Generator) -> set[int]:
    """``floor(fraction * len(rows))`` of the distinct ``rows``, drawn from ``generator``: the
    prompts whose pairs the reward model never trains on."""
    distinct = sorted(set(rows))
    count = math.floor(fraction * len(distinct))
    return {distinct[k] for k in torch.randperm(len(distinct), generator=generator)[:count].tolist()}


def pair_texts(pairs: Sequence[PreferencePair]) -> list[str]:
    """The reward model's inputs: every pair's chosen joint action, then every pair's rejected one."""
    chosen = [joint_reward_text(pair.prompts, pair.chosen_texts) for pair in pairs]
    return chosen + [joint_reward_text(pair.prompts, pair.rejected_texts) for pair in pairs]


class PairScores(NamedTuple):
    """A reward model's Bradley-Terry loss and ranking accuracy on some pairs."""

    loss: float
    accuracy: float


def scored_share(
    score: Callable[[list[str]], Tensor], share: Sequence[PreferencePair], batch_pairs: int
) -> tuple[Tensor, float]:
    """The Bradley-Terry loss (with the graph ``score`` built) and accuracy of ``share``, one
    rank's share of a batch of ``batch_pairs`` pairs, each weighted by the share's part of the
    batch, so that the ranks' add up to the batch's mean (one process: a weight of exactly 1,
    the batch's mean itself). An empty share (a batch of fewer pairs than ranks) scores 0."""
    if not share:
        return torch.zeros(()), 0.0
    weight = len(share) / batch_pairs
    chosen, rejected = score(pair_texts(share)).chunk(2)
    accuracy = pair_accuracy(chosen.detach(), rejected.detach()).item()
    return bradley_terry_loss(chosen, rejected) * weight, accuracy * weight


def fit_reward_model(
    model: JointRewardModel,
    pairs: Sequence[PreferencePair],
    epochs: int,
    batch_size: int,
    learning_rate: float,
    max_grad_norm: float | None,
    generator: torch.Generator,
    parallel: DataParallel = ONE_PROCESS,
) -> PairScores:
    """Fit ``model`` to ``pairs`` with the Bradley-Terry loss: AdamW, ``batch_size`` pairs per
    step in a new order each epoch (drawn from ``generator``). Returns the loss and accuracy
    averaged over the last epoch's batches, as they were fitted.

    Under data parallelism (``parallel``) every rank holds all the pairs and ``generator``'s
    state: each computes the loss of its share of every batch, the gradients are summed over
    the ranks and every rank takes the same step from rank 0's weights, so all of them hold
    the model one process fits; the metrics are summed over the ranks into one process's."""
    trainable = model.trainable_parameters()
    # Weights a checkpoint lacks are initialised at random, differently on each rank.
    parallel.broadcast_parameters(model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(pairs), generator=generator).tolist()
        losses, accuracies = [], []
        batches = tqdm(
            range(0, len(pairs), batch_size),
            desc=f"MARLHF reward model {epoch + 1}/{epochs}",
            unit="step",
            dynamic_ncols=True,
            disable=not parallel.is_main,
        )
        for first in batches:
            batch = [pairs[k] for k in order[first : first + batch_size]]
            share = parallel.shard(batch)
            loss, accuracy = scored_share(model.scores, share, len(batch))
            optimizer.zero_grad()
            if share:  # an empty share adds no gradient
                loss.backward()
            parallel.sum_gradients(trainable)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            accuracies.append(accuracy)
    return PairScores(*parallel.sum_values([sum(losses) / len(losses), sum(accuracies) / len(accuracies)]))


def score_pairs(
    model: JointRewardModel,
    pairs: Sequence[PreferencePair],
    batch_size: int | None,
    parallel: DataParallel = ONE_PROCESS,
) -> PairScores:
    """``model``'s loss and accuracy on ``pairs``, without training it; under data parallelism
    each rank scores its share of the pairs, and every rank gets the loss and accuracy of all."""
    loss, accuracy = scored_share(
        functools.partial(model.score_texts, batch_size=batch_size), parallel.shard(list(pairs)), len(pairs)
    )
    return PairScores(*parallel.sum_values([loss.item(), accuracy]))


class ServedRewardModel(RewardModelFunction):
    """The reward function of the RL phase: whichever reward model the reward source has
    fitted or read back, swapped in place (the training reward holds this one function)."""

    def use(self, model: JointRewardModel | None) -> None:
        """Score with ``model`` from now on (None: no reward model, as before the first fit)."""
        self.model = model


class FittedRewardModel(RewardSource):
    """MARLHF's reward source: phases 1-3, run when ``train()`` starts (``prepare``), give the
    reward function of the training rollouts (``function``, raw reward-model scores; no
    ``reward_processor``, no ``reward_weights``). Under data parallelism every rank fits the
    same reward model together (the run's ranks).

    Args:
        args: the MARLHF config (pairs and reward-model fields).
        source: the reward model's transformer: a folder or hub id.
        model_kwargs: its ``from_pretrained`` keyword arguments (the agents').
    """

    made_once = MadeOnce(
        "preference pairs and reward model",
        "MARLHFIterTrainer (a reward model fitted to fresh pairs of the current policy every round)",
    )

    run: Run
    """The run whose policy makes the pairs (from :meth:`attach`)."""

    def __init__(self, args: MARLHFConfig, source: str, model_kwargs: dict[str, Any]):
        self.args = args
        self.source = source
        self.model_kwargs = model_kwargs
        self.function = ServedRewardModel(None, args.micro_batch_size)
        """Scores the RL phase's joint actions once a reward model is fitted or read back."""
        self.pairs: list[PreferencePair] | None = None
        """The pairs the reward model was fitted to (None: not fitted in this process)."""

    @property
    def reward_model(self) -> JointRewardModel | None:
        return self.function.model

    def attach(self, run: Run, inputs: TrainerInputs) -> None:
        self.run = run
        check_candidate_budget(self.args, run.num_agents)

    def training_reward(self, inputs: TrainerInputs, task_reward: JointReward, make_reward: RewardMaker) -> JointReward:
        return make_reward(self.function, call="batch")

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        """The reward model: read from ``checkpoint`` when resuming (by every rank), else
        fitted now; returns the metrics of pairs and fit."""
        if checkpoint is not None:
            folder = os.path.join(checkpoint, REWARD_MODEL_FOLDER)
            if not os.path.isdir(folder):
                raise ValueError(
                    f"checkpoint {checkpoint} holds no {REWARD_MODEL_FOLDER}/: it was not written by MARLHFTrainer"
                )
            model = JointRewardModel.load(folder, self.device(), self.model_kwargs)
            self.function.use(frozen_model(model))
            return {}
        return self.fit()

    def device(self) -> str | torch.device:
        """Where the reward model lives: ``reward_model_device``, else with the run's agent 0."""
        return self.args.reward_model_device or self.run.agents.device(0)

    def fit(self) -> dict[str, float]:
        """Phases 1-3: pairs from the run's policy and task reward, a fresh reward model
        fitted to them (less the held-out prompts'), frozen and written to ``output_dir``."""
        pairs, metrics = sample_preference_pairs(self.run, self.args, "MARLHF")
        seed = self.args.seed
        return {**metrics, **self.fit_pairs(pairs, seeded(seed), seeded(seed + 1))}

    def fit_pairs(
        self,
        pairs: list[PreferencePair],
        held_out_draw: torch.Generator,
        batch_order: torch.Generator,
    ) -> dict[str, float]:
        """A fresh reward model fitted to ``pairs`` less those of the prompts held out (drawn
        from ``held_out_draw``; batches in an order drawn from ``batch_order``), frozen, used
        by ``function`` and written to ``output_dir`` (by rank 0); returns the fit's metrics.
        Every rank of the run holds the same ``pairs`` and generators, and they fit one
        model together."""
        args, parallel = self.args, self.run.parallel
        self.pairs = pairs
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        held_out = held_out_rows([pair.row for pair in self.pairs], args.reward_eval_fraction, held_out_draw)
        train_pairs = [pair for pair in self.pairs if pair.row not in held_out]
        eval_pairs = [pair for pair in self.pairs if pair.row in held_out]
        model = self.fresh_reward_model(self.device())
        fitted = fit_reward_model(
            model,
            train_pairs,
            args.reward_num_train_epochs,
            args.reward_train_batch_size,
            args.reward_learning_rate,
            args.max_grad_norm,
            batch_order,
            parallel,
        )
        self.function.use(frozen_model(model))
        metrics.update(
            {
                "reward_model/loss": fitted.loss,
                "reward_model/accuracy": fitted.accuracy,
                "reward_model/train_pairs": float(len(train_pairs)),
                "reward_model/eval_pairs": float(len(eval_pairs)),
            }
        )
        if eval_pairs:
            held = score_pairs(model, eval_pairs, args.micro_batch_size, parallel)
            metrics.update({"reward_model/eval_loss": held.loss, "reward_model/eval_accuracy": held.accuracy})
        metrics["time/reward_model_s"] = time.perf_counter() - started
        if parallel.is_main:
            write_folders(self.run.state.output_dir, [(REWARD_MODEL_FOLDER, model.save)])
        return metrics

    def fresh_reward_model(self, device: str | torch.device) -> JointRewardModel:
        """A reward model to fit, on ``device``: ``source``'s transformer (without dropout when
        the config says so) and a head at zero."""
        args = self.args
        model = JointRewardModel.from_pretrained(
            self.source, args.reward_freeze_backbone, args.reward_max_length, self.model_kwargs, device
        )
        if args.disable_dropout:
            disable_dropout(model)
        return model

    def writers(self) -> list[Writer]:
        """``reward_model/`` beside the agents, once fitted."""
        return [] if self.reward_model is None else [(REWARD_MODEL_FOLDER, self.reward_model.save)]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def frozen_model(model: JointRewardModel) -> JointRewardModel:
    """Phase 3: the reward model in eval mode, no weight trainable."""
    return model.eval().requires_grad_(False)
