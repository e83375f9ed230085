"""Check the trainer on one CUDA GPU without vLLM or model weights (sized for 3-5 minutes on one H200).

    python benchmarks/gpu_check.py --prepare DIR          # where comlrl has its embedded model
    python benchmarks/gpu_check.py --model-files DIR      # on the GPU: float32 and bfloat16, cuda:0
    python benchmarks/gpu_check.py --device cpu --tiny --model-files DIR --compile-backend eager

The agents are RANDOM models of SmolLM2-135M-Instruct's shape (its ``config.json``, seeded)
with its tokenizer: what is timed and compared here does not depend on trained weights, and the
files to carry are a few MB instead of 0.5 GB. ``--prepare DIR`` writes those files (the
embedded model's folder without its weights); ``--model-files DIR`` reads them. comlrl imports
no ``datasets``, so a machine with torch and transformers runs this from a checkout
(``PYTHONPATH=$PWD``). The compiled cases need a transformers whose decoders take a ``cache``
argument, as 5.24 (requirements-dev.txt's pin) does; 5.17 names it ``past_key_values``, so
compiled decoding falls back to the eager loop there, and those cases fail saying so.
benchmarks/gpu_wheels.sh fetches the transformers wheel (and datasets', for the examples).

Cases, for each ``--dtype`` (default: float32, then bfloat16):

  magrpo_eager, magrpo_compiled: two MAGRPO training steps (``MAGRPOTrainer.training_step``; 2
      agents on the device, 2 prompts per step of 4, G = 8 completions of exactly 64 tokens
      through ``min_new_tokens``, the story-len-ratio reward; ``precision="bf16"`` for bfloat16)
      with the hf backend's eager decoding loop, then with ``compiled_decoding=True``. Per
      step: wall, generation and update seconds, generated tokens/s; the first step's extra
      seconds over the second (compile and warm-up); the buckets compiled
      (``compile_seconds``); with bf16 the trainer's ``sampler_logprob_gap`` metric.
  logprob_gap: the sampler's log-probs of its tokens (``generate_group(with_logprobs=True)``,
      eager and compiled loops, the trainer's sampling settings) against the learner's
      (``completion_logprobs``, one forward over the whole sequences): mean and max abs gap,
      and each loop's tokens/s once warm. In fp32 the two must agree (mean gap at most
      ``FP32_GAP_MAX``), else positions, padding or the cache are wrong.
  fsdp_full_shard: one process group of one rank (NCCL on CUDA, gloo on the CPU), a model
      sharded by ``comlrl.engine.sharding.shard_model`` (``full_shard``, bf16 compute for bfloat16),
      gathered whole for a no-grad forward as for sampling, released, then two steps of forward,
      backward and AdamW on a batch of random tokens.

Each case reports its peak CUDA memory (``torch.cuda.max_memory_allocated``, reset before
it; null on the CPU) and ``ok``, or the error it raised: one failing case does not stop the
others. The JSON object (versions, device, cases) goes to ``--out``/gpu_check.json, written
again after every case so that a run stopped part-way keeps what it measured, and is printed
at the end; the exit status is 1 when a case failed.

``--tiny`` (2 layers, hidden size 64, the same tokenizer, 8 tokens, G = 4) makes a CPU smoke
run (tests/test_gpu_check.py); ``--compile-backend eager`` compiles the decoding step with
dynamo's eager backend there (graph capture and the static cache are exercised, no kernels
are generated), seconds instead of a minute of inductor per dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import transformers
import workload as wl
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from comlrl.engine import sharding
from comlrl.models.forward import accepts, completion_logprobs
from comlrl.rollout import compiled_decoding
from comlrl.rollout.generation import generate_group
from comlrl.rollout.sampling import SamplingSpec
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

DTYPES = ("float32", "bfloat16")
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
"""Config overrides of ``--tiny``: the embedding keeps the tokenizer's 49152 rows."""
SIZES = {
    False: {"num_generations": 8, "max_new_tokens": 64, "fsdp_batch": (16, 128)},
    True: {"num_generations": 4, "max_new_tokens": 8, "fsdp_batch": (4, 16)},
}
"""Per ``--tiny``: G, tokens per completion, and the FSDP step's batch (rows, tokens)."""
PROMPTS = wl.ALL_PROMPTS[:4]
"""The tutorial's first prompts: two steps of ``ROWS_PER_STEP`` rows."""
ROWS_PER_STEP = 2
STEPS = 2
"""Two steps: the first pays compiles and warm-up, the second is the steady figure."""
FP32_GAP_MAX = 1e-3
"""Largest mean abs gap between sampler and learner log-probs accepted in fp32 (the same
weights and kernels up to reduction order: ~1e-6 expected)."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
MAX_FILES_BYTES = 16 * 2**20
"""``--prepare`` refuses to write more than this: config and tokenizer files are a few MB."""
REPORT_NAME = "gpu_check.json"


# ------------------------------------------------------------------------------ model files
def prepare(target: Path, source: Path | None = None) -> dict[str, int]:
    """Copy the model folder ``source`` (default: the embedded model's) into ``target``
    without its weights; returns each file's size. Checks the copy loads and stays small."""
    if source is None:
        from comlrl.models import default_model_path

        source = default_model_path()
    files = [path for path in sorted(Path(source).iterdir()) if path.is_file() and not is_weights(path.name)]
    sizes = {path.name: path.stat().st_size for path in files}
    total = sum(sizes.values())
    if total > MAX_FILES_BYTES:  # a weights file of a kind is_weights does not know
        raise RuntimeError(f"{source}: {total / 2**20:.1f} MiB besides the weights, more than config and tokenizer")
    for needed in ("config.json", "tokenizer_config.json"):
        if needed not in sizes:
            raise RuntimeError(f"{source} has no {needed}")
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy2(path, target / path.name)
    AutoConfig.from_pretrained(target)
    AutoTokenizer.from_pretrained(target)
    return sizes


def is_weights(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def model_config(files: Path, tiny: bool) -> transformers.PreTrainedConfig:
    config = AutoConfig.from_pretrained(files)
    if tiny:
        config.update(TINY)
    return config


def random_model(files: Path, config: transformers.PreTrainedConfig, seed: int, device: str) -> torch.nn.Module:
    """A model of ``config`` with seeded random fp32 weights (built on the CPU, so that a seed
    gives the same weights on every device), with the folder's generation config."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if (files / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(files)
    return model.to(device)


# ------------------------------------------------------------------------------ measuring
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, work: Callable[[], Any]) -> tuple[Any, float]:
    synchronize(device)
    started = time.perf_counter()
    result = work()
    synchronize(device)
    return result, time.perf_counter() - started


def peak_mib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def new_compiles(before: dict, after: dict) -> list[dict[str, Any]]:
    """The compiles of the decoding step between two ``compile_seconds()`` readings."""
    compiles = []
    for bucket, seconds in after.items():
        added = seconds[len(before.get(bucket, ())) :]
        if added:
            compiles.append({"dtype": bucket.dtype, "rows": bucket.rows, "length": bucket.length, "seconds": added})
    return compiles


@contextlib.contextmanager
def compile_backend(name: str) -> Iterator[None]:
    """The decoding step compiled as the library does (``default``), or with another dynamo
    backend for the CPU smoke run; restored on the way out (the test runs in-process)."""
    if name == "default":
        yield
        return

    @functools.cache
    def step(device_type: str) -> Callable[..., torch.Tensor]:
        return torch.compile(compiled_decoding._forward_step, backend=name, dynamic=False, fullgraph=True)

    with mock.patch.object(compiled_decoding, "compiled_step", step):
        yield


# ------------------------------------------------------------------------------ cases
class Check:
    """The run's settings and what the cases share."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device = args.device
        self.files = Path(args.model_files)
        self.config = model_config(self.files, args.tiny)
        self.tokenizer = AutoTokenizer.from_pretrained(self.files)
        sizes = SIZES[args.tiny]
        self.num_generations = args.num_generations or sizes["num_generations"]
        self.max_new_tokens = args.max_new_tokens or sizes["max_new_tokens"]
        self.fsdp_batch = sizes["fsdp_batch"]

    def agents(self, seed: int) -> list[torch.nn.Module]:
        return [random_model(self.files, self.config, seed + i, self.device) for i in range(2)]

    def trainer_config(self, dtype: str, compiled: bool, output_dir: str) -> MAGRPOConfig:
        return MAGRPOConfig(
            num_train_epochs=1,
            per_device_train_batch_size=ROWS_PER_STEP,
            agent_learning_rate=5e-5,
            num_generations=self.num_generations,
            max_new_tokens=self.max_new_tokens,
            generation_kwargs={"min_new_tokens": self.max_new_tokens},
            precision="bf16" if dtype == "bfloat16" else "fp32",
            compiled_decoding=compiled,
            num_completions_to_log=0,
            output_dir=output_dir,
            seed=self.args.seed,
        )

    def magrpo(self, dtype: str, compiled: bool) -> dict[str, Any]:
        """Two training steps of a fresh trainer; see the module's docstring."""
        with tempfile.TemporaryDirectory(prefix="gpu_check-") as output_dir:
            agents = self.agents(self.args.seed)
            refusal = compiled_refusal(agents[0]) if compiled else None
            if refusal:  # the trainer would run the eager loop instead, silently
                raise RuntimeError(refusal)
            trainer = MAGRPOTrainer(
                agents=agents,
                tokenizer=self.tokenizer,
                train_dataset=[{"prompt": prompt} for prompt in PROMPTS],
                reward_func=wl.length_ratio_reward,
                args=self.trainer_config(dtype, compiled, output_dir),
            )
            torch.manual_seed(self.args.seed)  # the trainer's generators are drawn from torch's
            before = compiled_decoding.compile_seconds()
            steps, gaps = [], {}
            for step in range(STEPS):
                rows = list(range(step * ROWS_PER_STEP, (step + 1) * ROWS_PER_STEP))
                metrics, seconds = timed(self.device, lambda rows=rows: trainer.training_step(rows))
                steps.append(step_figures(metrics, seconds))
                for agent in range(2):
                    gap = metrics.get(f"agent{agent}/sampler_logprob_gap")
                    if gap is not None:
                        gaps.setdefault(f"agent{agent}", []).append(gap)
            result = {
                "agent_dtype": str(next(agents[0].parameters()).dtype),
                "steps": steps,
                "first_step_extra_s": steps[0]["wall_s"] - steps[-1]["wall_s"],
                "compiles": new_compiles(before, compiled_decoding.compile_seconds()),
            }
            if gaps:
                result["sampler_logprob_gap"] = gaps  # the trainer's metric, per step
            return result

    def logprob_gap(self, dtype: str) -> dict[str, Any]:
        """Sampler against learner log-probs of the same tokens, eager and compiled loops."""
        model = random_model(self.files, self.config, self.args.seed, self.device).to(getattr(torch, dtype))
        config = self.trainer_config(dtype, False, "unused")
        sampling = SamplingSpec.from_config(config).generate_kwargs()
        prompts = list(PROMPTS[:ROWS_PER_STEP])
        result = {}
        for loop, compiled in (("eager", False), ("compiled", True)):
            refusal = compiled_refusal(model) if compiled else None
            if refusal:
                result.update(ok=False, error=refusal)
                continue

            def sample(compiled=compiled):
                generator = torch.Generator(self.device).manual_seed(self.args.seed)
                return generate_group(
                    model, self.tokenizer, prompts, self.num_generations, sampling, generator, True, compiled
                )

            sample()  # warm-up: a compile, or first-call allocations
            rollout, seconds = timed(self.device, sample)
            tokens = rollout.lengths.sum().item()
            result[loop] = {**gap_figures(model, rollout, config.temperature), "tokens_per_s": tokens / seconds}
        if dtype == "float32":
            worst = max(result[loop]["mean_abs"] for loop in ("eager", "compiled") if loop in result)
            if not worst <= FP32_GAP_MAX:
                result.update(ok=False, error=f"fp32 sampler/learner mean log-prob gap {worst:.3g} > {FP32_GAP_MAX}")
        return result

    def fsdp(self, dtype: str) -> dict[str, Any]:
        """One sharded model at world size 1; see the module's docstring."""
        cuda = self.device.startswith("cuda")
        if cuda:  # NCCL's rank 0 is this device
            index = torch.device(self.device).index
            torch.cuda.set_device(torch.cuda.current_device() if index is None else index)
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
        try:
            model = random_model(self.files, self.config, self.args.seed, self.device)
            param_dtype = torch.bfloat16 if dtype == "bfloat16" else None
            sharding.shard_model(model, "full_shard", param_dtype, "the checked model")
            if not sharding.has_sharded(model.parameters()):
                raise AssertionError("shard_model left no parameter sharded")
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            rows, length = self.fsdp_batch
            generator = torch.Generator().manual_seed(self.args.seed)
            ids = torch.randint(0, self.config.vocab_size, (rows, length), generator=generator).to(self.device)

            def whole_forward():
                sharding.gather(model)  # as for sampling: whole weights, no gradient
                with torch.no_grad():
                    logits = model(input_ids=ids[:, :8], use_cache=False).logits
                sharding.release(model)
                return logits.dtype

            def train_step():
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return loss.item()

            compute_dtype, whole_s = timed(self.device, whole_forward)
            steps = [timed(self.device, train_step) for _ in range(STEPS)]
            losses = [loss for loss, _ in steps]
            if not all(math.isfinite(loss) for loss in losses):
                raise AssertionError(f"non-finite losses {losses}")
            return {
                "backend": backend,
                "compute_dtype": str(compute_dtype),
                "batch": [rows, length],
                "whole_forward_s": whole_s,
                "step_s": [seconds for _, seconds in steps],
                "losses": losses,
            }
        finally:
            dist.destroy_process_group()


def compiled_refusal(model: torch.nn.Module) -> str | None:
    """Why the compiled loop would not serve ``model`` (generation then runs the eager loop),
    or None when it would."""
    if compiled_decoding.supports_compiled(model):
        return None
    why = "its forward takes no 'cache' argument" if not accepts(model, "cache") else "see supports_compiled"
    return (
        f"compiled decoding does not serve {type(model).__name__} under transformers {transformers.__version__} "
        f"({why}): the eager loop would run"
    )


def step_figures(metrics: dict[str, float], wall_s: float) -> dict[str, float]:
    return {
        "wall_s": wall_s,
        "generate_s": metrics["time/generate_s"],
        "update_s": metrics["time/update_s"],
        "generated_tokens_per_s": metrics["time/generated_tokens_per_s"],
        "reward_mean": metrics["reward/raw_mean"],
    }


def gap_figures(model: torch.nn.Module, rollout: Any, temperature: float) -> dict[str, float]:
    """Mean and max abs difference, over the completions' own tokens, between the sampler's
    log-probs and the learner's forward over the whole sequences."""
    model.eval()
    with torch.no_grad():
        learner = completion_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=temperature,
        )
    gap = (learner.float() - rollout.sampler_logprobs.float()).abs()[rollout.completion_mask]
    return {"mean_abs": gap.mean().item(), "max_abs": gap.max().item(), "tokens": gap.numel()}


def free_port() -> int:
    """A TCP port free on the loopback now (the rendezvous of the one-rank process group)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_case(device: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``work``'s figures with ``ok``, its seconds and peak memory, or the error it raised."""
    free_memory(device)
    started = time.perf_counter()
    try:
        result = {"ok": True, **work()}
    except Exception as error:  # one case's failure must not lose the others' figures
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    result["seconds"] = time.perf_counter() - started
    result["peak_cuda_mib"] = peak_mib(device)
    free_memory(device)
    return result


# ------------------------------------------------------------------------------ report
def environment(check: Check) -> dict[str, Any]:
    cuda = check.device.startswith("cuda")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version() if cuda else None,
        "device": check.device,
        "device_name": torch.cuda.get_device_name(check.device) if cuda else platform.processor() or "cpu",
        "capability": list(torch.cuda.get_device_capability(check.device)) if cuda else None,
        "cpu_threads": torch.get_num_threads(),
    }


def nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")


def default_out() -> str:
    return os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", metavar="DIR", help="write the model's config and tokenizer files here, exit")
    parser.add_argument("--model-files", metavar="DIR", help="what --prepare wrote (default: the embedded model)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES), help="default: both")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and a few tokens: a CPU smoke run")
    parser.add_argument("--num-generations", type=int, default=None, help="G (default: 8, 4 with --tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens (default: 64, 8 with --tiny)")
    parser.add_argument(
        "--compile-backend",
        default="default",
        choices=("default", "eager", "aot_eager"),
        help="dynamo backend of the compiled decoding step; default: the library's (inductor, CUDA graphs on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and sampling (default: %(default)s)")
    parser.add_argument("--out", default=None, help=f"folder of {REPORT_NAME} (default: $OUT, else benchmarks/results)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare:
        sizes = prepare(Path(args.prepare))
        print(json.dumps({"prepared": args.prepare, "files": sizes, "total_bytes": sum(sizes.values())}, indent=2))
        return 0
    if args.model_files is None:
        from comlrl.models import default_model_path

        args.model_files = str(default_model_path())
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here (--device cpu runs the check on the CPU)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    check = Check(args)
    out = Path(args.out or default_out())
    report: dict[str, Any] = {
        "environment": environment(check),
        "model": {
            "files": args.model_files,
            "tiny": args.tiny,
            "layers": check.config.num_hidden_layers,
            "hidden_size": check.config.hidden_size,
            "vocab_size": check.config.vocab_size,
            "num_generations": check.num_generations,
            "max_new_tokens": check.max_new_tokens,
            "compile_backend": args.compile_backend,
        },
        "cases": {},
    }
    cases = []
    for dtype in args.dtype:
        cases += [
            (f"{dtype}/magrpo_eager", functools.partial(check.magrpo, dtype, False)),
            (f"{dtype}/magrpo_compiled", functools.partial(check.magrpo, dtype, True)),
            (f"{dtype}/logprob_gap", functools.partial(check.logprob_gap, dtype)),
        ]
    # Last, so that no trainer is built while their process group exists (it would join it).
    cases += [(f"{dtype}/fsdp_full_shard", functools.partial(check.fsdp, dtype)) for dtype in args.dtype]
    with compile_backend(args.compile_backend):
        for name, work in cases:
            print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
            report["cases"][name] = result = run_case(args.device, work)
            verdict = "ok" if result["ok"] else "FAILED"
            print(f"gpu_check: {name}: {verdict} in {result['seconds']:.1f} s", file=sys.stderr, flush=True)
            report["ok"] = all(case["ok"] for case in report["cases"].values())
            report["elapsed_s"] = time.perf_counter() - started
            write(report, out)
    print(json.dumps(report, indent=2))
    print(f"gpu_check: wrote {out / REPORT_NAME}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
