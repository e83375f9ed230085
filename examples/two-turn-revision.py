"""Two-turn collaboration: two agents draft, read each other's draft, and revise.

Turn 1: on the same story topic, agent 0 writes a one-line title and agent 1 a short
paragraph, independently (each agent's role is its system message in the model's chat
template). Turn 2 (``external_transition``): each agent is shown its own
draft and its partner's, and rewrites its own so that the two fit together. The joint
reward (``revision_reward``, in [0, 1] at every turn) needs both turns: at turn 1 the
tutorial's length-ratio score (the paragraph 2-3 times longer than the title); at turn 2
half that score of the revisions, half how many of the partner's turn-1 content words each
revision reuses (reading the partner's work pays). MAGRPO credits turn 1 with its reward
plus ``discount`` times the mean reward of the revisions it led to; with ``--trainer iac``
each agent instead learns a value head on its own model and is trained with GAE and PPO
(independent actor-critic), ``discount`` being GAE's gamma. Held-out topics are
evaluated before and after training (``eval/turn_1/...``, ``eval/turn_2/...``). Runs offline
on the embedded SmolLM2-135M-Instruct in a few minutes on a 2-core CPU. Each run writes to a new
folder, comlrl_output/<algorithm>-<time> (``--output-dir`` names one; see examples/_common.py),
the trained agents included (~1.1 GB; ``--no-save`` skips them).

    python examples/two-turn-revision.py               # W&B off
    python examples/two-turn-revision.py --wandb --wandb-project my-project
    python examples/two-turn-revision.py --trainer iac
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from functools import partial
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path (tests, runpy)
from _common import add_common_flags, model_source, parse, run_config, run_summary, save_models, wandb_config  # noqa: E402

TRAINERS = {"magrpo": (MAGRPOTrainer, MAGRPOConfig), "iac": (IACTrainer, IACConfig)}

TRAIN_TOPICS = [
    "a city in the clouds",
    "a new holiday nobody has heard of",
    "a bedtime story for a dragon",
    "a robot who learns to paint",
]
EVAL_TOPICS = [  # held out: never trained on
    "a world without electricity",
    "a playground on Mars",
    "the day the moon stopped talking",
    "a fruit nobody has tasted",
]

# Words too common to show that an agent read its partner's text.
STOPWORDS = frozenset(
    "about after also been before being could does each even from have here into just like made make many more "
    "most much must only other over said same should some such than that their them then there these they this "
    "those through very were what when where which while will with would your".split()
)


# ------------------------------------------------------------------------------ prompts
ROLES = [
    "You write the title of a story: one line of a few words, nothing else.",
    "You write one short paragraph of a story: two or three sentences, nothing else.",
]
"""Each agent's system message, at both turns."""


def agent_prompt(row: dict, tokenizer, role: str) -> str:
    """An agent's formatter: its ``role`` as the system message and the row's ``prompt`` (the
    topic at turn 1, what ``revision_transition`` wrote at turn 2) as the user message, in the
    tokenizer's chat template; ``"{role}\n\n{prompt}\n"`` for a tokenizer without one."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": role}, {"role": "user", "content": row["prompt"]}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{role}\n\n{row['prompt']}\n"


def revision_transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """Turn 2's user messages (the original library's ``external_transition`` signature).

    Each agent gets the topic (``prompt``, the row's), its own turn-1 draft and its
    partner's, and is asked to rewrite its own so the two fit; its formatter then wraps the
    message with its role. The histories are not needed here: ``agent_completions`` is the
    joint action just taken.
    """
    if num_agents != 2:
        raise ValueError(f"this transition is written for 2 agents (title, paragraph), got {num_agents}")
    title, paragraph = (text.strip() for text in agent_completions)
    return [
        f"{prompt}\nYour title: {title}\nYour partner's paragraph: {paragraph}\n"
        "Rewrite your title so that it fits the paragraph.",
        f"{prompt}\nYour paragraph: {paragraph}\nYour partner's title: {title}\n"
        "Rewrite your paragraph so that it fits the title.",
    ]


# ------------------------------------------------------------------------------ reward
def length_ratio_score(first: str, second: str, target_min: float = 2.0, target_max: float = 3.0) -> float:
    """The tutorial's score: 1.0 when len(second) / len(first) (characters) lies in
    [target_min, target_max], exp(-distance to the range) outside, 0.0 for an empty ``first``."""
    if not first:
        return 0.0
    ratio = len(second) / len(first)
    if target_min <= ratio <= target_max:
        return 1.0
    return math.exp(-(target_min - ratio if ratio < target_min else ratio - target_max))


def content_words(text: str) -> set[str]:
    """The distinct lower-case words of ``text`` with 4 letters or more that are not in ``STOPWORDS``."""
    return {word for word in re.findall(r"[a-z]+", text.lower()) if len(word) >= 4 and word not in STOPWORDS}


def reuse_fraction(revision: str, partner_text: str) -> float:
    """Fraction of ``partner_text``'s content words that ``revision`` contains (0.0 when it has none)."""
    wanted = content_words(partner_text)
    if not wanted:
        return 0.0
    return len(wanted & set(re.findall(r"[a-z]+", revision.lower()))) / len(wanted)


def revision_reward(completions1, completions2, turn=1, response_history_per_agent=None):
    """The joint reward of (title, paragraph) pairs, in [0, 1], shared by both agents.

    - turn 1: ``length_ratio_score(title, paragraph)``.
    - turn 2 (and later): ``0.5 * length_ratio_score(title, paragraph)`` of the revisions
      ``+ 0.5 * (reuse_fraction(title, partner's paragraph) + reuse_fraction(paragraph,
      partner's title)) / 2``, the partner's texts being those of the previous turn, read
      from ``response_history_per_agent`` (which the trainer passes because this function
      names it; ``[joint action][agent]`` lists every turn's text, this one's last).

    Copying the partner's draft maximises the reuse half; the length half pulls against
    that (a copied paragraph is no title), so the best revisions borrow words, not texts.
    """
    rewards = []
    for k, (title, paragraph) in enumerate(zip(completions1, completions2)):
        score = length_ratio_score(title, paragraph)
        if turn == 1:
            rewards.append(score)
            continue
        if response_history_per_agent is None:
            raise ValueError("revision_reward needs response_history_per_agent after turn 1")
        titles, paragraphs = response_history_per_agent[k]
        reuse = (reuse_fraction(title, paragraphs[-2]) + reuse_fraction(paragraph, titles[-2])) / 2
        rewards.append(0.5 * score + 0.5 * reuse)
    return rewards


# ------------------------------------------------------------------------------ evaluation samples
class LastEpisodes:
    """``eval_logger`` hook: keeps the texts of the latest evaluation (for the summary) and
    logs each agent's mean length per turn as ``eval/agent{i}/turn_{t}/chars``."""

    def __init__(self):
        self.prompts: list[str] = []
        self.texts: list[list[list[str]]] = []  # [agent][row][turn]

    def __call__(self, agent_completions_turns, prompts):
        self.prompts, self.texts = list(prompts), agent_completions_turns
        metrics = {}
        for i, rows in enumerate(agent_completions_turns):
            for t in range(max(len(turns) for turns in rows)):
                lengths = [len(turns[t]) for turns in rows if len(turns) > t]
                metrics[f"agent{i}/turn_{t + 1}/chars"] = sum(lengths) / len(lengths)
        return metrics


def evaluations(log: Path) -> list[dict]:
    """The evaluation records of ``log`` (this run's: a run's folder holds one run)."""
    with open(log, encoding="utf-8") as file:
        records = [json.loads(line) for line in file if line.strip()]
    return [record for record in records if "eval/turn_1/reward_mean" in record]


# ------------------------------------------------------------------------------ command line
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_flags(parser, models="both agents")
    parser.add_argument(
        "--epochs", type=int, default=2, help=f"passes over the {len(TRAIN_TOPICS)} topics (default: %(default)s)"
    )
    parser.add_argument(
        "--num-generations",
        type=int,
        default=2,
        help="completions per prompt, agent and turn; each joint action of turn 1 starts its own turn 2 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="most tokens per completion (default: %(default)s)"
    )
    parser.add_argument(
        "--discount",
        type=float,
        default=1.0,
        help="weight of turn 2 in turn 1's return, in [0, 1] (default: %(default)s)",
    )
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="AdamW learning rate (default: %(default)s)")
    parser.add_argument(
        "--trainer",
        choices=sorted(TRAINERS),
        default="magrpo",
        help="magrpo (group baselines) or iac (a value head on each agent, GAE, PPO) (default: %(default)s)",
    )
    return parse(parser, argv)


def main(argv=None) -> None:
    started = time.perf_counter()
    args = parse_args(argv)
    model_name = model_source(args)

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]
    batch = 2
    total_steps = args.epochs * math.ceil(len(TRAIN_TOPICS) / batch)
    trainer_class, config_class = TRAINERS[args.trainer]
    objective = {"discount": args.discount} if args.trainer == "magrpo" else {"gamma": args.discount}
    config = config_class(
        num_train_epochs=args.epochs,
        per_device_train_batch_size=batch,
        agent_learning_rate=args.learning_rate,
        logging_steps=1,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        num_turns=2,
        joint_mode="aligned",
        eval_interval=total_steps,  # evaluate before the first step and after the last
        eval_num_samples=len(EVAL_TOPICS),
        **objective,
        **run_config(args),
    )

    episodes = LastEpisodes()
    trainer = trainer_class(
        agents=agents,
        tokenizer=tokenizer,
        formatters=[partial(agent_prompt, tokenizer=tokenizer, role=role) for role in ROLES],
        reward_func=revision_reward,
        external_transition=revision_transition,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [f"Topic: {topic}" for topic in TRAIN_TOPICS]}),
        eval_dataset=Dataset.from_dict({"prompt": [f"Topic: {topic}" for topic in EVAL_TOPICS]}),
        eval_logger=episodes,
        wandb_config=wandb_config(args, f"two-turn-revision-{args.trainer}"),
    )
    result = trainer.train()
    saved = save_models(trainer, result, args)
    if not trainer.parallel.is_main:  # under torchrun, rank 0 reports
        return

    evals = evaluations(Path(result.output_dir) / "metrics.jsonl")
    before, after = evals[0], evals[-1]
    lines = [f"\nheld-out evaluation ({len(EVAL_TOPICS)} topics, reward 0..1 per turn): before -> after training"]
    for t in (1, 2):
        key, ret = f"eval/turn_{t}/reward_mean", f"eval/turn_{t}/expected_return"
        lines.append(
            f"  turn {t}: reward {before[key]:.3f} -> {after[key]:.3f}   return {before[ret]:.3f} -> {after[ret]:.3f}"
        )
    if episodes.texts:
        title, paragraph = episodes.texts[0][0], episodes.texts[1][0]
        lines.append(f"after training, topic {episodes.prompts[0].removeprefix('Topic: ')!r}:")
        for t in range(len(title)):
            lines.append(f"  turn {t + 1} title:     {title[t].strip()!r}")
            lines.append(f"  turn {t + 1} paragraph: {paragraph[t].strip()!r}")
    first, last = result.epoch_raw_reward_means[0], result.epoch_raw_reward_means[-1]
    lines.append(
        f"training reward (both turns): first epoch {first:.3f}, last epoch {last:.3f} "
        "(the training time below includes both evaluations)"
    )
    lines.append(run_summary(result, started, saved))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
