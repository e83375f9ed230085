"""Time two-turn MAGRPO steps: one ``generate`` per agent per tree level (comlrl) against one
``generate`` per node (how the original library expands its tree), in the same invocation.

    python benchmarks/bench_multiturn.py                 # embedded model, 2 steps per side
    python benchmarks/bench_multiturn.py --joint-mode cross --num-generations 2 --json out.json

Workload: two agents (the embedded SmolLM2-135M-Instruct, fp32), the tutorial's prompts and
length-ratio reward x100 at both turns, one dataset row per step, G completions per node
forced to exactly ``--max-new-tokens`` tokens; turn 2 shows each agent the other's turn-1
text. Both sides build the same tree with the same trainer and update it the same way;
only the generation calls differ. Printed per side: generate calls per step, generation and
update seconds, generated tokens per second, and the per-node / per-level time ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from unittest import mock

import torch

from comlrl.rollout import AgentRollout, backends
from comlrl.trainers.reinforce import MAGRPOTrainer

sys.path.insert(0, os.path.dirname(__file__))
import bench_step  # noqa: E402


def show_partner(prompt, agent_completions, num_agents):
    """Each agent sees the other's turn-1 text and is asked to revise its own."""
    return [
        f"{prompt}\nYour partner wrote: {agent_completions[1 - i]}\nRevise your text so the two fit together:"
        for i in range(num_agents)
    ]


def merge(rollouts: list[AgentRollout], pad_id: int) -> AgentRollout:
    """Stack per-node rollouts into one, left-padding prompts and right-padding completions."""
    prompt_width = max(r.prompt_ids.shape[1] for r in rollouts)
    completion_width = max(r.completion_ids.shape[1] for r in rollouts)

    def pad(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        padding = (width - tensor.shape[1], 0) if left else (0, width - tensor.shape[1])
        return torch.nn.functional.pad(tensor, padding, value=value)

    return AgentRollout(
        prompt_ids=torch.cat([pad(r.prompt_ids, prompt_width, pad_id, True) for r in rollouts]),
        prompt_mask=torch.cat([pad(r.prompt_mask, prompt_width, 0, True) for r in rollouts]),
        completion_ids=torch.cat([pad(r.completion_ids, completion_width, pad_id, False) for r in rollouts]),
        completion_mask=torch.cat([pad(r.completion_mask, completion_width, False, False) for r in rollouts]),
        texts=[text for r in rollouts for text in r.texts],
        truncated=torch.cat([r.truncated for r in rollouts]),
    )


def generate_per_node(backend) -> None:
    """Make ``backend`` (a trainer's generation backend) generate every node of a tree level in
    a call of its own, as the original library expands its tree, and merge the calls' rollouts
    into the one the trainer expects."""
    whole_level = backend.generate

    def generate(agent, prompts, num_generations, sampling, generator=None):
        per_node = [whole_level(agent, [prompt], num_generations, sampling, generator) for prompt in prompts]
        return merge(per_node, backend.tokenizers[agent].pad_token_id)

    backend.generate = generate


def run(name: str, trainer: MAGRPOTrainer, steps: int) -> dict[str, float]:
    """``bench_step.run`` of the library's step, counting the batched sampling calls (one
    ``generate_group`` each: a decoding loop over a batch of prompts)."""
    with mock.patch.object(backends, "generate_group", wraps=backends.generate_group) as counter:
        result = bench_step.run(name, bench_step.comlrl_step, trainer, steps)
    result["generate_calls_per_step"] = counter.call_count / steps
    print(f"{name:>8}: {result['generate_calls_per_step']:.0f} generate calls/step", flush=True)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per side (default: %(default)s)")
    parser.add_argument("--num-generations", type=int, default=4, help="G (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--joint-mode", default="aligned", choices=["aligned", "cross"])
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
        f"model {model_name}; 2 agents, 2 turns, {args.joint_mode}, G={args.num_generations}, "
        f"{args.max_new_tokens} tokens per completion, {args.steps} steps per side, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    multi_turn = dict(num_turns=2, joint_mode=args.joint_mode, external_transition=show_partner)
    results = {}
    for name, one_call_per_node in (("per level", False), ("per node", True)):
        trainer = bench_step.build_trainer(model_name, args, **multi_turn)
        if one_call_per_node:
            generate_per_node(trainer.backend)
        trainer.training_step([len(trainer.train_prompts) - 1])  # warm-up
        results[name] = run(name, trainer, args.steps)
    for phase in ("generate_s", "step_s"):
        results[f"speedup_{phase}"] = results["per node"][phase] / results["per level"][phase]
    print(
        f"per node / per level time: generate x{results['speedup_generate_s']:.2f}, "
        f"whole step x{results['speedup_step_s']:.2f}"
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
