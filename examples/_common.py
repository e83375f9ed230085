"""What every example script shares: its common flags, the checks made before anything loads,
where a run writes, and the summary's last lines. The scripts import it from their folder.

Where a run writes: every run gets a folder of its own, ``result.output_dir``, and everything
it writes goes there (``metrics.jsonl``, the curves ``metrics.png``, the trained models in
``models/``, and what an example adds, such as ``code_eval.json``). Without ``--output-dir``
that folder is new for each run (the library's default, ``comlrl_output/<algorithm>-<time>``;
``comlrl_output/latest`` links to the newest), so running an example again never replaces an
earlier run. A folder named with ``--output-dir`` holds one run: a second run there is refused
unless ``--overwrite`` says to replace the first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from comlrl.checkpoint.run_folder import earlier_run
from comlrl.metrics.plot import plot_run
from comlrl.models.folders import check_model_available

EMBEDDED = "the embedded SmolLM2-135M-Instruct"


def add_common_flags(parser: argparse.ArgumentParser, models: str, writes: str = "") -> None:
    """The flags every example has. ``models``: what ``--model`` loads ("both agents");
    ``writes``: what the example writes into its run folder beside the metrics, curves and models."""
    parser.add_argument("--model", default=None, help=f"model folder or hub id of {models} (default: {EMBEDDED})")
    parser.add_argument(
        "--output-dir",
        default=None,
        help=f"the run's folder: metrics.jsonl, metrics.png (the curves), {writes}the trained models in models/ "
        "(default: a new folder for each run, comlrl_output/<algorithm>-<time>, so no run replaces another; "
        "a folder named here that holds an earlier run is refused unless --overwrite)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the earlier run in --output-dir (its logs, checkpoints and curves; its models/ are replaced "
        "when this run saves its own)",
    )
    parser.add_argument(
        "--no-save",
        action="store_true",
        help="do not write the trained models into models/ (~0.54 GB per agent of the embedded model); the "
        "metrics and curves are still written",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads(N): the CPU threads torch computes with (default: torch's choice, one per "
        "core); on a machine shared with other jobs, fewer threads (often 1) avoid a many-fold slowdown",
    )
    parser.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--generation-backend",
        choices=["hf", "vllm"],
        default="hf",
        help="what samples the completions: the training models (hf, default) or vLLM engines (vllm: pip install "
        "'comlrl[vllm]', or the CPU build, see docs/guides/distributed.md)",
    )
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases (off by default)")
    parser.add_argument("--wandb-project", default="comlrl", help="W&B project (with --wandb; default: %(default)s)")
    parser.add_argument("--wandb-entity", default=None, help="W&B entity (with --wandb; default: your default entity)")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments, with ``--threads`` applied, or argparse's one-line error (exit
    code 2) for what would otherwise fail after the models load: a ``--model`` that cannot load,
    an ``--output-dir`` holding an earlier run without ``--overwrite``."""
    args = parser.parse_args(argv)
    if args.overwrite and args.output_dir is None:
        parser.error("--overwrite replaces the run in --output-dir, and there is none: without it, each run is new")
    found = earlier_run(args.output_dir) if args.output_dir is not None and not args.overwrite else []
    if found:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        parser.error(
            f"--output-dir {args.output_dir} holds an earlier run ({shown}): pass --overwrite to replace it, "
            "name another folder, or leave --output-dir out for a new folder"
        )
    if args.model is not None:
        try:
            args.model = check_model_available(args.model, "--model")
        except ValueError as error:
            parser.error(f"{error}; or leave --model out for {EMBEDDED}")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    return args


def model_source(args: argparse.Namespace) -> str:
    """``--model``, or the embedded model's folder (converted into the cache on first use)."""
    if args.model is not None:
        return args.model
    from comlrl.models import default_model_path

    return str(default_model_path())


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the common flags set."""
    return {
        "seed": args.seed,
        "output_dir": args.output_dir,
        "overwrite_output_dir": args.overwrite,
        "generation_backend": args.generation_backend,
    }


def wandb_config(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """The trainer's ``wandb_config`` (the run named ``name``), or None without ``--wandb``."""
    if not args.wandb:
        return None
    return {"project": args.wandb_project, "entity": args.wandb_entity, "name": name}


def save_models(trainer: Any, result: Any, args: argparse.Namespace) -> str:
    """The trained models into the run's ``models/`` (unless ``--no-save``); says where, for the summary."""
    if args.no_save:
        return "models not saved (--no-save)"
    folders = trainer.save_model(os.path.join(result.output_dir, "models"))
    return "models in " + ", ".join(os.path.relpath(folder, result.output_dir) for folder in folders)


def peak_memory() -> str:
    """ ", peak memory X GiB" (this process's peak resident set so far), where the OS reports it."""
    try:
        import resource
    except ImportError:  # Windows
        return ""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return f", peak memory {peak / (2**30 if sys.platform == 'darwin' else 2**20):.1f} GiB"


def run_summary(result: Any, started: float, saved: str) -> str:
    """The summary's last two lines: steps, time and torch threads (time per step depends on
    them), then the run's folder and what is in it. Draws the curves first."""
    try:
        curves = f"curves in {plot_run(result.output_dir).name}"
    except ImportError as error:  # matplotlib is an optional extra
        curves = f"no curves: {error}"
    total = time.perf_counter() - started
    return (
        f"{result.global_step} steps in {result.train_seconds:.0f} s of training ({total:.0f} s in all) "
        f"with torch.get_num_threads() = {torch.get_num_threads()}{peak_memory()}\n"
        f"run folder {result.output_dir}: metrics.jsonl; {curves}; {saved}"
    )
