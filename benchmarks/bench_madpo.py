"""MADPO against the policy it starts from: the task reward on HELD-OUT prompts.

Workload: the tutorial's length-ratio task (examples/story-len-ratio.py's ten prompts and
reward: 1.0 when the second agent's text is 2-3 times longer than the first's, decaying
outside), two agents (the embedded SmolLM2-135M-Instruct, fp32, CPU), MADPO on the ten
training prompts (as examples/madpo-story-len-ratio.py, with more candidates and pairs). Evaluated by the trainer's own
``evaluate()`` with the task reward, before the first step and after the last, on ten
prompts the training never sees, each answered ``--samples-per-prompt`` times with the
training's sampling settings from the same seed (the initial and the trained policy get the
same random draws). Printed per side: mean reward with its standard error, the share of joint
answers in the target range, each agent's mean length in characters; then the pair-building
figures and the last DPO step's.

    python benchmarks/bench_madpo.py                           # ~10 min on a 2-core CPU
    python benchmarks/bench_madpo.py --json out.json
    python benchmarks/bench_madpo.py --model TINY_FOLDER --num-candidates 2 --max-new-tokens 4  # a check
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import statistics
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.metrics.plot import read_metrics
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer

TUTORIAL = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "story-len-ratio.py"))
TRAIN_PROMPTS: list[str] = TUTORIAL["PROMPTS"]
reward = TUTORIAL["proper_length_ratio_reward"]

HELD_OUT_PROMPTS = [
    "Describe a forest that grows underwater:",
    "Invent a new sport and explain its rules:",
    "Write a lullaby for a robot:",
    "Explain how a time machine might work:",
    "Tell a joke about penguins:",
    "Describe a world without music:",
    "Create a villain with a harmless power:",
    "Write a scene where the sun takes a day off:",
    "Invent a new kind of vegetable:",
    "Design a library on the Moon:",
]


def before_and_after(records: list[dict]) -> dict[str, dict[str, float]]:
    """The first and last evaluations of a run's metrics records, without their ``eval/`` prefix."""
    evaluations = [r for r in records if "eval/reward_mean" in r]
    return {
        side: {key.removeprefix("eval/"): value for key, value in record.items() if key.startswith("eval/")}
        for side, record in (("initial", evaluations[0]), ("trained", evaluations[-1]))
    }


def print_held_out_table(figures: dict, samples_per_prompt: int, reward_label: str) -> None:
    """The held-out evaluations before and after training, as a Markdown table."""
    print(f"\nheld-out: {len(HELD_OUT_PROMPTS)} prompts x {samples_per_prompt} sampled joint answers, same seed")
    print(f"| policy | {reward_label} (0..1) | in 2-3x range | agent 0 chars | agent 1 chars |")
    print("|---|---|---|---|---|")
    for side in ("initial", "trained"):
        f = figures[side]
        print(
            f"| {side} | {f['reward_mean']:.3f} ± {f['reward_sem']:.3f} | {f['in_range_frac']:.2f} | "
            f"{f['agent0_chars']:.0f} | {f['agent1_chars']:.0f} |"
        )


def held_out_figures(agent_completions_turns) -> dict[str, float]:
    """``eval_logger``: what the mean reward hides, from each joint answer (first turn)."""
    first, second = ([turns[0] for turns in agent] for agent in agent_completions_turns)
    rewards = reward(first, second)
    return {
        "reward_sem": statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0,
        "in_range_frac": sum(r == 1.0 for r in rewards) / len(rewards),
        "agent0_chars": statistics.mean(len(text) for text in first),
        "agent1_chars": statistics.mean(len(text) for text in second),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or hub id (default: the embedded SmolLM2)")
    parser.add_argument("--epochs", type=int, default=2, help="DPO passes over the pairs (default: %(default)s)")
    parser.add_argument("--num-candidates", type=int, default=8, help="candidates per prompt and agent (%(default)s)")
    parser.add_argument("--pairs-per-prompt", type=int, default=3, help="pairs kept per prompt (%(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="most tokens per completion (%(default)s)")
    parser.add_argument("--learning-rate", type=float, default=3e-5, help="AdamW learning rate (%(default)s)")
    parser.add_argument("--samples-per-prompt", type=int, default=4, help="held-out answers per prompt (%(default)s)")
    parser.add_argument("--seed", type=int, default=42, help="training and evaluation seed (%(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    model_name = args.model
    if model_name is None:
        from comlrl.models import default_model_path

        model_name = default_model_path()
    output_dir = tempfile.mkdtemp(prefix="bench_madpo_")
    held_out = [{"prompt": p} for p in HELD_OUT_PROMPTS for _ in range(args.samples_per_prompt)]
    config = MADPOConfig(
        num_train_epochs=args.epochs,
        agent_learning_rate=args.learning_rate,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        dpo_reference="initial",
        per_device_train_batch_size=5,
        train_batch_size=4,
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=10**9,  # evaluate before the first step, and after the last
        eval_num_samples=None,
        eval_batch_size=20,
        seed=args.seed,
        output_dir=output_dir,
    )
    trainer = MADPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
        tokenizer=AutoTokenizer.from_pretrained(model_name),
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
    pairs = next(r for r in records if "preference/num_pairs" in r)
    last = [r for r in records if "dpo/loss" in r][-1]
    figures = {
        "held_out_answers": len(held_out),
        **before_and_after(records),
        "pairs": {key.removeprefix("preference/"): value for key, value in pairs.items() if key != "step"},
        "last_step": {key: last[key] for key in ("dpo/loss", "dpo/accuracy", "dpo/margin")},
        "steps": result.global_step,
        "train_seconds": seconds,
        "config": vars(args),
    }
    print_held_out_table(figures, args.samples_per_prompt, "reward")
    p = figures["pairs"]
    print(
        f"\npairs: {p['num_pairs']:.0f} from {len(TRAIN_PROMPTS)} prompts x {args.num_candidates} candidates "
        f"(mean candidate reward {p['candidate_reward_mean']:.3f}, mean gap {p['reward_gap_mean']:.3f}, "
        f"{p['rows_without_pairs']:.0f} prompts without a pair)"
    )
    print(
        f"last step: DPO loss {last['dpo/loss']:.3f}, accuracy {last['dpo/accuracy']:.2f}, "
        f"joint margin {last['dpo/margin']:.2f}; {result.global_step} steps; train() took {seconds:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
