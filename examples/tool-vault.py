"""The vault: two agents learn to call their tools.

Each row is a person with a four-digit vault code. Agent 0's ``lookup`` tool reads the code's
first two digits, agent 1's its last two; the joint answer scores 0.5 for each half it gets
right (``comlrl.tasks.vault``). Before training the embedded SmolLM2-135M-Instruct calls its
tool in 5 to 23% of its samples; the reward rises as the agents learn to call it and to copy
what it returns. ``--no-tools`` is the same task without the tools, where they can only guess.
Each run writes to a new folder, comlrl_output/magrpo-<time> (``--output-dir`` names one; see
examples/_common.py). About 22 minutes at one thread on a 2-core CPU shared with another run
(16 steps; benchmarks/README.md, ``tool_learning.py``).

    python examples/tool-vault.py                    # W&B off
    python examples/tool-vault.py --no-tools         # the baseline
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from comlrl.metrics.plot import read_metrics
from comlrl.tasks.vault import VaultTask
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

WINDOW = 4
"""Steps averaged at each end of the run in the summary."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents")
    parser.add_argument("--no-tools", action="store_true", help="the same task without the agents' tools")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the 64 people (default: %(default)s)")
    parser.add_argument(
        "--num-generations", type=int, default=8, help="completions per row and agent (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    task = VaultTask(tools=not args.no_tools)
    config = MAGRPOConfig(
        num_train_epochs=args.epochs,
        per_device_train_batch_size=4,
        agent_learning_rate=2e-5,
        num_generations=args.num_generations,
        joint_mode="cross",  # each sample meets all of its partner's: its credit is its own half, not the pair's luck
        max_new_tokens=16,  # a call, or an answer: a few tokens
        top_p=1.0,  # the calls are rare before training: sample the whole distribution
        top_k=None,
        logging_steps=1,
        eval_interval=8,  # before the first step, halfway and after the last
        eval_num_samples=None,  # the 16 held-out people, one episode each
        **run_config(args),
    )
    trainer = MAGRPOTrainer(
        agent_model=model_source(args),
        num_agents=2,
        train_dataset=task.dataset("train"),
        eval_dataset=task.dataset("eval"),
        environment=task,
        args=config,
        wandb_config=wandb_config(args, "tool-vault"),
    )
    result = trainer.train()
    saved = save_models(trainer, result, args)
    if not trainer.parallel.is_main:  # under torchrun, rank 0 reports
        return
    found = figures(Path(result.output_dir) / "metrics.jsonl")
    print(
        f"\nover the first {WINDOW} steps -> the last {WINDOW}: completions that called a tool "
        f"{found['call_frac_first']:.2f} -> {found['call_frac_last']:.2f}, vault reward (0..1) "
        f"{found['reward_first']:.3f} -> {found['reward_last']:.3f}\n"
        f"held-out reward (16 other people) {found['eval_before']:.3f} before training -> {found['eval_after']:.3f}"
    )
    print(run_summary(result, started, saved))


def figures(metrics_file: Path, window: int = WINDOW) -> dict:
    """A run's figures, from its metrics.jsonl: over its first and its last ``window`` steps,
    the share of completions that called a tool (both agents averaged) and the training reward;
    the held-out reward before training and after the last step; and the per-step curves."""
    rows = read_metrics(metrics_file)
    steps = [row for row in rows if "reward/vault/mean" in row]
    evals = [row["eval/reward_mean"] for row in rows if "eval/reward_mean" in row]
    calls = [sum(row.get(f"agent{i}/tool_call_frac", 0.0) for i in (0, 1)) / 2 for row in steps]
    reward = [row["reward/vault/mean"] for row in steps]
    return {
        "steps": len(steps),
        "call_frac_first": statistics.mean(calls[:window]),
        "call_frac_last": statistics.mean(calls[-window:]),
        "reward_first": statistics.mean(reward[:window]),
        "reward_last": statistics.mean(reward[-window:]),
        "eval_before": evals[0],
        "eval_after": evals[-1],
        "call_frac_curve": calls,
        "reward_curve": reward,
    }


if __name__ == "__main__":
    main()
