"""Checkpoints: what a folder holds and how it is written and read (``files``; its manifest of
file hashes: ``manifest``), and how a
trainer saves itself into one and resumes from it (``trainer``), and the run's config as
JSON (``config_record``)."""

from comlrl.checkpoint.config_record import check_resumed_config, config_record, not_json_values
from comlrl.checkpoint.files import (
    TrainerState,
    check_compatible,
    checkpoint_step,
    complete_checkpoints,
    describe_agent,
    find_checkpoint,
    load_training_state,
    load_weights,
    read_state,
    read_tensors,
    save_checkpoint,
    truncate_log,
    write_folders,
    write_json,
)
from comlrl.checkpoint.manifest import verify_checkpoint

__all__ = [
    "TrainerState",
    "check_compatible",
    "check_resumed_config",
    "checkpoint_step",
    "complete_checkpoints",
    "config_record",
    "describe_agent",
    "find_checkpoint",
    "load_training_state",
    "load_weights",
    "not_json_values",
    "read_state",
    "read_tensors",
    "save_checkpoint",
    "truncate_log",
    "verify_checkpoint",
    "write_folders",
    "write_json",
]
