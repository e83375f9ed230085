"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is ``output_dir/checkpoint-{step}/`` holding, as data only (never pickled code):

    agent_{i}/            each agent's weights (safetensors) and tokenizer, Hugging Face format
                          (and value_head.safetensors when its critic is a head on it)
    critic_{c}/           each separate critic's model, tokenizer and value head
    optimizer.pt          the optimizers' and schedulers' state dicts (tensors and numbers)
    rng_state.pt          torch generator states: sampling (CPU and CUDA) and data order
    trainer_state.json    step, epoch, position in the epoch, reward history, pending metric
                          window, Python and NumPy generator states, what the agents were
    manifest.json         every other file's size and SHA-256

It is written under ``checkpoint-{step}.partial`` and renamed when complete: a folder
without ``trainer_state.json`` (a crash mid-save) is never taken for a checkpoint. One is
deleted (``save_total_limit``, or a checkpoint of its step written again) by renaming it to
``.deleting-checkpoint-{step}`` first, so a deletion cut short leaves no folder that looks
complete and misses files; the next run's start removes what is left of it. Resuming
checks every file against the manifest first, so a damaged file (a flipped byte inside a
weight tensor loads without complaint) is an error naming the file. Reading uses
``torch.load(weights_only=True)``, JSON and safetensors only, so a tampered file gives an
error, not code execution.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file

from comlrl.checkpoint.manifest import unreadable, write_manifest
from comlrl.engine.sharding import is_sharded, load_whole_state_dict, local, model_class, sharded_parameters
from comlrl.models.lora import is_peft_model, load_adapter_weights
from comlrl.models.value import VALUE_HEAD_FILE

PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
OPTIMIZER_SHARDS = "optimizer_shards"
"""The folder of the sharded optimizers' states: each rank's slices (``torch.distributed.checkpoint``)."""
RNG_FILE = "rng_state.pt"
DISCARDED = ".deleting-"
"""What a checkpoint folder's name starts with while it is deleted (no listing takes it for one)."""
_STEP = re.compile(rf"^{PREFIX}(\d+)$")


@dataclass
class TrainerState:
    """Where a run stands, in JSON-friendly values."""

    global_step: int
    epoch: int
    """The epoch in progress (0-based)."""
    step_in_epoch: int
    """Steps of that epoch already taken."""
    epoch_reward_means: list[float]
    epoch_raw_reward_means: list[float]
    step_rewards: list[float]
    """Mean reward of each step of the epoch in progress."""
    step_raw_rewards: list[float]
    metrics_window: dict[str, list[float]]
    """Metrics of the steps since the last logging step, not yet averaged and written."""
    agents: list[dict[str, Any]]
    """What each agent was (see :func:`describe_agent`), to refuse resuming with other ones."""
    num_rows: int
    per_device_train_batch_size: int
    world_size: int = 1
    """Data-parallel ranks of the run (each rank's generator states are kept)."""
    generators: dict[str, Any] = field(default_factory=dict)
    """Python's and NumPy's generator states (torch's are tensors, in ``rng_state.pt``);
    rank r > 0's under ``rank{r}/``."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's config, for reading."""
    trainer: str | None = None
    """The algorithm that wrote it (a trainer's ``algorithm_name``; None: a checkpoint older than this field)."""
    output_dir: str | None = None
    """The absolute folder of the run's logs: a resumed run whose config names no
    ``output_dir`` goes on writing there (None: a checkpoint older than this field)."""

    def start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` is in progress."""
        self.epoch = epoch

    def record_step(self, global_step: int, step_in_epoch: int, metrics: dict[str, float]) -> None:
        """Step ``global_step``, the ``step_in_epoch``-th of its epoch, taken with ``metrics``;
        a step that sampled (MADPO's steps train on stored pairs) adds its rewards."""
        self.global_step, self.step_in_epoch = global_step, step_in_epoch
        if "reward/mean" in metrics:
            self.step_rewards.append(metrics["reward/mean"])
            self.step_raw_rewards.append(metrics["reward/raw_mean"])

    def end_epoch(self) -> None:
        """The epoch's last step was taken: its mean rewards kept, the next epoch's counts at 0."""
        if self.step_rewards:
            self.epoch_reward_means.append(sum(self.step_rewards) / len(self.step_rewards))
            self.epoch_raw_reward_means.append(sum(self.step_raw_rewards) / len(self.step_raw_rewards))
        self.step_rewards, self.step_raw_rewards, self.step_in_epoch = [], [], 0

    def keep_window(self, window: dict[str, list[float]]) -> None:
        """The metrics not yet logged, for a checkpoint to hold."""
        self.metrics_window = window


def describe_agent(agent: torch.nn.Module) -> dict[str, Any]:
    """What must not change between a checkpoint and the trainer that resumes from it."""
    config = getattr(agent, "config", None)
    return {
        "class": model_class(agent).__name__,
        "model_type": getattr(config, "model_type", None),
        "num_parameters": sum(p.numel() for p in agent.parameters()),
    }


def checkpoint_step(path: str) -> int | None:
    match = _STEP.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def complete_checkpoints(output_dir: str) -> list[str]:
    """The complete checkpoints of ``output_dir``, oldest first. Folders that look like one but
    lack ``trainer_state.json`` (a save that was cut short) are skipped with a warning."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        step = checkpoint_step(path)
        if step is None or not os.path.isdir(path):
            continue
        if not os.path.isfile(os.path.join(path, STATE_FILE)):
            warnings.warn(f"ignoring {path}: it has no {STATE_FILE}, so its save did not finish", stacklevel=2)
            continue
        found.append((step, path))
    return [path for _, path in sorted(found)]


def save_checkpoint(
    output_dir: str,
    write_models: Callable[[str], None],
    optimizer_state: dict[str, Any],
    generators: dict[str, torch.Tensor],
    state: TrainerState,
    total_limit: int | None = None,
    started: bool = False,
) -> str:
    """Write ``output_dir/checkpoint-{global_step}`` atomically; keep the newest ``total_limit``.
    ``write_models(folder)`` writes every agent's (and critic's) weights or adapter, and tokenizer;
    ``optimizer_state`` holds the optimizers' and schedulers' state dicts. ``started``: the
    ranks already wrote into :func:`start_checkpoint`'s folder (sharded optimizer states),
    which is kept and covered by the manifest."""
    final = os.path.join(output_dir, f"{PREFIX}{state.global_step}")
    partial = final + ".partial"
    if not started:
        start_checkpoint(output_dir, state.global_step)
    try:
        write_models(partial)
        torch.save(optimizer_state, os.path.join(partial, OPTIMIZER_FILE))
        torch.save(generators, os.path.join(partial, RNG_FILE))
        with open(os.path.join(partial, STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(asdict(state), f, indent=1)
        write_manifest(partial)
    except (OSError, RuntimeError) as error:  # torch reports a full disk as RuntimeError
        shutil.rmtree(partial, ignore_errors=True)
        raise OSError(save_failure(final, output_dir, error)) from error
    if os.path.isdir(final):
        discard_checkpoint(final)
    os.replace(partial, final)
    if total_limit is not None:
        for old in complete_checkpoints(output_dir)[:-total_limit]:
            discard_checkpoint(old)
    return final


def discard_checkpoint(path: str) -> None:
    """Delete checkpoint folder ``path``, renamed out of the ``checkpoint-*`` names first (one
    atomic step): a run stopped mid-deletion (a kill, a second Ctrl-C) then leaves no folder
    that looks complete and misses files, only what :func:`remove_discarded` removes."""
    parent, name = os.path.split(os.path.normpath(path))
    aside = os.path.join(parent, DISCARDED + name)
    shutil.rmtree(aside, ignore_errors=True)  # an earlier deletion's rest: a rename onto it would fail
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def remove_discarded(folder: str) -> list[str]:
    """Remove what deletions cut short (:func:`discard_checkpoint`) left in ``folder``; returns their names."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    removed = sorted(name for name in names if name.startswith(DISCARDED + PREFIX))
    for name in removed:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    return removed


def start_checkpoint(output_dir: str, step: int) -> str:
    """The empty folder checkpoint ``step`` is written into before :func:`save_checkpoint` renames it."""
    partial = os.path.join(output_dir, f"{PREFIX}{step}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    return partial


def save_failure(final: str, output_dir: str, error: BaseException) -> str:
    """What to tell when writing checkpoint ``final`` failed: the disk's free space and what was kept."""
    try:
        free = f"{shutil.disk_usage(output_dir).free / 2**30:.2f} GiB free"
    except OSError:
        free = "free space unknown"
    earlier = complete_checkpoints(output_dir)
    kept = f"the newest complete checkpoint, {earlier[-1]}, is kept" if earlier else "no earlier checkpoint exists"
    return (
        f"checkpoint {final} could not be written ({type(error).__name__}: {error}); the disk holding "
        f"{os.path.abspath(output_dir)} has {free}. Nothing of it was left behind; {kept}"
    )


def write_json(path: str, value: Any, indent: int | None = None) -> None:
    """``value`` as JSON at ``path``, whole or not at all: written aside, then renamed (a run
    stopped mid-write leaves the previous file, never a torn one)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=indent)
    os.replace(path + ".tmp", path)


def write_folders(output_dir: str, writers: Sequence[tuple[str, Callable[[str], None]]]) -> list[str]:
    """``output_dir/<name>`` written by each ``(name, write)``, under a temporary name renamed
    when complete, so an interrupted save never leaves a folder that looks complete."""
    os.makedirs(output_dir, exist_ok=True)
    folders = []
    for name, write in writers:
        final = os.path.join(output_dir, name)
        partial = os.path.join(output_dir, f".{name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        write(partial)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        folders.append(final)
    return folders


def find_checkpoint(output_dir: str, resume_from_checkpoint: bool | str) -> str:
    """The checkpoint folder to resume from: the newest complete one in ``output_dir`` when
    ``resume_from_checkpoint`` is True, else that path (which must be complete)."""
    if resume_from_checkpoint is True:
        found = complete_checkpoints(output_dir)
        if not found:
            raise ValueError(f"resume_from_checkpoint=True but {output_dir} holds no complete {PREFIX}* folder")
        return found[-1]
    path = str(resume_from_checkpoint)
    if os.path.basename(os.path.normpath(path)).startswith(DISCARDED):
        raise ValueError(
            f"{path} is a checkpoint whose deletion was cut short: files may be missing; resume from a complete "
            f"{PREFIX}* folder"
        )
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        raise ValueError(f"{path} is not a complete checkpoint: it has no {STATE_FILE}")
    return path


def read_state(path: str) -> TrainerState:
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
            return TrainerState(**json.load(f))
    except (OSError, ValueError, TypeError) as error:
        raise unreadable(path, STATE_FILE, error) from error


def check_compatible(path: str, state: TrainerState, now: TrainerState) -> None:
    """Refuse to resume with other agents or another data layout than ``now`` (a fresh
    trainer's starting state), naming what differs."""
    if state.trainer is not None and state.trainer != now.trainer:
        # Its trainer-specific parts (pairs, rounds, critics, a reward model) would be missing or ignored.
        raise ValueError(
            f"checkpoint {path} was written by a {state.trainer} run; this trainer trains {now.trainer}: resume it "
            f"with the trainer that wrote it ({state.trainer})"
        )
    if len(state.agents) != len(now.agents):
        raise ValueError(f"checkpoint {path} holds {len(state.agents)} agents; this trainer has {len(now.agents)}")
    for i, (saved, agent) in enumerate(zip(state.agents, now.agents)):
        for key, value in saved.items():
            if agent.get(key) != value:
                raise ValueError(
                    f"checkpoint {path}: agent {i} was {key}={value!r}, this trainer's agent {i} has {agent.get(key)!r}"
                )
    # Another number of ranks may continue the data order if a step takes as many rows.
    saved_step, now_step = (s.per_device_train_batch_size * s.world_size for s in (state, now))
    if (state.num_rows, saved_step) != (now.num_rows, now_step):
        raise ValueError(
            f"checkpoint {path} was taken with {state.num_rows} training rows, per_device_train_batch_size="
            f"{state.per_device_train_batch_size} and {state.world_size} rank(s) ({saved_step} rows per step); "
            f"this trainer has {now.num_rows}, {now.per_device_train_batch_size} and {now.world_size} ({now_step} "
            "rows per step), so the data order cannot be continued"
        )


def load_weights(
    path: str, agents: Sequence[torch.nn.Module], adapters: Sequence[str | None], prefix: str = "agent"
) -> None:
    """Load each agent's (or, with ``prefix="critic"``, each critic's) saved weights or adapter
    into it from ``{prefix}_{i}/``; tied weights are saved once and stay tied. A value head's
    file in the same folder is not the model's and is left to the value head."""
    for i, (agent, adapter) in enumerate(zip(agents, adapters)):
        folder = os.path.join(path, f"{prefix}_{i}")
        files = (
            sorted(f for f in os.listdir(folder) if f.endswith(".safetensors") and f != VALUE_HEAD_FILE)
            if os.path.isdir(folder)
            else []
        )
        if not files:
            raise ValueError(f"checkpoint {path}: {prefix}_{i} holds no .safetensors weights")
        weights: dict[str, torch.Tensor] = {}
        for name in files:
            try:
                weights.update(load_file(os.path.join(folder, name)))
            except Exception as error:
                raise unreadable(path, f"{prefix}_{i}/{name}", error) from error
        with sharded_parameters([agent]):
            if is_peft_model(agent):
                missing, unexpected = [], load_adapter_weights(agent, weights, adapter)
            elif is_sharded(agent):
                missing, unexpected = load_whole_state_dict(agent, weights)
            else:
                missing, unexpected = agent.load_state_dict(weights, strict=False)
            state = agent.state_dict()
            loaded = {local(t).data_ptr() for key, t in state.items() if key in weights}
            untied = [key for key in missing if local(state[key]).data_ptr() not in loaded]
        if untied or unexpected:
            what = "adapter does" if is_peft_model(agent) else "weights do"
            raise ValueError(
                f"checkpoint {path}: {prefix}_{i}'s {what} not fit {prefix} {i} (missing {untied[:3]}, "
                f"unexpected {unexpected[:3]})"
            )


def read_tensors(path: str, name: str, parse: Callable[[Any], Any] = lambda data: data) -> Any:
    """``parse`` of the data file ``name`` of checkpoint ``path`` (tensors, numbers, strings:
    ``torch.load(weights_only=True)``); a file that cannot be read or parsed is an error naming it."""
    try:
        return parse(torch.load(os.path.join(path, name), weights_only=True))
    except Exception as error:
        raise unreadable(path, name, error) from error


def load_training_state(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The optimizer/scheduler states and the generator states of a checkpoint."""
    return read_tensors(path, OPTIMIZER_FILE), read_tensors(path, RNG_FILE)


def truncate_log(path: str, step: int) -> None:
    """Drop the lines of a JSONL log written after ``step`` (by the run that stopped), so a
    resumed run's log reads as if it never stopped. Lines that are not JSON objects (a crash
    mid-write tears the last one, and the next record would be glued onto it) move to
    ``<log>.damaged``, with a warning: kept for a person to read, out of the log."""
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    kept, damaged = [], []
    for line in lines:
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError:  # UnicodeDecodeError included
            damaged.append(line if line.endswith(b"\n") else line + b"\n")
            continue
        if record.get("step", 0) <= step:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    if damaged:
        with open(path + ".damaged", "ab") as f:
            f.writelines(damaged)
        warnings.warn(
            f"{path}: {len(damaged)} damaged line(s) (a run stopped mid-write) moved to {path}.damaged", stacklevel=2
        )
    if kept != lines:
        with open(path + ".tmp", "wb") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
