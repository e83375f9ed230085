"""comlrl 1.4.3's actor-critic layouts, read with the meaning they had there.

- Its value-head file, ``value_head.pt`` (:data:`ORIGINAL_VALUE_HEAD_FILE`): the engine saves
  ``value_head.safetensors`` (:mod:`comlrl.models.value`) and reads this one through
  :func:`original_head_weights`, registered in :data:`~comlrl.models.value.OTHER_HEAD_FORMATS`.
  1.4.3 gave a critic loaded from a folder a fresh head; here it continues the saved one, which is said
  (:func:`warn_if_original_head`).
- Its critic keys of ``model_config`` (:func:`split_critic_model_config`):
  ``critic_model_kwargs`` and MAAC's ``critic_value_head_hidden_dim``.
- Its critic folders, saved without a tokenizer, and critic models that name no source
  (:func:`lacks_tokenizer`): such a critic reads with its agent's tokenizer (MAAC's: agent
  0's), as every 1.4.3 critic did.
- Its ``critic_devices`` (:func:`critic_device_list`), and its check of ``critic_model``
  against ``critics`` when both are given (:func:`check_same_model`).
- The config field its older docs named ``critic_model_name_or_path``, read as the trainer's
  ``critic_model`` (:func:`critic_model_argument`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from comlrl.compat.fields import warn_ignored
from comlrl.models.placement import resolve_agent_devices
from comlrl.models.value import OTHER_HEAD_FORMATS, HeadFormat
from comlrl.utils.caller import user_stacklevel, warn_once

# ------------------------------------------------------------------------------------------
# the value-head file
# ------------------------------------------------------------------------------------------
ORIGINAL_VALUE_HEAD_FILE = "value_head.pt"
"""comlrl 1.4.3's file of a value head: a ``torch.save``d state dict of ``pre_projection.0``
(the optional Tanh hidden layer) and ``value_projection`` (one output), in the backbone's dtype."""


def original_head_weights(path: str, num_values: int) -> dict[str, Tensor]:
    """The weights of comlrl 1.4.3's head file at ``path`` (tensors only: nothing in it is
    executed), renamed to :class:`~comlrl.models.value.ValueHead`'s, in float32. Its heads have
    one output; a head with ``num_values`` outputs (MAAC's, one per agent) starts with that one
    in every row: the same value for every agent, as 1.4.3's shared critic gave."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error})") from error
    names = (["pre_projection.0"] if "pre_projection.0.weight" in state else []) + ["value_projection"]
    try:
        weights = {
            f"layers.{2 * i}.{part}": state[f"{name}.{part}"].float()
            for i, name in enumerate(names)
            for part in ("weight", "bias")
        }
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not a comlrl 1.4.3 value head ({type(error).__name__}: {error})") from error
    last = f"layers.{2 * (len(names) - 1)}"
    if weights[f"{last}.weight"].shape[0] == 1:
        weights[f"{last}.weight"] = weights[f"{last}.weight"].repeat(num_values, 1)
        weights[f"{last}.bias"] = weights[f"{last}.bias"].repeat(num_values)
    return weights


OTHER_HEAD_FORMATS.append(
    HeadFormat(ORIGINAL_VALUE_HEAD_FILE, f"comlrl 1.4.3's {ORIGINAL_VALUE_HEAD_FILE}", original_head_weights)
)


def warn_if_original_head(critic_name: str, path: str) -> None:
    """Say that a critic starts from the 1.4.3 head file at ``path``: 1.4.3 gave a critic
    loaded from a folder a fresh head, so a 1.4.3 script starts elsewhere here."""
    if path.endswith(ORIGINAL_VALUE_HEAD_FILE):
        warnings.warn(
            f"{critic_name} starts from comlrl 1.4.3's value head {path} (1.4.3 gave a critic loaded from a "
            "folder a fresh head; pass the model instance for one)",
            stacklevel=user_stacklevel(),
        )


# ------------------------------------------------------------------------------------------
# the critic keys of model_config
# ------------------------------------------------------------------------------------------
CRITIC_MODEL_CONFIG = ("critic_model_kwargs", "critic_value_head_hidden_dim")
"""comlrl 1.4.3's critic keys of ``model_config``."""


@dataclass
class CriticModelConfig:
    """comlrl 1.4.3's critic keys of ``model_config``, taken out before the rest reaches the
    agents' ``from_pretrained`` (which would refuse them, or ignore them for given models)."""

    model_kwargs: dict[str, Any]
    """``critic_model_kwargs``: the critics' ``from_pretrained`` arguments, over the agents'."""
    head_width: int | None
    """``critic_value_head_hidden_dim``: 1.4.3 MAAC's hidden width of its critic's value head."""

    def resolve_head_width(self, configured: int | None, centralized: bool) -> int | None:
        """The value heads' hidden width: ``configured`` (the config's, for the critic layout
        in use), or :attr:`head_width` where 1.4.3 read it: for MAAC (``centralized``), and
        only if the two agree. 1.4.3's IAC ignored the key: so does IAC here, with a one-time
        warning."""
        if self.head_width is None:
            return configured
        if not centralized:
            warn_ignored(
                "IACTrainer",
                "model_config['critic_value_head_hidden_dim']",
                f"model_config['critic_value_head_hidden_dim']={self.head_width} has no effect: it was comlrl 1.4.3 "
                "MAAC's setting; write IACConfig(critic_value_head_hidden_dim=...) for separate critics, or drop it",
            )
            return configured
        if configured is not None and configured != self.head_width:
            raise ValueError(
                f"model_config['critic_value_head_hidden_dim']={self.head_width} and "
                f"critic_value_head_hidden_dim={configured} disagree: set only critic_value_head_hidden_dim"
            )
        return self.head_width


def split_critic_model_config(config: Any) -> tuple[Any, CriticModelConfig]:
    """``model_config`` without comlrl 1.4.3's critic keys, and what those keys say."""
    if not isinstance(config, Mapping) or not set(CRITIC_MODEL_CONFIG) & set(config):
        return config, CriticModelConfig({}, None)
    config = dict(config)
    model_kwargs = config.pop("critic_model_kwargs", None) or {}
    width = config.pop("critic_value_head_hidden_dim", None)
    if not isinstance(model_kwargs, Mapping):
        raise TypeError(f"model_config['critic_model_kwargs'] must be a dict, got {type(model_kwargs).__name__}")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise ValueError(f"model_config['critic_value_head_hidden_dim'] must be an integer >= 1 or None, got {width!r}")
    return config, CriticModelConfig(dict(model_kwargs), width)


# ------------------------------------------------------------------------------------------
# critic folders, devices and sources
# ------------------------------------------------------------------------------------------
def lacks_tokenizer(model: torch.nn.Module) -> bool:
    """The model has no tokenizer of its own to read with: it was loaded from a folder holding
    none (comlrl 1.4.3 saved its critics so), or it says nowhere where it came from (a model
    built in the script). comlrl 1.4.3 fed every critic its agent's token ids."""
    source = getattr(model, "name_or_path", "") or ""
    return not source or (os.path.isdir(source) and not os.path.isfile(os.path.join(source, "tokenizer_config.json")))


def critic_device_list(spec: str | Sequence[str], count: int, local_rank: int | None) -> list[torch.device]:
    """``critic_devices`` read as comlrl 1.4.3 read it: ``"auto"`` (as ``agent_devices``'s),
    one device for every critic, or a list of one, or of one per critic."""
    if spec == "auto":
        return resolve_agent_devices("auto", count, local_rank)
    names = [spec] if isinstance(spec, str) else list(spec)
    names = names * count if len(names) == 1 else names
    if len(names) != count:
        raise ValueError(f"critic_devices lists {len(names)} devices for {count} critics; give one, or one per critic")
    try:
        return [torch.device(name) for name in names]
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"critic_devices={spec!r} is not a device or list of devices ({error})") from error


def named_source(source: Any) -> str | None:
    """The folder or hub id a critic source names: itself, or where a model was loaded from."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return getattr(getattr(source, "config", None), "_name_or_path", None) or None


def critic_model_argument(critic_model: Any, config: Any) -> Any:
    """The trainer's ``critic_model``, or the folder or hub id ``config`` names in
    ``critic_model_name_or_path`` (older comlrl docs' config field for it; a one-time
    warning). Both given must name the same model."""
    named = getattr(config, "critic_model_name_or_path", None)
    if named is None:
        return critic_model
    if critic_model is not None and named_source(critic_model) != named:
        raise ValueError(
            f"critic_model_name_or_path={named!r} and critic_model={named_source(critic_model) or critic_model!r} "
            "name different critics: pass only critic_model="
        )
    config_name = type(config).__name__
    warn_once(
        (config_name, "critic_model_name_or_path"),
        f"{config_name}: critic_model_name_or_path is the name older comlrl docs gave the trainer's critic_model "
        f"argument; write {config_name.removesuffix('Config')}Trainer(critic_model={named!r})",
        FutureWarning,
    )
    return named if critic_model is None else critic_model


def check_same_model(critic_model: Any, critics: Sequence[Any]) -> None:
    """comlrl 1.4.3's meaning of ``critic_model`` and ``critics`` both given: ``critics`` is
    used, and each of its entries must name ``critic_model``'s model."""
    name, names = named_source(critic_model), [named_source(source) for source in critics]
    if name is None or None in names:
        raise ValueError(
            "critic_model and critics are both given, and whether they name the same model cannot be told "
            "(a model instance that was not loaded from a folder or hub id); pass only critics"
        )
    if any(other != name for other in names):
        raise ValueError(f"critic_model={name!r} and critics={names!r} name different models; pass only critics")
