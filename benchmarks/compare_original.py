"""Compare our trainer with the original library (PyPI comlrl==1.4.3) on the fixed workload of
benchmarks/workload.py: runs alternate original, ours, original, ours, ... each in a fresh
process started with its side's Python (benchmarks/bench_original.py in the original's virtual
environment, benchmarks/bench_ours.py in ours).

    benchmarks/setup_original.sh                                    # once: benchmarks/.venv-original
    .venv/bin/python benchmarks/compare_original.py                 # 3 pairs
    .venv/bin/python benchmarks/compare_original.py --pairs 5 --threads 2 --json benchmarks/results/original.json
    .venv/bin/python benchmarks/compare_original.py --smoke --pairs 1
    .venv/bin/python benchmarks/compare_original.py --precision bf16                      # ours bf16, original fp32
    .venv/bin/python benchmarks/compare_original.py --precision bf16 --original-dtype bf16

Printed: per pair, both sides' ``trainer.train()`` seconds and their ratio original / ours;
the median of those ratios; the median over the runs of every figure of each side (see
benchmarks/measure.py) and the ratio of the medians. ``--json`` also writes every run's line,
the pairs and the medians to a file. A run's own output is shown only if it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"original": "bench_original.py", "ours": "bench_ours.py"}


def run_script(python: str, script: str, options: list[str]) -> dict:
    """One run of a side's ``script`` (a file of benchmarks/) in a fresh process; returns its JSON line."""
    done = subprocess.run([python, os.path.join(HERE, script), *options], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"{script} failed with exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(runs: list[dict]) -> dict[str, float]:
    """The median of every numeric figure over ``runs``."""
    numeric = [key for key, value in runs[0].items() if isinstance(value, int | float)]
    return {key: statistics.median(run[key] for run in runs) for key in numeric}


def print_medians(median: dict[str, dict[str, float]], baseline: str = "original") -> None:
    """Each figure both sides have: the ``baseline`` side's median, ours, and their ratio."""
    print(f"\n{'median over runs':<24}{baseline:>14}{'ours':>14}{baseline + '/ours':>15}")
    for key, theirs in median[baseline].items():
        ours = median["ours"].get(key)
        if ours is None:
            continue
        ratio = f"x{theirs / ours:.2f}" if ours else "-"
        print(f"{key:<24}{theirs:>14.4g}{ours:>14.4g}{ratio:>15}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="original/ours run pairs (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--smoke", action="store_true", help="tiny check: 1 prompt, 2 generations, 4 tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of both sides")
    parser.add_argument(
        "--original-python",
        default=os.path.join(HERE, ".venv-original", "bin", "python"),
        help="Python of the original's virtual environment (default: %(default)s)",
    )
    parser.add_argument("--ours-python", default=sys.executable, help="Python of ours (default: this one)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="ours: the config's precision")
    parser.add_argument(
        "--original-dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="the original's agents' weights (its default: fp32)",
    )
    parser.add_argument("--json", default=None, help="also write every run and the medians to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not os.path.exists(args.original_python):
        sys.exit(f"{args.original_python} not found: run benchmarks/setup_original.sh first")
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    options = ["--model", args.model] + (["--smoke"] if args.smoke else [])
    options += ["--threads", str(args.threads)] if args.threads else []
    pythons = {"original": args.original_python, "ours": args.ours_python}
    side_options = {"original": ["--dtype", args.original_dtype], "ours": ["--precision", args.precision]}
    print(f"original with {args.original_dtype} agents, ours with precision={args.precision}", flush=True)
    alternate(args, args.pairs, pythons, SCRIPTS, options, side_options)


def alternate(
    args: argparse.Namespace,
    count: int,
    pythons: dict[str, str],
    scripts: dict[str, str],
    options: list[str],
    side_options: dict[str, list[str]],
) -> None:
    """``count`` pairs of runs, the sides of ``scripts`` (the baseline first, then ``ours``)
    alternating, each a fresh process of its side's Python; prints each pair's train-time
    ratio, their median and the medians of every figure, and writes them to ``args.json``."""
    baseline = next(iter(scripts))
    pairs = []
    for pair in range(1, count + 1):
        runs = {side: run_script(pythons[side], scripts[side], options + side_options[side]) for side in scripts}
        ratio = runs[baseline]["train_s"] / runs["ours"]["train_s"]
        pairs.append({**runs, "train_s_ratio": ratio})
        print(
            f"pair {pair}: {baseline} {runs[baseline]['train_s']:.1f} s, ours {runs['ours']['train_s']:.1f} s, "
            f"{baseline}/ours x{ratio:.2f}",
            flush=True,
        )
    median_ratio = statistics.median(p["train_s_ratio"] for p in pairs)
    print(f"median {baseline}/ours train time: x{median_ratio:.2f}")
    median = {side: medians([p[side] for p in pairs]) for side in scripts}
    print_medians(median, baseline)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "pairs": pairs, "median_train_s_ratio": median_ratio, "medians": median},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
