"""The code task itself: ``CodeTask`` turns HumanEval into the rows, formatters, reward and
evaluation a trainer takes, and runs the joint programs in the sandbox.

Settings (``CodeTask(mode=...)``):

- ``"collab"`` (two agents): agent 0, the helper, writes a function ``aux``; agent 1, the
  main agent, writes the problem's entry point, which may call ``aux``. The program is the
  problem's preamble (its imports and the functions its prompt defines besides the entry
  point) + the helper's code + the main agent's code.
- ``"single"`` (one agent, the baseline): the preamble + the agent's entry point.

Apart from the problems, prompts and scoring it assembles because it is the only part with
state: the chosen problems, the sandbox pool, the cache of results and the logs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from comlrl.tasks import Task
from comlrl.tasks.code.problems import (
    HELD_OUT_SIZE,
    Problem,
    body_indent,
    load_humaneval,
    magrpo_split,
    split_problems,
    without_docstring,
)
from comlrl.tasks.code.prompts import (
    FEEDBACK,
    FENCE,
    HELPER_NAME,
    HELPER_ROLE,
    MAIN_REQUEST,
    MAIN_ROLE,
    SINGLE_ROLE,
    _chat_or_plain,
)
from comlrl.tasks.code.scoring import (
    ANSWER_ENDS,
    LEVEL_WEIGHTS,
    _calls_name,
    complete_prefix,
    extract_code,
    levels,
    parses,
    pass_at_k,
    weighted,
)
from comlrl.tasks.sandbox import Job, SandboxLimits, SandboxPool, SandboxResult
from comlrl.utils.checks import require_int


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
        split: ``"hashed"`` (``split_problems``: 100 train, ``held_out`` held out) or
            ``"magrpo"`` (the MAGRPO paper's: train ``test[33:163]``, held out ``test[:32]``).
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
        split: str = "hashed",
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
        if split not in ("hashed", "magrpo"):
            raise ValueError(f"CodeTask split must be 'hashed' or 'magrpo', got {split!r}")
        every = list(problems) if problems is not None else load_humaneval()
        train, held_out = split_problems(every, held_out) if split == "hashed" else magrpo_split(every)
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

    @property
    def stop_strings(self) -> list[str]:
        """Where sampling stops an answer (``generation_kwargs={"stop_strings": ...}``): the
        ends of its code (``ANSWER_ENDS``). The reward cuts every answer there anyway; stopping
        saves the tokens after, and keeps them out of the loss."""
        return list(ANSWER_ENDS)

    def main_start(self, problem: Problem) -> str:
        """What the main (or single) agent's answer starts with: the problem's preamble, the
        entry point's ``def`` line(s) and the indentation of its body. The docstring is in the
        request (:meth:`main_request`): after it, the embedded chat model nearly always left the
        body empty and began a new ``def``."""
        preamble = problem.preamble.strip("\n")
        return (preamble + "\n\n" if preamble else "") + self.main_head(problem)

    @staticmethod
    def main_head(problem: Problem) -> str:
        """The code the main agent's body follows: the entry point without its docstring
        (``without_docstring``) and the indentation of its body."""
        return without_docstring(problem.function) + body_indent(problem.function)

    @staticmethod
    def main_request(problem: Problem) -> str:
        """The main (or single) agent's request: the problem's code, and what to write."""
        code = f"{FENCE}python\n{problem.prompt.strip()}\n{FENCE}"
        return f"Problem:\n{code}\n\n{MAIN_REQUEST.format(entry_point=problem.entry_point)}"

    def formatters(self, tokenizer: Any = None) -> list[Callable[[dict[str, Any]], str]]:
        def helper(row: dict[str, Any]) -> str:
            problem = self._problem(row)
            text = f"Problem:\n```python\n{problem.prompt.strip()}\n```"
            return _chat_or_plain(HELPER_ROLE, text, f"{FENCE}python\ndef {HELPER_NAME}(", tokenizer)

        def main(row: dict[str, Any]) -> str:
            problem = self._problem(row)
            role = MAIN_ROLE if self.mode == "collab" else SINGLE_ROLE
            return _chat_or_plain(
                role, self.main_request(problem), f"{FENCE}python\n{self.main_start(problem)}", tokenizer
            )

        return [helper, main] if self.mode == "collab" else [main]

    def transition(self, tokenizer: Any = None) -> Callable[..., list[str]]:
        """The MAGRPO paper's second turn, as an ``external_transition`` whose prompts are used
        as they are (``external_prompt_passthrough=True``): each agent's first-turn prompt again,
        with the team's test results (:meth:`feedback`) and the agent's own code of the first
        turn, and its answer opened as before."""

        def feedback_prompts(row: dict[str, Any], agent_completions: list[str]) -> list[str]:
            problem = self._problem(row)
            said = self.feedback(problem, agent_completions)
            main = FEEDBACK.format(feedback=said, fence=FENCE, code=self.main_code(problem, agent_completions[-1]))
            role = MAIN_ROLE if self.mode == "collab" else SINGLE_ROLE
            prompts = [
                _chat_or_plain(
                    role,
                    f"{self.main_request(problem)}\n\n{main}",
                    f"{FENCE}python\n{self.main_start(problem)}",
                    tokenizer,
                )
            ]
            if self.mode == "collab":
                helper = FEEDBACK.format(feedback=said, fence=FENCE, code=self.helper_code(agent_completions[0]))
                text = f"Problem:\n{FENCE}python\n{problem.prompt.strip()}\n{FENCE}\n\n{helper}"
                prompts.insert(0, _chat_or_plain(HELPER_ROLE, text, f"{FENCE}python\ndef {HELPER_NAME}(", tokenizer))
            return prompts

        return feedback_prompts

    def feedback(self, problem: Problem, completions: Sequence[str]) -> str:
        """What running the team's program of ``completions`` showed, in words (the run the
        reward made, from the cache)."""
        (result,) = self.run([self.job(problem, self.program(problem, completions))])
        if not result.parsed:
            return "the program does not parse."
        if not result.defined:
            return f"the program does not define {problem.entry_point} with a body."
        if not result.ran:
            return f"the program fails before the tests: {result.error[:200]}"
        return f"{result.tests_passed} of {len(result.passed)} tests passed."

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
        """The main agent's code: the entry point's ``def`` line(s) (the preamble goes into
        the program once, separately) and its completion, up to its end (``extract_code``),
        trimmed like the helper's. A completion without a statement leaves no function, or one
        with only a docstring, which does not count as defining the entry point."""
        return complete_prefix(self.main_head(problem) + extract_code(completion))

    def clean(self, problem: Problem, completions: Sequence[str]) -> bool:
        """Every agent's answer (up to the fence) parses as it is, untrimmed."""
        raw = [self.main_head(problem) + extract_code(completions[-1])]
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
    def reward(self, *completions: list[str], batch_items: list[dict[str, Any]], turn: int = 1) -> list[float]:
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
                "turn": turn,
                "count": len(results),
                **{name: sum(s[name] for s in scored) / len(scored) for name in LEVEL_WEIGHTS},
                "reward": sum(rewards) / len(rewards),
            }
        )
        return rewards

    # --- evaluation ------------------------------------------------------------------------
    def evaluate(self, agent_completions_turns: list[list[list[str]]], rows: list[dict[str, Any]]) -> dict[str, float]:
        """pass@1, pass@k and reward levels over the evaluated rows, for the joint program,
        the main agent's part alone and (collab) the helper's use, each row's last turn (with
        two turns, the answers written after the first turn's test results).

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
        texts = [[turns[-1] if turns else "" for turns in agent] for agent in agent_completions_turns]
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
