"""comlrl.tasks.code: HumanEval from the package, the fixed split, assert splitting, reward
levels on hand-built programs, pass@k by hand, prompts, the evaluation, and the example's
short run on a tiny model."""

import json
import math
import sys
from fractions import Fraction

import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.tasks.code import (
    HELD_OUT_SIZE,
    LEVEL_WEIGHTS,
    SPLIT_SEED,
    CodeTask,
    Problem,
    complete_prefix,
    extract_code,
    levelled_reward,
    load_humaneval,
    magrpo_split,
    pass_at_k,
    split_problems,
    split_tests,
)
from comlrl.tasks.code.problems import without_docstring
from comlrl.tasks.code.scoring import ANSWER_ENDS
from comlrl.tasks.sandbox import SandboxLimits, isolation
from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import TUTORIAL_FLAGS, char_tokenizer, help_text, load_example, tiny_llama

# These tests are about the task, not the isolation (tests/test_sandbox.py): where the machine
# refuses namespaces they choose plain process isolation, explicitly, as a user would have to.
NO_NAMESPACES = isolation.namespace_problem()
LIMITS = SandboxLimits(timeout=3.0, test_timeout=0.5, isolation="process" if NO_NAMESPACES else "namespace")


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


@pytest.fixture(scope="module")
def by_id(humaneval):
    return {p.task_id: p for p in humaneval}


# ------------------------------------------------------------------------------ data and split
def test_humaneval_comes_from_the_package(humaneval):
    assert len(humaneval) == 164 and len({p.task_id for p in humaneval}) == 164
    assert all(p.tests and p.function.lstrip().startswith(("def ", "@")) for p in humaneval)


def test_split_is_fixed_disjoint_and_complete(humaneval):
    train, held_out = split_problems(humaneval)
    assert (len(train), len(held_out)) == (164 - HELD_OUT_SIZE, HELD_OUT_SIZE)
    train_ids, held_ids = {p.task_id for p in train}, {p.task_id for p in held_out}
    assert not train_ids & held_ids and len(train_ids | held_ids) == 164
    again = split_problems(list(reversed(humaneval)))  # the input order does not matter
    assert [p.task_id for p in again[1]] == [p.task_id for p in held_out]
    # pinned: a change of the ordering rule would silently move problems into training
    assert SPLIT_SEED == 19
    assert [p.task_id for p in held_out[:4]] == ["HumanEval/25", "HumanEval/133", "HumanEval/149", "HumanEval/26"]
    other = split_problems(humaneval, seed=SPLIT_SEED + 1)[1]
    assert {p.task_id for p in other} != held_ids


def test_the_magrpo_papers_split(humaneval):
    train, held_out = magrpo_split(humaneval)
    assert [p.task_id for p in held_out] == [f"HumanEval/{n}" for n in range(32)]
    assert [p.task_id for p in train] == [f"HumanEval/{n}" for n in range(33, 163)]
    task = CodeTask(split="magrpo", train_problems=2, eval_problems=2, limits=LIMITS)
    try:
        assert [p.task_id for p in task.eval_problems] == ["HumanEval/0", "HumanEval/1"]
        assert [p.task_id for p in task.train_problems] == ["HumanEval/33", "HumanEval/34"]
    finally:
        task.close()
    with pytest.raises(ValueError, match="HumanEval problems \\[5\\] are missing"):
        magrpo_split([p for p in humaneval if p.task_id != "HumanEval/5"])
    with pytest.raises(ValueError, match="split must be 'hashed' or 'magrpo'"):
        CodeTask(split="paper")


def test_split_rejects_bad_input(humaneval):
    with pytest.raises(ValueError, match="held_out"):
        split_problems(humaneval, held_out=164)
    with pytest.raises(ValueError, match="repeat"):
        split_problems([humaneval[0], humaneval[0], humaneval[1]], held_out=1)


# ------------------------------------------------------------------------------ tests split into asserts
def test_split_tests_on_real_problems(by_id):
    assert len(by_id["HumanEval/0"].tests) == 7  # seven top-level asserts
    assert len(by_id["HumanEval/32"].tests) == 1  # one loop over random inputs with an assert inside
    assert "rng = random.Random(42)" in by_id["HumanEval/32"].tests[0]  # its setup comes along
    for test in by_id["HumanEval/0"].tests:
        compile(test, "test", "exec")
        assert test.count("assert ") == 1 and "def check(candidate):" in test


def test_split_tests_keeps_setup_and_drops_assert_true():
    source = (
        "IMPORTED = 1\n\ndef check(candidate):\n    x = 2\n    assert candidate(x) == 4\n"
        "    assert True, 'debug line'\n    y = 3\n    assert candidate(y) == 6\n"
    )
    first, second = split_tests(source)
    assert "IMPORTED = 1" in first and "x = 2" in first and "y = 3" not in first
    assert "x = 2" in second and "y = 3" in second and "candidate(x) == 4" not in second
    assert "assert True" not in first + second


def test_split_tests_names_the_culprit():
    with pytest.raises(ValueError, match="HumanEval/x: the test defines no check"):
        split_tests("def other(candidate):\n    assert 1\n", "HumanEval/x")
    with pytest.raises(ValueError, match="no assert"):
        split_tests("def check(candidate):\n    assert True\n    print(candidate)\n", "t")


def test_canonical_solutions_pass_and_stubs_fail(by_id):
    # a sample of real problems, including a helper-using preamble (32, 38) and 115's import above its docstring
    ids = [
        "HumanEval/0",
        "HumanEval/2",
        "HumanEval/32",
        "HumanEval/38",
        "HumanEval/50",
        "HumanEval/115",
        "HumanEval/53",
    ]
    problems = [by_id[i] for i in ids]
    task = CodeTask(mode="single", problems=list(by_id.values()), limits=LIMITS)
    try:
        solved = task.run([task.job(p, task.program(p, [p.canonical_solution.lstrip()])) for p in problems])
        stubbed = task.run([task.job(p, task.program(p, ["return None\n"])) for p in problems])
    finally:
        task.close()
    assert [r.all_passed for r in solved] == [True] * len(ids)
    assert not any(r.all_passed for r in stubbed) and all(r.ran for r in stubbed)


# ------------------------------------------------------------------------------ reward levels by hand
DOUBLE = {
    "prompt": 'import math\n\n\ndef double(x):\n    """Twice x."""\n',
    "entry_point": "double",
    "test": "METADATA = {}\n\ndef check(candidate):\n"
    + "".join(f"    assert candidate({x}) == {2 * x}\n" for x in (0, 1, 2, -3)),
    "canonical_solution": "    return 2 * x\n",
}


@pytest.fixture(scope="module")
def hand_task():
    problems = [Problem.from_record({"task_id": f"Hand/{i}", **DOUBLE}) for i in range(3)]
    task = CodeTask(mode="single", problems=problems, held_out=1, limits=LIMITS)
    yield task
    task.close()


def score(task, completion, row=None):
    row = row or task.dataset("train")[0]
    return task.reward([completion], batch_items=[row])[0]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("return (2 *\n", 0.0),  # not clean, and trimmed to the bare docstring: nothing defined
        ("return 2 * x\n  oops(\n", 0.1 + 0.1 + 0.5 + 0.2),  # not clean; the trimmed program passes
        ("return 2 * x\n\n1 / 0\n", 0.1 + 0.1),  # clean, defined, crashes at its top level
        ("return 0\n", 0.1 + 0.1 + 0.1 + 0.5 * 1 / 4),  # 1 of 4 asserts (x = 0)
        ("return 2 * x if x in (0, 1) else 0\n", 0.1 + 0.1 + 0.1 + 0.5 * 2 / 4),  # x = 0, 1
        ("return x + x\n", 1.0),  # everything
        ("return 2 * x\n```\nIt doubles x.", 1.0),  # the prose after the fence is not code
        # Clean, but the function is left empty (a trained main agent's answer): parsing alone earns nothing.
        ("\n# Test the function\nprint(double(10))\n```\nThis doubles.", 0.0),
        ("```\n", 0.0),
    ],
)
def test_each_level_on_a_hand_built_program(hand_task, completion, expected):
    assert score(hand_task, completion) == pytest.approx(expected)


def test_without_docstring_keeps_what_the_body_holds_before_it(by_id):
    assert without_docstring('def f(x):\n    """Doc\n    more."""\n') == "def f(x):\n"
    assert without_docstring("@cache\ndef f(\n    x,\n):\n    'Doc.'\n") == "@cache\ndef f(\n    x,\n):\n"
    assert without_docstring("def f(x):\n    return x\n") == "def f(x):\n    return x\n"  # no docstring: unchanged
    assert without_docstring(by_id["HumanEval/115"].function) == "def max_fill(grid, capacity):\n    import math\n"


def test_the_answers_stop_where_their_code_ends():
    problems = [Problem.from_record({"task_id": f"Hand/{i}", **DOUBLE}) for i in range(2)]
    task = CodeTask(mode="single", problems=problems, held_out=1, limits=LIMITS)
    try:
        assert task.stop_strings == list(ANSWER_ENDS) and "```" in task.stop_strings
        row = task.dataset("train")[0]
        # a body followed by a new def: the reward is the body's, as if sampling had stopped there
        assert task.reward(["return 2 * x\n\ndef g(:"], batch_items=[row]) == [1.0]
    finally:
        task.close()


def test_level_weights_sum_to_one():
    assert sum(LEVEL_WEIGHTS.values()) == pytest.approx(1.0)
    assert set(LEVEL_WEIGHTS) == {"parses", "defines", "runs", "asserts", "passes"}


def test_a_program_without_the_entry_point_gets_nothing_although_it_parses(hand_task):
    problem = hand_task.train_problems[0]
    result = hand_task.run([hand_task.job(problem, "def other(x):\n    return 2 * x\n")])[0]
    assert result.parsed and not result.defined
    assert levelled_reward(result, clean=True) == 0.0


def test_trimming_and_extraction():
    assert extract_code("    return 1\n```\nprose ``` more") == "    return 1\n"
    assert extract_code("no fence") == "no fence"
    # the code also ends at a new statement at the left margin (HumanEval's stop sequences) ...
    body = "    if x:\n        print(x)\n    # done\n    return 1\n"
    for after in ("\ndef g():", "\nclass C:", "\nif __name__:", "\nprint(f(1))", "\n# tests", "\nassert f(1)"):
        assert extract_code(body + after + "\n```") == body, after
    # ... at the first of them, and not inside the function (indented)
    assert extract_code("x):\n    return x\n\nassert aux(1)\n```\ndef g():") == "x):\n    return x\n"
    assert complete_prefix("def f():\n    return 1\ndef g(:\n") == "def f():\n    return 1\n"
    assert complete_prefix("def f(:\n") == ""


def test_reward_rejects_rows_it_does_not_know(hand_task):
    with pytest.raises(KeyError, match="no known task_id"):
        hand_task.reward(["return 1\n"], batch_items=[{"task_id": "Elsewhere/1"}])
    with pytest.raises(ValueError, match="takes 1 completion lists"):
        hand_task.reward(["a"], ["b"], batch_items=[hand_task.dataset("train")[0]])


# ------------------------------------------------------------------------------ pass@k
def test_pass_at_k_by_hand():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(3, 1, 3) == 1.0  # every sample is drawn: the passing one among them
    # where the binomials are huge: the exact value from integers
    exact = 1 - Fraction(math.comb(190, 100), math.comb(200, 100))
    assert pass_at_k(200, 10, 100) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(0, 0, 1), (3, 4, 1), (3, 1, 4), (3, 1, 0), (3, -1, 1)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(n, c, k)
    with pytest.raises(TypeError):
        pass_at_k(3.0, 1, 1)


# ------------------------------------------------------------------------------ prompts and the evaluation
CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def collab():
    task = CodeTask(mode="collab", train_problems=2, eval_problems=2, eval_samples=2, pass_ks=[2], limits=LIMITS)
    yield task
    task.close()


def test_prompts_for_chat_and_base_models(collab):
    row = collab.dataset("train")[0]
    problem = collab.train_problems[0]
    chat = char_tokenizer()
    chat.chat_template = CHAT
    for tokenizer in (None, chat):
        helper, main = (f(row) for f in collab.formatters(tokenizer))
        assert helper.endswith("```python\ndef aux(") and "`aux`" in helper and problem.prompt.strip() in helper
        # the request shows the whole problem; the answer opens at the body, after the def line without the docstring
        assert problem.prompt.strip() in main and "aux" in main and f"body of `{problem.entry_point}`" in main
        assert main.endswith("```python\n" + without_docstring(problem.function) + "    ")
    assert helper.startswith("<|system|>") and "<|assistant|>```python\ndef aux(" in helper
    single = CodeTask(mode="single", train_problems=1, eval_problems=1, limits=LIMITS)
    try:
        (only,) = single.formatters(None)
        assert "aux" not in only(single.dataset("train")[0])
    finally:
        single.close()


def test_datasets_repeat_held_out_problems_per_sample(collab):
    rows = collab.dataset("eval")
    assert [(r["task_id"], r["sample"]) for r in rows] == [
        (p.task_id, s) for p in collab.eval_problems for s in range(2)
    ]
    train_ids = {r["task_id"] for r in collab.dataset("train")}
    assert train_ids.isdisjoint(r["task_id"] for r in rows) and {r["split"] for r in rows} == {"eval"}


def test_evaluation_reports_pass_at_k_and_the_helpers_use():
    problems = [Problem.from_record({"task_id": f"Hand/{i}", **DOUBLE}) for i in range(3)]
    task = CodeTask(mode="collab", problems=problems, held_out=1, eval_samples=3, pass_ks=[2, 3], limits=LIMITS)
    try:
        # sample 0: main solves it alone; 1: main delegates to a helper that solves it; 2: both wrong
        helpers = ["x):\n    return None\n", "x):\n    return 2 * x\n", "x):\n    return None\n"]
        mains = ["return 2 * x\n", "return aux(x)\n", "return None\n"]
        metrics = task.evaluate([[[c] for c in helpers], [[c] for c in mains]], task.dataset("eval"))
        problem = task.eval_problems[0]
    finally:
        task.close()
    assert metrics["pass@1"] == pytest.approx(2 / 3) and metrics["pass@3"] == 1.0
    assert metrics["pass@2"] == pytest.approx(pass_at_k(3, 2, 2))
    assert metrics["main/pass@1"] == pytest.approx(1 / 3)  # without the helper only sample 0 passes
    assert metrics["helper/used"] == pytest.approx(1 / 3) and metrics["helper/called"] == pytest.approx(1 / 3)
    assert metrics["helper/needed"] == pytest.approx(1 / 3) and metrics["helper/valid"] == 1.0
    assert metrics["level/passes"] == pytest.approx(2 / 3)
    assert task.last_evaluation["problems"] == {problem.task_id: {"n": 3, "joint": 2, "main": 1}}


def test_the_second_turn_tells_each_agent_its_teams_test_results():
    problems = [Problem.from_record({"task_id": f"Hand/{i}", **DOUBLE}) for i in range(2)]
    task = CodeTask(mode="collab", problems=problems, held_out=1, limits=LIMITS)
    try:
        row = task.dataset("train")[0]
        transition = task.transition(None)
        results = {}
        for name, main in (("half", "return 2 * x if x < 2 else 0\n"), ("broken", "return (\n"), ("crash", "1 / 0\n")):
            task.reward(["x):\n    return x\n"], [main], batch_items=[row])  # the reward's run, cached
            results[name] = transition(row=row, agent_completions=["x):\n    return x\n", main])
    finally:
        task.close()
    helper, main = results["half"]
    assert "3 of 4 tests passed." in helper and "3 of 4 tests passed." in main  # x = 0, 1 and -3
    assert "def aux(x):\n    return x" in helper and helper.endswith("```python\ndef aux(")
    assert "return 2 * x if x < 2 else 0" in main and main.endswith("```python\nimport math\n\ndef double(x):\n    ")
    assert '"""Twice x."""' in main  # the problem, in the request
    assert "does not define double with a body" in results["broken"][1]
    assert "0 of 4 tests passed." in results["crash"][1]  # the body raises in every test
    assert task.reward_log[-1]["turn"] == 1


def test_task_arguments_are_checked():
    with pytest.raises(ValueError, match="mode"):
        CodeTask(mode="trio")
    with pytest.raises(ValueError, match="pass_ks"):
        CodeTask(eval_samples=2, pass_ks=[3])
    with pytest.raises(ValueError, match="order"):
        CodeTask(order="longest")
    with pytest.raises(ValueError, match="train_problems"):
        CodeTask(train_problems=-1)  # a slice would quietly drop the last problem


# ------------------------------------------------------------------------------ the example
@pytest.fixture(scope="module")
def example():
    return load_example("code-collab.py")


def test_example_flags(example, capsys):
    text = help_text(example, capsys)
    for flag in [
        *TUTORIAL_FLAGS,
        "--mode",
        "--train-problems",
        "--eval-problems",
        "--eval-samples",
        "--threads",
        "--temperature",
        "--top-p",
        "--scale-rewards",
        "--overlong-buffer",
        "--overlong-penalty-factor",
    ]:
        assert flag in text


@pytest.mark.parametrize("turns", [1, 2])
def test_example_runs_on_a_tiny_model(example, tmp_path, capsys, monkeypatch, turns):
    if NO_NAMESPACES:
        pytest.skip(f"the example builds a namespace sandbox, which this machine refuses: {NO_NAMESPACES}")
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now fail: W&B stays off
    alphabet = "".join(chr(c) for c in range(32, 127)) + "\n\t"
    tok = char_tokenizer(alphabet)
    model = tiny_llama(tok)
    model.config.max_position_embeddings = 1024  # HumanEval prompts are long in characters (rotary: no new weights)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    scale = ("group", "batch")[turns - 1]  # both values over the two runs: a flag left unread fails one of them
    configs = []
    monkeypatch.setattr(example, "MAGRPOTrainer", lambda **kw: configs.append(kw["args"]) or MAGRPOTrainer(**kw))
    report = example.main(
        ["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--epochs", "1", "--train-problems", "1",
         "--eval-problems", "1", "--eval-samples", "2", "--num-generations", "2", "--max-new-tokens", "4",
         "--timeout", "3", "--turns", str(turns), "--temperature", "0.9", "--top-p", "0.8",
         "--scale-rewards", scale, "--overlong-buffer", "2", "--overlong-penalty-factor", "0.1"]
    )  # fmt: skip
    assert (configs[0].temperature, configs[0].top_p) == (0.9, 0.8)  # the sampling flags reach the trainer
    assert configs[0].scale_rewards == scale
    assert (configs[0].overlong_buffer, configs[0].overlong_penalty_factor) == (2, 0.1)
    assert configs[0].generation_kwargs == {"stop_strings": list(ANSWER_ENDS)}  # sampling stops where the code ends
    printed = capsys.readouterr().out
    assert "training reward levels" in printed and "pass@1" in printed and "pass@2" in printed
    assert "mean reward per epoch" in printed
    saved = json.loads((out / "code_eval.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert (
        saved["steps"] == 1 and len(saved["train_reward_per_step"]) == 1 and len(saved["train_reward_per_epoch"]) == 1
    )
    assert set(saved["before"]["metrics"]) >= {"pass@1", "pass@2", "main/pass@1", "reward", "helper/used"}
    assert not set(saved["train_problems"]) & set(saved["eval_problems"])
    assert saved["seconds_per_step"] > 0 and saved["threads"] >= 1
    assert len(saved["weight_change"]) == 2 and all(moved >= 0 for moved in saved["weight_change"])
    assert f"run folder {out}: metrics.jsonl; curves in metrics.png; the evaluation in code_eval.json;" in printed
    assert saved["turns"] == turns and all(entry["turn"] == turns for entry in saved["train_reward_per_step"])
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-2])  # the last step's (then its evaluation)
    assert ("turn_2/reward_mean" in last) == (turns == 2)


def test_example_weight_change_is_the_relative_distance_from_the_loaded_weights(example, tmp_path):
    tok = char_tokenizer("abc")
    tiny_llama(tok).save_pretrained(tmp_path)
    agents = [AutoModelForCausalLM.from_pretrained(tmp_path) for _ in range(2)]
    start = {name: value.clone() for name, value in agents[1].state_dict().items()}
    with torch.no_grad():
        agents[1].lm_head.weight[0, :3] += torch.tensor([0.3, -0.4, 0.0])  # a step of length 0.5
    norm = math.sqrt(sum(value.square().sum().item() for value in start.values()))
    assert example.weight_change(agents, str(tmp_path)) == pytest.approx([0.0, 0.5 / norm], rel=1e-5)
