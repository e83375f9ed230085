"""Does each library learn the tutorial task as much per optimizer step? Runs the learning
workload of benchmarks/workload.py (the tutorial's 10 prompts, 2 agents, G = 8, up to 64 free
tokens, 2 epochs of 5 optimizer steps per agent, lr 5e-5, rows in order) for several seeds on
each side, each run in a fresh process (benchmarks/bench_original.py and bench_ours.py with
``--learning-seed``), sides alternating within each seed.

    benchmarks/setup_original.sh                                        # once
    .venv/bin/python benchmarks/learning_vs_original.py                 # 5 seeds: original, ours fp32, ours bf16
    .venv/bin/python benchmarks/learning_vs_original.py --seeds 3 --sides ours-fp32 ours-bf16 --json out.json
    .venv/bin/python benchmarks/learning_vs_original.py --sides ours-fp32-unclipped   # max_grad_norm=None

Printed per run: each epoch's mean reward x100 and the gain from the first epoch to the last;
per side, the mean gain over seeds and its standard deviation (the spread between seeds is
large on this task: compare means with their spread in mind).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from compare_original import HERE, SCRIPTS, run_script

SIDES = {
    "original": ("original", ["--dtype", "fp32"]),
    "original-bf16": ("original", ["--dtype", "bf16"]),
    "ours-fp32": ("ours", ["--precision", "fp32"]),
    "ours-bf16": ("ours", ["--precision", "bf16"]),
    "ours-fp32-unclipped": ("ours", ["--precision", "fp32", "--max-grad-norm", "none"]),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per side, 0..N-1 (default: %(default)s)")
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["original", "ours-fp32", "ours-bf16"],
        choices=sorted(SIDES),
        help="what to run (default: %(default)s)",
    )
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of every run")
    parser.add_argument(
        "--original-python",
        default=os.path.join(HERE, ".venv-original", "bin", "python"),
        help="Python of the original's virtual environment (default: %(default)s)",
    )
    parser.add_argument("--ours-python", default=sys.executable, help="Python of ours (default: this one)")
    parser.add_argument("--json", default=None, help="also write every run and the summary to this JSON file")
    return parser.parse_args(argv)


def gain(run: dict) -> float:
    means = run["epoch_reward_means"]
    return means[-1] - means[0]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    pythons = {"original": args.original_python, "ours": args.ours_python}
    common = ["--model", args.model] + (["--threads", str(args.threads)] if args.threads else [])
    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in range(args.seeds):
        for side in args.sides:
            library, options = SIDES[side]
            run = run_script(pythons[library], SCRIPTS[library], [*common, *options, "--learning-seed", str(seed)])
            runs[side].append(run)
            means = ", ".join(f"{m:.1f}" for m in run["epoch_reward_means"])
            print(f"seed {seed} {side:<14} epochs [{means}] gain {gain(run):+.1f} ({run['train_s']:.0f} s)", flush=True)
    summary = {}
    for side, side_runs in runs.items():
        gains = [gain(run) for run in side_runs]
        spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
        summary[side] = {"mean_gain": statistics.mean(gains), "stdev_gain": spread, "gains": gains}
        print(f"{side:<14} mean gain {summary[side]['mean_gain']:+.1f} (sd {spread:.1f}) over {len(gains)} seeds")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
