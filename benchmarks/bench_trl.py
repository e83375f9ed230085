"""Run TRL's ``GRPOTrainer`` (PyPI trl==1.16.0) on the fixed workload of benchmarks/workload.py
with ONE model, and print one JSON line, in the format of benchmarks/bench_ours.py.

    benchmarks/setup_trl.sh                                    # once: benchmarks/.venv-trl
    benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --model ~/.cache/comlrl/SmolLM2-135M-Instruct
    benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --model DIR --smoke --threads 2
    benchmarks/.venv-trl/bin/python benchmarks/bench_trl.py --model DIR --precision bf16

Run it with TRL's virtual environment (it has no ``comlrl``). ``--model`` is the embedded model's
plain Hugging Face folder (our ``comlrl.models.default_model_path()`` prints it). Our side of the
comparison is ``benchmarks/bench_ours.py --agents 1``; benchmarks/compare_trl.py alternates the two.

Config (``GRPOConfig``), the workload's for one agent: the model and tokenizer loaded as
``measure.trainer_inputs`` loads them (fp32 weights), the prompts as raw text (not
conversational), one epoch in dataset order (``shuffle_dataset=False``), ``num_generations``
G, ``max_completion_length`` and ``generation_kwargs={"min_new_tokens": ...}`` (every
completion forced to that many tokens), the workload's temperature, top-p, top-k and learning
rate (constant, as ours), ``per_device_train_batch_size`` = 2 prompts x G rows and
``gradient_accumulation_steps=1`` (one generation batch, one forward + backward and one
optimizer step per 2 prompts, as ours), ``beta=0`` (no reference model), ``num_iterations=1``,
TRL's default ``loss_type`` ("dapo", ours' default too), ``max_grad_norm=1.0`` (both defaults),
``gradient_checkpointing=False`` (TRL's default is True; ``--gradient-checkpointing`` keeps it),
``bf16`` from ``--precision`` (TRL's default is True; ``use_cpu`` where there is no GPU, which
transformers asks for with bf16), seed 0, no logging, saving, evaluation or
report_to. Reward: ``workload.one_agent_length_ratio_reward`` x100 (the scale ours applies as its
reward processor; TRL has none, so the function returns the scaled value).

Measured: ``train_s``, the wall time of ``trainer.train()``; ``generate_s``, the time in
``_generate_and_score_completions`` (tokenising, ``generate``, decoding, rewards, advantages: ours'
rollout), wrapped on the instance, which also gives the generated and prompt tokens (the masks'
sums); ``update_s``, the time from each optimizer step's ``on_step_begin`` to its
``on_optimizer_step`` callback (forward, backward, clipping, optimizer step) less the generation
inside it. The fields, peak RSS and FLOP utilisation are described in benchmarks/measure.py. The
trainer's own output goes to stderr: stdout carries only the JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from importlib.metadata import version

import measure
import torch
import workload as wl
from datasets import Dataset
from transformers import TrainerCallback

TRL_VERSION = "1.16.0"


def length_ratio_reward(prompts, completions, **_):
    """The one-agent reward, scaled as ours scales it (TRL names reward columns after ``__name__``)."""
    return [wl.scale_reward(r) for r in wl.one_agent_length_ratio_reward(prompts, completions)]


class StepTimer(TrainerCallback):
    """Adds each optimizer step's time, from its start to its optimizer step, to ``totals["step_s"]``."""

    def __init__(self, totals: dict) -> None:
        self.totals, self.started = totals, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.totals["step_s"] += time.perf_counter() - self.started


def build_trainer(model: str, work: wl.Workload, output_dir: str, precision: str, checkpointing: bool, totals: dict):
    from trl import GRPOConfig, GRPOTrainer

    inputs = measure.trainer_inputs(model, work)
    config = GRPOConfig(
        output_dir=output_dir,
        num_train_epochs=wl.NUM_EPOCHS,
        per_device_train_batch_size=min(wl.PROMPTS_PER_STEP, len(work.prompts)) * work.num_generations,
        gradient_accumulation_steps=1,
        learning_rate=wl.LEARNING_RATE,
        lr_scheduler_type="constant",
        num_generations=work.num_generations,
        max_completion_length=work.max_new_tokens,
        generation_kwargs={"min_new_tokens": work.max_new_tokens},
        temperature=wl.TEMPERATURE,
        top_p=wl.TOP_P,
        top_k=wl.TOP_K,
        beta=0.0,
        num_iterations=1,
        shuffle_dataset=False,
        gradient_checkpointing=checkpointing,
        bf16=precision == "bf16",
        use_cpu=not torch.cuda.is_available(),  # transformers refuses bf16 without a GPU unless told
        seed=wl.SEED,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    return GRPOTrainer(
        model=inputs["agents"][0],
        reward_funcs=length_ratio_reward,
        args=config,
        train_dataset=Dataset.from_list(inputs["train_dataset"]),
        processing_class=inputs["tokenizer"],
        callbacks=[StepTimer(totals)],
    )


def instrument(trainer, totals: dict) -> None:
    """Time the trainer's rollouts and count their tokens into ``totals`` as the trainer runs."""
    rollout = trainer._generate_and_score_completions

    def timed_rollout(*args, **kwargs):
        started = time.perf_counter()
        out = rollout(*args, **kwargs)
        totals["generate_s"] += time.perf_counter() - started
        totals["generated_tokens"] += int(out["completion_mask"].sum())
        totals["prompt_tokens"] += int(out["prompt_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed_rollout


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model folder, e.g. ~/.cache/comlrl/SmolLM2-135M-Instruct")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="fp32, or TRL's bf16 flag")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="keep TRL's default gradient checkpointing (off here)"
    )
    measure.add_common_args(parser)
    args = parser.parse_args(argv)
    if version("trl") != TRL_VERSION:
        sys.exit(f"trl {version('trl')} found, {TRL_VERSION} expected: run with benchmarks/.venv-trl (setup_trl.sh)")
    measure.set_threads(args.threads)
    work = dataclasses.replace(measure.workload_from_args(args), num_agents=1)
    totals = {"generate_s": 0.0, "step_s": 0.0, "generated_tokens": 0, "prompt_tokens": 0}
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as output_dir:
        trainer = build_trainer(args.model, work, output_dir, args.precision, args.gradient_checkpointing, totals)
        instrument(trainer, totals)
        gflops = measure.matmul_gflops()
        with contextlib.redirect_stdout(sys.stderr):
            started = time.perf_counter()
            trainer.train()
            train_s = time.perf_counter() - started
    measure.check_generated(totals["generated_tokens"], work.generated_tokens)
    figures = measure.result(
        f"trl-{args.precision}",
        train_s=train_s,
        generate_s=totals["generate_s"],
        update_s=totals["step_s"] - totals["generate_s"],
        generated_tokens=totals["generated_tokens"],
        trained_tokens=totals["generated_tokens"] + totals["prompt_tokens"],
        params_per_agent=measure.parameter_count(trainer.model),
        gflops=gflops,
    )
    measure.print_result({**figures, "trl": version("trl")})


if __name__ == "__main__":
    main()
