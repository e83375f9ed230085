"""Configuration of the MAGRPO trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from comlrl.algorithms import BASELINES, JOINT_MODES, LOSS_AGGREGATIONS


@dataclass
class MAGRPOConfig:
    """Everything that shapes a MAGRPO run. Every field is checked in ``__post_init__``."""

    # --- schedule -------------------------------------------------------------------------
    num_train_epochs: int = 20
    """Passes over the training dataset."""
    per_device_train_batch_size: int = 2
    """Dataset rows per optimizer step; all their prompts are generated in one batch
    (2 matches the original library's rollout buffer)."""
    shuffle: bool = True
    """Reshuffle the dataset rows at every epoch (seeded by ``seed``)."""
    seed: int = 42
    """Seeds Python, NumPy and torch (sampling and data order) at the start of ``train()``."""

    # --- optimisation ---------------------------------------------------------------------
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every agent."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip each agent's gradient to this global norm; ``None`` turns clipping off."""

    # --- sampling -------------------------------------------------------------------------
    num_generations: int = 4
    """Completions sampled per prompt and agent (the group size G)."""
    max_new_tokens: int = 256
    """Most tokens generated per completion."""
    temperature: float = 0.6
    """Sampling temperature (> 0; the policy's log-probs use the same temperature)."""
    top_p: float = 0.6
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int | None = 50
    """Sample among the k most likely tokens; ``None`` or 0 turns it off."""
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments forwarded to ``generate`` (e.g. ``{"min_new_tokens": 64}``)."""

    # --- multi-agent structure ------------------------------------------------------------
    num_turns: int = 1
    """Turns per episode. Only single-turn training is available in this release."""
    joint_mode: str = "aligned"
    """``aligned``: sample j of every agent forms joint action j (G joint actions);
    ``cross``: every combination of the agents' samples (G**N joint actions)."""

    # --- objective ------------------------------------------------------------------------
    advantage_mode: str = "mean"
    """Group baseline: ``mean`` (GRPO), ``rloo`` (leave-one-out), ``max`` (ReMax-style), ``raw`` (none)."""
    advantage_normalization: bool = True
    """Divide advantages by the group's reward std (never re-centres)."""
    loss_type: str = "dapo"
    """Token normalisation of the loss: ``dapo`` (mean over all tokens of the batch, the
    default: no length bias), ``grpo`` (per-sequence mean, then mean), ``dr_grpo`` (sum over
    ``num_sequences * max_new_tokens``)."""

    # --- output ---------------------------------------------------------------------------
    output_dir: str = "comlrl_output"
    """Where the run's metrics log (``metrics.jsonl``) is written."""
    logging_steps: int = 50
    """Write averaged metrics every this many optimizer steps."""

    def __post_init__(self):
        positive_ints = (
            "num_train_epochs",
            "per_device_train_batch_size",
            "num_generations",
            "max_new_tokens",
            "num_turns",
            "logging_steps",
        )
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("shuffle", "advantage_normalization"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not self.agent_learning_rate > 0:
            raise ValueError(f"agent_learning_rate must be > 0, got {self.agent_learning_rate!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (sampling is required), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0
        ):
            raise ValueError(f"top_k must be an integer >= 0 or None, got {self.top_k!r}")
        if not isinstance(self.generation_kwargs, dict):
            raise ValueError(f"generation_kwargs must be a dict, got {type(self.generation_kwargs).__name__}")
        reserved = {"input_ids", "attention_mask", "do_sample", "num_return_sequences"} & set(self.generation_kwargs)
        if reserved:
            raise ValueError(f"generation_kwargs may not set {sorted(reserved)}: the trainer controls them")
        if self.num_turns != 1:
            raise ValueError(
                f"num_turns={self.num_turns}: only single-turn training (num_turns=1) is available in this release"
            )
        choices = {"joint_mode": JOINT_MODES, "advantage_mode": BASELINES, "loss_type": LOSS_AGGREGATIONS}
        for name, table in choices.items():
            if getattr(self, name) not in table:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {sorted(table)}")
        needs_group = self.advantage_mode != "raw" or self.advantage_normalization
        if needs_group and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 with advantage_mode={self.advantage_mode!r} and "
                f"advantage_normalization={self.advantage_normalization} (a group of one has no "
                f"baseline or std), got {self.num_generations}"
            )
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ValueError(f"output_dir must be a non-empty path string, got {self.output_dir!r}")

    def sampling_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``generate`` this config implies."""
        kwargs = {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k or 0,
            "max_new_tokens": self.max_new_tokens,
        }
        kwargs.update(self.generation_kwargs)
        return kwargs
