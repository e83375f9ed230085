"""comlrl 1.4.3's modules and public names that this library does not have, each with what to
use instead: importing one is an ImportError that says so, rather than Python's bare "No
module named" (the migration guide, "Migrating from comlrl 1.4.3", has the whole table).

Modules are caught by the finder of :mod:`comlrl.compat.paths`; names by the packages' module
``__getattr__``, which calls :func:`moved_name`.
"""

from __future__ import annotations

import dis
import sys
from typing import Any, NoReturn

_VALUE_HEADS = (
    "value heads are not a model class here: pass plain causal LMs as agents (and critics); IACTrainer "
    "and MAACTrainer add the heads (IACConfig(use_separate_critic=False) puts them on the agents, "
    "critic_value_head_hidden_dim sizes them) and still load 1.4.3's saved value_head.pt; "
    "CausalLMWithValueHead(model, value_head_hidden_dim=...).value_head is such a head"
)
_HELPER = (
    "one of its internal helpers: the trainers do that work themselves here (trainer arguments and "
    "config fields: see the migration guide)"
)

MOVED_MODULES = {
    "comlrl.trainers.preference.checkpointing": "checkpoints are written by train() (checkpoint_dir, "
    "checkpoint_interval) and read by train(resume_from_checkpoint=...); their files: comlrl.checkpoint",
    "comlrl.trainers.preference.collaboration": "centralized collaboration is collaboration_mode='centralized' "
    "with a CentralizedComparatorAdapter (comlrl.engine.centralized)",
    "comlrl.trainers.preference.output_paths": "preference files are written under the config's output_dir",
    "comlrl.utils.distributed": "several processes run under torchrun; comlrl.engine.distributed holds the data "
    "parallelism",
    "comlrl.utils.model_loading": "agents are loaded from agent_model= or agents=[names or models], with model_config",
    "comlrl.utils.reference_kl": "the KL to a reference is the config's reference_kl_enabled / reference_kl_coef "
    "(reward shaping, as 1.4.3) or beta (a loss term)",
    "comlrl.utils.wandb_utils": "W&B is configured by the trainer's wandb_config=",
}
"""1.4.3 module -> what to use instead."""

_UTILS_HELPERS = (
    "DistributedContext",
    "apply_tokenizer_specials",
    "clone_reference_models",
    "ensure_pad_token",
    "ensure_tokenizer",
    "infer_model_name",
    "load_reference_models_from_sources",
    "local_context",
    "normalize_reward_lengths",
    "reference_kl_coef",
    "reference_kl_enabled",
    "reference_kl_for_sequence",
    "resolve_model_sources",
    "resolve_reference_devices",
    "unwrap_model",
    "validate_reference_kl_config",
)

_TOKENIZERS = "tokenizers are passed as tokenizer= (one, or one per agent) or loaded with the agents"

MOVED_NAMES = {
    "comlrl.models": {"ValueHead": _VALUE_HEADS},
    "comlrl.models.actor_critic": {"ValueHead": _VALUE_HEADS},
    "comlrl.trainers.reinforce.magrpo": {
        "NodeSample": "a step's rollout is a tree of turns: comlrl.rollout.tree (RolloutTree, Turn)"
    },
    "comlrl.utils": {name: _HELPER for name in _UTILS_HELPERS},
    "comlrl.utils.checkpoint": {
        name: "checkpoints are written by train() (checkpoint_dir) and resumed by train(resume_from_checkpoint=...); "
        "their files: comlrl.checkpoint"
        for name in (
            "TrainingCheckpointMixin",
            "capture_rng_state",
            "capture_trainer_state",
            "restore_rng_state",
            "restore_trainer_state",
        )
    },
    "comlrl.utils.reward_utils": {
        "normalize_reward_lengths": "how many values a reward function returns is checked by the trainers "
        "(one, or one per agent)"
    },
    "comlrl.utils.tokenizer_utils": {
        name: _TOKENIZERS for name in ("apply_tokenizer_specials", "ensure_pad_token", "ensure_tokenizer")
    },
}
"""Package or module -> {1.4.3 public name it had -> what to use instead}."""


class MovedNameError(AttributeError):
    """A name comlrl 1.4.3 had and this library does not; the message says what to use instead."""


def moved_name(module: str, name: str) -> NoReturn:
    """A module ``__getattr__``'s answer for ``name`` (call it from there): for a name 1.4.3
    had, a :class:`MovedNameError` naming its replacement, so that ``hasattr`` is False and
    ``getattr(module, name, None)`` None, as for any missing attribute; else the usual
    AttributeError.

    ``from module import name`` turns any AttributeError into its own "cannot import name",
    which would drop the replacement: there the answer is an ImportError carrying it."""
    instead = MOVED_NAMES.get(module, {}).get(name)
    if instead is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}", name=name)
    message = f"{module}.{name} was comlrl 1.4.3's; {instead}"
    if _importing_from(sys._getframe(2)):  # the frame that asked the module's __getattr__
        raise ImportError(message, name=module)
    raise MovedNameError(message, name=name)


def _importing_from(frame: Any) -> bool:
    """Whether ``frame`` is executing a ``from ... import ...`` (its IMPORT_FROM instruction)."""
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_FROM"
