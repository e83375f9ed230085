"""fp32 master weights for parameters held in a lower precision (``precision="bf16"``).

The forward and backward passes run on the bf16 parameters; each parameter's gradient is
added into its fp32 master's gradient as soon as autograd has accumulated it (a
post-accumulate hook), and the bf16 gradient is freed at once, so micro-batches accumulate
in fp32 and no second set of gradients waits for the step. Clipping, the gradient sum over
ranks and the optimizer act on the masters; after each optimizer step the masters are
rounded back into the parameters. Updates smaller than bf16's spacing (lr x Adam's step is
often 1e-5 of a weight, below bf16's 8 bits of mantissa) then still add up.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

# id(parameter) -> (the parameter, weakly; the handle of the hook that feeds its current
# master). A model handed from one trainer to the next must feed the new trainer's masters
# only, not the old ones as well. (Tensors compare elementwise: no WeakKeyDictionary.)
_HOOKS: dict[int, tuple[weakref.ref, torch.utils.hooks.RemovableHandle]] = {}


class MasterWeights:
    """The optimizer's view of one learner's parameters: each fp32 parameter itself, and an
    fp32 master (which collects the gradient) for each lower-precision one; with
    ``enabled=False``, the parameters themselves (an earlier trainer's masters let go of them)."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter], enabled: bool = True):
        self.masters: list[torch.nn.Parameter] = []
        """What the optimizer steps, in the order of ``parameters``."""
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        """(parameter, its master) for each lower-precision parameter."""
        for parameter in parameters:
            _release(parameter)
            if enabled and parameter.is_floating_point() and parameter.dtype != torch.float32:
                master = torch.nn.Parameter(parameter.detach().float(), requires_grad=True)
                _hold(parameter, _add_hook(parameter, _add_to(master)))
                self.pairs.append((parameter, master))
                self.masters.append(master)
            else:
                self.masters.append(parameter)

    @torch.no_grad()
    def write_back(self) -> None:
        """Round the masters into the parameters (after an optimizer step or a load)."""
        for parameter, master in self.pairs:
            parameter.copy_(master)

    @torch.no_grad()
    def read_parameters(self) -> None:
        """Take the parameters' values as the masters' (after weights were loaded into the model)."""
        for parameter, master in self.pairs:
            master.copy_(parameter)

    def state(self) -> list[torch.Tensor]:
        """The masters' values, for a checkpoint: the parameters hold them only rounded."""
        return [master.detach() for _, master in self.pairs]

    @torch.no_grad()
    def load_state(self, values: Sequence[torch.Tensor], source: str) -> None:
        """Load what :meth:`state` gave, then round it into the parameters; ``source`` names it in errors."""
        if len(values) != len(self.pairs):
            raise ValueError(
                f"{source} holds {len(values)} fp32 master weights for a learner with {len(self.pairs)} "
                "lower-precision parameters: it was written by a run with another precision or other models"
            )
        for (_, master), value in zip(self.pairs, values):
            if value.shape != master.shape:
                raise ValueError(f"{source}: a master weight of shape {tuple(value.shape)} for {tuple(master.shape)}")
            master.copy_(value)
        self.write_back()


def _add_hook(parameter: torch.nn.Parameter, hook) -> torch.utils.hooks.RemovableHandle:
    """The hook on ``parameter`` even while it is frozen: an adapter of agents sharing a base
    model requires gradient only while its agent is active."""
    frozen = not parameter.requires_grad
    parameter.requires_grad_(True)
    handle = parameter.register_post_accumulate_grad_hook(hook)
    parameter.requires_grad_(not frozen)
    return handle


def _hold(parameter: torch.nn.Parameter, handle: torch.utils.hooks.RemovableHandle) -> None:
    key = id(parameter)
    _HOOKS[key] = (weakref.ref(parameter, lambda _: _HOOKS.pop(key, None)), handle)


def _release(parameter: torch.nn.Parameter) -> None:
    """Remove the hook an earlier :class:`MasterWeights` put on ``parameter``, if any."""
    entry = _HOOKS.get(id(parameter))
    if entry is not None and entry[0]() is parameter:
        del _HOOKS[id(parameter)]
        entry[1].remove()


def _add_to(master: torch.nn.Parameter):
    def hook(parameter: torch.Tensor) -> None:
        gradient = parameter.grad.float()
        if master.grad is None:
            master.grad = gradient
        else:
            master.grad.add_(gradient)
        parameter.grad = None

    return hook
