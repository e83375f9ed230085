"""One sampling specification per run, built from the config and frozen.

Generation, the temperature of the policy's log-probs and every loss constant that depends
on sampling (``dr_grpo``'s ``max_new_tokens``) read the same :class:`SamplingSpec`, so they
cannot disagree. ``generation_kwargs`` may add settings the config does not have (e.g.
``min_new_tokens``, ``repetition_penalty``, a logits processor) but never shadow one it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SHADOWED = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_new_tokens": "max_new_tokens",
    "max_length": "max_new_tokens",
    "do_sample": "eval_do_sample (training always samples)",
    "num_return_sequences": "num_generations",
    "generation_config": "the config's sampling fields (temperature, top_p, top_k, max_new_tokens)",
    "input_ids": None,
    "attention_mask": None,
}
"""``generation_kwargs`` keys the trainer sets itself -> the config field to set instead
(None: the trainer's own input)."""


def check_generation_kwargs(kwargs: Mapping[str, Any], config_name: str = "the config") -> None:
    """Refuse ``generation_kwargs`` keys that would shadow a config field, naming the field."""
    for key in kwargs:
        if key not in SHADOWED:
            continue
        instead = SHADOWED[key]
        if instead is None:
            raise ValueError(f"generation_kwargs may not set {key!r}: the trainer passes the prompts itself")
        raise ValueError(
            f"generation_kwargs[{key!r}] shadows a setting the trainer uses for sampling, the log-probs and the "
            f"loss; set {instead} on {config_name} instead"
        )


@dataclass(frozen=True)
class SamplingSpec:
    """How completions are sampled; what the log-probs and the loss assume about them."""

    temperature: float
    """Sampling temperature; the policy's log-probs are taken at the same temperature."""
    top_p: float
    top_k: int | None
    """0: no top-k filter; None: the model's ``generation_config`` decides (transformers'
    default is 50), as comlrl 1.4.3 left it."""
    max_new_tokens: int
    """Most tokens per completion; ``dr_grpo``'s normaliser."""
    do_sample: bool = True
    """False: greedy decoding (evaluation only)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further ``generate`` keyword arguments (``generation_kwargs``), read-only."""

    def __post_init__(self) -> None:
        check_generation_kwargs(self.extra)
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @classmethod
    def from_config(cls, config: Any) -> SamplingSpec:
        """The training sampling of a trainer config (its ``generation_kwargs`` are checked
        again, in ``__post_init__``: the config may have changed since its own check)."""
        return cls(
            temperature=float(config.temperature),
            top_p=float(config.top_p),
            top_k=None if config.top_k is None else int(config.top_k),
            max_new_tokens=int(config.max_new_tokens),
            extra=config.generation_kwargs,
        )

    def greedy(self) -> SamplingSpec:
        """The same settings, decoded greedily."""
        return SamplingSpec(self.temperature, self.top_p, self.top_k, self.max_new_tokens, False, self.extra)

    def generate_kwargs(self) -> dict[str, Any]:
        """Hugging Face ``generate`` keyword arguments."""
        kwargs: dict[str, Any] = {"do_sample": self.do_sample, "max_new_tokens": self.max_new_tokens}
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p)
            if self.top_k is not None:
                kwargs["top_k"] = self.top_k
        kwargs.update(self.extra)
        return kwargs
