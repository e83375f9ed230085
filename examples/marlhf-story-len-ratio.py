"""Length-ratio training with MARLHF: a reward model learns the task from pairs, then RL on it.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second agent's text has 2-3 times more characters than the first's, and decays
exponentially outside that range. MARLHF first builds preference pairs as MADPO does (each
agent writes N candidates per prompt, candidate j of both agents is joint answer j, a higher
task reward wins), fits a joint reward model to them (the same transformer without its LM
head, a linear score head, the Bradley-Terry loss; the pairs of some prompts are held out to
measure it), then trains both agents with MAGRPO on the reward model's scores. Evaluation
always uses the task reward: one sampled answer per prompt, before and after. Runs offline
on the embedded SmolLM2-135M-Instruct in a few minutes on a laptop CPU. Each run writes to a new folder,
comlrl_output/<algorithm>-<time> (``--output-dir`` names one; see examples/_common.py), the
trained agents and reward model in models/ included (~1.6 GB; ``--no-save`` skips them; the
reward model as fitted, in reward_model/, ~0.54 GB, is written either way).

    python examples/marlhf-story-len-ratio.py               # W&B off
    python examples/marlhf-story-len-ratio.py --wandb --wandb-project my-project
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

from datasets import Dataset

from comlrl.metrics.plot import read_metrics
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

# The tutorial's prompts and reward, from its example (whose main() this does not run).
TUTORIAL = runpy.run_path(str(Path(__file__).with_name("story-len-ratio.py")))
PROMPTS: list[str] = TUTORIAL["PROMPTS"]
proper_length_ratio_reward = TUTORIAL["proper_length_ratio_reward"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents and the reward model", writes="reward_model/ (as fitted), ")
    parser.add_argument("--epochs", type=int, default=1, help="RL passes over the prompts (default: %(default)s)")
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
    config = MARLHFConfig(
        rl_algorithm="magrpo",
        num_train_epochs=args.epochs,
        agent_learning_rate=3e-5,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        reward_learning_rate=3e-5,
        reward_num_train_epochs=2,
        reward_train_batch_size=2,
        reward_eval_fraction=0.2,  # the pairs of 2 of the 10 prompts measure the reward model
        num_generations=4,
        per_device_train_batch_size=5,  # prompts per RL step, and whose candidates are sampled together
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=0,  # the trainer evaluates after the last step; the run's start is evaluated below
        eval_num_samples=None,
        eval_batch_size=len(PROMPTS),
        **run_config(args),
    )

    trainer = MARLHFTrainer(
        agent_model=model_name,  # two copies; the reward model loads it too (reward_model_name=None)
        train_dataset=prompts,
        eval_dataset=prompts,
        reward_func=proper_length_ratio_reward,
        args=config,
        wandb_config=wandb_config(args, "marlhf-story-len-ratio"),
    )
    before = trainer.evaluate()["eval/reward_mean"]
    result = trainer.train()
    saved = save_models(trainer, result, args)

    records = read_metrics(Path(result.output_dir) / "metrics.jsonl")
    fit = next(r for r in records if "reward_model/loss" in r)
    after = [r for r in records if "eval/reward_mean" in r][-1]["eval/reward_mean"]
    held_out = (
        f"{fit['reward_model/eval_accuracy']:.2f} on {fit['reward_model/eval_pairs']:.0f} pairs of held-out prompts"
        if "reward_model/eval_accuracy" in fit
        else "none held out"
    )
    print(
        f"\n{len(trainer.pairs)} preference pairs; reward model: Bradley-Terry loss {fit['reward_model/loss']:.3f}, "
        f"accuracy {fit['reward_model/accuracy']:.2f} on its {fit['reward_model/train_pairs']:.0f} training pairs, "
        f"{held_out}\n"
        f"length-ratio reward (0..1) of one sampled answer per prompt: before {before:.3f}, after {after:.3f}\n"
        f"{run_summary(result, started, saved)}"
    )


if __name__ == "__main__":
    main()
