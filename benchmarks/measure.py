"""What benchmarks/bench_ours.py and benchmarks/bench_original.py measure, and the one JSON line
each prints. Imports torch and transformers, never ``comlrl`` (each runner has its own ``comlrl``).

FLOP utilisation: generation is counted as 2 x P FLOPs per generated token, the update as
6 x P FLOPs per trained token (forward + backward; trained tokens = prompt + completion tokens
of every trained sequence), P = one agent's parameter count (tied weights once); both agents'
tokens are summed. The FLOPs are divided by the rate of fp32 2048 x 2048 ``torch.matmul`` measured
in the same process, with the same threads, just before training.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import resource
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
import workload as wl
from transformers import AutoModelForCausalLM, AutoTokenizer

MATMUL_SIZE = 2048


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="tiny check: 1 prompt, 2 generations, 4 tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    # Overrides of the workload, for memory probes (benchmarks/memory_ceiling.py).
    parser.add_argument("--num-generations", type=int, default=None, help="G (default: the workload's)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="forced tokens (default: the workload's)")
    parser.add_argument("--prompts", type=int, default=None, help="first prompts used (default: the workload's)")


def add_shape_args(parser: argparse.ArgumentParser, tokens: int) -> None:
    """``--prompts``, ``--samples`` and ``--tokens``: the rows one agent generates or trains at once."""
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=tokens, help="tokens per completion (default: %(default)s)")


def repeated_prompts(tokenizer: Any, count: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The workload's first ``count`` prompts (cycled), left-padded, each repeated ``samples``
    times in a row: ``(count * samples, L)`` ids and attention mask."""
    prompts = [wl.PROMPTS[i % len(wl.PROMPTS)] for i in range(count)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    return tuple(encoded[key].repeat_interleave(samples, dim=0) for key in ("input_ids", "attention_mask"))


def add_learning_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--learning-seed",
        type=int,
        default=None,
        help="instead of the timed run: the learning run (workload.LEARNING) with this seed, printing each "
        "epoch's mean reward x100 (benchmarks/learning_vs_original.py)",
    )


UPDATE_FIGURES = (
    "clip_fraction",
    "sampler_ratio_capped",
    "sampler_ratio_masked",
    "entropy_kept",
    "truncated_frac",
    "flat_row_frac",
    "refill_rows",
)
"""Per-agent metrics that a learning run averages over its steps and agents (where logged)."""


def run_learning(
    side: str, seed: int, recorder: wl.RecordedReward, train: Any, metrics_file: str | None = None
) -> None:
    """Run ``train()`` of a trainer whose reward is ``recorder`` and print one JSON line: the
    side, the seed, the wall time and each epoch's mean reward x100; with ``metrics_file`` (a
    run's metrics.jsonl), also the mean over steps and agents of each of ``UPDATE_FIGURES`` it logged;
    with dynamic sampling, which scores refill rows too, the epoch means are those of each step's own rows."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        train()
    train_s = time.perf_counter() - started
    means = recorder.epoch_means(wl.LEARNING_EPOCHS)
    line = {"side": side, "seed": seed, "train_s": train_s, "epoch_reward_means": means}
    if metrics_file is not None:
        with open(metrics_file, encoding="utf-8") as f:
            rows = [json.loads(row) for row in f]
        own = [row["dynamic_sampling/batch_reward_mean"] for row in rows if "dynamic_sampling/batch_reward_mean" in row]
        if own:  # dynamic sampling scores refill rows too: each epoch's mean is that of the steps' own rows
            per_epoch = len(own) // wl.LEARNING_EPOCHS
            line["epoch_reward_means"] = [  # already x100: the metric is of the processed reward
                sum(own[e * per_epoch : (e + 1) * per_epoch]) / per_epoch for e in range(wl.LEARNING_EPOCHS)
            ]
        for figure in UPDATE_FIGURES:
            values = [value for row in rows for key, value in row.items() if key.endswith(f"/{figure}")]
            if values:
                line[figure] = sum(values) / len(values)
    print(json.dumps(line), flush=True)


def workload_from_args(args: argparse.Namespace) -> wl.Workload:
    """The workload, or the smoke check, with the command line's overrides."""
    work = wl.LEARNING if getattr(args, "learning_seed", None) is not None else wl.workload(args.smoke)
    return dataclasses.replace(
        work,
        prompts=work.prompts[: args.prompts] if args.prompts else work.prompts,
        num_generations=args.num_generations or work.num_generations,
        max_new_tokens=args.max_new_tokens or work.max_new_tokens,
    )


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def add_timing_args(parser: argparse.ArgumentParser, pairs: int) -> None:
    """``--pairs`` (timed rounds of every side) and ``--threads``."""
    parser.add_argument("--pairs", type=int, default=pairs, help="timed rounds (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")


def model_for_sampling(path: Any, threads: int | None) -> tuple[Any, torch.nn.Module]:
    """The tokenizer and the model (eval mode, its own dtype) at ``path``, torch set to ``threads``."""
    set_threads(threads)
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_gflops(repeats: int = 8) -> float:
    """fp32 matrix-product rate of this process (GFLOP/s), after two warm-up products."""
    a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    for _ in range(2):
        torch.matmul(a, b)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    return 2 * MATMUL_SIZE**3 * repeats / (time.perf_counter() - started) / 1e9


def trainer_inputs(
    model: str, work: wl.Workload, dtype: torch.dtype = torch.float32, reward: Any = wl.length_ratio_reward
) -> dict[str, Any]:
    """What both libraries' ``MAGRPOTrainer`` get for ``work`` (a ``workload.Workload``): the
    agents (``work.num_agents`` copies of ``model`` in ``dtype``), the shared tokenizer, the prompts, the reward
    (the length ratio, or a recording of it) and its processor. The configs differ: each
    library names its fields its own way."""
    return {
        "agents": [AutoModelForCausalLM.from_pretrained(model, dtype=dtype) for _ in range(work.num_agents)],
        "tokenizer": AutoTokenizer.from_pretrained(model),
        "train_dataset": [{"prompt": prompt} for prompt in work.prompts],
        "reward_func": reward,
        "reward_processor": wl.scale_reward,
    }


def check_generated(generated_tokens: int, expected_tokens: int) -> None:
    """Both sides must sample the same tokens: every completion forced to ``max_new_tokens``."""
    if generated_tokens != expected_tokens:
        raise RuntimeError(f"{generated_tokens} tokens generated, the workload forces {expected_tokens}")


def installed_version(package: str) -> str | None:
    """``package``'s version, None where it is not installed (TRL's venv has no comlrl)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def result(
    side: str,
    *,
    train_s: float,
    generate_s: float,
    update_s: float,
    generated_tokens: int,
    trained_tokens: int,
    params_per_agent: int,
    gflops: float,
) -> dict:
    """The figures of one run, as printed by ``print_result``."""
    generate_flops = 2 * params_per_agent * generated_tokens
    update_flops = 6 * params_per_agent * trained_tokens
    rate = gflops * 1e9
    return {
        "side": side,
        "train_s": train_s,
        "generate_s": generate_s,
        "update_s": update_s,
        "generated_tokens": generated_tokens,
        "trained_tokens": trained_tokens,
        "generated_tokens_per_s": generated_tokens / generate_s,
        "peak_rss_mib": peak_rss_mib(),
        "params_per_agent": params_per_agent,
        "matmul_gflops": gflops,
        "update_flop_util": update_flops / update_s / rate,
        "run_flop_util": (generate_flops + update_flops) / train_s / rate,
        "threads": torch.get_num_threads(),
        "comlrl": installed_version("comlrl"),
        "torch": torch.__version__,
        "transformers": version("transformers"),
    }


def print_result(figures: dict) -> None:
    """The runner's only line on stdout."""
    print(json.dumps(figures), flush=True)
