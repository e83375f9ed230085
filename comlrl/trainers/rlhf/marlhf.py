"""MARLHF: multi-agent RLHF. A joint reward model learns from pairs of the agents' own joint
actions ranked by the task reward; then one of comlrl's RL trainers trains the agents on the
reward model's scores.

    train() starts (seeded; a resumed run reads the reward model from its checkpoint instead):
        1. pairs, exactly as MADPO's: N candidates per prompt, task reward, strict wins, pair_selection
        2. the pairs of reward_eval_fraction of the prompts held out; a fresh JointRewardModel
           ─Bradley-Terry loss, AdamW, shuffled batches, reward_num_train_epochs─▶ fitted
        3. frozen, written to output_dir/reward_model/ (and into every checkpoint)
    4. the RL trainer of rl_algorithm (MAGRPO, MAREINFORCE, MAReMax, MARLOO, IAC, MAAC) runs its
       own loop: training rollouts scored by the reward model, evaluate() by the task reward
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from comlrl.algorithms.reward_model import bradley_terry_loss, pair_accuracy
from comlrl.checkpoint import write_folders
from comlrl.distributed import DataParallel
from comlrl.models.folders import check_model_source
from comlrl.models.loading import split_model_config
from comlrl.models.modes import disable_dropout
from comlrl.models.reward_model import JointRewardModel, RewardModelFunction, joint_reward_text
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.centralized import refuse_unused_adapter
from comlrl.trainers.config import TrainerConfig
from comlrl.trainers.config_checks import (
    check_bool,
    check_choice,
    check_int,
    check_learning_rate,
    field_default,
    is_real,
)
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.dpo.madpo import check_candidate_budget, raise_second_train, sample_preference_pairs
from comlrl.trainers.dpo.pairs import PreferencePair
from comlrl.trainers.loop import TrainResult
from comlrl.trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]

REWARD_MODEL_FOLDER = "reward_model"
"""Where the fitted reward model goes: in ``output_dir``, in every checkpoint, in ``save_model``'s folder."""

ONE_PROCESS = DataParallel()
"""No data parallelism, every collective a no-op: what the reward model is fitted on unless told otherwise."""

RL_ALGORITHM_ALIASES = {"mareforce": "mareinforce"}
"""comlrl 1.4.3's other spellings of ``rl_algorithm``."""

MAGRPO_BASELINES = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
"""The MAGRPO family's ``rl_algorithm`` -> its ``advantage_mode`` (what comlrl 1.4.3 forced)."""

ACTOR_CRITIC_FIELDS = (
    "critic_learning_rate",
    "critic_type",
    "use_separate_critic",
    "value_head_hidden_dim",
    "critic_value_head_hidden_dim",
    "critic_devices",
    "value_clip_range",
    "value_loss_coef",
    "ppo_epochs",
)
"""MARLHFConfig's fields passed to the IAC / MAAC config (the MAGRPO family has no critic)."""


@dataclass
class MARLHFConfig(MADPOConfig):
    """Everything that shapes a MARLHF run: MADPO's pair fields, the reward model's, and the
    RL phase's (the shared fields, and the critics' for ``iac`` / ``maac``). Every field is
    checked in ``__post_init__``."""

    num_train_epochs: int = 20
    """Passes of the RL phase over the training dataset."""
    per_device_train_batch_size: int = 2
    """Dataset rows per RL step; also the rows whose candidates are sampled together while pairs are built."""
    train_batch_size: int | None = None
    """Rows per optimizer step of the RL phase (at most ``per_device_train_batch_size``); None: one per rollout."""
    rl_algorithm: str = "magrpo"
    """The RL trainer of phase 4: ``magrpo``, ``mareinforce`` (1.4.3's alias ``mareforce``), ``maremax``,
    ``marloo`` (MAGRPO with those baselines), ``iac`` or ``maac`` (actor-critic)."""
    num_generations: int = 4
    """Completions per prompt and agent in the RL phase: >= 2 for the MAGRPO family, >= 1 for iac / maac."""
    advantage_mode: str | None = None
    """comlrl 1.4.3's field, which ``rl_algorithm`` sets: None, or that algorithm's baseline (mean, raw, max, rloo)."""
    advantage_normalization: bool | None = None
    """Scale the RL phase's advantages by the group std (MAGRPO family) or whiten them (iac / maac);
    None: that trainer's default (True for magrpo, iac, maac; False for the REINFORCE variants)."""

    # --- the reward model ---------------------------------------------------------------------
    reward_model_name: str | None = None
    """Folder or hub id of the reward model's transformer (its LM head is not loaded); None: the agents' model."""
    reward_model_device: str | None = None
    """Where the reward model lives; None: with agent 0 (the CPU on a machine without GPU)."""
    reward_learning_rate: float = 1e-5
    """AdamW learning rate of the reward model (its gradient clipped at ``max_grad_norm``, as the agents')."""
    reward_num_train_epochs: int = 1
    """Passes over the training pairs when fitting the reward model (shuffled each epoch)."""
    reward_train_batch_size: int = 1
    """Pairs per optimizer step of the reward model (both joint actions of a pair in one forward)."""
    reward_max_length: int | None = None
    """Reward-model inputs are truncated to this many tokens; None: the tokenizer's ``model_max_length``."""
    reward_freeze_backbone: bool = False
    """Fit the reward model's head only, its transformer frozen."""
    reward_eval_fraction: float = 0.1
    """Share in [0, 1) of the training prompts whose pairs are held out of the fit, to measure the
    reward model on prompts it never saw (``reward_model/eval_accuracy``); rounded down, 0: none."""

    # --- iac / maac: the critics -------------------------------------------------------------
    critic_model_name: str | None = None
    """Folder or hub id of the separate critics when the trainer gets no ``critic_model`` / ``critics``;
    None: maac (and iac with ``use_separate_critic=True``) load the agents' model."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critics; None: ``agent_learning_rate`` (comlrl 1.4.3's MARLHF)."""
    critic_type: str = "v"
    """``v``: the critic values the prompts; ``q``: the prompts and completions."""
    use_separate_critic: bool | None = None
    """iac: critics as separate models (True) or value heads on the agents (False); None: True
    with iac (comlrl 1.4.3's MARLHF default: critics loaded from ``critic_model`` / ``critics`` /
    ``critic_model_name``, else from the agents' model), set so in ``__post_init__``."""
    value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in value heads on the agents (iac); None: one linear map."""
    critic_value_head_hidden_dim: int | None = None
    """Width of a Tanh hidden layer in each separate critic's value head; None: one linear map."""
    critic_devices: str | list[str] | None = None
    """comlrl 1.4.3's critic placement: None, or the devices the critics live on anyway (with their agents)."""
    value_clip_range: float | None = 0.2
    """PPO's value clipping range; None: off."""
    value_loss_coef: float = 0.6
    """Weight of the value loss."""
    ppo_epochs: int = 2
    """Passes of iac / maac over each rollout."""

    train_batch_size_counts_rows = True  # the RL phase's rows, not pairs (MADPO's)
    unused_shared_fields: ClassVar[dict[str, str]] = {
        "dpo_beta": "MARLHF fits a reward model to the pairs, not the DPO loss",
        "dpo_reference": "MARLHF fits a reward model to the pairs, not the DPO loss",
        "turn_weighting": "MARLHF is single-turn",
    }
    trainer_name: ClassVar[str] = "MARLHF"

    def __post_init__(self):
        if isinstance(self.rl_algorithm, str):  # comlrl 1.4.3 took any letter case and an alias
            name = self.rl_algorithm.strip().lower()
            self.rl_algorithm = RL_ALGORITHM_ALIASES.get(name, name)
        super().__post_init__()
        check_choice(self, "rl_algorithm", RL_ALGORITHMS)
        self._resolve_separate_critic()
        family = self.rl_algorithm in MAGRPO_BASELINES
        if self.collaboration_mode == "centralized" and not family:
            raise ValueError(
                f"collaboration_mode='centralized' trains one model with centralized MAGRPO, whose baselines are "
                f"{sorted(MAGRPO_BASELINES)}; rl_algorithm={self.rl_algorithm!r} has critics per agent: choose one "
                "of those, or collaboration_mode='decentralized'"
            )
        if family and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 with rl_algorithm={self.rl_algorithm!r} (its baseline compares the "
                f"samples of a group), got {self.num_generations}; iac and maac take 1"
            )
        self._check_advantage_mode()
        if self.advantage_normalization is not None:
            check_bool(self, "advantage_normalization")
        self._check_reward_model_fields()
        for name in (*ACTOR_CRITIC_FIELDS, "critic_model_name"):
            value, default = getattr(self, name), field_default(self, name)
            if family and value != default:
                raise ValueError(
                    f"{name}={value!r} is a critic's setting, and rl_algorithm={self.rl_algorithm!r} has no critic: "
                    f"leave it at {default!r}, or choose rl_algorithm='iac' or 'maac'"
                )
        self.rl_config()  # the RL trainer's own checks, now rather than when the trainer is built

    def _resolve_separate_critic(self) -> None:
        """With iac, None is comlrl 1.4.3's MARLHF default, True: separate critic models (from
        the agents' model when no critic is named), never value heads unless asked for with
        ``use_separate_critic=False``. IACConfig's own None (separate only when a critic is
        given) would put value heads on the agents where a 1.4.3 script had critic models."""
        if self.rl_algorithm == "iac" and self.use_separate_critic is None:
            self.use_separate_critic = True

    def _check_advantage_mode(self) -> None:
        """comlrl 1.4.3's ``advantage_mode`` may only repeat what ``rl_algorithm`` chooses."""
        if self.advantage_mode is None:
            return
        wanted = MAGRPO_BASELINES.get(self.rl_algorithm)
        mode = self.advantage_mode.lower() if isinstance(self.advantage_mode, str) else self.advantage_mode
        if mode != wanted:
            has = f"uses {wanted!r}" if wanted else "has a critic, not a group baseline"
            raise ValueError(
                f"advantage_mode={self.advantage_mode!r}, but rl_algorithm={self.rl_algorithm!r} {has}: drop "
                f"advantage_mode; rl_algorithm chooses the baseline ({MAGRPO_BASELINES})"
            )
        self.advantage_mode = mode

    def _check_reward_model_fields(self) -> None:
        for name in ("reward_model_name", "critic_model_name"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be a folder or hub id (a non-empty str) or None, got {value!r}")
        device = self.reward_model_device
        if device is not None:
            try:
                self.reward_model_device = str(torch.device(device))
            except (RuntimeError, TypeError) as error:
                raise ValueError(
                    f"reward_model_device must be None (with agent 0) or a device such as 'cpu' or 'cuda:1', "
                    f"got {device!r}"
                ) from error
        check_learning_rate(self.reward_learning_rate, "reward_learning_rate")
        check_int(self, "reward_num_train_epochs")
        check_int(self, "reward_train_batch_size")
        check_int(self, "reward_max_length", allow_none=True)
        check_bool(self, "reward_freeze_backbone")
        fraction = self.reward_eval_fraction
        if not (is_real(fraction) and 0 <= fraction < 1):
            raise ValueError(f"reward_eval_fraction must be in [0, 1), got {fraction!r}")

    def rl_config(self) -> TrainerConfig:
        """The config of the RL trainer of ``rl_algorithm``: every shared field as set here, the
        critics' fields for iac / maac, and the advantage scaling when set; centralized, a
        :class:`CentralizedMAGRPOConfig` with that algorithm's baseline."""
        config_class = RL_ALGORITHMS[self.rl_algorithm].config_class
        values = {spec.name: getattr(self, spec.name) for spec in fields(TrainerConfig) if spec.init}
        if self.rl_algorithm not in MAGRPO_BASELINES:
            values.update({name: getattr(self, name) for name in ACTOR_CRITIC_FIELDS})
        if self.advantage_normalization is not None:
            values["advantage_normalization"] = self.advantage_normalization
        config = config_class(**values)
        if self.collaboration_mode == "centralized":
            magrpo = {spec.name: getattr(config, spec.name) for spec in fields(MAGRPOConfig) if spec.init}
            return CentralizedMAGRPOConfig(**magrpo)
        return config


# ----------------------------------------------------------------------------------------------
# phases 1-3: pairs, the reward model's fit, freezing it
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


class RewardModelStage:
    """MARLHF's phases 1-3, run when the RL trainer's ``train()`` starts (its ``prepare``), and
    the reward function of its training rollouts (``function``, raw reward-model scores).
    Under data parallelism every rank fits the same reward model together (the trainer's ranks)."""

    rounds_alternative = "MARLHFIterTrainer (a reward model fitted to fresh pairs of the current policy every round)"
    """What to use for a reward model of the trained policy, named in a second ``train()``'s error."""

    def __init__(self, args: MARLHFConfig, source: str, model_kwargs: dict[str, Any]):
        self.args = args
        self.source = source
        """The reward model's transformer: a folder or hub id."""
        self.model_kwargs = model_kwargs
        self.function = RewardModelFunction(None, args.micro_batch_size)
        """Scores the RL phase's joint actions once a reward model is fitted or read back."""
        self.pairs: list[PreferencePair] | None = None
        """The pairs the reward model was fitted to (None: not fitted in this process)."""
        self.comparator_adapter: Any = None
        """With one model per agent: the adapter of a comparator that writes every agent's part
        (MARLHFIter's ``comparator_generation_mode="centralized"``)."""

    @property
    def reward_model(self) -> JointRewardModel | None:
        return self.function.model

    def prepare(self, trainer: Any, checkpoint: str | None) -> dict[str, float]:
        """The reward model: read from ``checkpoint`` when resuming (by every rank), else
        fitted now (a second ``train()`` is refused before it gets here: see
        :meth:`RewardModelTraining.train`); returns the metrics of pairs and fit."""
        if checkpoint is not None:
            folder = os.path.join(checkpoint, REWARD_MODEL_FOLDER)
            if not os.path.isdir(folder):
                raise ValueError(
                    f"checkpoint {checkpoint} holds no {REWARD_MODEL_FOLDER}/: it was not written by MARLHFTrainer"
                )
            model = JointRewardModel.load(folder, self.device(trainer), self.model_kwargs)
            self.function.model = frozen_model(model)
            return {}
        return self.fit(trainer)

    def device(self, trainer: Any) -> str | torch.device:
        """Where the reward model lives: ``reward_model_device``, else with ``trainer``'s agent 0."""
        return self.args.reward_model_device or trainer.agents.device(0)

    def fit(self, trainer: Any) -> dict[str, float]:
        """Phases 1-3: pairs from ``trainer``'s policy and task reward, a fresh reward model
        fitted to them (less the held-out prompts'), frozen and written to ``output_dir``."""
        pairs, metrics = sample_preference_pairs(trainer, self.args, "MARLHF")
        seed = self.args.seed
        return {**metrics, **self.fit_pairs(trainer, pairs, seeded(seed), seeded(seed + 1))}

    def fit_pairs(
        self,
        trainer: Any,
        pairs: list[PreferencePair],
        held_out_draw: torch.Generator,
        batch_order: torch.Generator,
    ) -> dict[str, float]:
        """A fresh reward model fitted to ``pairs`` less those of the prompts held out (drawn
        from ``held_out_draw``; batches in an order drawn from ``batch_order``), frozen, used
        by ``function`` and written to ``output_dir`` (by rank 0); returns the fit's metrics.
        Every rank of ``trainer`` holds the same ``pairs`` and generators, and they fit one
        model together."""
        args, parallel = self.args, trainer.parallel
        self.pairs = pairs
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        held_out = held_out_rows([pair.row for pair in self.pairs], args.reward_eval_fraction, held_out_draw)
        train_pairs = [pair for pair in self.pairs if pair.row not in held_out]
        eval_pairs = [pair for pair in self.pairs if pair.row in held_out]
        model = self.fresh_reward_model(self.device(trainer))
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
        self.function.model = frozen_model(model)
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
            write_folders(trainer.output_dir, [(REWARD_MODEL_FOLDER, model.save)])
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

    def write(self, folder: str) -> None:
        self.reward_model.save(folder)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def frozen_model(model: JointRewardModel) -> JointRewardModel:
    """Phase 3: the reward model in eval mode, no weight trainable."""
    return model.eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------
# phase 4: an RL trainer trained on the reward model
# ----------------------------------------------------------------------------------------------
class RewardModelTraining:
    """Makes one of comlrl's RL trainers MARLHF's phase 4: its ``prepare`` (when ``train()``
    starts) runs phases 1-3, its training rollouts are scored by the reward model, and the
    reward model is written beside the agents (checkpoints, ``save_model``)."""

    def __init__(self, *args: Any, stage: RewardModelStage, **kwargs: Any):
        self.stage = stage
        self.algorithm_name = f"{stage.args.trainer_name}-{stage.args.rl_algorithm.upper()}"
        super().__init__(*args, train_reward_func=stage.function, **kwargs)

    train_started = False
    """Whether ``train()`` was called on this trainer."""

    def start_training(self, resume_from_checkpoint: bool | str | None) -> None:
        """Once per trainer, unless resuming a checkpoint: a second ``train()`` would train on
        the first call's reward model, not on one fitted to new pairs of the trained policy as
        comlrl 1.4.3's did, so it is an error (:func:`raise_second_train`), raised before
        ``overwrite_output_dir`` clears anything (``output_dir/reward_model/`` included)."""
        stage = self.stage
        if not resume_from_checkpoint and self.train_started:
            raise_second_train(
                f"{stage.args.trainer_name}Trainer", "preference pairs and reward model", stage.rounds_alternative
            )
        self.train_started = True

    def prepare(self, checkpoint: str | None) -> dict[str, float]:
        return {**super().prepare(checkpoint), **self.stage.prepare(self, checkpoint)}

    def model_writers(self, merge_adapters: bool = False) -> list:
        writers = super().model_writers(merge_adapters)
        if self.stage.reward_model is not None:
            writers.append((REWARD_MODEL_FOLDER, self.stage.write))
        return writers


class MAGRPOOnRewardModel(RewardModelTraining, MAGRPOTrainer):
    """MAGRPO, or one of its REINFORCE variants (by its config), on a reward model."""


class CentralizedMAGRPOOnRewardModel(RewardModelTraining, CentralizedMAGRPOTrainer):
    """Centralized MAGRPO (or a REINFORCE variant, by its config's baseline) on a reward model
    that reads the joint prompt and the one model's joint response."""


class IACOnRewardModel(RewardModelTraining, IACTrainer):
    """IAC on a reward model."""


class MAACOnRewardModel(RewardModelTraining, MAACTrainer):
    """MAAC on a reward model."""


class RLAlgorithm(NamedTuple):
    """What ``rl_algorithm`` names: the RL trainer of phase 4 and its config class."""

    trainer_class: type
    config_class: type[TrainerConfig]


RL_ALGORITHMS: dict[str, RLAlgorithm] = {
    "magrpo": RLAlgorithm(MAGRPOOnRewardModel, MAGRPOConfig),
    "mareinforce": RLAlgorithm(MAGRPOOnRewardModel, MAREINFORCEConfig),
    "maremax": RLAlgorithm(MAGRPOOnRewardModel, MAReMaxConfig),
    "marloo": RLAlgorithm(MAGRPOOnRewardModel, MARLOOConfig),
    "iac": RLAlgorithm(IACOnRewardModel, IACConfig),
    "maac": RLAlgorithm(MAACOnRewardModel, MAACConfig),
}
"""``rl_algorithm`` -> its RL trainer and config (the REINFORCE variants differ by config only)."""


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


class MARLHFTrainer:
    """Multi-Agent RLHF: a joint reward model fitted to preference pairs of the agents' own
    joint actions, then online RL on its scores (module docstring: the four phases).

    Arguments: those of :class:`~comlrl.trainers.preference.MADPOTrainer` (comlrl 1.4.3's
    order; ``args`` is a :class:`MARLHFConfig`), plus, for ``rl_algorithm`` iac / maac, those
    of :class:`~comlrl.trainers.actor_critic.ActorCriticTrainer`: ``critic_model``,
    ``critics``, ``critic_tokenizer``. The agents, rewards, datasets and hooks go to the RL
    trainer, ``rl_trainer``, which owns them; ``train()``, ``evaluate()`` and ``save_model()``
    are its.

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

    config_class: type[MARLHFConfig] = MARLHFConfig
    algorithm_name = "MARLHF"
    stage_class: type[RewardModelStage] = RewardModelStage
    """Phases 1-3 (MARLHFIter: in rounds)."""
    rl_algorithms: dict[str, RLAlgorithm] = RL_ALGORITHMS
    """``rl_algorithm`` -> the RL trainer of phase 4 and its config."""
    centralized_rl_trainer: type = CentralizedMAGRPOOnRewardModel
    """The RL trainer of phase 4 with ``collaboration_mode="centralized"`` (its config has the baseline)."""

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
        reward_processor: Any = None,
        formatters: Any = None,
        external_transition: Any = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Any = None,
        eval_aggregator: Any = None,
        args: MARLHFConfig | None = None,
        *,
        peft_config: Any = None,
        metrics_callback: Any = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        critic_tokenizer: Any = None,
        centralized_comparator_adapter: Any = None,
    ):
        if args is None:
            args = self.config_class()
        if not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}")
        self.args = args
        source = model_name(args.reward_model_name, agent_model, agents, "reward_model_name")
        self.stage = self.stage_class(
            args,
            check_model_source(source, "reward_model_name"),
            split_model_config(model_config).model_kwargs,
        )
        kwargs: dict[str, Any] = {}
        if args.rl_algorithm in MAGRPO_BASELINES:
            for name, value in (
                ("critic_model", critic_model),
                ("critics", critics),
                ("critic_tokenizer", critic_tokenizer),
            ):
                if value is not None:
                    raise ValueError(
                        f"{name} is given, but rl_algorithm={args.rl_algorithm!r} has no critic: "
                        "drop it, or choose rl_algorithm='iac' or 'maac'"
                    )
        else:
            kwargs = dict(
                critic_model=self.critic_source(critic_model, critics, agent_model, agents),
                critics=critics,
                critic_tokenizer=critic_tokenizer,
            )
        trainer_class = self.rl_algorithms[args.rl_algorithm].trainer_class
        if args.collaboration_mode == "centralized":
            trainer_class = self.centralized_rl_trainer
            kwargs = {"centralized_adapter": centralized_comparator_adapter}
        else:
            refuse_unused_adapter(centralized_comparator_adapter, args)
            self.stage.comparator_adapter = centralized_comparator_adapter
        self.rl_trainer = trainer_class(
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            args=args.rl_config(),
            peft_config=peft_config,
            metrics_callback=metrics_callback,
            stage=self.stage,
            **kwargs,
        )
        """The RL trainer of phase 4, which owns the agents and runs the loop."""
        check_candidate_budget(args, self.num_agents)

    def critic_source(self, critic_model: Any, critics: Any, agent_model: Any, agents: Any) -> Any:
        """The separate critics' model: ``critic_model`` or ``critics`` as given, else
        ``critic_model_name``, else, where a separate critic is needed (maac; iac unless
        ``use_separate_critic=False``, as comlrl 1.4.3's), the agents' model; None: value heads
        on the agents (iac with ``use_separate_critic=False``)."""
        args = self.args
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

    # ----------------------------------------------------------------------------------------
    # the RL trainer's
    # ----------------------------------------------------------------------------------------
    def train(
        self,
        resume_from_checkpoint: bool | str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int | None = None,
        checkpoint_total_limit: int | None = None,
    ) -> TrainResult:
        """Phases 1-4 (see :meth:`MultiAgentTrainer.train <comlrl.trainers.base.MultiAgentTrainer.train>`
        for the arguments); the pairs' and the reward model's metrics are logged at step 0.
        Once per trainer, unless resuming a checkpoint: a second call is an error, since the
        reward model came from the policy before the first call (comlrl 1.4.3 fitted a new one)."""
        return self.rl_trainer.train(
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit
        )

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The agents on ``eval_dataset`` with the task reward (see the RL trainer's ``evaluate``)."""
        return self.rl_trainer.evaluate(num_eval_samples)

    def save_model(self, output_dir: str, merge_adapters: bool = False) -> list[str]:
        """``output_dir/agent_{i}/`` (and the critics), and ``reward_model/`` once fitted."""
        return self.rl_trainer.save_model(output_dir, merge_adapters)

    @property
    def agents(self) -> Any:
        return self.rl_trainer.agents

    @property
    def num_agents(self) -> int:
        return self.rl_trainer.num_agents

    @property
    def global_step(self) -> int:
        return self.rl_trainer.global_step

    @property
    def output_dir(self) -> str | None:
        """The folder of the latest ``train()`` call's run (the RL trainer's)."""
        return self.rl_trainer.output_dir

    @property
    def parallel(self) -> DataParallel:
        """This process's place among the torchrun ranks (the RL trainer's)."""
        return self.rl_trainer.parallel

    @property
    def reward_model(self) -> JointRewardModel | None:
        """The fitted (or read back) reward model; None before ``train()``."""
        return self.stage.reward_model

    @property
    def pairs(self) -> list[PreferencePair] | None:
        """The preference pairs the reward model was fitted to in this process."""
        return self.stage.pairs
