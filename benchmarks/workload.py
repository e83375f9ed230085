"""The fixed workload that benchmarks/bench_ours.py and benchmarks/bench_original.py both run.

Two agents (SmolLM2-135M-Instruct in fp32, one shared tokenizer, on CPU) are trained for one
epoch on the first 4 prompts of examples/story-len-ratio.py, fed as raw text (no chat
template), with the tutorial's length-ratio reward (target ratio 2-3) scaled x100. Each agent
samples G = 8 completions per prompt (temperature 0.6, top-p 0.6, top-k 50), every one forced
to exactly 64 tokens (``min_new_tokens``), and takes one optimizer step per 2 prompts (2 steps
per agent; 2 is the original library's default rollout buffer). Work per run: 4 prompts x 8
completions x 64 tokens x 2 agents = 4096 generated tokens.

Pure data and the reward function: this module imports neither ``comlrl`` (the two runners
run in different virtual environments, each with its own ``comlrl``) nor torch. The prompts
and the reward are frozen copies of the example's, so editing the example does not move the
benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NUM_AGENTS = 2
TEMPERATURE = 0.6
TOP_P = 0.6
TOP_K = 50
LEARNING_RATE = 5e-5
NUM_EPOCHS = 1
SEED = 0
PROMPTS_PER_STEP = 2
REWARD_SCALE = 100.0

# examples/story-len-ratio.py's PROMPTS; the speed workload takes the first 4.
ALL_PROMPTS = (
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
)
PROMPTS = ALL_PROMPTS[:4]
LEARNING_EPOCHS = 2
"""The learning comparison (benchmarks/learning_vs_original.py): the tutorial's 10 prompts,
G = 8, up to 64 tokens chosen freely, 2 epochs of 5 optimizer steps per agent."""


@dataclass(frozen=True)
class Workload:
    """What changes between the real run and the ``--smoke`` check."""

    prompts: tuple[str, ...]
    num_generations: int
    max_new_tokens: int
    num_agents: int = NUM_AGENTS
    """1 in benchmarks/compare_trl.py (TRL trains one model)."""

    @property
    def generated_tokens(self) -> int:
        """Tokens sampled in one run (every completion is forced to ``max_new_tokens``)."""
        return len(self.prompts) * self.num_generations * self.max_new_tokens * self.num_agents


FULL = Workload(prompts=PROMPTS, num_generations=8, max_new_tokens=64)
SMOKE = Workload(prompts=PROMPTS[:1], num_generations=2, max_new_tokens=4)
LEARNING = Workload(prompts=ALL_PROMPTS, num_generations=8, max_new_tokens=64)


def workload(smoke: bool) -> Workload:
    return SMOKE if smoke else FULL


def length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
    """1.0 when len(second) / len(first) lies in [target_min, target_max], exp(-distance) outside
    (``proper_length_ratio_reward`` of examples/story-len-ratio.py)."""
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


def one_agent_length_ratio_reward(prompts, completions, **_):
    """The length-ratio reward for one agent (benchmarks/compare_trl.py): the completion
    against its prompt, ``length_ratio_reward(prompts, completions)``. Both libraries call it
    with the prompts first (ours because it has one more required parameter than agents, TRL
    by keyword); ``**_`` takes the rest TRL passes."""
    return length_ratio_reward(prompts, completions)


def scale_reward(reward: float) -> float:
    """The reward processor of both runs: x100."""
    return REWARD_SCALE * reward


class RecordedReward:
    """The length-ratio reward, keeping every value it returns in call order (both libraries
    score a turn's joint actions in sample order, in one call or one call each)."""

    __name__ = "length_ratio_reward"

    def __init__(self) -> None:
        self.values: list[float] = []

    def __call__(self, completions1, completions2):
        rewards = length_ratio_reward(completions1, completions2)
        self.values.extend(rewards)
        return rewards

    def epoch_means(self, epochs: int) -> list[float]:
        """Mean reward x100 of each of ``epochs`` equal runs of calls (every epoch scores as many)."""
        per_epoch = len(self.values) // epochs
        return [REWARD_SCALE * sum(self.values[e * per_epoch : (e + 1) * per_epoch]) / per_epoch for e in range(epochs)]
