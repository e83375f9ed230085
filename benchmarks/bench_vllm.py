"""MAGRPO with the vllm backend against the hf backend, on CPU agents, in one invocation.

    .venv-vllm/bin/python benchmarks/bench_vllm.py               # `make test-vllm` builds .venv-vllm
    .venv-vllm/bin/python benchmarks/bench_vllm.py --steps 4 --max-new-tokens 16   # quicker
    .venv-vllm/bin/python benchmarks/bench_vllm.py --precision bf16 --full-only    # bf16 agents and engines
    .venv-vllm/bin/python benchmarks/bench_vllm.py --agents 4 --lora-only          # four adapters, one engine

Run with ``PYTHONPATH=.`` from the checkout (the vllm environment does not install comlrl).
Four runs, each in a process of its own, of ``--steps`` training steps on the embedded model
(fp32): two full-model
agents, then two LoRA agents on one base (one engine serves both), each with
``generation_backend="vllm"`` (vLLM's CPU build) and ``"hf"``; the tutorial's first prompts,
G = 4, the length-ratio reward of benchmarks/workload.py. Prints one JSON line per run:
engine start-up (the trainer's construction), the median step time, generated tokens/s, peak
RSS of this process and of its engine processes, and the sampler/learner log-prob gap of every
agent at every step (``agent{i}/sampler_logprob_gap``: mean over tokens; max over steps), with
the share of tokens the mismatch correction truncated; and whether the gap grew over the run
(its last third against its first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import measure
import torch
import workload as wl
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models import default_model_path
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def rss_mib(pid: int) -> float:
    """Peak resident memory of process ``pid`` (``VmHWM``), MiB; 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (the engine processes and their workers)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as listing:
                kids = [int(k) for k in listing.read().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def chained_length_ratio(*completions: list[str]) -> list[float]:
    """The fixed workload's length-ratio reward of each agent against the one before it, averaged
    (two agents: the workload's own reward)."""
    pairs = [wl.length_ratio_reward(first, second) for first, second in zip(completions, completions[1:])]
    return [sum(values) / len(values) for values in zip(*pairs)]


def run(backend: str, lora: bool, steps: int, max_new_tokens: int, num_agents: int, precision: str) -> dict:
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [{"prompt": p} for p in (wl.ALL_PROMPTS * 4)[:steps]]
    peft_config = None
    agents = None
    if lora:
        from peft import LoraConfig

        base = AutoModelForCausalLM.from_pretrained(path)
        agents = [base] * num_agents
        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        trainer = MAGRPOTrainer(
            agent_model=None if lora else path,
            agents=agents,
            tokenizer=tokenizer,
            peft_config=peft_config,
            train_dataset=prompts,
            reward_func=chained_length_ratio,
            reward_processor=wl.scale_reward,
            args=MAGRPOConfig(
                num_agents=num_agents,
                precision=precision,
                num_train_epochs=1,
                num_generations=4,
                max_new_tokens=max_new_tokens,
                generation_kwargs={"min_new_tokens": max_new_tokens},
                per_device_train_batch_size=1,
                agent_learning_rate=1e-5 if not lora else 1e-4,
                generation_backend=backend,
                output_dir=folder,
                logging_steps=1,
            ),
        )
        built = time.perf_counter() - started
        trainer.train()
        with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as log:
            lines = [json.loads(line) for line in log]
    engine_rss = sum(rss_mib(pid) for pid in children(os.getpid()))
    if backend == "vllm":
        trainer.backend.close()
    steps_s = [line["time/step_s"] for line in lines]
    tokens = [line["time/generated_tokens_per_s"] for line in lines]
    figures = {
        "backend": backend,
        "agents": f"{num_agents} LoRA on one base" if lora else f"{num_agents} full models",
        "precision": precision,
        "steps": len(lines),
        "construction_s": round(built, 1),
        "step_s_median": round(statistics.median(steps_s), 2),
        "generated_tokens_per_s_median": round(statistics.median(tokens), 1),
        "peak_rss_mib": round(measure.peak_rss_mib()),
        "engine_processes_peak_rss_mib": round(engine_rss),
    }
    for agent in range(num_agents):
        gaps = [line.get(f"agent{agent}/sampler_logprob_gap") for line in lines]
        if None in gaps:  # the hf backend in fp32 samples with the learner: no gap to measure
            continue
        third = max(1, len(gaps) // 3)
        capped = [line.get(f"agent{agent}/sampler_ratio_capped", 0.0) for line in lines]
        figures[f"agent{agent}_gap_mean"] = statistics.mean(gaps)
        figures[f"agent{agent}_gap_max"] = max(gaps)
        figures[f"agent{agent}_gap_first_third_mean"] = statistics.mean(gaps[:third])
        figures[f"agent{agent}_gap_last_third_mean"] = statistics.mean(gaps[-third:])
        figures[f"agent{agent}_capped_share_mean"] = statistics.mean(capped)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (one prompt each)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--agents", type=int, default=2, help="agents per run")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--lora-only", action="store_true", help="only the LoRA runs")
    parser.add_argument("--full-only", action="store_true", help="only the full-model runs")
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "LORA"), help="one run in this process (internal)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.one:
        torch.manual_seed(wl.SEED)
        lora = args.one[1] == "1"
        figures = run(args.one[0], lora, args.steps, args.max_new_tokens, args.agents, args.precision)
        print(json.dumps(figures), flush=True)
        return
    # Each run in a fresh process: the peak RSS is then the run's own.
    command = [sys.executable, __file__, "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens)]
    command += ["--agents", str(args.agents), "--precision", args.precision]
    for lora in ("0",) * (not args.lora_only) + ("1",) * (not args.full_only):
        for backend in ("vllm", "hf"):
            done = subprocess.run([*command, "--one", backend, lora], capture_output=True, text=True, check=True)
            print(*[line for line in done.stdout.splitlines() if line.startswith("{")], sep="\n", flush=True)


if __name__ == "__main__":
    main()
