"""Run the ORIGINAL library's ``MAGRPOTrainer`` (PyPI comlrl==1.4.3) on the fixed workload of
benchmarks/workload.py and print one JSON line, in the format of benchmarks/bench_ours.py.

    benchmarks/setup_original.sh                                 # once: benchmarks/.venv-original
    benchmarks/.venv-original/bin/python benchmarks/bench_original.py --model ~/.cache/comlrl/SmolLM2-135M-Instruct
    benchmarks/.venv-original/bin/python benchmarks/bench_original.py --model DIR --smoke --threads 2

Run it with the original's virtual environment, where ``comlrl`` is the original library.
``--model`` is the embedded model's plain Hugging Face folder (``make setup`` writes it to
~/.cache/comlrl/SmolLM2-135M-Instruct; our ``comlrl.models.default_model_path()`` prints it).

Config (the original's ``MAGRPOConfig``): ``num_turns=1``, one epoch, ``rollout_buffer_size=2``
(its default; ``train_batch_size`` follows it, so each agent takes one optimizer step per 2
prompts), the workload's ``num_generations``, ``max_new_tokens``, sampling and learning rate,
``eval_interval=0`` and no eval dataset, ``wandb_config=None`` (W&B off). Python, NumPy and
torch are seeded with the workload's seed before training (the original seeds nothing).
It runs on CPU as it is: with no CUDA device its device resolution picks ``cpu``.

Forcing every completion to ``max_new_tokens`` tokens: the original's config has no generation
keyword arguments, but its ``train(**kwargs)`` forwards extra keyword arguments to every
``generate`` call (train -> _train_step_returns -> _generate_completions, "additional arguments
to pass to the model during generation"), so this runs ``trainer.train(min_new_tokens=...)``.

Measured by wrapping two of the trainer's methods on the instance (its files are untouched):
``_generate_completions`` (one call per prompt and agent: tokenising, one ``generate`` of G
samples, decoding) gives ``generate_s``, the generated tokens and the prompt tokens;
``_update_from_samples`` (one call per agent and full rollout buffer: one forward + backward
per sequence, one optimizer step) gives ``update_s``. ``train_s`` is the wall time of
``trainer.train()``; rewards and buffer bookkeeping count only there. The fields, peak RSS and
FLOP utilisation are described in benchmarks/measure.py. The trainer's own output goes to
stderr: stdout carries only the JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from importlib.metadata import version

import measure
import numpy as np
import torch
import workload as wl

ORIGINAL_VERSION = "1.4.3"


def build_trainer(
    model: str,
    work: wl.Workload,
    dtype: torch.dtype = torch.float32,
    epochs: int = wl.NUM_EPOCHS,
    reward: object = wl.length_ratio_reward,
):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(
        num_train_epochs=epochs,
        agent_learning_rate=wl.LEARNING_RATE,
        num_agents=wl.NUM_AGENTS,
        num_generations=work.num_generations,
        max_new_tokens=work.max_new_tokens,
        temperature=wl.TEMPERATURE,
        top_p=wl.TOP_P,
        top_k=wl.TOP_K,
        num_turns=1,
        eval_interval=0,
        rollout_buffer_size=wl.PROMPTS_PER_STEP,
    )
    return MAGRPOTrainer(args=config, **measure.trainer_inputs(model, work, dtype, reward))


def instrument(trainer) -> dict:
    """Time the trainer's generation and update calls and count their tokens; returns the totals,
    which fill in as the trainer runs."""
    totals = {"generate_s": 0.0, "update_s": 0.0, "generated_tokens": 0, "prompt_tokens": 0}
    generate, update = trainer._generate_completions, trainer._update_from_samples

    def timed_generate(*args, **kwargs):
        started = time.perf_counter()
        out = generate(*args, **kwargs)
        totals["generate_s"] += time.perf_counter() - started
        completions = out["completion_input_ids"][0]  # one prompt per call
        totals["generated_tokens"] += sum(len(ids) for ids in completions)
        totals["prompt_tokens"] += out["prompt_input_ids"].shape[1] * len(completions)
        return out

    def timed_update(*args, **kwargs):
        started = time.perf_counter()
        update(*args, **kwargs)
        totals["update_s"] += time.perf_counter() - started

    trainer._generate_completions, trainer._update_from_samples = timed_generate, timed_update
    return totals


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model folder, e.g. ~/.cache/comlrl/SmolLM2-135M-Instruct")
    parser.add_argument(
        "--dtype", default="fp32", choices=["fp32", "bf16"], help="the agents' weights (bf16: pure bf16 training)"
    )
    measure.add_learning_arg(parser)
    measure.add_common_args(parser)
    args = parser.parse_args(argv)
    if version("comlrl") != ORIGINAL_VERSION:
        sys.exit(f"comlrl {version('comlrl')} found: run with the original's venv (benchmarks/setup_original.sh)")
    measure.set_threads(args.threads)
    work = measure.workload_from_args(args)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.learning_seed is not None:
        recorder = wl.RecordedReward()
        trainer = build_trainer(args.model, work, dtype, wl.LEARNING_EPOCHS, recorder)
        seed_everything(args.learning_seed)
        measure.run_learning(f"original-{args.dtype}", args.learning_seed, recorder, trainer.train)
        return
    trainer = build_trainer(args.model, work, dtype)
    totals = instrument(trainer)
    gflops = measure.matmul_gflops()
    seed_everything(wl.SEED)
    with contextlib.redirect_stdout(sys.stderr):
        started = time.perf_counter()
        trainer.train(min_new_tokens=work.max_new_tokens)
        train_s = time.perf_counter() - started
    measure.check_generated(totals["generated_tokens"], work.generated_tokens)
    measure.print_result(
        measure.result(
            f"original-{args.dtype}",
            train_s=train_s,
            generate_s=totals["generate_s"],
            update_s=totals["update_s"],
            generated_tokens=totals["generated_tokens"],
            trained_tokens=totals["generated_tokens"] + totals["prompt_tokens"],
            params_per_agent=measure.parameter_count(trainer.agents[0]),
            gflops=gflops,
        )
    )


if __name__ == "__main__":
    main()
