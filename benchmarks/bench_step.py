"""Time MAGRPO training steps on the story-len-ratio workload, against a per-sample baseline
run in the same invocation.

    python benchmarks/bench_step.py                      # embedded model, 2 steps + baseline
    python benchmarks/bench_step.py --steps 3 --no-baseline
    python benchmarks/bench_step.py --json benchmarks/results/step.json

What is measured, per agent and step (2 agents, one dataset row per step, G completions):
  - comlrl: one batched ``generate`` per agent (G samples together, inference mode), one
    batched masked forward + backward per agent, one optimizer step.
  - baseline: a naive per-sample loop: one ``generate`` call per sample and one forward +
    backward per sequence. Same prompts, rewards, advantages and optimizer. (The original
    library 1.4.3 generates the G samples of a prompt in one call and updates per sequence;
    benchmarks/compare_original.py runs that library itself.)
Completions are forced to exactly ``--max-new-tokens`` tokens (``min_new_tokens``) so both
sides generate the same number of tokens. Printed: generation seconds, update seconds,
generated tokens per second, peak resident memory, and the baseline/comlrl time ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from functools import partial

import measure
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.algorithms import group_advantages
from comlrl.models.forward import completion_logprobs
from comlrl.rollout.generation import eos_token_ids
from comlrl.rollout.sampling import SamplingSpec
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

_EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "story-len-ratio.py")
_spec = importlib.util.spec_from_file_location("story_len_ratio", _EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def build_trainer(
    model_name: str,
    args: argparse.Namespace,
    trainer_class: type[MAGRPOTrainer] = MAGRPOTrainer,
    external_transition=None,
    **config_overrides,
) -> MAGRPOTrainer:
    """The benchmark workload's trainer; ``config_overrides`` change ``MAGRPOConfig`` fields."""
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]
    values = dict(
        num_train_epochs=1,
        per_device_train_batch_size=1,
        agent_learning_rate=5e-5,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        generation_kwargs={"min_new_tokens": args.max_new_tokens},
        seed=0,
        output_dir=os.path.join("benchmarks", "results", "run"),
    )
    config = MAGRPOConfig(**{**values, **config_overrides})
    return trainer_class(
        agents=agents,
        tokenizer=tokenizer,
        train_dataset=[{"prompt": p} for p in example.PROMPTS],
        reward_func=partial(example.proper_length_ratio_reward, target_min=2, target_max=3),
        reward_processor=RewardProcessors.scale(100.0),
        external_transition=external_transition,
        args=config,
    )


def comlrl_step(trainer: MAGRPOTrainer, row: int) -> tuple[float, float, int]:
    """One training step: its generation seconds, update seconds and generated tokens (every
    agent and turn: the logged rate times the time it was measured over)."""
    metrics = trainer.training_step([row])
    tokens = round(metrics["time/generated_tokens_per_s"] * metrics["time/generate_s"])
    return metrics["time/generate_s"], metrics["time/update_s"], tokens


def baseline_step(trainer: MAGRPOTrainer, row: int) -> tuple[float, float, int]:
    """One generate per sample, one forward/backward per sequence."""
    args, group = trainer.args, trainer.args.num_generations
    started = time.perf_counter()
    samples = []  # per agent: list of (prompt_ids, completion_ids, text)
    for agent, tok in zip(trainer.agents, trainer.agents.tokenizers):
        prompt = tok(trainer.train_prompts.agent_prompts(0, [row]), return_tensors="pt")
        agent.eval()
        per_agent = []
        for _ in range(group):
            with torch.inference_mode():
                out = agent.generate(
                    **prompt,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=eos_token_ids(agent, tok),
                    **SamplingSpec.from_config(args).generate_kwargs(),
                )
            completion = out[0, prompt["input_ids"].shape[1] :].clone()
            per_agent.append(
                (prompt["input_ids"].clone(), completion, tok.decode(completion, skip_special_tokens=True))
            )
        samples.append(per_agent)
    generated = time.perf_counter()
    scored = trainer.reward([example.PROMPTS[row]] * group, [[s[2] for s in a] for a in samples], [row] * group)
    rewards = scored.processed[:, 0]  # the length-ratio reward is shared by both agents
    advantages = group_advantages(rewards.unsqueeze(0), args.advantage_mode, args.advantage_normalization)[0]
    for agent, optimizer, per_agent in zip(trainer.agents, trainer.learners.optimizers, samples):
        agent.train()
        optimizer.zero_grad()
        for (prompt_ids, completion, _), advantage in zip(per_agent, advantages):
            logps = completion_logprobs(
                agent,
                prompt_ids,
                torch.ones_like(prompt_ids),
                completion.unsqueeze(0),
                torch.ones_like(completion.unsqueeze(0), dtype=torch.bool),
                args.temperature,
            )
            (-advantage * logps.mean() / group).backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
    tokens = sum(len(s[1]) for a in samples for s in a)
    return generated - started, time.perf_counter() - generated, tokens


def run(name: str, step_fn, trainer: MAGRPOTrainer, steps: int) -> dict[str, float]:
    generate_s = update_s = 0.0
    tokens = 0
    for row in range(steps):
        g, u, t = step_fn(trainer, row)
        generate_s, update_s, tokens = generate_s + g, update_s + u, tokens + t
    result = {
        "generate_s": generate_s,
        "update_s": update_s,
        "step_s": (generate_s + update_s) / steps,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / generate_s,
        "peak_rss_mib": measure.peak_rss_mib(),
    }
    print(
        f"{name:>8}: generate {generate_s:7.1f} s | update {update_s:7.1f} s | {result['step_s']:6.1f} s/step | "
        f"{result['tokens_per_s']:6.1f} generated tok/s | peak RSS {result['peak_rss_mib']:.0f} MiB",
        flush=True,
    )
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per side (default: %(default)s)")
    parser.add_argument("--num-generations", type=int, default=8, help="G (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the per-sample baseline")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_name = args.model
    if model_name is None:
        from comlrl.models import default_model_path

        model_name = default_model_path()
    print(
        f"model {model_name}; 2 agents, G={args.num_generations}, {args.max_new_tokens} tokens per completion, "
        f"{args.steps} steps per side, torch {torch.__version__}, {torch.get_num_threads()} threads",
        flush=True,
    )
    trainer = build_trainer(model_name, args)
    comlrl_step(trainer, 0)  # warm-up: first calls pay one-off allocation and dispatch costs
    results = {"comlrl": run("comlrl", comlrl_step, trainer, args.steps)}
    if not args.no_baseline:
        results["baseline"] = run("baseline", baseline_step, trainer, args.steps)
        for phase in ("generate_s", "update_s", "step_s"):
            results[f"speedup_{phase}"] = results["baseline"][phase] / results["comlrl"][phase]
        print(
            f"baseline / comlrl time: generate x{results['speedup_generate_s']:.2f}, "
            f"update x{results['speedup_update_s']:.2f}, whole step x{results['speedup_step_s']:.2f}"
        )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
