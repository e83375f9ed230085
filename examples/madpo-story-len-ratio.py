"""Length-ratio training with MADPO: two agents learn from pairs of their own joint answers.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second agent's text has 2-3 times more characters than the first's, and decays
exponentially outside that range. MADPO first lets each agent write N candidates per prompt;
candidate j of both agents is joint answer j, scored by the reward. Every joint answer with a
strictly higher reward beats a lower one, the pairs with the largest reward gaps are kept,
and both agents are trained on them with the joint DPO loss (no reward model, no sampling
while training). The reward of one sampled answer per prompt is measured before and after.
Runs offline on the embedded SmolLM2-135M-Instruct in a few minutes on a laptop CPU. Each run writes to a new folder,
comlrl_output/<algorithm>-<time> (``--output-dir`` names one; see examples/_common.py), the
trained agents included (~1.1 GB; ``--no-save`` skips them).

    python examples/madpo-story-len-ratio.py               # W&B off
    python examples/madpo-story-len-ratio.py --wandb --wandb-project my-project
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
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

# The tutorial's prompts and reward, from its example (whose main() this does not run).
TUTORIAL = runpy.run_path(str(Path(__file__).with_name("story-len-ratio.py")))
PROMPTS: list[str] = TUTORIAL["PROMPTS"]
proper_length_ratio_reward = TUTORIAL["proper_length_ratio_reward"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents")
    parser.add_argument("--epochs", type=int, default=2, help="DPO passes over the pairs (default: %(default)s)")
    parser.add_argument(
        "--num-candidates", type=int, default=6, help="candidates per prompt and agent (default: %(default)s)"
    )
    parser.add_argument(
        "--pairs-per-prompt", type=int, default=2, help="preference pairs kept per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=48, help="most tokens per completion (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    prompts = Dataset.from_dict({"prompt": PROMPTS})
    config = MADPOConfig(
        num_train_epochs=args.epochs,
        agent_learning_rate=3e-5,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        dpo_reference="initial",  # DPO's reference: the policy that sampled the pairs
        per_device_train_batch_size=5,  # prompts whose candidates are sampled together
        train_batch_size=4,  # pairs per optimizer step
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=0,  # the trainer evaluates after the last step; the run's start is evaluated below
        eval_num_samples=None,
        eval_batch_size=len(PROMPTS),
        **run_config(args),
    )

    trainer = MADPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
        tokenizer=AutoTokenizer.from_pretrained(model_name),
        train_dataset=prompts,
        eval_dataset=prompts,
        reward_func=proper_length_ratio_reward,
        args=config,
        wandb_config=wandb_config(args, "madpo-story-len-ratio"),
    )
    before = trainer.evaluate()["eval/reward_mean"]
    result = trainer.train()
    saved = save_models(trainer, result, args)

    records = read_metrics(Path(result.output_dir) / "metrics.jsonl")
    after = [r for r in records if "eval/reward_mean" in r][-1]["eval/reward_mean"]
    last = [r for r in records if "dpo/loss" in r][-1]
    print(
        f"\n{len(trainer.pairs)} preference pairs; last step: DPO loss {last['dpo/loss']:.3f}, "
        f"accuracy {last['dpo/accuracy']:.2f}, joint margin {last['dpo/margin']:.2f}\n"
        f"length-ratio reward (0..1) of one sampled answer per prompt: before {before:.3f}, after {after:.3f}\n"
        f"{run_summary(result, started, saved)}"
    )


if __name__ == "__main__":
    main()
