"""Time data-parallel training: K ranks (torchrun) against one process over the same global
batch, on the story-len-ratio workload with the embedded model.

    python benchmarks/bench_ddp.py                       # 1 process vs 2 ranks, 2 steps each
    python benchmarks/bench_ddp.py --ranks 4 --steps 3 --json benchmarks/results/ddp.json

Each side trains 2 agents for ``--steps`` steps of ``--global-rows`` dataset rows (G samples
of exactly ``--max-new-tokens`` tokens per prompt and agent). One process takes all the rows
of a step; each of the K ranks takes global-rows / K and the gradients are summed across
ranks (gloo on CPU). The machine's cores are split evenly between the ranks
(``OMP_NUM_THREADS``). Printed: seconds per training step of each side (wall time, after a warm-up
step) and their ratio. On one CPU machine the ranks share its cores, so no gain is
expected: the figure shows what the gradient exchange costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import bench_step

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args: argparse.Namespace) -> None:
    """One rank (or the single process): warm up, train, and (rank 0) print one JSON line."""
    from comlrl.models import default_model_path

    trainer = bench_step.build_trainer(
        default_model_path(),
        args,
        per_device_train_batch_size=args.global_rows // args.ranks,
        output_dir=os.path.join(HERE, "results", f"ddp-{args.ranks}"),
    )
    # The dataset's rows in order, round and round: step s takes global-rows of them.
    order = [r % len(trainer.train_prompts) for r in range(args.global_rows * (args.steps + 1))]
    steps = [order[s * args.global_rows : (s + 1) * args.global_rows] for s in range(args.steps + 1)]
    trainer.training_step(trainer.parallel.shard(steps[0]))  # warm-up
    started = time.perf_counter()
    for rows in steps[1:]:
        trainer.training_step(trainer.parallel.shard(rows))
    step_s = (time.perf_counter() - started) / args.steps
    if trainer.parallel.is_main:
        print(json.dumps({"ranks": args.ranks, "step_s": step_s}), flush=True)


def launch(args: argparse.Namespace, ranks: int) -> dict:
    cores = os.cpu_count() or 1
    env = dict(os.environ, OMP_NUM_THREADS=str(max(cores // ranks, 1)))
    script = [os.path.abspath(__file__), "--worker", "--ranks", str(ranks)]
    script += ["--steps", str(args.steps), "--global-rows", str(args.global_rows)]
    script += ["--num-generations", str(args.num_generations), "--max-new-tokens", str(args.max_new_tokens)]
    if ranks == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *script]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in finished.stdout.splitlines() if line.startswith("{")]
    if finished.returncode != 0 or not lines:
        raise SystemExit(f"{ranks} rank(s) failed:\n{finished.stderr[-4000:]}")
    result = json.loads(lines[-1])
    print(f"{ranks} rank(s): {result['step_s']:.1f} s/step", flush=True)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks to compare with 1 (default: 2)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side (default: %(default)s)")
    parser.add_argument("--global-rows", type=int, default=4, help="dataset rows per step (default: %(default)s)")
    parser.add_argument("--num-generations", type=int, default=4, help="G (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.global_rows % args.ranks:
        raise SystemExit(f"--global-rows {args.global_rows} must be a multiple of --ranks {args.ranks}")
    if args.worker:
        worker(args)
        return
    single, parallel = launch(args, 1), launch(args, args.ranks)
    ratio = parallel["step_s"] / single["step_s"]
    print(f"{args.ranks} ranks / 1 process time per step: x{ratio:.2f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "single": single, "parallel": parallel, "ratio": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
