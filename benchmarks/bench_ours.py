"""Run OUR ``MAGRPOTrainer`` on the fixed workload of benchmarks/workload.py and print one JSON line.

    .venv/bin/python benchmarks/bench_ours.py                    # the embedded SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/bench_ours.py --threads 2 --model DIR
    .venv/bin/python benchmarks/bench_ours.py --smoke            # 1 prompt, 2 generations, 4 tokens
    .venv/bin/python benchmarks/bench_ours.py --precision bf16   # bf16 agents, fp32 master weights
    .venv/bin/python benchmarks/bench_ours.py --max-grad-norm none   # no gradient clipping (the original's)
    .venv/bin/python benchmarks/bench_ours.py --agents 1         # one agent (benchmarks/compare_trl.py)
    .venv/bin/python benchmarks/bench_ours.py --compiled-decoding   # the compiled decoding step
    .venv/bin/python benchmarks/bench_ours.py --learning-seed 0 --config policy_loss=cispo --config num_iterations=2

Config: one epoch, 2 dataset rows per step (``per_device_train_batch_size=2``: one optimizer
step per agent per 2 prompts, as the original's rollout buffer of 2), rows in dataset order (the
original does not shuffle), ``generation_kwargs={"min_new_tokens": ...}``, ``logging_steps=1``,
metrics written to a temporary folder under /tmp, W&B off. ``--agents 1`` trains one agent on
the same prompts, its reward the length ratio of each completion to its prompt
(``workload.one_agent_length_ratio_reward``), as benchmarks/bench_trl.py does.

Measured: ``train_s``, the wall time of ``trainer.train()``; ``generate_s`` and ``update_s``, the
sums of the per-step ``time/generate_s`` (rollout: tokenising, ``generate``, decoding, rewards)
and ``time/update_s`` (forward, backward, optimizer steps) metrics read back from the run's
metrics.jsonl; generated tokens, the sum over steps of ``time/generated_tokens_per_s`` x
``time/generate_s``; trained tokens, those plus every prompt's tokens once per completion.
The fields, peak RSS and FLOP utilisation are described in benchmarks/measure.py. The trainer's
own output goes to stderr: stdout carries only the JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time

import measure
import workload as wl

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def build_trainer(
    model: str,
    work: wl.Workload,
    output_dir: str,
    precision: str = "fp32",
    learning_seed: int | None = None,
    reward: object = wl.length_ratio_reward,
    max_grad_norm: float | None = MAGRPOConfig.max_grad_norm,
    compiled_decoding: bool = False,
    overrides: dict | None = None,
) -> MAGRPOTrainer:
    """The timed run, or with ``learning_seed`` the learning run (free lengths, its epochs and
    seed); ``overrides``: more config fields (``--config``)."""
    learning = learning_seed is not None
    config = MAGRPOConfig(
        precision=precision,
        num_train_epochs=wl.LEARNING_EPOCHS if learning else wl.NUM_EPOCHS,
        per_device_train_batch_size=wl.PROMPTS_PER_STEP,
        shuffle=False,
        agent_learning_rate=wl.LEARNING_RATE,
        num_generations=work.num_generations,
        max_new_tokens=work.max_new_tokens,
        temperature=wl.TEMPERATURE,
        top_p=wl.TOP_P,
        top_k=wl.TOP_K,
        generation_kwargs={} if learning else {"min_new_tokens": work.max_new_tokens},
        seed=learning_seed if learning else wl.SEED,
        max_grad_norm=max_grad_norm,
        compiled_decoding=compiled_decoding,
        logging_steps=1,
        output_dir=output_dir,
        **(overrides or {}),
    )
    inputs = measure.trainer_inputs(model, work, reward=reward)
    if config.multi_objective_aggregation == "normalize_then_sum":  # GDPO takes no processor: fold the x100 in
        inputs["reward_func"] = scaled(inputs.pop("reward_processor"), inputs["reward_func"])
    return MAGRPOTrainer(args=config, **inputs)


def scaled(processor, reward):
    """``reward`` with ``processor`` applied to each value it returns (its signature kept)."""

    @functools.wraps(reward)
    def processed(*args, **kwargs):
        return [processor(value) for value in reward(*args, **kwargs)]

    return processed


def step_metrics(output_dir: str) -> list[dict]:
    """The training steps' metrics (one line per step with ``logging_steps=1``)."""
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [row for row in map(json.loads, f) if "time/generate_s" in row]


def prompt_tokens(trainer: MAGRPOTrainer, work: wl.Workload) -> int:
    """Prompt tokens of every trained sequence (each prompt once per completion and agent)."""
    lengths = [len(trainer.agents.tokenizers[0](prompt)["input_ids"]) for prompt in work.prompts]
    return sum(lengths) * work.num_generations * work.num_agents


def config_override(item: str) -> tuple[str, object]:
    """``FIELD=VALUE`` -> (field, value): JSON where it parses (numbers, true, null), else the string."""
    field, _, value = item.partition("=")
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="the config's precision")
    parser.add_argument(
        "--max-grad-norm",
        type=lambda value: None if value == "none" else float(value),
        default=MAGRPOConfig.max_grad_norm,
        help="the config's gradient clipping, 'none' for none as the original (default: %(default)s)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=wl.NUM_AGENTS,
        choices=[1, 2],
        help="agents (default: %(default)s; 1: the one-agent reward, as benchmarks/bench_trl.py)",
    )
    parser.add_argument(
        "--compiled-decoding",
        action="store_true",
        help="the config's compiled_decoding=True (its compile, once per process, inside train())",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="another MAGRPOConfig field, the value read as JSON when it parses (else a string); repeatable",
    )
    measure.add_learning_arg(parser)
    measure.add_common_args(parser)
    args = parser.parse_args(argv)
    overrides = dict(config_override(item) for item in args.config)
    if args.compiled_decoding and args.learning_seed is not None:
        parser.error("--compiled-decoding times the timed run; the learning run (--learning-seed) decodes eagerly")
    measure.set_threads(args.threads)
    work = dataclasses.replace(measure.workload_from_args(args), num_agents=args.agents)
    reward = wl.one_agent_length_ratio_reward if args.agents == 1 else wl.length_ratio_reward
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    if args.learning_seed is not None:
        recorder = wl.RecordedReward()
        with tempfile.TemporaryDirectory(prefix="learn_ours_") as output_dir:
            trainer = build_trainer(
                args.model,
                work,
                output_dir,
                args.precision,
                args.learning_seed,
                recorder,
                args.max_grad_norm,
                overrides=overrides,
            )
            metrics = os.path.join(output_dir, "metrics.jsonl")
            measure.run_learning(f"ours-{args.precision}", args.learning_seed, recorder, trainer.train, metrics)
        return
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as output_dir:
        trainer = build_trainer(
            args.model,
            work,
            output_dir,
            args.precision,
            reward=reward,
            max_grad_norm=args.max_grad_norm,
            compiled_decoding=args.compiled_decoding,
            overrides=overrides,
        )
        gflops = measure.matmul_gflops()
        with contextlib.redirect_stdout(sys.stderr):
            started = time.perf_counter()
            trainer.train()
            train_s = time.perf_counter() - started
        steps = step_metrics(output_dir)
    generated = sum(round(s["time/generated_tokens_per_s"] * s["time/generate_s"]) for s in steps)
    measure.check_generated(generated, work.generated_tokens)
    measure.print_result(
        measure.result(
            f"ours-{args.precision}" + ("-compiled" if args.compiled_decoding else ""),
            train_s=train_s,
            generate_s=sum(s["time/generate_s"] for s in steps),
            update_s=sum(s["time/update_s"] for s in steps),
            generated_tokens=generated,
            trained_tokens=generated + prompt_tokens(trainer, work),
            params_per_agent=measure.parameter_count(trainer.agents[0]),
            gflops=gflops,
        )
    )


if __name__ == "__main__":
    main()
