"""comlrl 1.4.3's module paths where this library keeps no file of its own: importing one
builds a module holding the names 1.4.3 had there (:data:`PATHS`), taken from where they live
now, so ``from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer`` gets the very class
``comlrl.trainers.reinforce`` has. 1.4.3's modules that have no counterpart at all
(:data:`~comlrl.compat.moved.MOVED_MODULES`) are an error naming what to use instead.

The same for this library's own earlier paths that its documentation named, from before the
shared trainer machinery moved to :mod:`comlrl.engine` (:data:`ENGINE_PATHS`):
``from comlrl.trainers.config import TrainerConfig`` still works.

One finder, last on ``sys.meta_path``, answers both, so it sees only names that no real
module answers.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

from comlrl.compat.moved import MOVED_MODULES, moved_name


def _names(home: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, home)


_CENTRALIZED_ADAPTERS = _names(
    "comlrl.engine.centralized",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "TaggedCentralizedComparatorAdapter",
)
_MADPO = _names("comlrl.trainers.dpo", "MADPOConfig", "MADPOTrainer")
_MADPO_ITER = _names("comlrl.trainers.dpo", "MADPOIterConfig", "MADPOIterTrainer")
_MARLHF = _names("comlrl.trainers.rlhf", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel")
_MARLHF_ITER = _names("comlrl.trainers.rlhf", "MARLHFIterConfig", "MARLHFIterTrainer")

_MAGRPO = _names("comlrl.trainers.reinforce", "MAGRPOConfig", "MAGRPOTrainer")
_IAC = _names("comlrl.trainers.actor_critic", "IACConfig", "IACTrainer")
_MAAC = _names("comlrl.trainers.actor_critic", "MAACConfig", "MAACTrainer")
_SCHEDULERS = _names("comlrl.compat.schedulers", "DeviceScheduler", "normalize_parallel_training")

PATHS: dict[str, dict[str, str]] = {
    # An older 1.4.3 documentation page imported the trainers from these.
    "comlrl.trainers.magrpo": _MAGRPO,
    "comlrl.trainers.iac": _IAC,
    "comlrl.trainers.maac": _MAAC,
    "comlrl.trainers.reinforce.magrpo": _MAGRPO,
    "comlrl.trainers.reinforce.mareinforce": _names(
        "comlrl.trainers.reinforce", "MAREINFORCEConfig", "MAREINFORCETrainer"
    ),
    "comlrl.trainers.reinforce.maremax": _names("comlrl.trainers.reinforce", "MAReMaxConfig", "MAReMaxTrainer"),
    "comlrl.trainers.reinforce.marloo": _names("comlrl.trainers.reinforce", "MARLOOConfig", "MARLOOTrainer"),
    "comlrl.trainers.reinforce.centralized_magrpo": _names(
        "comlrl.trainers.reinforce", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"
    ),
    "comlrl.trainers.actor_critic.iac": {**_IAC, **_names("comlrl.trainers.actor_critic", "RolloutSample")},
    "comlrl.trainers.actor_critic.maac": _MAAC,
    "comlrl.trainers.actor_critic.ac_base": _names("comlrl.compat.trainer_base", "ActorCriticTrainerBase"),
    "comlrl.models.actor_critic": _names("comlrl.compat.value_heads", "CausalLMWithValueHead", "ActorCriticOutput"),
    "comlrl.schedulers": _SCHEDULERS,
    "comlrl.schedulers.device_scheduler": _SCHEDULERS,
    "comlrl.utils.formatters": _names("comlrl.compat.helpers", "build_formatters"),
    "comlrl.utils.reward_utils": {
        **_names("comlrl.compat.helpers", "call_reward_function"),
        **_names("comlrl.utils.reward_range", "resolve_reward_range", "set_reward_range"),
    },
    "comlrl.utils.tokenizer_utils": _names("comlrl.compat.helpers", "resolve_tokenizers"),
    "comlrl.utils.checkpoint": _names("comlrl.compat.helpers", "read_checkpoint_metadata"),
    "comlrl.trainers.preference": {
        **_CENTRALIZED_ADAPTERS,
        **_MADPO,
        **_MADPO_ITER,
        **_MARLHF,
        **_MARLHF_ITER,
        **_names("comlrl.trainers.dpo", "PreferencePair"),
        **_names("comlrl.engine.loop", "TrainResult"),
    },
    "comlrl.trainers.preference.madpo": _MADPO,
    "comlrl.trainers.preference.marlhf": _MARLHF,
    # 1.4.3 defined both iterative trainers here.
    "comlrl.trainers.preference.iterative": {**_MADPO_ITER, **_MARLHF_ITER},
    "comlrl.trainers.preference.centralized": _CENTRALIZED_ADAPTERS,
}
"""1.4.3 module path -> {public name it had -> the module that holds it now}."""

ENGINE_PATHS: dict[str, dict[str, str]] = {
    "comlrl.trainers.base": _names("comlrl.engine.base", "MultiAgentTrainer"),
    "comlrl.trainers.centralized": _names(
        "comlrl.engine.centralized",
        "CentralizedCollaboration",
        "CentralizedComparatorAdapter",
        "CentralizedComparatorParseError",
        "CentralizedSetup",
        "TaggedCentralizedComparatorAdapter",
    ),
    "comlrl.trainers.config": _names("comlrl.engine.config", "TrainerConfig"),
    "comlrl.trainers.inputs": _names("comlrl.engine.inputs", "TrainerInputs"),
    "comlrl.trainers.loop": _names("comlrl.engine.loop", "TrainResult"),
    "comlrl.trainers.parts": _names(
        "comlrl.engine.parts", "MadeOnce", "Objective", "Part", "Parts", "RewardSource", "Schedule", "TaskReward"
    ),
    "comlrl.trainers.policy_gradient": _names("comlrl.trainers.reinforce.objective", "PolicyGradient"),
    "comlrl.trainers.policy_gradient_config": _names("comlrl.engine.policy_gradient_config", "PolicyGradientConfig"),
    # 1.4.3's comlrl.utils.distributed is an error that named this module.
    "comlrl.distributed": _names("comlrl.engine.distributed", "DataParallel"),
}
"""This library's module path before :mod:`comlrl.engine` -> {documented name -> its module now}."""

PATHS.update(ENGINE_PATHS)

PACKAGES = frozenset({"comlrl.trainers.preference", "comlrl.schedulers"})
"""The paths of :data:`PATHS` that were packages (their submodules are paths too)."""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Builds the modules of :data:`PATHS`; refuses those of ``MOVED_MODULES``."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201 (importlib's protocol)
        if fullname in PATHS:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in PACKAGES)
        instead = MOVED_MODULES.get(fullname)
        if instead is None:
            return None
        raise ModuleNotFoundError(f"No module named {fullname!r}: it was comlrl 1.4.3's; {instead}", name=fullname)

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        homes = PATHS[name]
        for attribute, home in homes.items():
            setattr(module, attribute, getattr(importlib.import_module(home), attribute))
        module.__all__ = sorted(homes)
        whose = "an earlier comlrl" if name in ENGINE_PATHS else "comlrl 1.4.3's"
        module.__doc__ = f"{whose} module path; its names live in {', '.join(sorted(set(homes.values())))}."

        def __getattr__(attribute: str):  # 1.4.3's names we lack: an error naming what to use instead
            moved_name(name, attribute)

        module.__getattr__ = __getattr__


def install() -> None:
    """Put the finder last on ``sys.meta_path``, once."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
