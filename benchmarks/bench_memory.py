"""Memory of N agents: full models, LoRA adapters on separate models, or LoRA adapters on ONE
shared base model. Each layout runs one training step in its own process.

    python benchmarks/bench_memory.py                    # 2 agents, the embedded model
    python benchmarks/bench_memory.py --agents 4 --json out.json

Printed per layout: the bytes of distinct parameters held (base weights counted once when
shared), the trainable parameters, and the peak resident memory of the process after one
step (G=4, 32 tokens), which includes torch itself, activations and optimizer state.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import measure

LAYOUTS = ("full", "lora", "lora-shared")


def one_layout(layout: str, num_agents: int, model: str) -> dict[str, float]:
    """Build the layout, take one training step, and measure (run in a fresh process)."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(0)
    if layout == "lora-shared":
        agents = [AutoModelForCausalLM.from_pretrained(model)] * num_agents
    else:
        agents = [AutoModelForCausalLM.from_pretrained(model) for _ in range(num_agents)]
    lora = LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
    )
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=AutoTokenizer.from_pretrained(model),
        train_dataset=[{"prompt": "Describe a city in the clouds:"}],
        reward_func=lambda *texts: [float(len(t)) for t in texts[0]],
        peft_config=None if layout == "full" else lora,
        args=MAGRPOConfig(
            num_generations=4,
            max_new_tokens=32,
            generation_kwargs={"min_new_tokens": 32},
            output_dir=os.path.join("benchmarks", "results", "memory"),
        ),
    )
    trainer.training_step([0])
    distinct = {p.data_ptr(): p for agent in trainer.agents for p in agent.parameters()}
    return {
        "param_mib": sum(p.numel() * p.element_size() for p in distinct.values()) / 2**20,
        "trainable_params": sum(p.numel() for params in trainer.agents.parameters for p in params),
        "peak_rss_mib": measure.peak_rss_mib(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--agents", type=int, default=2, help="number of agents (default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # the child process's job
    args = parser.parse_args(argv)
    if args.model is None:
        from comlrl.models import default_model_path

        args.model = str(default_model_path())
    if args.layout:
        print(json.dumps(one_layout(args.layout, args.agents, args.model)))
        return
    results = {}
    for layout in LAYOUTS:
        command = [sys.executable, __file__, "--layout", layout, "--agents", str(args.agents), "--model", args.model]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[layout] = json.loads(out.strip().splitlines()[-1])
        r = results[layout]
        print(
            f"{layout:>12}: {args.agents} agents | parameters held {r['param_mib']:7.0f} MiB | "
            f"trainable {r['trainable_params'] / 1e6:7.2f} M | peak RSS {r['peak_rss_mib']:6.0f} MiB",
            flush=True,
        )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=2)


if __name__ == "__main__":
    main()
