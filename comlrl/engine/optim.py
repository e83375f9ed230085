"""One optimizer and one learning-rate schedule per agent (and critic), and the steps that apply them."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import torch
from transformers import get_scheduler

from comlrl.engine import sharding
from comlrl.engine.distributed import DataParallel
from comlrl.engine.master_weights import MasterWeights
from comlrl.utils.per_agent import per_agent

Modules = Sequence[torch.nn.Module | None] | None
"""Per learner, the model its parameters are named in (None: none), or None for every one."""

# Our names -> transformers' schedule names; each warms up linearly over the warmup steps.
LR_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def per_agent_learning_rates(learning_rate: float | Sequence[float], num_agents: int) -> list[float]:
    """One learning rate per agent from one value or a list of one per agent."""
    return [float(rate) for rate in per_agent(learning_rate, num_agents, "values of agent_learning_rate")]


def build_optimizers(
    parameters: Sequence[Sequence[torch.nn.Parameter]], learning_rates: Sequence[float], weight_decay: float
) -> list[torch.optim.Optimizer]:
    """One AdamW per agent over that agent's trainable parameters; the fused kernel where the
    parameters' devices have one (CPU, CUDA): one pass over each tensor instead of a dozen
    ``foreach`` ops with their temporaries (on the CPU, 7x faster and ~0.5 GB less peak
    memory for a 135M-parameter model)."""
    optimizers = []
    for params, rate in zip(parameters, learning_rates):
        params = list(params)
        fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
        optimizers.append(torch.optim.AdamW(params, lr=rate, weight_decay=weight_decay, fused=fused or None))
    return optimizers


def build_schedulers(
    optimizers: Sequence[torch.optim.Optimizer], schedule: str, warmup_ratio: float, total_steps: int
) -> list[torch.optim.lr_scheduler.LRScheduler]:
    """The schedule ``schedule`` (a key of ``LR_SCHEDULES``) over ``total_steps`` optimizer steps."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_scheduler_type={schedule!r}; expected one of {sorted(LR_SCHEDULES)}")
    warmup = math.ceil(warmup_ratio * total_steps)
    return [
        get_scheduler(LR_SCHEDULES[schedule], optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
        for optimizer in optimizers
    ]


class Learners:
    """Everything a trainer optimizes, as named parameter sets ("agent 0", "critic 0", ...),
    each with its own AdamW and learning-rate schedule; with ``fp32_masters``, the optimizer
    steps fp32 masters of the lower-precision parameters (see :mod:`comlrl.engine.master_weights`).
    A learner whose parameters are sharded (:mod:`comlrl.engine.sharding`) checks and checkpoints
    them together with the other ranks of ``parallel``."""

    def __init__(self, fp32_masters: bool = False, parallel: DataParallel | None = None) -> None:
        self.fp32_masters = fp32_masters
        self.parallel = parallel or DataParallel()
        self.names: list[str] = []
        self.modules: list[torch.nn.Module | None] = []
        """Per learner, the model its parameters are named in (for a sharded optimizer's state)."""
        self.masters: list[MasterWeights] = []
        self.parameters: list[list[torch.nn.Parameter]] = []
        """Per learner, what its optimizer steps (the masters, where there are)."""
        self.optimizers: list[torch.optim.Optimizer] = []
        self.schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
        self.waiting: list[tuple[Sequence[str], Sequence[Sequence[torch.nn.Parameter]], Sequence[float], Modules]] = []
        """Learners waiting for the run's length (:meth:`wait`): names, parameter sets, rates, modules."""

    def wait(
        self,
        names: Sequence[str],
        parameters: Sequence[Sequence[torch.nn.Parameter]],
        learning_rates: Sequence[float],
        modules: Modules = None,
    ) -> None:
        """One AdamW and one learning-rate schedule (the config's) for each named parameter set,
        built by :meth:`add_waiting` once the run's length is known (at the end of the set-up;
        MADPO's pairs: when ``train()`` starts); every update pass steps them all, after
        clipping each set's gradient on its own. Every rank takes rank 0's weights now."""
        self.parallel.broadcast_parameters(p for group in parameters for p in group)
        self.waiting.append((names, parameters, learning_rates, modules))

    def add_waiting(self, weight_decay: float, schedule: str, warmup_ratio: float, total_steps: int) -> None:
        """Build every learner :meth:`wait` holds, in the order they came (see :meth:`add`)."""
        for names, parameters, rates, modules in self.waiting:
            self.add(names, parameters, rates, weight_decay, schedule, warmup_ratio, total_steps, modules)
        self.waiting = []

    def restart_schedules(self, schedule: str, warmup_ratio: float, total_steps: int) -> None:
        """Every learner's learning-rate schedule started over, spanning ``total_steps`` (a new round's)."""
        self.schedulers = build_schedulers(self.optimizers, schedule, warmup_ratio, total_steps)

    def add(
        self,
        names: Sequence[str],
        parameters: Sequence[Sequence[torch.nn.Parameter]],
        learning_rates: Sequence[float],
        weight_decay: float,
        schedule: str,
        warmup_ratio: float,
        total_steps: int,
        modules: Sequence[torch.nn.Module | None] | None = None,
    ) -> None:
        """One AdamW and one schedule over ``total_steps`` optimizer steps per named set (of
        ``modules``' parameters, when given)."""
        own_file_mapped(p for group in parameters for p in group)
        masters = [MasterWeights(p, enabled=self.fp32_masters) for p in parameters]
        optimizers = build_optimizers([m.masters for m in masters], learning_rates, weight_decay)
        self.names.extend(names)
        self.modules.extend(modules or [None] * len(names))
        self.masters.extend(masters)
        self.parameters.extend(m.masters for m in masters)
        self.optimizers.extend(optimizers)
        self.schedulers.extend(build_schedulers(optimizers, schedule, warmup_ratio, total_steps))

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def allocate_state(self) -> None:
        """Every optimizer's state, allocated now rather than in its first step
        (:func:`allocate_adamw_state`; a sharded learner's still in its first step)."""
        for optimizer, parameters in zip(self.optimizers, self.parameters):
            if not sharding.has_sharded(parameters):
                allocate_adamw_state(optimizer)

    def step(self, max_grad_norm: float | None, reduce_gradients: Callable, step_number: int) -> list[float]:
        """Clip and apply every learner's gradient, or none: a non-finite gradient stops
        training with an error before any weight changes in this step. ``reduce_gradients``
        sums a parameter set's gradients over data-parallel ranks. Returns the norms."""
        max_norm = max_grad_norm if max_grad_norm is not None else math.inf
        norms = []
        for name, parameters in zip(self.names, self.parameters):
            reduce_gradients(parameters)
            norm = self.clip(parameters, max_norm)
            if not math.isfinite(norm):
                self.zero_grad()
                raise FloatingPointError(
                    f"{name} has a non-finite loss or gradient (gradient norm {norm}) at step {step_number}; "
                    "no weights were changed in this step"
                )
            norms.append(norm)
        rates = self.learning_rates()
        for optimizer, scheduler, masters in zip(self.optimizers, self.schedulers, self.masters):
            optimizer.step()
            scheduler.step()
            masters.write_back()
        for module in {id(m): m for m in self.modules if m is not None}.values():
            sharding.gather(module)  # whole again for sampling, until its next gradient pass
        used = ", ".join(f"{name} {rate:.3g}" for name, rate in zip(self.names, rates))
        self.require_finite(
            f" after the optimizer step of step {step_number} (learning rates: {used}); training stopped, "
            "and nothing of this step was saved"
        )
        return norms

    @staticmethod
    def clip(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
        """Scale the gradients of ``parameters`` to a total norm of at most ``max_norm``; returns their norm."""
        if not sharding.has_sharded(parameters):
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm).item()
        norm = sharding.total_norm(parameters)
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
        return norm.item()

    @property
    def sharded(self) -> list[int]:
        """The learners whose parameters are sharded over the ranks."""
        return [i for i, parameters in enumerate(self.parameters) if sharding.has_sharded(parameters)]

    def require_finite(self, consequence: str) -> None:
        """Stop with an error naming the first learner whose weights hold a NaN or an
        infinity, followed by ``consequence``. With sharded learners every rank must call it:
        each checks its slices, and all stop if one finds any."""
        bad = next(
            (
                name
                for name, parameters in zip(self.names, self.parameters)
                if not all_finite([sharding.local(p) for p in parameters])
            ),
            None,
        )
        if self.sharded:
            bad = next((name for name in self.parallel.gather(bad) if name is not None), None)
        if bad is not None:
            raise FloatingPointError(f"{bad}'s weights are not finite{consequence}")

    def learning_rates(self) -> list[float]:
        return [optimizer.param_groups[0]["lr"] for optimizer in self.optimizers]

    def state_dict(self) -> dict[str, list]:
        """The optimizers' and schedulers' states (None for a sharded optimizer: its slices are
        :meth:`save_shards`'), the fp32 masters where there are, and the sharded learners' names."""
        sharded = self.sharded
        state: dict[str, list] = {
            "optimizers": [None if i in sharded else o.state_dict() for i, o in enumerate(self.optimizers)],
            "schedulers": [s.state_dict() for s in self.schedulers],
        }
        if any(m.pairs for m in self.masters):
            state["masters"] = [m.state() for m in self.masters]
        if sharded:
            state["sharded"] = [self.names[i] for i in sharded]
        return state

    def shard_entries(self, names: Sequence[str]) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """The sharded learners ``names`` as ``torch.distributed.checkpoint`` addresses them: each
        one's model (the owner of the parameter names the saved slices are keyed by) and optimizer."""
        entries = {}
        for name in names:
            i = self.names.index(name)
            module = self.modules[i]
            if module is None:
                raise ValueError(f"{name}'s optimizer state is sharded but its parameters belong to no model")
            entries[name] = (module, self.optimizers[i])
        return entries

    def save_shards(self, folder: str) -> None:
        """Every rank writes its slices of the sharded optimizers' states into ``folder`` (nothing without any)."""
        sharded = [self.names[i] for i in self.sharded]
        if sharded:
            sharding.save_optimizer_shards(folder, self.shard_entries(sharded))

    def load_state_dict(self, state: dict[str, list], source: str) -> None:
        """Load what :meth:`state_dict` gave; ``source`` names where it came from in errors."""
        if len(state["optimizers"]) != len(self.optimizers):
            raise ValueError(
                f"{source} holds {len(state['optimizers'])} optimizers; this trainer has {len(self.optimizers)} "
                f"({', '.join(self.names)})"
            )
        # The models were loaded first: masters a checkpoint lacks are their values.
        saved_masters = state.get("masters")
        for i, masters in enumerate(self.masters):
            if saved_masters is None:
                masters.read_parameters()
            else:
                masters.load_state(saved_masters[i], f"{source} ({self.names[i]})")
        sharded_now = self.sharded
        for i, (optimizer, saved) in enumerate(zip(self.optimizers, state["optimizers"])):
            if saved is None:
                continue  # in the checkpoint's shards: load_shards
            if i in sharded_now:  # written by an unsharded run
                sharding.load_whole_optimizer_state(self.modules[i], optimizer, saved)
            else:
                optimizer.load_state_dict(saved)
        for scheduler, saved in zip(self.schedulers, state["schedulers"]):
            scheduler.load_state_dict(saved)

    def load_shards(self, folder: str, state: dict[str, list]) -> None:
        """The sharded optimizers' states of a checkpoint whose :meth:`state_dict` is ``state``,
        from its shards in ``folder``, resharded to this run's ranks (every rank calls it)."""
        names = state.get("sharded", [])
        if names:
            sharding.load_optimizer_shards(folder, self.shard_entries(names))


def allocate_adamw_state(optimizer: torch.optim.Optimizer) -> None:
    """Give each parameter of an AdamW that has no state yet the state its first step would
    create (step 0, zero moments), through ``load_state_dict``, which places it as the
    optimizer places its own (the fused kernel's step on the parameter's device). The first
    step computes the same numbers from it.

    Why: AdamW allocates its state in its first step, in memory the gradient pass before it
    has just freed, so the next pass needs as much fresh memory again. With the state in place
    before training starts, every rollout and gradient pass reuses the first one's memory (kept
    in the process by :func:`comlrl.utils.cpu_memory.kept_freed_memory`)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        return
    parameters = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    if all(p in optimizer.state for p, _ in parameters):
        return
    state = optimizer.state_dict()
    for index, (parameter, group) in enumerate(parameters):
        if index not in state["state"]:
            moments = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
            state["state"][index] = {"step": torch.tensor(0.0)} | {
                name: torch.zeros_like(parameter, memory_format=torch.preserve_format) for name in moments
            }
    optimizer.load_state_dict(state)


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether no element of ``tensors`` is a NaN or an infinity, read from each tensor's
    smallest and largest elements (``aminmax`` propagates NaN and cannot overflow), once per
    device. On the CPU it runs vectorised in the intra-op threads and writes nothing the size
    of a tensor: 0.02 s for SmolLM2-135M's weights, against 0.25 s for an ``isfinite`` mask
    of each one (and 0.19 s for a max-abs ``_foreach_norm``)."""
    extremes: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        if tensor.numel():  # an empty tensor has no extremes (this rank's slice may be empty)
            extremes.setdefault(tensor.device, []).extend(torch.aminmax(tensor))
    return all(bool(torch.stack(group).isfinite().all()) for group in extremes.values())


def own_file_mapped(parameters: Iterable[torch.nn.Parameter]) -> int:
    """Copy each CPU parameter that is a view of a memory-mapped file into memory of its own;
    returns how many were copied. ``from_pretrained`` maps safetensors files copy-on-write and
    leaves the parameters in the mapping when it needs no conversion (the file's dtype).

    Why: the optimizer's first write to such a parameter faults its pages in one by one, each
    copied from the file: 1.35-2.6 s for SmolLM2-135M's fp32 weights on a 2-core CPU, against
    0.25 s for one copy. And a parameter not yet written follows the file: a file rewritten in
    place under a running trainer would change it, or (truncated) crash the process.
    Parameters that share their storage with another (weights tied by storage rather than by
    being one parameter) are left where they are, so that they stay tied. Only Linux says which
    memory is mapped from a file (``/proc/self/maps``); elsewhere nothing is copied and the
    first step pays the faults."""
    distinct = {id(p): p for p in parameters}.values()
    candidates = [p for p in distinct if p.device.type == "cpu" and type(p.data) is torch.Tensor and p.numel() > 0]
    sharers = Counter(p.untyped_storage().data_ptr() for p in candidates)
    ranges = file_mapped_ranges()
    copied = 0
    with torch.no_grad():
        for parameter in candidates:
            if maps_file(ranges, parameter.data_ptr()) and sharers[parameter.untyped_storage().data_ptr()] == 1:
                parameter.data = parameter.data.clone()
                copied += 1
    return copied


def maps_file(ranges: list[tuple[int, int]], address: int) -> bool:
    """Whether ``address`` lies in one of ``ranges``, the sorted mappings of :func:`file_mapped_ranges`."""
    i = bisect.bisect_right(ranges, address, key=lambda mapping: mapping[0]) - 1
    return i >= 0 and address < ranges[i][1]


def file_mapped_ranges() -> list[tuple[int, int]]:
    """Sorted ``(start, end)`` addresses of this process's memory mapped from files (Linux; else none)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        # address perms offset device inode [path]; inode 0: anonymous memory, the heap, the stack
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0":
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return sorted(ranges)
