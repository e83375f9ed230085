"""comlrl.tasks.sandbox: programs run in limited processes, and hostile ones are contained
and scored as failures."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from comlrl.tasks.sandbox import Job, Sandbox, SandboxLimits, SandboxPool, live_group_members

PASSING_TEST = "def check(candidate):\n    assert candidate() == 1\n"
FAST = SandboxLimits(timeout=1.5, test_timeout=0.5, cpu_seconds=3, memory_bytes=256 << 20)


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(FAST)


def returns_one(extra: str = "") -> Job:
    """A program whose entry point passes PASSING_TEST, after ``extra`` top-level code."""
    return Job(f"{extra}\ndef f():\n    return 1\n", "f", (PASSING_TEST,))


def assert_contained(result, limits=FAST):
    assert not result.all_passed
    assert result.seconds < limits.timeout + 1.5
    assert result.pid is not None and live_group_members(result.pid) == []


# ------------------------------------------------------------------------------ ordinary programs
def test_a_correct_program_passes_and_leaves_nothing(sandbox):
    folders = set(Path(tempfile.gettempdir()).glob("comlrl-sandbox-*"))
    result = sandbox.run(returns_one("open('scratch.txt', 'w').write('x')"))
    assert result.all_passed and (result.parsed, result.defined, result.ran, result.status) == (
        True, True, True, "finished",
    )  # fmt: skip
    assert live_group_members(result.pid) == []
    assert set(Path(tempfile.gettempdir()).glob("comlrl-sandbox-*")) == folders  # its folder was deleted


def test_each_test_is_scored_separately(sandbox):
    tests = tuple(f"def check(candidate):\n    assert candidate({i}) == {i * 2}\n" for i in range(4))
    result = sandbox.run(Job("def f(x):\n    return x * 2 if x < 2 else 0\n", "f", tests))
    assert result.passed == (True, True, False, False)


def test_stages_of_broken_programs(sandbox):
    syntax = sandbox.run(Job("def f(:\n", "f", (PASSING_TEST,)))
    assert (syntax.parsed, syntax.defined, syntax.ran) == (False, False, False) and "SyntaxError" in syntax.error
    other = sandbox.run(Job("def g():\n    return 1\n", "f", (PASSING_TEST,)))
    assert (other.parsed, other.defined, other.ran) == (True, False, False)
    crash = sandbox.run(Job("def f():\n    return 1\n1 / 0\n", "f", (PASSING_TEST,)))
    assert (crash.parsed, crash.defined, crash.ran, crash.passed) == (True, True, False, (False,))
    assert "ZeroDivisionError" in crash.error


def test_helper_calls_are_counted(sandbox):
    program = "def aux(x):\n    return x + 1\ndef f(x):\n    return aux(aux(x))\n"
    tests = ("def check(candidate):\n    assert candidate(0) == 2\n",) * 3
    assert sandbox.run(Job(program, "f", tests, helper="aux")).helper_calls == 6


def test_limits_are_checked():
    with pytest.raises(ValueError, match="timeout"):
        SandboxLimits(timeout=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        SandboxLimits(memory_bytes=1 << 20)
    with pytest.raises(ValueError, match="no user"):
        Sandbox(SandboxLimits(user="no-such-user-here"))


# ------------------------------------------------------------------------------ hostile programs
def test_infinite_loop_in_a_test_times_out_and_skips_the_rest(sandbox):
    program = "def f():\n    while True:\n        pass\n"
    started = time.perf_counter()
    result = sandbox.run(Job(program, "f", (PASSING_TEST,) * 5))
    assert result.passed == (False,) * 5 and time.perf_counter() - started < 2 * FAST.test_timeout + 1
    assert_contained(result)


def test_infinite_loop_that_ignores_the_alarm_is_killed_by_the_wall_clock(sandbox):
    program = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    result = sandbox.run(returns_one(program))
    assert result.status == "timeout" and not result.ran
    assert_contained(result)


# Before the fork bomb: its killed children count against the user's process limit until init
# reaps them, which can take seconds (see comlrl.tasks.sandbox).
def test_background_child_does_not_outlive_its_program(sandbox):
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n"
    result = sandbox.run(returns_one(program))
    assert result.all_passed  # the parent went on and passed; its sleeping child was killed after
    assert live_group_members(result.pid) == []


def test_fork_bomb_is_contained(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(returns_one(bomb))
    assert not result.ran  # the alarm stopped the first process; the whole group was killed with it
    assert_contained(result)  # every forked child died with the group


def test_memory_hog_fails(sandbox):
    at_once = sandbox.run(returns_one("x = bytearray(8 << 30)"))
    assert not at_once.ran and "MemoryError" in at_once.error
    growing = "def f():\n    chunks = []\n    while True:\n        chunks.append(bytearray(10 << 20))\n"
    result = sandbox.run(Job(growing, "f", (PASSING_TEST,)))
    assert result.ran and result.passed == (False,)
    assert_contained(result)


def test_writing_home_stays_in_the_sandbox(sandbox, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the trainer's home, as the program would find it
    program = (
        "import os\nopen(os.path.expanduser('~/planted.txt'), 'w').write('x')\n"
        "open('planted_here.txt', 'w').write('x')\n"
    )
    result = sandbox.run(returns_one(program))
    assert result.all_passed  # it wrote into its own home and working folder, deleted after
    assert not (tmp_path / "planted.txt").exists()


@pytest.fixture(scope="module")
def switched(sandbox):
    if sandbox.ids is None:
        pytest.skip("the trainer is not root: the sandbox cannot switch user, so the program could write and signal "
                    "as the trainer's user (documented in comlrl.tasks.sandbox)")  # fmt: skip
    return sandbox


def test_writing_to_the_trainers_folders_fails_as_another_user(switched, tmp_path):
    target = tmp_path / "planted.txt"  # the test's own folder: the trainer's user's, not the sandbox's
    program = f"def f():\n    open({str(target)!r}, 'w').write('x')\n    return 1\n"
    result = switched.run(Job(program, "f", (PASSING_TEST,)))
    assert result.ran and result.passed == (False,) and not target.exists()


def test_environment_secrets_are_not_inherited(sandbox, monkeypatch):
    monkeypatch.setenv("COMLRL_TEST_SECRET", "s3cret-value")
    program = "import os\nprint(dict(os.environ))\ndef f():\n    return os.environ.get('COMLRL_TEST_SECRET', 1)\n"
    result = sandbox.run(Job(program, "f", (PASSING_TEST,)))
    assert result.all_passed  # the variable is absent in the program
    assert "s3cret-value" not in result.output and "HOME" in result.output
    assert set(json.loads(result.output.replace("'", '"'))) == {"PATH", "HOME", "TMPDIR", "LANG"}


KILL_PARENT = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])  # not the comlrl package: torch is slow to import
sandbox_module = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox_module)
Job, Sandbox, SandboxLimits = sandbox_module.Job, sandbox_module.Sandbox, sandbox_module.SandboxLimits
sandbox = Sandbox(SandboxLimits(timeout=1.5, test_timeout=0.5))
program = "import os, signal\\ndef f():\\n    os.kill(os.getppid(), signal.SIGKILL)\\n    return 1\\n"
tests = ("def check(candidate):\\n    assert candidate() == 1\\n",)
top = "import os, signal\\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\\ndef f():\\n    return 1\\n"
results = [sandbox.run(Job(program, "f", tests)), sandbox.run(Job(top, "f", tests))]
print(json.dumps([[r.ran, r.all_passed] for r in results]))
"""


def test_killing_the_parent_fails_and_the_parent_survives(switched):
    # The parent is a sacrificial process, so a sandbox that failed here would not kill pytest.
    module = Path(__file__).resolve().parents[1] / "comlrl" / "tasks" / "sandbox.py"
    done = subprocess.run([sys.executable, "-c", KILL_PARENT, str(module)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[True, False], [False, False]]


def test_huge_output_is_cut_and_fails(sandbox):
    program = "def f():\n    while True:\n        print('x' * 10000)\n"
    started = time.perf_counter()
    result = sandbox.run(Job(program, "f", (PASSING_TEST,)))
    assert result.status == "output_limit" and not result.all_passed
    assert len(result.output) <= FAST.output_bytes and time.perf_counter() - started < 2
    assert_contained(result)


def test_sys_exit_inside_a_test_fails_that_test_only(sandbox):
    program = "import sys\ndef f(x):\n    if x == 1:\n        sys.exit(0)\n    return x\n"
    tests = tuple(f"def check(candidate):\n    assert candidate({i}) == {i}\n" for i in range(3))
    assert sandbox.run(Job(program, "f", tests)).passed == (True, False, True)
    hard = "import os\ndef f(x):\n    if x == 1:\n        os._exit(0)\n    return x\n"
    result = sandbox.run(Job(hard, "f", tests))
    assert result.passed == (True, False, False)  # a process that is gone reports nothing more


def test_forged_result_lines_do_not_count(sandbox):
    forged = "print('\\n' + '0' * 32 + ' test 0 pass 0')\ndef f():\n    return 2\n"
    assert sandbox.run(Job(forged, "f", (PASSING_TEST,))).passed == (False,)


# ------------------------------------------------------------------------------ the pool
def test_one_hang_does_not_stall_the_pool():
    limits = SandboxLimits(timeout=1.5, test_timeout=0.5)
    hang = returns_one("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n")
    jobs = [hang] + [returns_one()] * 6
    with SandboxPool(limits, workers=2) as pool:
        started = time.perf_counter()
        results = pool.run(jobs)
        elapsed = time.perf_counter() - started
    assert results[0].status == "timeout" and all(r.all_passed for r in results[1:])
    # the six quick ones ran on the other worker meanwhile: one timeout in all, not two
    assert elapsed < limits.timeout + 1.0
    assert max(r.seconds for r in results[1:]) < 0.75
