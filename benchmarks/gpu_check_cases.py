"""The cases of benchmarks/gpu_check.py (its docstring describes them): :class:`Check` runs
each, :func:`run_case` wraps one with its seconds, peak memory and compiler counters."""

from __future__ import annotations

import argparse
import datetime
import functools
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import workload as wl
from gpu_check_parts import (
    LOGIT_PROMPT,
    collectives_smoke,
    compiled_refusal,
    compiler_counts,
    compiler_figures,
    finite,
    free_memory,
    free_port,
    gap_figures,
    median,
    model_config,
    new_compiles,
    peak_mib,
    random_model,
    timed,
)
from transformers import AutoTokenizer

from comlrl.engine import sharding
from comlrl.rollout import compiled_decoding
from comlrl.rollout.generation import generate_group
from comlrl.rollout.sampling import SamplingSpec
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

DTYPES = ("bfloat16", "float32")
SIZES = {
    False: {"num_generations": 8, "max_new_tokens": 64, "fsdp_batch": (16, 128)},
    True: {"num_generations": 4, "max_new_tokens": 8, "fsdp_batch": (4, 16)},
}
"""Per ``--tiny``: G, tokens per completion, and the FSDP step's batch (rows, tokens)."""
ROWS_PER_STEP = 2
STEPS = 4
"""One warm-up step (compiles, first allocations), then 3 steady ones whose medians are reported."""
PROMPTS = wl.ALL_PROMPTS[: STEPS * ROWS_PER_STEP]
"""The tutorial's first prompts: ``STEPS`` steps of ``ROWS_PER_STEP`` rows."""
REPEATS = 3
"""Timed calls of each decoding loop in logprob_gap, after a warm-up one."""
ALTERNATIONS = 3
"""Rounds of the two buckets in cache_alternation: the first compiles and records."""
FP32_GAP_MAX = 1e-3
"""Largest mean abs gap between sampler and learner log-probs accepted in fp32 (the same
weights and kernels up to reduction order: ~1e-6 expected)."""
PG_TIMEOUT = datetime.timedelta(seconds=60)


class Check:
    """The run's settings and what the cases share."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device = args.device
        self.files = Path(args.model_files)
        self.config = model_config(self.files, args.tiny)
        self.tokenizer = AutoTokenizer.from_pretrained(self.files)
        self.logit_prompt_ids = self.tokenizer(LOGIT_PROMPT, return_tensors="pt").input_ids
        self.unscaled_logit_std: dict[str, float] = {}
        """Per seed, the random model's logits' std before the scaling to ``LOGIT_STD``."""
        sizes = SIZES[args.tiny]
        self.num_generations = args.num_generations or sizes["num_generations"]
        self.max_new_tokens = args.max_new_tokens or sizes["max_new_tokens"]
        self.fsdp_batch = sizes["fsdp_batch"]

    def model(self, seed: int) -> torch.nn.Module:
        model, unscaled = random_model(self.files, self.config, seed, self.device, self.logit_prompt_ids)
        self.unscaled_logit_std[str(seed)] = unscaled
        return model

    def agents(self, seed: int) -> list[torch.nn.Module]:
        return [self.model(seed + i) for i in range(2)]

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

    def sampler(self, model: torch.nn.Module, dtype: str, compiled: bool) -> Callable[..., Any]:
        """``generate_group`` of ``model`` with the trainer's sampling settings and a fresh
        generator of the run's seed, over the prompts it is given."""
        if compiled and (refusal := compiled_refusal(model)):
            raise RuntimeError(refusal)  # generation would run the eager loop instead, silently
        sampling = SamplingSpec.from_config(self.trainer_config(dtype, False, "unused")).generate_kwargs()

        def sample(prompts: list[str], with_logprobs: bool = False) -> Any:
            generator = torch.Generator(self.device).manual_seed(self.args.seed)
            return generate_group(
                model, self.tokenizer, prompts, self.num_generations, sampling, generator, with_logprobs, compiled
            )

        return sample

    def magrpo(self, dtype: str, compiled: bool) -> dict[str, Any]:
        """``STEPS`` training steps of a fresh trainer; see the module's docstring."""
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
                **steady_figures(steps),
                "compiles": new_compiles(before, compiled_decoding.compile_seconds()),
            }
            if gaps:  # the trainer's metric, per agent and step
                result["sampler_logprob_gap"] = gaps
                result["sampler_logprob_gap_median"] = median([gap for per_step in gaps.values() for gap in per_step])
            return result

    def logprob_gap(self, dtype: str) -> dict[str, Any]:
        """Sampler against learner log-probs of the same tokens, eager and compiled loops."""
        model = self.model(self.args.seed).to(getattr(torch, dtype))
        temperature = self.trainer_config(dtype, False, "unused").temperature
        prompts = list(PROMPTS[:ROWS_PER_STEP])
        result = {}
        for loop, compiled in (("eager", False), ("compiled", True)):
            try:
                sample = self.sampler(model, dtype, compiled)
            except RuntimeError as refusal:
                result.update(ok=False, error=str(refusal))
                continue
            sample(prompts, True)  # warm-up: a compile, or first-call allocations
            runs = [timed(self.device, functools.partial(sample, prompts, True)) for _ in range(REPEATS)]
            rollout = runs[-1][0]
            tokens_per_s = median([rollout.lengths.sum().item() / seconds for rollout, seconds in runs])
            result[loop] = {**gap_figures(model, rollout, temperature, entropy=True), "tokens_per_s": tokens_per_s}
        if dtype == "float32":
            worst = max(result[loop]["mean_abs"] for loop in ("eager", "compiled") if loop in result)
            if not worst <= FP32_GAP_MAX:
                result.update(ok=False, error=f"fp32 sampler/learner mean log-prob gap {worst:.3g} > {FP32_GAP_MAX}")
        return result

    def cache_alternation(self, dtype: str) -> dict[str, Any]:
        """Compiled decoding alternating two buckets; see the module's docstring."""
        model = self.model(self.args.seed).to(getattr(torch, dtype))
        sample = self.sampler(model, dtype, True)
        groups = [list(PROMPTS[:ROWS_PER_STEP]), list(PROMPTS[:1])]  # 2G and G rows: two buckets
        # Every cache decoding was given, weakly: a cache the library drops is freed as it would
        # be (and the allocator may give its addresses to the next one, as it would).
        seen: list[weakref.ref] = []
        take_cache = compiled_decoding._take_cache

        def counted_take_cache(model: torch.nn.Module, shape: tuple[Any, ...]) -> Any:
            cache = take_cache(model, shape)
            if not any(ref() is cache for ref in seen):
                seen.append(weakref.ref(cache))
            return cache

        alternations = []
        with mock.patch.object(compiled_decoding, "_take_cache", counted_take_cache):
            for _ in range(ALTERNATIONS):
                before, caches = compiler_counts(), len(seen)
                for prompts in groups:
                    timed(self.device, lambda prompts=prompts: sample(prompts))
                figures = compiler_figures(before, compiler_counts())
                keys = ("graphs", "recompiles", "cudagraph_recordings", "cudagraph_skips")
                alternations.append({"new_caches": len(seen) - caches, **{key: figures[key] for key in keys}})
        last = alternations[-1]
        result = {"rows": [len(group) * self.num_generations for group in groups], "alternations": alternations}
        result["cache_per_bucket"] = last["new_caches"] == 0
        if result["cache_per_bucket"] and (last["graphs"] or last["cudagraph_recordings"]):
            raise AssertionError(f"caches kept per bucket, yet the last alternation compiled or recorded: {last}")
        if not result["cache_per_bucket"]:
            result["finding"] = (
                "static caches not kept per (model, bucket) (compiled_decoding._HELD): each alternation "
                f"allocated {last['new_caches']} caches and recorded {last['cudagraph_recordings']} CUDA graphs "
                "again (CUDA graphs replay on fixed addresses)"
            )
        return result

    def fsdp(self, dtype: str) -> dict[str, Any]:
        """The FSDP2 API smoke test at world size 1; see the module's docstring."""
        cuda = self.device.startswith("cuda")
        if cuda:  # NCCL's rank 0 is this device
            index = torch.device(self.device).index
            torch.cuda.set_device(torch.cuda.current_device() if index is None else index)
        backend = "nccl" if cuda else "gloo"
        address = f"tcp://127.0.0.1:{free_port()}"
        dist.init_process_group(backend, rank=0, world_size=1, init_method=address, timeout=PG_TIMEOUT)
        try:
            collectives = collectives_smoke(self.device, getattr(torch, dtype))
            model = self.model(self.args.seed)
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
            if not finite(losses):
                raise AssertionError(f"non-finite losses {losses}")
            return {
                "backend": backend,
                "timeout_s": PG_TIMEOUT.total_seconds(),
                "collectives": collectives,
                "compute_dtype": str(compute_dtype),
                "batch": [rows, length],
                "whole_forward_s": whole_s,
                "step_s": [seconds for _, seconds in steps],
                **steady_figures([{"wall_s": seconds} for _, seconds in steps]),
                "losses": losses,
            }
        finally:
            dist.destroy_process_group()


def step_figures(metrics: dict[str, float], wall_s: float) -> dict[str, float]:
    return {
        "wall_s": wall_s,
        "generate_s": metrics["time/generate_s"],
        "update_s": metrics["time/update_s"],
        "generated_tokens_per_s": metrics["time/generated_tokens_per_s"],
        "reward_mean": metrics["reward/raw_mean"],
    }


def steady_figures(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median over the steps after the first, and the first's extra wall seconds."""
    steady = {key: median([step[key] for step in steps[1:]]) for key in steps[0]}
    return {
        "steady_steps": len(steps) - 1,
        "steady": steady,
        "first_step_extra_s": steps[0]["wall_s"] - steady["wall_s"],
    }


def run_case(device: str, work: Callable[[], dict[str, Any]], compiled: bool) -> dict[str, Any]:
    """``work``'s figures with ``ok``, its seconds and peak memory (and with ``compiled``, what
    the compiler counted), or the error it raised."""
    free_memory(device)
    counts = compiler_counts()
    started = time.perf_counter()
    try:
        result = {"ok": True, **work()}
    except Exception as error:  # one case's failure must not lose the others' figures
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    result["seconds"] = time.perf_counter() - started
    if compiled:
        result["compiler"] = compiler_figures(counts, compiler_counts())
    result["peak_cuda_mib"] = peak_mib(device)
    free_memory(device)
    return result
