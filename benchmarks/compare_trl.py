"""Compare our trainer with ONE agent against TRL's GRPOTrainer (PyPI trl==1.16.0) on the fixed
workload of benchmarks/workload.py: runs alternate TRL, ours, TRL, ours, ... each in a fresh
process started with its side's Python (benchmarks/bench_trl.py in TRL's virtual environment,
``benchmarks/bench_ours.py --agents 1`` in ours).

    benchmarks/setup_trl.sh                                         # once: benchmarks/.venv-trl
    .venv/bin/python benchmarks/compare_trl.py                      # 3 rounds, fp32
    .venv/bin/python benchmarks/compare_trl.py --rounds 5 --threads 2 --json benchmarks/results/trl.json
    .venv/bin/python benchmarks/compare_trl.py --smoke --rounds 1
    .venv/bin/python benchmarks/compare_trl.py --precision bf16     # TRL's bf16 flag, ours precision="bf16"

Printed: per round, both sides' ``trainer.train()`` seconds and peak RSS, and the ratio TRL / ours
of the train time; the median of those ratios; the median over the runs of every figure of each
side (see benchmarks/measure.py) and the ratio of the medians. ``--json`` also writes every run's
line, the rounds (as "pairs") and the medians to a file. A run's own output is shown only if it fails.
"""

from __future__ import annotations

import argparse
import os
import sys

from compare_original import alternate

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"trl": "bench_trl.py", "ours": "bench_ours.py"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="TRL/ours run pairs (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--smoke", action="store_true", help="tiny check: 1 prompt, 2 generations, 4 tokens")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="forced tokens (default: the workload's)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of both sides")
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16"],
        help="both sides: TRL's bf16 flag, ours' precision (default: %(default)s)",
    )
    parser.add_argument(
        "--trl-python",
        default=os.path.join(HERE, ".venv-trl", "bin", "python"),
        help="Python of TRL's virtual environment (default: %(default)s)",
    )
    parser.add_argument("--ours-python", default=sys.executable, help="Python of ours (default: this one)")
    parser.add_argument("--json", default=None, help="also write every run and the medians to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not os.path.exists(args.trl_python):
        sys.exit(f"{args.trl_python} not found: run benchmarks/setup_trl.sh first")
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    options = ["--model", args.model, "--precision", args.precision] + (["--smoke"] if args.smoke else [])
    options += ["--threads", str(args.threads)] if args.threads else []
    options += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    pythons = {"trl": args.trl_python, "ours": args.ours_python}
    side_options = {"trl": [], "ours": ["--agents", "1"]}
    print(f"one agent, precision={args.precision} on both sides", flush=True)
    alternate(args, args.rounds, pythons, SCRIPTS, options, side_options)


if __name__ == "__main__":
    main()
