"""Length-ratio training, centralized: ONE model writes both agents' texts in one response.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second text has 2-3 times more characters than the first, and decays
exponentially outside that range. Here a single model answers one prompt that asks for both
texts; the trainer splits its response into the two texts before the reward sees them, so the
reward function is the two-agent one, unchanged. Runs offline on the embedded
SmolLM2-135M-Instruct: 10 steps of about 20 s each on two idle CPU cores. Each run writes to a
new folder, comlrl_output/<algorithm>-<time> (``--output-dir`` names one; see
examples/_common.py), the trained model included (~0.54 GB; ``--no-save`` skips it).

The library's default adapter asks for ``<agent_i>`` tags, which instruction-tuned models of
a few billion parameters follow; the 135M model copies the tag template instead. So this
example brings its own adapter, a numbered list ("1. ...", "2. ..."), which that model
writes readily: a response without one scores as two empty texts (reward 0).

    python examples/centralized-story-len-ratio.py               # W&B off
    python examples/centralized-story-len-ratio.py --wandb --wandb-project my-project
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers import CentralizedComparatorParseError
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

# The tutorial's prompts and reward, from its example (whose main() this does not run).
TUTORIAL = runpy.run_path(str(Path(__file__).with_name("story-len-ratio.py")))
PROMPTS: list[str] = TUTORIAL["PROMPTS"]
proper_length_ratio_reward = TUTORIAL["proper_length_ratio_reward"]

_ITEM = re.compile(r"^\s*(\d+)[.)]\s*", flags=re.MULTILINE)


@dataclass(frozen=True)
class NumberedListAdapter:
    """Asks for the two texts as a numbered list and splits the response at ``1.`` / ``2.``
    at line starts. The prompt ends with ``1.``, so the model starts the first text at once;
    parsing puts that ``1.`` back."""

    def build_prompt(self, row: dict[str, Any], agent_prompts: list[str]) -> str:
        return (
            f"{agent_prompts[0]}\nWrite two answers as a numbered list: 1. a short one, "
            "2. one two to three times longer.\n\n1."
        )

    def parse_completion(self, completion: str, row: dict[str, Any], num_agents: int) -> list[str]:
        pieces = _ITEM.split("1. " + completion)  # ["", "1", text, "2", text, ...]
        items: dict[int, str] = {}
        for number, text in zip(pieces[1::2], pieces[2::2]):
            items.setdefault(int(number), text.strip())  # the first item of each number
        texts = [items.get(i + 1, "") for i in range(num_agents)]
        if not any(texts):
            raise CentralizedComparatorParseError(f"no numbered answer in {completion[:80]!r}")
        return texts


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="the one model")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the 10 prompts (default: %(default)s)")
    parser.add_argument(
        "--num-generations", type=int, default=4, help="joint responses per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=48, help="most tokens per joint response (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    config = CentralizedMAGRPOConfig(
        num_agents=2,  # the roles the one model writes
        num_train_epochs=args.epochs,
        agent_learning_rate=5e-5,
        logging_steps=5,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        **run_config(args),
    )

    trainer = CentralizedMAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name)],
        tokenizer=AutoTokenizer.from_pretrained(model_name),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        reward_func=partial(proper_length_ratio_reward, target_min=2, target_max=3),
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        wandb_config=wandb_config(args, "centralized-story-len-ratio"),
        centralized_comparator_adapter=NumberedListAdapter(),
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
