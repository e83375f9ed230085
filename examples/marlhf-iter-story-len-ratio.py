"""Length-ratio training with MARLHFIter: MARLHF in rounds, each with a reward model fitted to
fresh pairs of the agents' current joint answers against a comparator's.

The task and reward are the tutorial's (examples/story-len-ratio.py): the joint reward is
1.0 when the second agent's text has 2-3 times more characters than the first's, and decays
exponentially outside that range. Each round, both agents write N candidates per prompt, and
so does the comparator (here the agents themselves, from a random stream of their own);
current answer j meets comparator answer j and the higher task reward wins (ties are
dropped). A fresh joint reward model (the same transformer without its LM head, a linear
score head, the Bradley-Terry loss) is fitted to the round's pairs, and both agents are
trained with MAGRPO on its scores; the next round samples again from the trained agents.
The task reward of sampled answers to prompts the training never sees is measured before
and after. Runs offline on the embedded SmolLM2-135M-Instruct in a few minutes on a laptop CPU.
Each run writes to a new folder, comlrl_output/<algorithm>-<time> (``--output-dir`` names one;
see examples/_common.py), the trained agents and last reward model in models/ included (~1.6 GB;
``--no-save`` skips them; the last reward model as fitted, in reward_model/, ~0.54 GB, is written
either way).

    python examples/marlhf-iter-story-len-ratio.py               # W&B off
    python examples/marlhf-iter-story-len-ratio.py --rounds 3 --comparator history
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
from comlrl.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

# The tutorial's prompts and reward, from its example (whose main() this does not run), and
# the held-out prompts of the MADPOIter example.
TUTORIAL = runpy.run_path(str(Path(__file__).with_name("story-len-ratio.py")))
PROMPTS: list[str] = TUTORIAL["PROMPTS"]
proper_length_ratio_reward = TUTORIAL["proper_length_ratio_reward"]
HELD_OUT_PROMPTS: list[str] = runpy.run_path(str(Path(__file__).with_name("madpo-iter-story-len-ratio.py")))[
    "HELD_OUT_PROMPTS"
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(
        parser,
        models="both agents and the reward model",
        writes="preference_replay/ (each round's pairs), reward_model/ (the last round's), ",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of new pairs (default: %(default)s)")
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
        "--pairs-per-prompt", type=int, default=2, help="preference pairs kept per prompt (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="most tokens per completion (default: %(default)s)"
    )
    parser.add_argument(
        "--samples-per-prompt", type=int, default=2, help="held-out answers per prompt (default: %(default)s)"
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    held_out = Dataset.from_dict({"prompt": [p for p in HELD_OUT_PROMPTS for _ in range(args.samples_per_prompt)]})
    config = MARLHFIterConfig(
        num_iterations=args.rounds,
        num_train_epochs=1,  # RL passes over the prompts per round
        rl_algorithm="magrpo",
        agent_learning_rate=3e-5,
        preference_num_candidates=args.num_candidates,
        preference_pairs_per_sample=args.pairs_per_prompt,
        comparator_policy=args.comparator,
        reward_learning_rate=3e-5,
        reward_num_train_epochs=2,
        reward_train_batch_size=2,
        reward_eval_fraction=0.2,  # the pairs of 2 of the 10 prompts measure each round's reward model
        num_generations=4,
        per_device_train_batch_size=5,  # prompts per RL step, and whose candidates are sampled together
        max_new_tokens=args.max_new_tokens,
        logging_steps=1,
        eval_interval=0,  # the trainer evaluates after the last step; the run's start is evaluated below
        eval_num_samples=None,
        eval_batch_size=len(held_out),
        **run_config(args),
    )

    trainer = MARLHFIterTrainer(
        agent_model=model_name,  # two copies; the reward model loads it too (reward_model_name=None)
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        eval_dataset=held_out,
        reward_func=proper_length_ratio_reward,
        args=config,
        wandb_config=wandb_config(args, "marlhf-iter-story-len-ratio"),
    )
    before = trainer.evaluate()["eval/reward_mean"]
    result = trainer.train()
    saved = save_models(trainer, result, args)

    records = read_metrics(Path(result.output_dir) / "metrics.jsonl")
    after = [r for r in records if "eval/reward_mean" in r][-1]["eval/reward_mean"]
    print()
    for r in (r for r in records if "iter/current_iteration" in r):
        held = f", held-out pairs {r['reward_model/eval_accuracy']:.2f}" if "reward_model/eval_accuracy" in r else ""
        print(
            f"round {r['iter/current_iteration']:.0f}: {r['iter/current_preference_pairs']:.0f} pairs, current answers "
            f"won {r['iter/current_win_rate']:.0%} of the untied comparisons; reward model accuracy on its "
            f"{r['reward_model/train_pairs']:.0f} training pairs {r['reward_model/accuracy']:.2f}{held}"
        )
    print(
        f"held-out length-ratio reward (0..1), {len(held_out)} sampled answers: "
        f"before {before:.3f}, after {after:.3f}\n{run_summary(result, started, saved)}"
    )


if __name__ == "__main__":
    main()
