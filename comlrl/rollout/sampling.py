"""One sampling specification per run, built from the config and frozen.

Generation, the temperature of the policy's log-probs and every loss constant that depends
on sampling (``dr_grpo``'s ``max_new_tokens``) read the same :class:`SamplingSpec`, so they
cannot disagree. ``generation_kwargs`` may add settings the config does not have (e.g.
``min_new_tokens``, ``repetition_penalty``, a logits processor) but never shadow one it has.
They are checked before the first ``generate``, which would otherwise be the first to fail on
them, many frames down: their values (types, transformers' ``GenerationConfig.validate``) when
the config is made, their names (which need the model's inputs) when the trainer is built.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from comlrl.utils.text import number_string_error

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


GENERATE_MODE_ARGUMENTS = ("tokenizer", "assistant_tokenizer", "trust_remote_code")
"""``generate`` arguments it takes through ``**kwargs`` rather than by name (``stop_strings``
needs the ``tokenizer``)."""

ALSO_ALLOWED = {"early_stopping": ("never",)}
"""``GenerationConfig`` fields that take a string besides their default's type."""

TYPES_WITHOUT_DEFAULT = {"min_new_tokens": int, "min_p": float, "max_time": float}
"""Types of the numeric ``GenerationConfig`` fields most often set here that have no default to read a type from."""

TYPE_NAMES = {bool: "True or False", int: "an integer", float: "a number"}
"""How errors name each type."""


@functools.cache
def generation_defaults() -> dict[str, Any]:
    """Every ``GenerationConfig`` field -> transformers' default: the field's own, or (in
    transformers 5, where every field starts as None) the default ``generate`` fills in."""
    from transformers import GenerationConfig

    config = GenerationConfig()
    fallback = getattr(config, "_get_default_generation_params", dict)()
    return {
        name: fallback.get(name) if value is None else value
        for name, value in vars(config).items()
        if not name.startswith("_") and name != "transformers_version"
    }


@functools.cache
def generate_arguments() -> frozenset[str]:
    """What ``generate`` takes besides ``GenerationConfig`` fields and model inputs: its named
    arguments (``logits_processor``, ``stopping_criteria``, ``prefix_allowed_tokens_fn``, ...)."""
    from transformers import GenerationMixin

    named = set(inspect.signature(GenerationMixin.generate).parameters) - {"self", "inputs", "kwargs"}
    return frozenset(named | set(GENERATE_MODE_ARGUMENTS))


def expected_type(key: str) -> type | None:
    """The type ``generation_kwargs[key]`` must have: its ``GenerationConfig`` default's when
    that is a bool, an int or a float (None: any)."""
    default = generation_defaults().get(key)
    for kind in (bool, int, float):  # bool first: a bool is an int too
        if isinstance(default, kind):
            return kind
    return TYPES_WITHOUT_DEFAULT.get(key)


def has_type(value: Any, kind: type) -> bool:
    """``value`` is a ``kind``; an integer is also a float, a bool is neither."""
    if kind is bool:
        return isinstance(value, bool)
    number = numbers.Integral if kind is int else numbers.Real
    return isinstance(value, number) and not isinstance(value, bool)


def check_generation_value(key: str, value: Any) -> None:
    """``generation_kwargs[key]`` must have the type of its ``GenerationConfig`` default
    (``None``, transformers' "unset", is always allowed): ``generate`` would otherwise fail at
    the first step with a ``TypeError`` deep inside it (``num_beams="x"``)."""
    kind = expected_type(key)
    if value is None or kind is None or has_type(value, kind):
        return
    if isinstance(value, str) and value in ALSO_ALLOWED.get(key, ()):
        return
    name = f"generation_kwargs[{key!r}]"
    if isinstance(value, str) and kind is not bool:
        raise number_string_error(name, value, integer=kind is int)
    also = "".join(f" or {choice!r}" for choice in ALSO_ALLOWED.get(key, ()))
    raise ValueError(
        f"{name} must be {TYPE_NAMES[kind]}{also}, as transformers' GenerationConfig takes it, got {value!r} "
        f"({type(value).__name__})"
    )


def check_generation_kwargs(kwargs: Mapping[str, Any], config_name: str = "the config") -> None:
    """Refuse ``generation_kwargs`` keys that would shadow a config field, naming the field,
    and values of the wrong type, naming the key. Which keys ``generate`` knows depends on the
    model (its inputs): :func:`check_generation_names` checks them when the trainer is built."""
    for key, value in kwargs.items():
        if key in SHADOWED:
            raise shadowed_error(key, config_name)
        check_generation_value(key, value)


def shadowed_error(key: str, config_name: str) -> ValueError:
    """The error for ``generation_kwargs[key]``, a setting the trainer makes itself."""
    instead = SHADOWED[key]
    if instead is None:
        return ValueError(f"generation_kwargs may not set {key!r}: the trainer passes the prompts itself")
    return ValueError(
        f"generation_kwargs[{key!r}] shadows a setting the trainer uses for sampling, the log-probs and the "
        f"loss; set {instead} on {config_name} instead"
    )


def check_with_generation_config(sampling: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    """transformers' own checks of ``sampling`` (``generate``'s keyword arguments, ``extra``
    the user's among them): ``GenerationConfig.validate``, strict where the installed
    transformers has it (a setting it would ignore is an error too), now rather than at the
    first ``generate``. The error names the user's keys it is about."""
    from transformers import GenerationConfig

    settings = {key: value for key, value in sampling.items() if key in generation_defaults()}
    if not set(settings) & set(extra):
        return  # the config's own fields are checked by the config
    strict = {"strict": True} if "strict" in inspect.signature(GenerationConfig.validate).parameters else {}
    try:
        GenerationConfig(**settings).validate(**strict)
    except (ValueError, TypeError) as error:
        named = [key for key in extra if f"`{key}`" in str(error)] or sorted(set(settings) & set(extra))
        fixed = {key: value for key, value in settings.items() if key not in extra}
        them = "it" if len(named) == 1 else "them"
        raise ValueError(
            f"{', '.join(f'generation_kwargs[{key!r}]' for key in named)}: transformers' GenerationConfig refuses "
            f"{them} with the trainer's sampling settings {fixed}; change or drop {them}. {error}"
        ) from None


def check_generation_names(kwargs: Mapping[str, Any], models: Sequence[Any]) -> None:
    """Every ``generation_kwargs`` key must be something ``generate`` uses: a ``GenerationConfig``
    field, one of ``generate``'s own arguments, or an input every agent's model takes (as
    transformers checks it, at the first ``generate``, in ``_validate_model_kwargs``)."""
    known = generation_defaults().keys() | generate_arguments()
    for key in kwargs:
        if key in known:
            continue
        for agent, model in enumerate(models):
            validate = getattr(model, "_validate_model_kwargs", None)
            if validate is None:  # not a transformers model: generate is its own
                continue
            try:
                validate({key: kwargs[key]})
            except ValueError:
                raise unknown_generation_key_error(key, agent) from None


def unknown_generation_key_error(key: str, agent: int) -> ValueError:
    """The error for ``generation_kwargs[key]``, which nothing ``generate`` reads takes."""
    close = difflib.get_close_matches(key, sorted(generation_defaults().keys() | generate_arguments()), n=1)
    return ValueError(
        f"generation_kwargs[{key!r}] is not a generate() setting: no field of transformers' GenerationConfig, "
        f"none of generate's own arguments ({', '.join(sorted(generate_arguments()))}), and no input of agent "
        f"{agent}'s model" + (f"; did you mean {close[0]!r}?" if close else "; drop it")
    )


class SamplingSettings(Protocol):
    """The sampling fields of a trainer config."""

    temperature: float
    top_p: float
    top_k: int | None
    max_new_tokens: int
    generation_kwargs: Mapping[str, Any]


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
        # A greedy spec is made from a sampled one (greedy()), checked already: strict checks of
        # greedy settings would refuse sampling-only ones (min_p, typical_p) evaluation just ignores.
        if self.do_sample:
            check_with_generation_config(self.generate_kwargs(), self.extra)
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @classmethod
    def from_config(cls, config: SamplingSettings) -> SamplingSpec:
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
