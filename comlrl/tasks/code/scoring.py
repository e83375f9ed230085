"""An answer's code and its score: the code cut out of a completion, the reward levels of
a program's sandbox result, and pass@k.

Reward (``LEVEL_WEIGHTS``, summing to 1): a small model rarely passes every test, so the
reward climbs through levels (``levels``): ``parses`` 0.1 (every agent's answer parses as
written, untrimmed, and the program defines the entry point: an answer that leaves the
function empty parses but earns nothing, else closing the code block at once is a reward the
agents learn to take); then, on the program, each counted only when the one before it holds:
``defines`` 0.1 (a top-level ``def`` of the entry point with a body: the prompt's docstring
alone defines nothing), ``runs`` 0.1 (its top level runs without an exception), ``asserts``
0.5 x the fraction of the problem's asserts that pass (``check(candidate)`` split into one
test per assert), ``passes`` 0.2 (all of them pass).

Apart from the task because these are pure functions of text and results: the reward's rules
are read, and tested, without building a task or running a sandbox.
"""

from __future__ import annotations

import ast

from comlrl.tasks.code.prompts import FENCE
from comlrl.tasks.sandbox import SandboxResult

LEVEL_WEIGHTS = {"parses": 0.1, "defines": 0.1, "runs": 0.1, "asserts": 0.5, "passes": 0.2}
"""Weight of each reward level; ``asserts`` is multiplied by the fraction of asserts passed."""


ANSWER_ENDS = (FENCE, "\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#", "\nassert ")
"""Where an answer's code ends: the closing fence, or a new statement at the left margin after
the agent's one function (HumanEval's usual stop sequences, from the Codex paper, with
``assert``). Sampling stops at them (``CodeTask.stop_strings``)."""


def extract_code(completion: str) -> str:
    """The code of a completion that continues an opened code block: the text up to the
    first of ``ANSWER_ENDS`` (all of it when there is none)."""
    ends = [index for index in (completion.find(end) for end in ANSWER_ENDS) if index >= 0]
    return completion[: min(ends)] if ends else completion


def parses(code: str) -> bool:
    """Whether ``code`` is valid Python syntax."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def complete_prefix(code: str) -> str:
    """The longest prefix of whole lines of ``code`` that parses ("" when none does).

    ``max_new_tokens`` cuts most of a small model's answers mid-statement; without this one
    unfinished last line (or an unclosed docstring) would make the whole joint program fail
    to parse, every sample would score 0 and no group would have a gradient. The agent still
    pays for what it loses: a helper with no complete ``def`` contributes nothing, a main
    agent with no complete statement defines no entry point.
    """
    lines = code.splitlines(keepends=True)
    for end in range(len(lines), 0, -1):
        candidate = "".join(lines[:end])
        if parses(candidate):
            return candidate
    return ""


def _calls_name(code: str, name: str) -> bool:
    """``code`` parses, calls ``name`` somewhere and does not define it itself."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))
    calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree))
    return calls and not defines


def levels(result: SandboxResult, clean: bool = True) -> dict[str, float]:
    """Each reward level (1.0 / 0.0, ``asserts`` the fraction passed) of a program's sandbox
    result. ``parses`` is ``clean``: every agent's answer parsed as written, before
    ``complete_prefix`` trimmed it (the program run is built from the trimmed answers, so it
    parses nearly always), and counts only with ``defines``; ``defines``, ``runs``, ``asserts``
    and ``passes`` are the program's, each counted only when the one before it holds."""
    defines = result.parsed and result.defined
    runs = defines and result.ran
    fraction = result.tests_passed / len(result.passed) if runs and result.passed else 0.0
    return {
        "parses": float(clean and defines),
        "defines": float(defines),
        "runs": float(runs),
        "asserts": fraction,
        "passes": float(runs and result.all_passed),
    }


def weighted(level_values: dict[str, float]) -> float:
    """Sum of ``LEVEL_WEIGHTS`` times the values of ``levels``, in [0, 1]."""
    return sum(LEVEL_WEIGHTS[name] * value for name, value in level_values.items())


def levelled_reward(result: SandboxResult, clean: bool = True) -> float:
    """``weighted(levels(result, clean))``."""
    return weighted(levels(result, clean))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` pass: 1 - C(n-c, k) / C(n, k),
    computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which stays exact where the binomials
    overflow."""
    for label, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {label} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product
