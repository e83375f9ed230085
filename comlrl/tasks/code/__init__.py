"""HumanEval as a collaborative code task: a helper agent and a main agent write one program.

``CodeTask`` (``task.py``) is what a trainer is given; it assembles the problems and their
fixed train / held-out split (``problems.py``), what each agent is told (``prompts.py``) and
the answers' code and reward levels (``scoring.py``), and runs the programs in
``comlrl.tasks.sandbox``. Every name below is importable from ``comlrl.tasks.code``.
"""

from comlrl.tasks.code.problems import (
    HELD_OUT_SIZE,
    SPLIT_SEED,
    Problem,
    load_humaneval,
    magrpo_split,
    split_problems,
    split_tests,
)
from comlrl.tasks.code.scoring import LEVEL_WEIGHTS, extract_code, levels, pass_at_k

# Two names the tests import from here, re-exported but off __all__ as they were before the split.
from comlrl.tasks.code.scoring import complete_prefix as complete_prefix
from comlrl.tasks.code.scoring import levelled_reward as levelled_reward
from comlrl.tasks.code.task import CodeTask

__all__ = [
    "HELD_OUT_SIZE",
    "LEVEL_WEIGHTS",
    "SPLIT_SEED",
    "CodeTask",
    "Problem",
    "extract_code",
    "levels",
    "load_humaneval",
    "magrpo_split",
    "pass_at_k",
    "split_problems",
    "split_tests",
]
