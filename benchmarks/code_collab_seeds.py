"""Does the code task's default recipe learn without collapsing? examples/code-collab.py at its
defaults (two agents, two turns, the MAGRPO paper's split, the whole held-out split of 32
problems x 4 samples before and after training), several seeds, each run in a fresh process.

    .venv/bin/python benchmarks/code_collab_seeds.py                          # seeds 1, 2, 3
    .venv/bin/python benchmarks/code_collab_seeds.py --jobs 2 --threads 1 --json out.json  # ~7.6 GiB per run
    .venv/bin/python benchmarks/code_collab_seeds.py --seeds 1 -- --learning-rate 5e-5   # after --: the example's flags
    .venv/bin/python benchmarks/code_collab_seeds.py --reports RUN/code_eval.json ...     # summarise earlier runs

Read from each run's code_eval.json: how far each agent's weights moved (||w - w0|| / ||w0||),
the training reward per epoch (an epoch is the same problems, so epochs compare), the
last turn's reward of every step (the curve), and the held-out levelled reward, its levels
and pass@1 before and after training.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "code-collab.py")
HELD_OUT = ("reward", "level/parses", "level/defines", "level/runs", "level/asserts", "level/passes", "pass@1")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (default: %(default)s)")
    parser.add_argument("--first-seed", type=int, default=1, help="first seed (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at the same time (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="the example's --threads (default: torch's choice)")
    parser.add_argument("--python", default=sys.executable, help="Python that runs the example (default: this one)")
    parser.add_argument("--json", default=None, help="also write every run's figures to this JSON file")
    parser.add_argument(
        "--runs-dir", default=None, help="keep each run's folder here, seed-N (default: a temporary folder)"
    )
    parser.add_argument(
        "--reports", nargs="+", default=None, help="summarise these code_eval.json files of earlier runs, run nothing"
    )
    parser.add_argument("options", nargs="*", help="after --: more flags for the example")
    return parser.parse_args(argv)


def run(python: str, seed: int, options: list[str], folder: str) -> dict:
    """One run of the example in a fresh process, in ``folder``: its code_eval.json."""
    command = [python, EXAMPLE, "--no-save", "--seed", str(seed), "--output-dir", folder, *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"code-collab.py --seed {seed} {' '.join(options)} failed with exit status {done.returncode}")
    return json.loads((Path(folder) / "code_eval.json").read_text())


def figures(report: dict) -> dict:
    """What the benchmark reads from one run's code_eval.json."""
    before, after = report["before"]["metrics"], report["after"]["metrics"]
    return {
        "seed": report["seed"],
        "weight_change": report["weight_change"],
        "train_reward_per_epoch": report["train_reward_per_epoch"],
        "train_reward_per_step": [entry["reward"] for entry in report["train_reward_per_step"]],
        "before": {key: before[key] for key in HELD_OUT},
        "after": {key: after[key] for key in HELD_OUT},
        "seconds_per_step": report["seconds_per_step"],
        "train_seconds": report["train_seconds"],
    }


def run_seeds(args: argparse.Namespace) -> list[dict]:
    """Every seed's run, ``--jobs`` at a time; each run's folder is in ``--runs-dir`` (kept) or
    a temporary folder."""
    threads = [] if args.threads is None else ["--threads", str(args.threads)]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    with tempfile.TemporaryDirectory(prefix="code-collab-") as scratch, ThreadPoolExecutor(args.jobs) as pool:
        folder = args.runs_dir or scratch
        return list(
            pool.map(
                lambda seed: run(args.python, seed, [*threads, *args.options], os.path.join(folder, f"seed-{seed}")),
                seeds,
            )
        )


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.reports:
        runs = [figures(json.loads(Path(path).read_text())) for path in args.reports]
    else:
        runs = [figures(report) for report in run_seeds(args)]
    for found in runs:
        epochs = " -> ".join(f"{value:.3f}" for value in found["train_reward_per_epoch"])
        steps = " ".join(f"{value:.2f}" for value in found["train_reward_per_step"])
        moved = ", ".join(f"{value:.2e}" for value in found["weight_change"])
        print(f"seed {found['seed']}: weights moved {moved}; training reward per epoch {epochs} (per step: {steps})")
        print(
            "  held-out before -> after: "
            + ", ".join(f"{key} {found['before'][key]:.3f} -> {found['after'][key]:.3f}" for key in HELD_OUT)
        )
        print(f"  {found['seconds_per_step']:.1f} s per training step, {found['train_seconds']:.0f} s in train()")
    print(f"\nmean ± std over {len(runs)} seeds, held-out before -> after:")
    for key in HELD_OUT:
        before, after = [r["before"][key] for r in runs], [r["after"][key] for r in runs]
        change = [b - a for a, b in zip(before, after)]
        print(f"  {key:<14} {mean_std(before)} -> {mean_std(after)} (change {mean_std(change)})")
    first, last = [r["train_reward_per_epoch"][0] for r in runs], [r["train_reward_per_epoch"][-1] for r in runs]
    print(f"  training reward, first -> last epoch: {mean_std(first)} -> {mean_std(last)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
