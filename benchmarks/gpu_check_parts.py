"""The parts of benchmarks/gpu_check.py that are not its cases: the model files and the random
models, timing, the compiler's counters, the collectives' smoke test, the log-prob gap and the
one-line summaries. Imports what gpu_check.py may import (no ``datasets``)."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import platform
import shutil
import socket
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import transformers
from torch._dynamo.utils import counters
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from comlrl.models.forward import accepts, completion_logprobs
from comlrl.rollout import compiled_decoding

TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
"""Config overrides of ``--tiny``: the embedding keeps the tokenizer's 49152 rows."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
MAX_FILES_BYTES = 16 * 2**20
"""``--prepare`` refuses to write more than this: config and tokenizer files are a few MB."""
LOGIT_STD = 3.5
"""The logits' std over the vocabulary (mean over :data:`LOGIT_PROMPT`'s positions) that the
random models are scaled to. SmolLM2-135M-Instruct gives 3.2-3.45 on the prompts of
benchmarks/workload.py (2.8-4.0 over prompt and 32 sampled tokens), and its sampled tokens'
entropy at T = 0.6 is 0.9-1.0; a random model of its shape gives 0.48 and 10.5 (near uniform
over 49152 tokens), scaled to 3.5 it gives 0.89 (measured on the CPU, seed 0)."""
LOGIT_PROMPT = "Describe a city in the clouds:"
"""The fixed prompt the logits' spread is measured on (workload.ALL_PROMPTS[0], raw text)."""


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


def random_model(
    files: Path, config: transformers.PreTrainedConfig, seed: int, device: str, prompt_ids: torch.Tensor
) -> tuple[torch.nn.Module, float]:
    """A model of ``config`` with seeded random fp32 weights (built on the CPU, so that a seed
    gives the same weights on every device), with the folder's generation config, its final
    norm's weight scaled so that its logits' spread on ``prompt_ids`` is :data:`LOGIT_STD`
    (random weights give near-uniform logits, which understate the bf16 sampler/learner gap);
    and the spread before scaling. The scale is exact: the logits are linear in that weight."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if (files / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(files)
    unscaled = logit_std(model, prompt_ids)
    with torch.no_grad():
        model.model.norm.weight.mul_(LOGIT_STD / unscaled)
    return model.to(device), unscaled


def logit_std(model: torch.nn.Module, prompt_ids: torch.Tensor) -> float:
    """The std over the vocabulary of ``model``'s logits, averaged over the prompt's positions."""
    with torch.no_grad():
        logits = model(input_ids=prompt_ids.to(next(model.parameters()).device), use_cache=False).logits
    return logits[0].float().std(dim=-1).mean().item()


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


def median(values: list[float]) -> float:
    return statistics.median(values)


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


def recompiles(before: dict, after: dict) -> int:
    """Compiles between two ``compile_seconds()`` readings of buckets compiled before (or twice)."""
    added = {bucket: len(seconds) - len(before.get(bucket, ())) for bucket, seconds in after.items()}
    return sum(count - (bucket not in before) for bucket, count in added.items() if count)


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


# ------------------------------------------------------------------------------ compiler counters
SKIP_REASONS: list[str] = []
"""The messages of inductor's CUDA-graph skips while :func:`compiler_watch` is on."""


class _Kept(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        SKIP_REASONS.append(record.getMessage())


@contextlib.contextmanager
def compiler_watch() -> Iterator[None]:
    """Counts CUDA-graph recordings (each call of the CUDA-graph tree's ``record_function``: a
    first recording or a re-recording) as ``counters["gpu_check"]["cudagraph_recordings"]``, and
    keeps the messages of CUDA-graph skips in :data:`SKIP_REASONS`. Both are private torch
    names; where they moved, those two figures stay 0."""
    try:
        from torch._inductor import cudagraph_trees, cudagraph_utils

        manager, log = cudagraph_trees.CUDAGraphTreeManager, cudagraph_utils.cudagraphs_log
        original = manager.record_function
    except (ImportError, AttributeError):
        yield
        return

    def record_function(self, *args: Any, **kwargs: Any) -> Any:
        counters["gpu_check"]["cudagraph_recordings"] += 1
        return original(self, *args, **kwargs)

    handler = _Kept(logging.WARNING)
    log.addHandler(handler)
    try:
        with mock.patch.object(manager, "record_function", record_function):
            yield
    finally:
        log.removeHandler(handler)


def compiler_counts() -> dict[str, Any]:
    """The counters of dynamo and inductor (``torch._dynamo.utils.counters``) read now, with
    dynamo's last compilation records (a private deque; empty where it moved)."""
    return {
        "graphs": counters["stats"]["unique_graphs"],  # dynamo graphs compiled: first compiles and recompiles
        "graph_breaks": dict(counters["graph_break"]),  # reason -> count
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "cudagraph_recordings": counters["gpu_check"]["cudagraph_recordings"],
        "cudagraph_recorded_non_static_inputs": counters["inductor"]["cudagraph_recorded_non_static_inputs"],
        "skip_reasons": len(SKIP_REASONS),
        "compile_seconds": compiled_decoding.compile_seconds(),
        "records": list(getattr(torch._dynamo.utils, "_compilation_metrics", ())),
    }


def compiler_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the compiler did between two :func:`compiler_counts` readings."""
    breaks = {reason: n - before["graph_breaks"].get(reason, 0) for reason, n in after["graph_breaks"].items()}
    breaks = {reason: n for reason, n in breaks.items() if n > 0}
    records = [record for record in after["records"] if not any(record is old for old in before["records"])]
    reasons = {getattr(record, "recompile_reason", None) for record in records} - {None}
    return {
        **{key: after[key] - before[key] for key in ("graphs", "cudagraph_skips", "cudagraph_recordings")},
        "recompiles": recompiles(before["compile_seconds"], after["compile_seconds"]),
        "recompile_reasons": sorted(reasons)[:5],  # dynamo's first failed guard of each recompile
        "graph_breaks": sum(breaks.values()),
        "graph_break_reasons": sorted(breaks)[:5],
        "cudagraph_skip_reasons": SKIP_REASONS[before["skip_reasons"] : after["skip_reasons"]][:5],
        "cudagraph_recorded_non_static_inputs": after["cudagraph_recorded_non_static_inputs"]
        - before["cudagraph_recorded_non_static_inputs"],
    }


# ------------------------------------------------------------------------------ cases' parts
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


def gap_figures(model: torch.nn.Module, rollout: Any, temperature: float, entropy: bool = False) -> dict[str, float]:
    """Mean and max abs difference, over the completions' own tokens, between the sampler's
    log-probs and the learner's forward over the whole sequences (the trainer's path); with
    ``entropy``, also the mean entropy of the (tempered) distributions the tokens were drawn
    from (before top-k/top-p), from a second forward that keeps whole logits."""
    model.eval()
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    with torch.no_grad():
        learner = completion_logprobs(model, *args, temperature=temperature)
    mask = rollout.completion_mask
    gap = (learner.float() - rollout.sampler_logprobs.float()).abs()[mask]
    figures = {"mean_abs": gap.mean().item(), "max_abs": gap.max().item(), "tokens": gap.numel()}
    if entropy:
        with torch.no_grad():
            _, entropies = completion_logprobs(model, *args, temperature=temperature, with_entropy=True)
        figures["entropy_mean"] = entropies.float()[mask].mean().item()
    return figures


COLLECTIVES = (("all_gather_into_tensor", "all_gather_single"), ("reduce_scatter_tensor", "reduce_scatter_single"))
"""The collectives FSDP2 calls: ``*_single`` in torch 2.13 (the others deprecated there), the
first names before; each that this torch has is called."""


def collectives_smoke(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """Each collective of :data:`COLLECTIVES` this torch has, on a small tensor of ``dtype`` in
    the current process group, its output checked (written over a buffer of -1: a call that did
    nothing fails). At world size 1 this exercises the API and the backend's kernels, not any
    communication."""
    world = dist.get_world_size()
    shard = torch.arange(1, 9, device=device, dtype=dtype)  # small integers: exact in bf16
    whole = torch.cat([shard * (rank + 1) for rank in range(world)])
    rank = dist.get_rank()
    expected = {"gather": whole, "scatter": shard * (rank + 1) * world}
    figures: dict[str, Any] = {"world_size": world, "elements": shard.numel(), "dtype": str(dtype)}
    for kind, names in zip(("gather", "scatter"), COLLECTIVES):
        for name in names:
            if not hasattr(dist, name):
                continue
            source = shard * (rank + 1) if kind == "gather" else whole
            output = torch.full_like(expected[kind], -1)
            with warnings.catch_warnings():  # deprecation warnings of torch 2.13
                warnings.simplefilter("ignore", FutureWarning)
                _, seconds = timed(
                    device, lambda name=name, output=output, source=source: getattr(dist, name)(output, source)
                )
            if not torch.equal(output, expected[kind]):
                raise AssertionError(f"{name} gave {output.tolist()}, expected {expected[kind].tolist()}")
            figures[name] = {"ok": True, "seconds": seconds}
    return figures


def free_port() -> int:
    """A TCP port free on the loopback now (the rendezvous of the one-rank process group)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ------------------------------------------------------------------------------ report
def summary_line(name: str, case: dict[str, Any]) -> str:
    """One line of a finished case: its name, dtype, ok or its error, and its key figures."""
    dtype, _, kind = name.partition("/")
    verdict = "ok" if case["ok"] else f"ERROR {case.get('error', '?')}".splitlines()[0][:200]
    parts = [f"{case['seconds']:.1f} s"]
    if "steady" in case:
        steady = case["steady"]
        parts.append(f"step {steady['wall_s']:.3g} s (median of {case['steady_steps']})")
        if "generated_tokens_per_s" in steady:
            parts.append(f"{steady['generated_tokens_per_s']:.0f} tok/s")
        parts.append(f"warm-up {case['first_step_extra_s']:+.3g} s")
    if "sampler_logprob_gap_median" in case:
        parts.append(f"sampler gap {case['sampler_logprob_gap_median']:.3g}")
    for loop in ("eager", "compiled"):
        if isinstance(case.get(loop), dict):
            gap = case[loop]
            parts.append(
                f"{loop}: gap {gap['mean_abs']:.3g} (max {gap['max_abs']:.3g}), entropy {gap['entropy_mean']:.3g}, "
                f"{gap['tokens_per_s']:.0f} tok/s"
            )
    if "collectives" in case:
        called = [key for key, value in case["collectives"].items() if isinstance(value, dict) and value["ok"]]
        parts.append(f"collectives ok: {' '.join(called)}; loss {case['losses'][-1]:.3g}")
    if "alternations" in case:
        last = case["alternations"][-1]
        kept = "yes" if case["cache_per_bucket"] else "no"
        parts.append(
            f"cache per (model, bucket): {kept}; last alternation: {last['new_caches']} new caches, "
            f"{last['graphs']} graphs, {last['cudagraph_recordings']} CUDA-graph recordings"
        )
    if "compiler" in case:
        figures = case["compiler"]
        parts.append(
            "compiler: "
            + ", ".join(f"{key} {figures[key]}" for key in ("graphs", "recompiles", "graph_breaks", "cudagraph_skips"))
            + f", cudagraph_recordings {figures['cudagraph_recordings']}"
        )
    if case.get("peak_cuda_mib") is not None:
        parts.append(f"peak {case['peak_cuda_mib']:.0f} MiB")
    return f"gpu_check: {kind} {dtype} {verdict}: " + "; ".join(parts)


def environment(device: str) -> dict[str, Any]:
    cuda = device.startswith("cuda")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version() if cuda else None,
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "cpu_threads": torch.get_num_threads(),
    }


def nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def finite(values: list[float]) -> bool:
    return all(math.isfinite(value) for value in values)
