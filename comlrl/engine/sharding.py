"""Agents sharded over the data-parallel ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``):
``sharding="full_shard"`` or ``"shard_grad_op"`` under torchrun.

Each model is sharded per decoder layer and then whole, so every rank holds 1/K of its
parameters, gradients and AdamW state (in fp32: the sharded parameters are the optimizer's
master weights; with ``precision="bf16"`` each layer is gathered in bf16 for compute and its
gradients are reduced in fp32). ``"full_shard"`` frees each layer's gathered parameters after
its forward and gathers them again for the backward (ZeRO-3); ``"shard_grad_op"`` keeps them
from the forward to the backward (ZeRO-2: more memory, one gather fewer).

Three rules make FSDP fit RL, where the ranks' shares of a step differ:

1. Sampling and every forward without gradient run on whole weights: a sharded model is kept
   whole (:func:`gather`, a collective) from when it is built and after every optimizer step,
   and sharded (:func:`release`) only for its gradient passes. So the ranks may take
   different numbers of decoding steps, turns and micro-batches outside the update.
2. Every gradient forward all-gathers and every backward reduce-scatters, so each rank runs
   as many gradient passes through a sharded model in each phase of an update: the ranks with
   fewer micro-batches first run zero-loss passes (:func:`pad_passes`).
3. Gradients are summed over the ranks, not averaged, as without sharding: each loss is
   already normalised over every rank's tokens.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

SHARDING_MODES = ("replicate", "full_shard", "shard_grad_op")
"""``sharding``'s values: whole models on every rank, or FSDP2 as ZeRO-3 or ZeRO-2."""

# Sharded model -> its reshard_after_forward (restored by release), and the gathered ones.
_RESHARD: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
_GATHERED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules of the classes its Hugging Face
    ``_no_split_modules`` names (``LlamaDecoderLayer``, ``GPT2Block``, ...)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def shard_model(model: torch.nn.Module, mode: str, param_dtype: torch.dtype | None, what: str) -> None:
    """Shard ``model`` in place over the default process group: rank 0's weights first (each
    rank keeps its slice of what it holds), then each decoder layer, then the rest. ``what``
    names the model in errors."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"{what} ({type(model).__name__}) names no decoder layer class in _no_split_modules, so it cannot "
            "be sharded layer by layer: use sharding='replicate'"
        )
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)
    reshard = mode == "full_shard"
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=policy)
    for unit in units(model):
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-scaled sum
    _RESHARD[model] = reshard


def is_sharded(model: torch.nn.Module) -> bool:
    return model in _RESHARD


def units(model: torch.nn.Module) -> list[Any]:
    """The model's FSDP units: itself, then its decoder layers."""
    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def gather(model: torch.nn.Module) -> None:
    """Make a sharded ``model`` whole (a collective), until :func:`release`; else nothing.
    Whole means its parameters, not this module's record: a ``state_dict()`` call shards a
    gathered model again (FSDP's pre-save hook), and the next gather must undo it."""
    if not is_sharded(model) or (model in _GATHERED and not has_sharded(model.parameters())):
        return
    model.set_reshard_after_forward(False)
    for unit in units(model):
        unit.unshard()
    _GATHERED.add(model)


def release(model: torch.nn.Module) -> None:
    """Free the whole weights :func:`gather` made, before a gradient pass; else nothing."""
    if model not in _GATHERED:
        return
    for unit in units(model):
        unit.reshard()
    model.set_reshard_after_forward(_RESHARD[model])
    _GATHERED.discard(model)


def pad_passes(model: torch.nn.Module, planned: int, most_of_ranks: Callable[[int], int]) -> None:
    """Before a phase of ``planned`` gradient passes through a sharded ``model`` (one forward
    and backward each), the zero-loss passes that bring this rank to the most any rank plans
    (``most_of_ranks(planned)``): every rank must make the same collectives, in the same order."""
    if not is_sharded(model):
        return
    release(model)
    device = next(model.parameters()).device
    for _ in range(most_of_ranks(planned) - planned):
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        (model(input_ids=ids, use_cache=False).logits.sum() * 0).backward()


def has_sharded(parameters: Iterable[torch.Tensor]) -> bool:
    return any(isinstance(p, DTensor) for p in parameters)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor; the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective); the tensor itself otherwise."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def whole_state_dict(model: torch.nn.Module, every_rank: bool = False) -> dict[str, torch.Tensor]:
    """A sharded model's whole weights on rank 0's CPU (a collective; other ranks get ``{}``),
    or with ``every_rank``, on every rank's device."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
    with sharded_parameters([model]):
        return get_model_state_dict(model, options=options)


def whole_parameters(model: torch.nn.Module, names: Iterable[str], every_rank: bool = False) -> dict[str, torch.Tensor]:
    """These parameters of a sharded model whole on rank 0's CPU (a collective; other ranks
    get ``{}`` unless ``every_rank``): an adapter's, without gathering its base."""
    with sharded_parameters([model]):
        parameters = dict(model.named_parameters())
        whole = {name: full(parameters[name]).detach().cpu() for name in names}
    return whole if every_rank or dist.get_rank() == 0 else {}


def sampling_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a sharded ``model`` samples in: its gathered parameters' (precision's compute
    dtype, where its slices are fp32 masters). Gathers it (a collective)."""
    gather(model)
    return next(model.parameters()).dtype


def whole_copy(model: torch.nn.Module, empty: torch.nn.Module) -> torch.nn.Module:
    """``empty`` (built with ``model``'s architecture, not sharded) holding a sharded
    ``model``'s whole weights in the dtype it samples in, on every rank (a collective)."""
    dtype = sampling_dtype(model)
    empty.load_state_dict(whole_state_dict(model, every_rank=True))
    return empty.to(dtype)


def load_whole_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Whole ``weights`` (every rank read them) into a sharded model's slices; returns the
    missing and unexpected keys as ``load_state_dict`` does. Call it within
    :func:`sharded_parameters`: gathered copies would keep the old weights."""
    names = set(model.state_dict())
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    return sorted(names - set(weights)), sorted(set(weights) - names)


def total_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """The 2-norm of every gradient of ``parameters`` together, sharded ones over every rank's slices."""
    grads = [p.grad for p in parameters if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    whole = [g for g in grads if not isinstance(g, DTensor)]
    squares = torch.zeros((), dtype=torch.float32)
    if sharded:
        squares = squares + torch.nn.utils.get_total_norm(sharded).full_tensor().float().cpu() ** 2
    if whole:
        squares = squares + torch.nn.utils.get_total_norm(whole).float().cpu() ** 2
    return squares.sqrt()


@contextlib.contextmanager
def _all_trainable(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[None]:
    """Within it, every parameter of ``optimizers`` requires grad. The state-dict functions
    make a fresh optimizer's state by a zero step, which skips frozen parameters: an inactive
    adapter of a shared base would get no state, and loading would leave it fresh."""
    parameters = [p for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]]
    flags = [p.requires_grad for p in parameters]
    for p in parameters:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in zip(parameters, flags):
            p.requires_grad_(flag)


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer``'s state keyed by ``module``'s parameter names (sharded tensors stay
    sharded), which a checkpoint can load at any other number of ranks."""
    return get_optimizer_state_dict(module, optimizer)


def save_optimizer_shards(folder: str, learners: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]) -> None:
    """Every rank writes its slices of these optimizers' states into ``folder``
    (``torch.distributed.checkpoint``: a collective)."""
    with sharded_parameters(module for module, _ in learners.values()):
        dcp.save({name: optimizer_state(*pair) for name, pair in learners.items()}, checkpoint_id=folder)


def load_optimizer_shards(folder: str, learners: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]) -> None:
    """What :func:`save_optimizer_shards` wrote, at this run's number of ranks and sharding
    (resharded as needed), into these optimizers."""
    with sharded_parameters(module for module, _ in learners.values()), _all_trainable(o for _, o in learners.values()):
        states = {name: optimizer_state(*pair) for name, pair in learners.items()}
        dcp.load(states, checkpoint_id=folder, no_dist=not dist.is_initialized())
        for name, (module, optimizer) in learners.items():
            set_optimizer_state_dict(module, optimizer, states[name])


def load_whole_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """An optimizer state saved whole by an unsharded run (``optimizer.state_dict()``) into
    the slices of this sharded ``optimizer`` of ``module``'s parameters."""
    with sharded_parameters([module]), _all_trainable([optimizer]):
        names = {id(p): name for name, p in module.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        state = {
            "state": {order[k]: value for k, value in saved["state"].items()},
            "param_groups": [{**g, "params": [order[k] for k in g["params"]]} for g in saved["param_groups"]],
        }
        set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


@contextlib.contextmanager
def sharded_parameters(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Within it, gathered models are sharded again, so their parameters are those their
    optimizers step (a whole model's are its gathered copies); gathered again after."""
    modules = [module for module in modules if module in _GATHERED]
    for module in modules:
        release(module)
    try:
        yield
    finally:
        for module in modules:
            gather(module)


def model_class(model: torch.nn.Module) -> type:
    """The class a model had before FSDP wrapped it (FSDP2 makes ``FSDP<class>``)."""
    kind = type(model)
    return kind.__bases__[-1] if isinstance(model, FSDPModule) else kind
