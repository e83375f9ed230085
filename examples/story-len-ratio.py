"""Length-ratio training: two agents, one shared reward.

Both agents receive the same creative prompt and write independently (the second agent
does not see the first one's text). The joint reward is 1.0 when the second completion has
2-3 times more characters than the first, and decays exponentially outside that range.
This is the tutorial's example; it runs offline on the embedded SmolLM2-135M-Instruct. Each
run writes to a new folder, comlrl_output/magrpo-<time> (``--output-dir`` names one; see
examples/_common.py), the trained agents included (~1.1 GB; ``--no-save`` skips them).

    python examples/story-len-ratio.py               # W&B off
    python examples/story-len-ratio.py --wandb --wandb-project my-project
    python examples/story-len-ratio.py --no-save --threads 1
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from functools import partial

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Explain how teleportation might work:",
    "Tell a joke about dinosaurs:",
    "Describe a world without electricity:",
    "Create a superhero with a unique power:",
    "Write a scene where the moon talks:",
    "Invent a new type of fruit:",
    "Design a playground on Mars:",
]


def proper_length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
    """1.0 when len(second) / len(first) lies in [target_min, target_max], exp(-distance) outside."""
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        len1, len2 = len(c1), len(c2)
        if len1 == 0:
            rewards.append(0.0)
            continue
        ratio = len2 / len1
        if target_min <= ratio <= target_max:
            reward = 1.0
        else:
            distance = target_min - ratio if ratio < target_min else ratio - target_max
            reward = math.exp(-distance)
        rewards.append(float(reward))
    return rewards


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the 10 prompts (default: %(default)s)")
    parser.add_argument(
        "--num-generations", type=int, default=8, help="completions per prompt and agent (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="most tokens per completion (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    train_dataset = Dataset.from_dict({"prompt": PROMPTS})
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]

    config = MAGRPOConfig(
        num_train_epochs=args.epochs,
        agent_learning_rate=5e-5,
        logging_steps=10,
        num_generations=args.num_generations,
        num_turns=1,
        max_new_tokens=args.max_new_tokens,
        micro_batch_size=8,  # 7.8 GiB peak instead of 9.6 (the default 32), as fast at 128 tokens
        **run_config(args),
    )
    trainer = MAGRPOTrainer(
        agents=agents,
        reward_func=partial(proper_length_ratio_reward, target_min=2, target_max=3),
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        train_dataset=train_dataset,
        tokenizer=tokenizer,
        wandb_config=wandb_config(args, "story-len-ratio"),
    )
    result = trainer.train()
    saved = save_models(trainer, result, args)
    if not trainer.parallel.is_main:  # under torchrun, rank 0 reports
        return

    first, last = result.epoch_raw_reward_means[0], result.epoch_raw_reward_means[-1]
    print(
        f"\nmean length-ratio reward (0..1, before the x100 scale): first epoch {first:.3f}, "
        f"last epoch {last:.3f}\n{run_summary(result, started, saved)}"
    )


if __name__ == "__main__":
    main()
