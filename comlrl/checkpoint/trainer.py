"""A trainer into a checkpoint and back: its models, optimizers and schedulers, every
rank's generator states, the data order and where the run stands.

It knows the trainer's parts (agents, learners, the data-parallel ranks) but not its loop:
the loop hands over its :class:`TrainerState` and the data-order generator's state at the
start of the epoch in progress.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import torch

from comlrl.checkpoint.config_record import check_resumed_config, config_changes, config_record
from comlrl.checkpoint.files import (
    OPTIMIZER_SHARDS,
    TrainerState,
    check_compatible,
    find_checkpoint,
    load_training_state,
    read_state,
    save_checkpoint,
    start_checkpoint,
    truncate_log,
)
from comlrl.utils.run_control import (
    generator_states,
    rank_generator_states,
    restore_generator_states,
    seed_everything,
    states_of_rank,
)

LOGS = ("metrics.jsonl", "samples.jsonl")


class Checkpointable(Protocol):
    """What of a trainer a checkpoint holds."""

    args: Any
    algorithm_name: str
    output_dir: str
    parallel: Any
    agents: Any
    learners: Any
    train_prompts: Any
    global_step: int

    def write_models(self, folder: str) -> None: ...

    def load_models(self, path: str) -> None: ...


def save_trainer(
    trainer: Checkpointable,
    progress: TrainerState,
    epoch_order_state: torch.Tensor,
    checkpoint_dir: str,
    total_limit: int | None,
) -> str:
    """Rank 0 writes ``checkpoint_dir/checkpoint-{step}`` (keeping the newest ``total_limit``),
    with every rank's generator states (each rank samples its own); returns the folder on every rank."""
    trainer.learners.require_finite(f": checkpoint-{trainer.global_step} was not written")
    json_states, tensors = generator_states()
    gathered = trainer.parallel.gather((json_states, tensors))
    folder = os.path.join(checkpoint_dir, f"checkpoint-{trainer.global_step}")
    sharded = bool(trainer.learners.sharded)
    if sharded:  # every rank writes its slices first
        if trainer.parallel.is_main:
            start_checkpoint(checkpoint_dir, trainer.global_step)
        trainer.parallel.barrier()
        trainer.learners.save_shards(os.path.join(folder + ".partial", OPTIMIZER_SHARDS))
    with trainer.agents.whole_weights():
        if trainer.parallel.is_main:
            progress.generators = rank_generator_states([json for json, _ in gathered])
            generators = rank_generator_states([tensors for _, tensors in gathered])
            generators["data_order"] = epoch_order_state
            progress.config = config_record(trainer.args)
            progress.output_dir = os.path.abspath(trainer.output_dir)
            folder = save_checkpoint(
                checkpoint_dir,
                trainer.write_models,
                trainer.learners.state_dict(),
                generators,
                progress,
                total_limit,
                started=sharded,
            )
    trainer.parallel.barrier()
    return folder


def resume_trainer(
    trainer: Checkpointable,
    resume_from_checkpoint: bool | str,
    data_order: torch.Generator,
    say: Callable[[str], None],
    checkpoint_dir: str,
) -> TrainerState:
    """Load a checkpoint (with True: the newest in ``checkpoint_dir``) into the trainer's
    models, optimizers, schedulers and generators and the data-order generator; returns where
    the run stood. ``say`` prints notes (values of the config the checkpoint could not store,
    taken from this run's config)."""
    path = find_checkpoint(checkpoint_dir, resume_from_checkpoint)
    state = read_state(path)
    check_compatible(path, state, start_state(trainer))
    for note in check_resumed_config(path, state.config, trainer.args) + config_changes(
        path, state.config, trainer.args
    ):
        say(note)
    optimizer_state, generators = load_training_state(path)
    trainer.load_models(path)
    trainer.learners.load_state_dict(optimizer_state, f"checkpoint {path}")
    trainer.learners.load_shards(os.path.join(path, OPTIMIZER_SHARDS), optimizer_state)
    rank = trainer.parallel.rank
    if rank < state.world_size:
        restore_generator_states(states_of_rank(state.generators, rank), states_of_rank(generators, rank))
    else:  # a rank the writing run did not have: its own stream, the same in every such resume
        seed_everything(trainer.args.seed + rank + state.global_step)
    data_order.set_state(generators["data_order"])
    trainer.global_step = state.global_step
    # Lines the stopped run wrote after its checkpoint would otherwise appear twice.
    for log in LOGS if trainer.parallel.is_main else ():
        truncate_log(os.path.join(trainer.output_dir, log), state.global_step)
    return state


def start_state(trainer: Checkpointable) -> TrainerState:
    """Where a new run stands: nothing done yet."""
    return TrainerState(
        global_step=0,
        epoch=0,
        step_in_epoch=0,
        epoch_reward_means=[],
        epoch_raw_reward_means=[],
        step_rewards=[],
        step_raw_rewards=[],
        metrics_window={},
        agents=trainer.agents.describe(),
        num_rows=len(trainer.train_prompts),
        per_device_train_batch_size=trainer.args.per_device_train_batch_size,
        world_size=trainer.parallel.world_size,
        trainer=trainer.algorithm_name,
    )
