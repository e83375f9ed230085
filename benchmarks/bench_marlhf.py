"""MARLHF against the policy it starts from: the reward model on held-out prompts' pairs, and
the task reward on HELD-OUT prompts.

Workload: the tutorial's length-ratio task (examples/story-len-ratio.py's ten prompts and
reward: 1.0 when the second agent's text is 2-3 times longer than the first's, decaying
outside), two agents (the embedded SmolLM2-135M-Instruct, fp32, CPU), MARLHF with MAGRPO
(as examples/marlhf-story-len-ratio.py). Reported:

- the reward model: its Bradley-Terry loss and accuracy on its training pairs, and on the
  pairs of the ``--held-out-fraction`` of the training prompts it never trains on;
- the agents: the trainer's own ``evaluate()`` with the TASK reward, before the first step and
  after the last, on bench_madpo.py's ten held-out prompts (never trained on), each answered
  ``--samples-per-prompt`` times with the training's sampling settings from the same seed.

    python benchmarks/bench_marlhf.py                           # ~15 min on a shared 2-core CPU
    python benchmarks/bench_marlhf.py --train-backbone --max-new-tokens 48   # the whole reward model (slower)
    python benchmarks/bench_marlhf.py --json out.json
    python benchmarks/bench_marlhf.py --model TINY_FOLDER --num-candidates 2 --max-new-tokens 4  # a check
"""

from __future__ import annotations

import argparse
import json
import runpy
import tempfile
import time
from pathlib import Path

from comlrl.metrics.plot import read_metrics
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer

BENCHMARKS = Path(__file__).resolve().parent
TUTORIAL = runpy.run_path(str(BENCHMARKS.parent / "examples" / "story-len-ratio.py"))
TRAIN_PROMPTS: list[str] = TUTORIAL["PROMPTS"]
reward = TUTORIAL["proper_length_ratio_reward"]
# MADPO's benchmark's held-out prompts and figures, so the two benchmarks measure alike.
MADPO_BENCH = runpy.run_path(str(BENCHMARKS / "bench_madpo.py"))
HELD_OUT_PROMPTS: list[str] = MADPO_BENCH["HELD_OUT_PROMPTS"]
held_out_figures = MADPO_BENCH["held_out_figures"]
before_and_after = MADPO_BENCH["before_and_after"]
print_held_out_table = MADPO_BENCH["print_held_out_table"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or hub id (default: the embedded SmolLM2)")
    parser.add_argument("--rl-algorithm", default="magrpo", help="MARLHF's RL trainer (%(default)s)")
    parser.add_argument("--epochs", type=int, default=1, help="RL passes over the prompts (%(default)s)")
    parser.add_argument("--rows-per-step", type=int, default=5, help="prompts per RL step (%(default)s)")
    parser.add_argument("--num-generations", type=int, default=2, help="RL samples per prompt and agent (%(default)s)")
    parser.add_argument("--num-candidates", type=int, default=4, help="candidates per prompt and agent (%(default)s)")
    parser.add_argument("--pairs-per-prompt", type=int, default=3, help="pairs kept per prompt (%(default)s)")
    parser.add_argument("--reward-epochs", type=int, default=2, help="passes over the pairs (%(default)s)")
    parser.add_argument("--reward-learning-rate", type=float, default=1e-3, help="the reward model's (%(default)s)")
    parser.add_argument(
        "--train-backbone", action="store_true", help="fit the reward model's transformer too (default: its head only)"
    )
    parser.add_argument("--held-out-fraction", type=float, default=0.3, help="prompts held out (%(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="most tokens per completion (%(default)s)")
    parser.add_argument("--learning-rate", type=float, default=3e-5, help="the agents' (%(default)s)")
    parser.add_argument("--samples-per-prompt", type=int, default=2, help="held-out answers per prompt (%(default)s)")
    parser.add_argument("--seed", type=int, default=42, help="training and evaluation seed (%(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    model_name = args.model
    if model_name is None:
        from comlrl.models import default_model_path

        model_name = str(default_model_path())
    output_dir = tempfile.mkdtemp(prefix="bench_marlhf_")
    held_out = [{"prompt": p} for p in HELD_OUT_PROMPTS for _ in range(args.samples_per_prompt)]
    config = MARLHFConfig(
        rl_algorithm=args.rl_algorithm,
        num_train_epochs=args.epochs,
        agent_learning_rate=args.learning_rate,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        reward_learning_rate=args.reward_learning_rate,
        reward_num_train_epochs=args.reward_epochs,
        reward_train_batch_size=2,
        reward_freeze_backbone=not args.train_backbone,  # a 2-core CPU fits the head in minutes, not the model
        reward_eval_fraction=args.held_out_fraction,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.rows_per_step,
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=10**9,  # evaluate before the first step, and after the last
        eval_num_samples=None,
        eval_batch_size=20,
        seed=args.seed,
        output_dir=output_dir,
    )
    trainer = MARLHFTrainer(
        agent_model=model_name,
        train_dataset=[{"prompt": p} for p in TRAIN_PROMPTS],
        eval_dataset=held_out,
        reward_func=reward,
        eval_logger=held_out_figures,
        args=config,
    )
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started

    records = read_metrics(Path(output_dir) / "metrics.jsonl")
    fit = next(r for r in records if "reward_model/loss" in r)
    steps = [r for r in records if "reward/mean" in r]
    figures = {
        "held_out_answers": len(held_out),
        **before_and_after(records),
        "pairs_and_reward_model": {key: value for key, value in fit.items() if key != "step"},
        "rl_steps_reward_model_score": [r["reward/mean"] for r in steps],
        "steps": result.global_step,
        "train_seconds": seconds,
        "config": vars(args),
    }
    print_held_out_table(figures, args.samples_per_prompt, "task reward")
    held = (
        f"held-out prompts' {fit['reward_model/eval_pairs']:.0f} pairs: loss {fit['reward_model/eval_loss']:.3f}, "
        f"accuracy {fit['reward_model/eval_accuracy']:.2f}"
        if "reward_model/eval_accuracy" in fit
        else "no pairs held out"
    )
    print(
        f"\npairs: {fit['preference/num_pairs']:.0f} from {len(TRAIN_PROMPTS)} prompts x {args.num_candidates} "
        f"candidates (mean candidate reward {fit['preference/candidate_reward_mean']:.3f}, mean gap "
        f"{fit['preference/reward_gap_mean']:.3f})\n"
        f"reward model: training pairs ({fit['reward_model/train_pairs']:.0f}, last epoch): loss "
        f"{fit['reward_model/loss']:.3f}, accuracy {fit['reward_model/accuracy']:.2f}; {held}; "
        f"fitted in {fit['time/reward_model_s']:.0f} s\n"
        f"RL: {result.global_step} {args.rl_algorithm} steps, mean reward-model score per step "
        f"{', '.join(f'{s:.3f}' for s in figures['rl_steps_reward_model_score'])}; train() took {seconds:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
