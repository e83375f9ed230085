"""comlrl 1.4.3's call shapes of the trainers: their positional argument orders, its other
names of trainer arguments, and a REINFORCE variant given a plain ``MAGRPOConfig``. A call
written for it is turned here into keyword arguments and a config, with the meaning it had
there, before the trainer reads any.

1.4.3's MAGRPO, its variants, centralized MAGRPO, MADPO and MARLHF take
:data:`POSITIONAL_ORDER`; its IAC and MAAC take :data:`ACTOR_CRITIC_ORDER`, a different order.
Its ``CentralizedMAGRPOTrainer`` named the adapter ``centralized_adapter``, where MADPO and
MARLHF said ``centralized_comparator_adapter`` (the one name here); its docs named
``agent_model`` ``model``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

POSITIONAL_ORDER = (
    "agent_model",
    "agents",
    "num_agents",
    "tokenizer",
    "model_config",
    "train_dataset",
    "eval_dataset",
    "reward_func",
    "reward_processor",
    "formatters",
    "external_transition",
    "wandb_config",
    "eval_logger",
    "eval_aggregator",
    "args",
)
"""1.4.3's order of the MAGRPO family's, centralized MAGRPO's, MADPO's and MARLHF's arguments."""

ACTOR_CRITIC_ORDER = (
    "agent_model",
    "critic_model",
    "tokenizer",
    "reward_func",
    "reward_processor",
    "formatters",
    "args",
    "train_dataset",
    "eval_dataset",
    "model_config",
    "wandb_config",
    "metrics_callback",
    "external_transition",
    "agents",
    "critics",
)
"""1.4.3's order of IAC's and MAAC's arguments."""

RENAMED_ARGUMENTS = {"centralized_adapter": "centralized_comparator_adapter", "model": "agent_model"}
"""1.4.3's other names of a trainer argument -> ours (the same meaning). ``model`` is the name
its README and older pages used for ``agent_model`` (1.4.3 itself refused it: an unexpected
keyword)."""


def named_arguments(trainer_name: str, order: Sequence[str], positional: Sequence[Any], named: dict[str, Any]) -> dict:
    """Every argument of a call of ``trainer_name`` by name: ``positional`` ones in ``order``,
    1.4.3's other names as ours. Too many positional arguments, or one given twice, is the
    TypeError Python gives for such a call."""
    if len(positional) > len(order):
        raise TypeError(
            f"{trainer_name}() takes at most {len(order)} positional arguments ({', '.join(order)}), "
            f"but {len(positional)} were given"
        )
    result = dict(zip(order, positional))
    for name, value in named.items():
        name = RENAMED_ARGUMENTS.get(name, name)
        if name in result:
            raise TypeError(f"{trainer_name}() got multiple values for argument {name!r}")
        result[name] = value
    return result


def variant_config(config_class: type, trainer_name: str, args: Any) -> Any:
    """The config of a REINFORCE variant (``config_class``, e.g. ``MARLOOConfig``) from the
    plain ``MAGRPOConfig`` ``args`` 1.4.3 documented passing: the variant's ``advantage_mode``
    replaces the default ``"mean"``; every other field is kept as given
    (``advantage_normalization`` included). Another baseline is an error naming what to use."""
    mode = config_class.advantage_mode
    if args.advantage_mode not in ("mean", mode):
        raise ValueError(
            f"{trainer_name} uses advantage_mode={mode!r}, but its MAGRPOConfig says "
            f"advantage_mode={args.advantage_mode!r}: use MAGRPOTrainer for that baseline, "
            f"or a {config_class.__name__}"
        )
    values = {spec.name: getattr(args, spec.name) for spec in fields(args) if spec.init}
    return config_class(**{**values, "advantage_mode": mode})
