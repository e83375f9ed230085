"""Memory ceiling: peak resident memory of one training step of the fixed workload
(benchmarks/workload.py: two agents, 2 prompts, one optimizer step per agent) as the number of
completions G grows, ours against the original library, and the largest G x max_new_tokens
that fits in a memory budget.

    .venv/bin/python benchmarks/memory_ceiling.py                          # G = 8 16 32, 64 tokens
    .venv/bin/python benchmarks/memory_ceiling.py --generations 8 16 32 64 --max-new-tokens 128 --json out.json

Each point is one fresh process per side (benchmarks/bench_ours.py, benchmarks/bench_original.py
with ``--prompts 2``, ``--num-generations`` and ``--max-new-tokens``), so its peak RSS is that
run's alone. The ceiling is read off the line through the last two points, and is an
extrapolation unless a point reaches the budget: past a few dozen completions the growth in G
is the KV cache and the rollout (ours: once the update's micro-batches are full), so use points
large enough for that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from compare_original import HERE, SCRIPTS, run_script


def ceiling(points: list[tuple[int, float]], budget_mib: float) -> float:
    """G where the line through the last two (G, peak MiB) points reaches the budget."""
    (g0, m0), (g1, m1) = points[-2:]
    slope = (m1 - m0) / (g1 - g0)
    return float("inf") if slope <= 0 else g1 + (budget_mib - m1) / slope


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=int, nargs="+", default=[8, 16, 32], help="G values (at least 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="forced tokens per completion")
    parser.add_argument("--budget-gib", type=float, default=16.0, help="memory budget (default: %(default)s GiB)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of both sides")
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--original-python",
        default=os.path.join(HERE, ".venv-original", "bin", "python"),
        help="Python of the original's virtual environment (default: %(default)s)",
    )
    parser.add_argument("--json", default=None, help="also write every run to this JSON file")
    args = parser.parse_args(argv)
    if len(args.generations) < 2:
        parser.error("--generations needs at least two values")
    if not os.path.exists(args.original_python):
        sys.exit(f"{args.original_python} not found: run benchmarks/setup_original.sh first")
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    pythons = {"original": args.original_python, "ours": sys.executable}
    runs: dict[str, list[dict]] = {side: [] for side in SCRIPTS}
    for g in sorted(args.generations):
        options = ["--model", args.model, "--threads", str(args.threads)]
        options += ["--prompts", "2", "--num-generations", str(g), "--max-new-tokens", str(args.max_new_tokens)]
        for side in SCRIPTS:
            run = run_script(pythons[side], SCRIPTS[side], options)
            runs[side].append({"num_generations": g, **run})
            peak, seconds = run["peak_rss_mib"], run["train_s"]
            print(f"G={g:<4} {side:<9} peak RSS {peak:8.0f} MiB, train {seconds:.0f} s", flush=True)
    budget = args.budget_gib * 1024
    print(f"\nlargest G x {args.max_new_tokens} tokens within {args.budget_gib:g} GiB (2 agents, 2 prompts per step):")
    ceilings = {}
    for side in SCRIPTS:
        g = ceiling([(r["num_generations"], r["peak_rss_mib"]) for r in runs[side]], budget)
        ceilings[side] = g
        print(f"  {side:<9} G = {g:.0f}  ({g * args.max_new_tokens:.0f} tokens per completion group)")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "ceiling_num_generations": ceilings}, f, indent=2)


if __name__ == "__main__":
    main()
