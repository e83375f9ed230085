"""A run into a checkpoint and back: its models, optimizers and schedulers, every rank's
generator states, the data order and where the run stands.

It knows the run (agents, learners, the data-parallel ranks) and what writes and reads its
models, but not the loop: the loop hands over its :class:`TrainerState` and the data-order
generator's state at the start of the epoch in progress.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

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
from comlrl.engine.run import Run
from comlrl.utils.run_control import (
    generator_states,
    rank_generator_states,
    restore_generator_states,
    seed_everything,
    states_of_rank,
)

LOGS = ("metrics.jsonl", "samples.jsonl")


def save_run(
    run: Run,
    write_models: Callable[[str], None],
    progress: TrainerState,
    epoch_order_state: torch.Tensor,
    checkpoint_dir: str,
    total_limit: int | None,
) -> str:
    """Rank 0 writes ``checkpoint_dir/checkpoint-{step}`` (its models by ``write_models``;
    keeping the newest ``total_limit``), with every rank's generator states (each rank samples
    its own); returns the folder on every rank."""
    run.learners.require_finite(f": checkpoint-{run.state.global_step} was not written")
    json_states, tensors = generator_states()
    gathered = run.parallel.gather((json_states, tensors))
    folder = os.path.join(checkpoint_dir, f"checkpoint-{run.state.global_step}")
    sharded = bool(run.learners.sharded)
    if sharded:  # every rank writes its slices first
        if run.parallel.is_main:
            start_checkpoint(checkpoint_dir, run.state.global_step)
        run.parallel.barrier()
        run.learners.save_shards(os.path.join(folder + ".partial", OPTIMIZER_SHARDS))
    with run.agents.whole_weights():
        if run.parallel.is_main:
            generators = rank_generator_states([tensors for _, tensors in gathered])
            generators["data_order"] = epoch_order_state
            progress = dataclasses.replace(
                progress,
                generators=rank_generator_states([json for json, _ in gathered]),
                config=config_record(run.config),
                output_dir=os.path.abspath(run.state.output_dir),
            )
            folder = save_checkpoint(
                checkpoint_dir,
                write_models,
                run.learners.state_dict(),
                generators,
                progress,
                total_limit,
                started=sharded,
            )
    run.parallel.barrier()
    return folder


def resume_run(
    run: Run,
    load_models: Callable[[str], None],
    resume_from_checkpoint: bool | str,
    data_order: torch.Generator,
    say: Callable[[str], None],
    checkpoint_dir: str,
) -> TrainerState:
    """Load a checkpoint (with True: the newest in ``checkpoint_dir``) into the run's models
    (``load_models`` reads them), optimizers, schedulers and generators and the data-order
    generator; returns where the run stood. ``say`` prints notes (values of the config the checkpoint could not store,
    taken from this run's config)."""
    path = find_checkpoint(checkpoint_dir, resume_from_checkpoint)
    state = read_state(path)
    check_compatible(path, state, start_state(run))
    for note in check_resumed_config(path, state.config, run.config) + config_changes(path, state.config, run.config):
        say(note)
    optimizer_state, generators = load_training_state(path)
    load_models(path)
    run.learners.load_state_dict(optimizer_state, f"checkpoint {path}")
    run.learners.load_shards(os.path.join(path, OPTIMIZER_SHARDS), optimizer_state)
    rank = run.parallel.rank
    if rank < state.world_size:
        restore_generator_states(states_of_rank(state.generators, rank), states_of_rank(generators, rank))
    else:  # a rank the writing run did not have: its own stream, the same in every such resume
        seed_everything(run.config.seed + rank + state.global_step)
    data_order.set_state(generators["data_order"])
    run.state.resume_at(state.global_step)
    # Lines the stopped run wrote after its checkpoint would otherwise appear twice.
    for log in LOGS if run.parallel.is_main else ():
        truncate_log(os.path.join(run.state.output_dir, log), state.global_step)
    return state


def start_state(run: Run) -> TrainerState:
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
        agents=run.agents.describe(),
        num_rows=len(run.train_prompts),
        per_device_train_batch_size=run.config.per_device_train_batch_size,
        world_size=run.parallel.world_size,
        trainer=run.name,
    )
