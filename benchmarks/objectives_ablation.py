"""Does each objective of the toolbox learn, against today's default? The learning workload of
benchmarks/learning_vs_original.py (the tutorial's 10 prompts, 2 agents, G = 8, up to 64 free
tokens, 2 epochs, lr 5e-5; fp32) with one config change per variant, several seeds, each run in
a fresh process (benchmarks/bench_ours.py ``--learning-seed`` ``--config``), variants
alternating within each seed.

    .venv/bin/python benchmarks/objectives_ablation.py                        # every variant, 3 seeds
    .venv/bin/python benchmarks/objectives_ablation.py --variants default cispo-2it --seeds 2 --json out.json

With one optimizer step per rollout and no sampler mismatch the ratio is exactly 1, and the
clip, GSPO, CISPO, SAPO and delta objectives all reduce to the plain policy gradient; so the
ratio-based variants take two optimizer steps per rollout (``num_iterations=2``), against
``clip-2it``, the default objective with the same two steps. Printed per run: each epoch's mean
reward x100, the gain from the first epoch to the last, and the mean over steps and agents of
the clip fraction (and of the other figures of ``measure.UPDATE_FIGURES`` the run logged); per
variant, the mean gain over seeds, its standard deviation and the mean clip fraction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from compare_original import run_script
from learning_vs_original import gain

TWO_STEPS = {"num_iterations": 2}
VARIANTS = {
    "default": {},
    "clip-2it": TWO_STEPS,
    "gspo-2it": {**TWO_STEPS, "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "cispo-2it": {**TWO_STEPS, "policy_loss": "cispo", "epsilon_high": 0.28},
    "sapo-2it": {**TWO_STEPS, "policy_loss": "sapo"},
    "delta-2it": {**TWO_STEPS, "epsilon": 0.1, "delta": 1.3},
    "top-entropy-0.2": {"top_entropy_quantile": 0.2},
    "mask-truncated": {"mask_truncated_completions": True},
    "dynamic-sampling": {"dynamic_sampling": True},
    "gdpo": {"multi_objective_aggregation": "normalize_then_sum"},
}
"""Each variant's config changes (GSPO's ranges are its paper's, section 5.1; CISPO's cap is DAPO's
clip-higher). The workload has one reward function, so ``gdpo`` only adds the step-wide std
scaling after the group z-scores; ``dynamic-sampling`` refills groups whose 8 samples all score
alike (all cut at 64 tokens, say)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (default: %(default)s)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default: %(default)s)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--python", default=sys.executable, help="Python that runs bench_ours.py (default: this one)")
    parser.add_argument("--json", default=None, help="also write every run and the summary to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    common = ["--model", args.model] if args.model else []
    runs: dict[str, list[dict]] = {name: [] for name in args.variants}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in args.variants:
            options = [f"--config={field}={json.dumps(value)}" for field, value in VARIANTS[name].items()]
            run = run_script(args.python, "bench_ours.py", [*common, *options, "--learning-seed", str(seed)])
            runs[name].append(run)
            means = ", ".join(f"{m:.1f}" for m in run["epoch_reward_means"])
            clip = f" clip {run['clip_fraction']:.4f}" if "clip_fraction" in run else ""
            print(f"seed {seed} {name:<16} epochs [{means}] gain {gain(run):+.1f}{clip} ({run['train_s']:.0f} s)")
            sys.stdout.flush()
    summary = {}
    print(f"\n{'variant':<16}{'gain mean':>10}{'std':>8}{'clip':>9}  runs")
    for name, variant_runs in runs.items():
        gains = [gain(run) for run in variant_runs]
        clips = [run["clip_fraction"] for run in variant_runs if "clip_fraction" in run]
        summary[name] = {
            "config": VARIANTS[name],
            "gain_mean": statistics.mean(gains),
            "gain_std": statistics.stdev(gains) if len(gains) > 1 else 0.0,
            "clip_fraction": statistics.mean(clips) if clips else None,
            "gains": gains,
        }
        clip = "-" if not clips else f"{summary[name]['clip_fraction']:.4f}"
        row = summary[name]
        print(f"{name:<16}{row['gain_mean']:>+10.1f}{row['gain_std']:>8.1f}{clip:>9}  {len(gains)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
