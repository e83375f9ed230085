"""Length-ratio training with MADPOIter: MADPO in rounds, each on fresh pairs of the agents'
current joint answers against a comparator's.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second agent's text has 2-3 times more characters than the first's, and decays
exponentially outside that range. Each round, both agents write N candidates per prompt,
and so does the comparator (here the agents themselves, sampled from a random stream of
their own); current answer j meets comparator answer j, the better one is preferred (ties
are dropped), and both agents are trained on those pairs with the joint DPO loss. The next
round samples again from the trained agents. The reward of sampled answers to prompts the
training never sees is measured before and after. Runs offline on the embedded
SmolLM2-135M-Instruct in a few minutes on a laptop CPU. Each run writes to a new folder,
comlrl_output/<algorithm>-<time> (``--output-dir`` names one; see examples/_common.py), the
trained agents included (~1.1 GB; ``--no-save`` skips them).

    python examples/madpo-iter-story-len-ratio.py               # W&B off
    python examples/madpo-iter-story-len-ratio.py --rounds 4 --comparator history
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.metrics.plot import read_metrics
from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

# The tutorial's prompts and reward, from its example (whose main() this does not run).
TUTORIAL = runpy.run_path(str(Path(__file__).with_name("story-len-ratio.py")))
PROMPTS: list[str] = TUTORIAL["PROMPTS"]
proper_length_ratio_reward = TUTORIAL["proper_length_ratio_reward"]

HELD_OUT_PROMPTS = [
    "Describe a forest that grows underwater:",
    "Write a lullaby for a robot:",
    "Tell a joke about penguins:",
    "Invent a new kind of vegetable:",
    "Design a library on the Moon:",
]
"""Prompts the training never sees, to measure what the agents learnt."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents", writes="preference_replay/ (each round's pairs), ")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of new pairs (default: %(default)s)")
    parser.add_argument(
        "--comparator",
        default="current",
        choices=["current", "current_copy", "history"],
        help="what the agents' answers are compared with (default: %(default)s)",
    )
    parser.add_argument(
        "--num-candidates", type=int, default=4, help="candidates per prompt, agent and side (default: %(default)s)"
    )
    parser.add_argument(
        "--pairs-per-prompt", type=int, default=1, help="preference pairs kept per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="most tokens per completion (default: %(default)s)"
    )
    parser.add_argument(
        "--samples-per-prompt", type=int, default=4, help="held-out answers per prompt (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    held_out = Dataset.from_dict({"prompt": [p for p in HELD_OUT_PROMPTS for _ in range(args.samples_per_prompt)]})
    config = MADPOIterConfig(
        num_iterations=args.rounds,
        num_train_epochs=1,  # one DPO pass over each round's pairs (1.4.3's MADPOIter default)
        agent_learning_rate=3e-5,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        comparator_policy=args.comparator,
        dpo_reference="initial",  # DPO's reference: the policy at the start of the pair's round
        per_device_train_batch_size=5,  # prompts whose candidates are sampled together
        train_batch_size=4,  # pairs per optimizer step
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=0,  # the trainer evaluates after the last step; the run's start is evaluated below
        eval_num_samples=None,
        eval_batch_size=len(held_out),
        **run_config(args),
    )

    trainer = MADPOIterTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
        tokenizer=AutoTokenizer.from_pretrained(model_name),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        eval_dataset=held_out,
        reward_func=proper_length_ratio_reward,
        args=config,
        wandb_config=wandb_config(args, "madpo-iter-story-len-ratio"),
    )
    before = trainer.evaluate()["eval/reward_mean"]
    result = trainer.train()
    saved = save_models(trainer, result, args)

    records = read_metrics(Path(result.output_dir) / "metrics.jsonl")
    after = [r for r in records if "eval/reward_mean" in r][-1]["eval/reward_mean"]
    print()
    for r in (r for r in records if "iter/current_iteration" in r):
        print(
            f"round {r['iter/current_iteration']:.0f}: {r['iter/current_preference_pairs']:.0f} pairs, "
            f"current answers won {r['iter/current_win_rate']:.0%} of the untied comparisons, mean reward "
            f"{r['iter/current_reward_mean']:.3f} (comparator {r['iter/comparator_reward_mean']:.3f})"
        )
    print(
        f"held-out length-ratio reward (0..1), {len(held_out)} sampled answers: "
        f"before {before:.3f}, after {after:.3f}\n{run_summary(result, started, saved)}"
    )


if __name__ == "__main__":
    main()
