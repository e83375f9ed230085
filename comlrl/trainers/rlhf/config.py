"""MARLHF's config: MADPO's pair fields, the reward model's, and the RL phase's (the shared
fields, and the critics' for ``iac`` / ``maac``); :meth:`MARLHFConfig.rl_config` is the
config the RL phase runs with."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from comlrl.compat.spellings import RL_ALGORITHM_ALIASES
from comlrl.engine.config import TrainerConfig
from comlrl.engine.config_checks import check_bool, check_choice, check_int, check_learning_rate
from comlrl.engine.policy_gradient_config import PolicyGradientConfig
from comlrl.trainers.actor_critic.config import IACConfig, MAACConfig
from comlrl.trainers.dpo.config import MADPOConfig
from comlrl.trainers.reinforce.centralized import CentralizedMAGRPOConfig
from comlrl.trainers.reinforce.config import MAGRPOConfig
from comlrl.trainers.reinforce.variants import MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl.utils.checks import field_default, is_real
from comlrl.utils.config_fields import respell

__all__ = ["MARLHFConfig"]

MAGRPO_BASELINES = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
"""The MAGRPO family's ``rl_algorithm`` -> its ``advantage_mode`` (what comlrl 1.4.3 forced)."""

RL_CONFIGS: dict[str, type[TrainerConfig]] = {
    "magrpo": MAGRPOConfig,
    "mareinforce": MAREINFORCEConfig,
    "maremax": MAReMaxConfig,
    "marloo": MARLOOConfig,
    "iac": IACConfig,
    "maac": MAACConfig,
}
"""``rl_algorithm`` -> the config of its RL phase (the REINFORCE variants differ by config only)."""

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
class MARLHFConfig(MADPOConfig, PolicyGradientConfig):
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
        if isinstance(self.rl_algorithm, str):  # any letter case, as the original library took
            self.rl_algorithm = self.rl_algorithm.strip().lower()
        respell(self, "rl_algorithm", RL_ALGORITHM_ALIASES)
        super().__post_init__()
        check_choice(self, "rl_algorithm", RL_CONFIGS)
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
            if isinstance(value, os.PathLike):  # a pathlib.Path names a folder as a str does
                value = os.fspath(value)
                setattr(self, name, value)
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
        config_class = RL_CONFIGS[self.rl_algorithm]
        values = {spec.name: getattr(self, spec.name) for spec in fields(PolicyGradientConfig) if spec.init}
        if self.rl_algorithm not in MAGRPO_BASELINES:
            values.update({name: getattr(self, name) for name in ACTOR_CRITIC_FIELDS})
        if self.advantage_normalization is not None:
            values["advantage_normalization"] = self.advantage_normalization
        config = config_class(**values)
        if self.collaboration_mode == "centralized":
            magrpo = {spec.name: getattr(config, spec.name) for spec in fields(MAGRPOConfig) if spec.init}
            return CentralizedMAGRPOConfig(**magrpo)
        return config
