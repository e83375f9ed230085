"""Where a comlrl 1.4.3 call of a trainer becomes one of ours: the user-facing trainer classes
take this mixin before the engine's :class:`~comlrl.engine.base.MultiAgentTrainer`, whose
constructor takes keywords only. It reads positional arguments in 1.4.3's order (and its other
argument names), unwraps the ``CausalLMWithValueHead`` agents of 1.4.3's actor-critic API for
trainers that put no value heads on their agents, and gives the trainer 1.4.3's attributes.
"""

from __future__ import annotations

from typing import Any, ClassVar

from comlrl.compat.arguments import POSITIONAL_ORDER, named_arguments
from comlrl.compat.trainer_attributes import TrainerAttributes
from comlrl.compat.value_heads import plain_agents
from comlrl.engine.inputs import call_signature


class OriginalCalls(TrainerAttributes):
    """A trainer called as comlrl 1.4.3's was: positionally, in ``positional_order``, or by
    keyword, 1.4.3's other names included; ``inspect.signature`` shows that order."""

    positional_order: ClassVar[tuple[str, ...]] = POSITIONAL_ORDER
    """The order positional arguments are read in (:mod:`comlrl.compat.arguments`)."""
    takes_value_heads: ClassVar[bool] = False
    """Whether the trainer's own parts take the value heads of 1.4.3's wrapped agents (the
    actor-critic trainers); else the wrappers are unwrapped here, with a warning for a head."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = call_signature(cls.positional_order, cls)

    def __init__(self, *positional: Any, **named: Any):
        named = named_arguments(type(self).__name__, self.positional_order, positional, named)
        args = named.get("args")
        if not self.keeps_value_heads(args):
            owner = type(args).__name__ if args is not None else self.config_class.__name__
            named["agents"] = plain_agents(named.get("agents"), owner.removesuffix("Config"))
        super().__init__(**named)

    def keeps_value_heads(self, args: Any) -> bool:
        """Whether this trainer, with config ``args`` (None: its defaults), keeps 1.4.3's
        wrapped agents for its parts to take their value heads."""
        return self.takes_value_heads
