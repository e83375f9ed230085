"""Time data-parallel training: K ranks (torchrun) against one process over the same global
batch, on the story-len-ratio workload with the embedded model, for each ``sharding``.

    python benchmarks/bench_ddp.py                       # 1 process vs 2 ranks x each sharding
    python benchmarks/bench_ddp.py --ranks 4 --steps 3 --sharding full_shard --json benchmarks/results/ddp.json

Each side trains 2 agents for ``--steps`` steps of ``--global-rows`` dataset rows (G samples
of exactly ``--max-new-tokens`` tokens per prompt and agent). One process takes all the rows
of a step; each of the K ranks takes global-rows / K and the gradients are summed across
ranks (gloo on CPU): after the backward pass (``replicate``), or by FSDP2 into each rank's
slice (``full_shard``, ``shard_grad_op``). The machine's cores are split evenly between the
ranks (``OMP_NUM_THREADS``). Printed: seconds per training step of each side (wall time,
after a warm-up step), their ratio, each rank's peak RSS and the numbers of AdamW state it
holds. On one CPU machine the ranks share its cores, so no gain is expected: the figure
shows what the gradient exchange and the gathers cost, and what sharding saves per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import bench_step

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args: argparse.Namespace) -> None:
    """One rank (or the single process): warm up, train, and (rank 0) print one JSON line."""
    from comlrl.engine.sharding import local
    from comlrl.models import default_model_path

    trainer = bench_step.build_trainer(
        default_model_path(),
        args,
        per_device_train_batch_size=args.global_rows // args.ranks,
        output_dir=os.path.join(HERE, "results", f"ddp-{args.ranks}"),
        sharding=args.sharding[0],
    )
    # The dataset's rows in order, round and round: step s takes global-rows of them.
    order = [r % len(trainer.train_prompts) for r in range(args.global_rows * (args.steps + 1))]
    steps = [order[s * args.global_rows : (s + 1) * args.global_rows] for s in range(args.steps + 1)]
    trainer.training_step(trainer.parallel.shard(steps[0]))  # warm-up
    started = time.perf_counter()
    for rows in steps[1:]:
        trainer.training_step(trainer.parallel.shard(rows))
    step_s = (time.perf_counter() - started) / args.steps
    states = [v for o in trainer.learners.optimizers for st in o.state.values() for v in st.values() if v.dim() > 0]
    held = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    held["adam_numel"] = sum(local(v).numel() for v in states)
    per_rank = trainer.parallel.gather(held)
    if trainer.parallel.is_main:
        result = {"ranks": args.ranks, "sharding": args.sharding[0], "step_s": step_s, "per_rank": per_rank}
        print(json.dumps(result), flush=True)


def launch(args: argparse.Namespace, ranks: int, sharding: str = "replicate") -> dict:
    cores = os.cpu_count() or 1
    env = dict(os.environ, OMP_NUM_THREADS=str(max(cores // ranks, 1)))
    script = [os.path.abspath(__file__), "--worker", "--ranks", str(ranks), "--sharding", sharding]
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
    peaks = ", ".join(f"{r['peak_rss_mib']:.0f}" for r in result["per_rank"])
    adam = ", ".join(f"{r['adam_numel'] / 1e6:.0f}M" for r in result["per_rank"])
    label = "1 process" if ranks == 1 else f"{ranks} ranks, {sharding}"
    print(f"{label}: {result['step_s']:.1f} s/step, peak RSS per rank {peaks} MiB, AdamW state {adam}", flush=True)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks to compare with 1 (default: 2)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side (default: %(default)s)")
    parser.add_argument("--global-rows", type=int, default=4, help="dataset rows per step (default: %(default)s)")
    parser.add_argument("--num-generations", type=int, default=4, help="G (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per completion (default: %(default)s)")
    parser.add_argument(
        "--sharding",
        nargs="+",
        default=["replicate", "full_shard", "shard_grad_op"],
        help="the K-rank sides' sharding, one run each (default: %(default)s)",
    )
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.global_rows % args.ranks:
        raise SystemExit(f"--global-rows {args.global_rows} must be a multiple of --ranks {args.ranks}")
    if args.worker:
        worker(args)
        return
    single = launch(args, 1)
    parallel = {mode: launch(args, args.ranks, mode) for mode in args.sharding}
    ratios = {mode: result["step_s"] / single["step_s"] for mode, result in parallel.items()}
    for mode, ratio in ratios.items():
        print(f"{args.ranks} ranks ({mode}) / 1 process time per step: x{ratio:.2f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            record = {"args": vars(args), "single": single, "parallel": parallel, "ratios": ratios}
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
