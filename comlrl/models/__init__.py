"""Models: the offline default model and helpers to load agents; and comlrl 1.4.3's
``CausalLMWithValueHead`` and ``ActorCriticOutput`` (:mod:`comlrl.compat.value_heads`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comlrl.compat.moved import moved_name

if TYPE_CHECKING:
    from comlrl.compat.value_heads import ActorCriticOutput, CausalLMWithValueHead
    from comlrl.models.embedded import default_model_path

__all__ = ["ActorCriticOutput", "CausalLMWithValueHead", "default_model_path"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `python -m comlrl.models.embedded` does not find the module
    # already imported by its package (runpy warns about that) and `import comlrl.models`
    # stays cheap.
    if name == "default_model_path":
        from comlrl.models.embedded import default_model_path

        return default_model_path
    if name in ("ActorCriticOutput", "CausalLMWithValueHead"):
        from comlrl.compat import value_heads

        return getattr(value_heads, name)
    moved_name(__name__, name)
