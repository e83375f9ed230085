"""Data parallelism across processes: ``torchrun --nproc_per_node K script.py`` (or across
machines with torchrun's rendezvous) runs K copies of a training script; each rank samples
and scores its share of every step's rows, and the gradients of every agent (and critic)
are summed across ranks before each optimizer step, so all ranks keep identical weights.

The loss of a step is normalised over the tokens (or sequences) of ALL ranks, and the
gradients are summed, not averaged: K ranks compute exactly the gradient a single process
would over the same global batch. NCCL is used on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from comlrl.utils.stats import Stat, combine, finish

Item = TypeVar("Item")


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the ranks; with one rank every operation is a no-op."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> DataParallel:
        """The ranks torchrun started (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``), joining the
        process group if the script has not; one rank when not launched by torchrun."""
        if int(os.environ.get("WORLD_SIZE", "1")) == 1 and not dist.is_initialized():
            return cls()
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, saves and writes checkpoints."""
        return self.rank == 0

    def shard(self, rows: list[Item]) -> list[Item]:
        """This rank's contiguous share of a step's rows, or of any list (shares differ by at
        most one item; with fewer items than ranks, the last ranks' shares are empty)."""
        if not self.enabled:
            return rows
        share, extra = divmod(len(rows), self.world_size)
        start = self.rank * share + min(self.rank, extra)
        return rows[start : start + share + (self.rank < extra)]

    def check_optimizer_steps(self, train_batch_size: int | None, rollout_rows: int, counts_rows: bool) -> None:
        """Several optimizer steps per rollout (a ``train_batch_size`` of rows below the
        ``rollout_rows`` a rank samples; ``counts_rows``: the config's field counts rows) are one
        process's only."""
        several_steps = train_batch_size not in (None, rollout_rows)
        if self.enabled and counts_rows and several_steps:
            raise ValueError(
                f"train_batch_size={train_batch_size} (several optimizer steps per rollout) is not supported "
                "under torchrun yet: leave it None, or lower per_device_train_batch_size instead"
            )

    def check_rows(self, num_rows: int, per_device_batch_size: int) -> None:
        """Every rank needs a row at every step of an epoch, the last one included."""
        rows_per_step = per_device_batch_size * self.world_size
        last = num_rows % rows_per_step
        if 0 < last < self.world_size or num_rows < self.world_size:
            raise ValueError(
                f"train_dataset has {num_rows} rows; with {self.world_size} ranks x per_device_train_batch_size="
                f"{per_device_batch_size} = {rows_per_step} rows per step, the last step of each epoch holds "
                f"{last or num_rows}, fewer than the {self.world_size} ranks. Use a row count whose remainder "
                f"modulo {rows_per_step} is 0 or at least {self.world_size}"
            )

    def sum_values(self, values: list[float]) -> list[float]:
        """Each number summed over the ranks (counts, totals), in float64."""
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on one (e.g. a rank received SIGTERM)."""
        return self.sum_values([float(flag)])[0] > 0

    def most(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks, one flat buffer per device and dtype.
        Sharded parameters (:mod:`comlrl.engine.sharding`) are skipped: FSDP summed their gradients
        into each rank's slice during the backward pass."""
        if not self.enabled:
            return
        buckets: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for parameter in parameters:
            if isinstance(parameter, DTensor):
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            buckets.setdefault((parameter.grad.device, parameter.grad.dtype), []).append(parameter)
        for group in buckets.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for parameter, summed in zip(group, flat.split([p.numel() for p in group])):
                parameter.grad.copy_(summed.view_as(parameter.grad))

    def broadcast_parameters(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Every rank starts from rank 0's weights (models initialised at random differ); sharded
        parameters took rank 0's before they were sharded."""
        if not self.enabled:
            return
        with torch.no_grad():
            for parameter in parameters:
                if not isinstance(parameter, DTensor):
                    dist.broadcast(parameter.data, src=0)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (any picklable object), in rank order."""
        if not self.enabled:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def gather_lists(self, items: list[Item]) -> list[Item]:
        """Every rank's ``items`` joined in rank order, the same list on every rank; ``items``
        itself with one rank. Made share by share of :meth:`shard`, a list comes back whole and
        in its order (MADPO's preference pairs, built from each rank's share of the rows)."""
        if not self.enabled:
            return items
        return [item for share in self.gather(items) for item in share]

    def reduce_metrics(self, stats: dict[str, Stat]) -> dict[str, float]:
        """The step's metrics over every rank's share, each combined the way it was formed
        (see :mod:`comlrl.utils.stats`): the values one process gets over the global batch."""
        return finish(combine(self.gather(stats)) if self.enabled else stats)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def _device(self) -> torch.device:
        """Where collective operations' tensors live: NCCL only moves GPU tensors."""
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
