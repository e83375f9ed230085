"""Do the agents learn to call their tools? examples/tool-vault.py (the vault task of
comlrl.tasks.vault: a lookup tool per agent, one four-digit code, 0.5 per right half) at its
defaults, with its tools and without them (``--no-tools``), several seeds, each run in a fresh
process, the two alternating within each seed.

    .venv/bin/python benchmarks/tool_learning.py                  # 3 seeds, tools and no tools
    .venv/bin/python benchmarks/tool_learning.py --seeds 1 --threads 1 --json out.json

Read from each run's metrics.jsonl by the example's ``figures``, over its first and its last
``--window`` steps: the share of completions that called a tool (both agents'
``agent{i}/tool_call_frac``, averaged) and the training reward (``reward/vault/mean``); and the
held-out reward (16 other people, one episode each) before training and after the last step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "tool-vault.py")
VARIANTS = {"tools": [], "no-tools": ["--no-tools"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (default: %(default)s)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default: %(default)s)")
    parser.add_argument("--window", type=int, default=4, help="steps averaged at each end (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="the example's --threads (default: torch's choice)")
    parser.add_argument("--python", default=sys.executable, help="Python that runs the example (default: this one)")
    parser.add_argument("--json", default=None, help="also write every run's figures and curves to this JSON file")
    return parser.parse_args(argv)


def example_module():
    """examples/tool-vault.py as a module: its ``figures`` reads a run's metrics."""
    spec = importlib.util.spec_from_file_location("tool_vault", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(python: str, seed: int, options: list[str], folder: str, window: int, example) -> dict:
    """One run of the example in a fresh process, in ``folder`` (``options``: more of its flags),
    read with ``example``'s ``figures``."""
    command = [python, EXAMPLE, "--no-save", "--seed", str(seed), "--output-dir", folder, *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"tool-vault.py {' '.join(options)} failed with exit status {done.returncode}")
    return example.figures(Path(folder) / "metrics.jsonl", window)


def main(argv=None) -> None:
    args = parse_args(argv)
    example = example_module()
    runs: dict[str, list[dict]] = {name: [] for name in args.variants}
    keys = ("call_frac_first", "call_frac_last", "reward_first", "reward_last", "eval_before", "eval_after")
    print(f"{'run':<18}" + "".join(f"{key:>16}" for key in keys))
    with tempfile.TemporaryDirectory(prefix="tool-learning-") as scratch:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for name in args.variants:
                folder = os.path.join(scratch, f"{name}-{seed}")
                threads = [] if args.threads is None else ["--threads", str(args.threads)]
                found = run(args.python, seed, VARIANTS[name] + threads, folder, args.window, example)
                runs[name].append({"seed": seed, **found})
                print(f"{name + ' seed ' + str(seed):<18}" + "".join(f"{found[key]:>16.3f}" for key in keys))
                sys.stdout.flush()
    summary = {}
    print(f"\n{'mean (std)':<18}" + "".join(f"{key:>16}" for key in keys))
    for name, variant_runs in runs.items():
        summary[name] = {
            key: (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
            for key in keys
            for values in [[r[key] for r in variant_runs]]
        }
        cells = "".join(f"{m:>9.3f} ({s:.3f})" for m, s in summary[name].values())
        print(f"{name:<18}{cells}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
