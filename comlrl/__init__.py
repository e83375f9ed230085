"""comlrl: cooperative multi-LLM reinforcement learning.

    from comlrl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors

The trainers are imported on first use, so ``import comlrl`` (and ``python -m comlrl plot``)
does not load torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RewardProcessors": "comlrl.utils.reward_processor",
    **dict.fromkeys(
        [
            "ActorCriticConfig",
            "ActorCriticTrainer",
            "IACConfig",
            "IACTrainer",
            "MAACConfig",
            "MAACTrainer",
            "MAGRPOConfig",
            "MAGRPOTrainer",
            "MAREINFORCEConfig",
            "MAREINFORCETrainer",
            "MARLOOConfig",
            "MARLOOTrainer",
            "MAReMaxConfig",
            "MAReMaxTrainer",
            "MultiAgentTrainer",
            "TrainResult",
            "TrainerConfig",
        ],
        "comlrl.trainers",
    ),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'comlrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
