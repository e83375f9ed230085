"""Length-ratio training, centralized: ONE model writes both agents' texts in one response.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second text has 2-3 times more characters than the first, and decays
exponentially outside that range. Here a single model answers one prompt that asks for both
texts; the trainer splits its response into the two texts before the reward sees them, so the
reward function is the two-agent one, unchanged. Runs offline on the embedded
SmolLM2-135M-Instruct: 10 steps of about 20 s each on two idle CPU cores.

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
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.metrics.plot import plot_run
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from comlrl.trainers.reinforce.centralized import CentralizedComparatorParseError
from comlrl.utils.reward_processor import RewardProcessors

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
    parser.add_argument(
        "--model", default=None, help="model folder or hub id (default: the embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--output-dir",
        default="./centralized_story_len_ratio_output",
        help="metrics log here, the trained model in OUTPUT_DIR/models (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=2, help="passes over the 10 prompts (default: %(default)s)")
    parser.add_argument(
        "--num-generations", type=int, default=4, help="joint responses per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=48, help="most tokens per joint response (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=42, help="random seed (default: %(default)s)")
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases (off by default)")
    parser.add_argument("--wandb-project", default="comlrl", help="W&B project (with --wandb; default: %(default)s)")
    parser.add_argument("--wandb-entity", default=None, help="W&B entity (with --wandb; default: your default entity)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    model_name = args.model
    if model_name is None:
        from comlrl.models import default_model_path

        model_name = default_model_path()

    config = CentralizedMAGRPOConfig(
        num_agents=2,  # the roles the one model writes
        num_train_epochs=args.epochs,
        agent_learning_rate=5e-5,
        logging_steps=5,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        output_dir=args.output_dir,
        overwrite_output_dir=True,  # running the example again replaces its previous run
    )
    wandb_config = None
    if args.wandb:
        name = "centralized-story-len-ratio"
        wandb_config = {"project": args.wandb_project, "entity": args.wandb_entity, "name": name}

    trainer = CentralizedMAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name)],
        tokenizer=AutoTokenizer.from_pretrained(model_name),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        reward_func=partial(proper_length_ratio_reward, target_min=2, target_max=3),
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        wandb_config=wandb_config,
        centralized_adapter=NumberedListAdapter(),
    )
    started = time.perf_counter()
    result = trainer.train()
    models_dir = os.path.join(args.output_dir, "models")
    trainer.save_model(models_dir)
    if not trainer.parallel.is_main:  # under torchrun, rank 0 reports
        return

    try:
        curves = f"curves in {plot_run(args.output_dir).resolve()}"
    except ImportError as error:  # matplotlib is an optional extra
        curves = f"no curves: {error}"
    first, last = result.epoch_raw_reward_means[0], result.epoch_raw_reward_means[-1]
    print(
        f"\nmean length-ratio reward (0..1, before the x100 scale): first epoch {first:.3f}, "
        f"last epoch {last:.3f}\n"
        f"{result.global_step} steps in {time.perf_counter() - started:.0f} s; "
        f"model saved in {os.path.abspath(models_dir)}/agent_0; "
        f"metrics in {os.path.abspath(os.path.join(args.output_dir, 'metrics.jsonl'))}; {curves}"
    )


if __name__ == "__main__":
    main()
