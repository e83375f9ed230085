"""Run model-written Python programs and their tests in separate, limited processes.

Model-written code will be wrong, slow or hostile, so it never runs in the trainer's
process. Each program gets:

- its own process (``python -I -S``: no environment variables of Python's, no user or site
  packages), in a new session whose whole process group is killed with SIGKILL when the
  program ends, times out or prints too much, after which no member of the group may be left;
- a wall-clock ``timeout`` for the whole program and a ``test_timeout`` per test (an alarm
  inside the process; the wall clock is the backstop when the program disables it);
- resource limits set before any model code runs: CPU seconds, address space, size of any
  file written, number of processes of the user (the fork bomb);
- a fresh temporary directory as working directory, ``HOME`` and ``TMPDIR``, deleted after;
- an environment of ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG`` only: nothing of the
  trainer's (API keys, tokens) is inherited;
- its output read up to ``output_bytes`` (beyond that it is killed);
- when the trainer runs as root, another user (``nobody`` by default): the limit on
  processes is then enforced (the kernel does not enforce it for root), the program cannot
  signal the trainer or write where that user may not (the trainer's home, the project).

What it does not guarantee: it is no security boundary against a determined attacker.
There is no network, filesystem or PID namespace: the program can read what its user may
read, open sockets, write in world-writable places (``/tmp``, ``/dev/shm``), signal other
sandboxed programs of the same user, and a process that leaves the group (``setsid``) is not
killed (it keeps the CPU and memory limits). Without a user switch (the trainer not root)
the program runs as the trainer's user and can signal or write anything that user can. Its
results come back on its own output with a random marker that a program could find in its
own process's memory and forge. Containers, VMs or seccomp filters are the tools for
untrusted code at scale.

A ``SandboxPool`` runs many programs at once from threads (each thread waits on its
subprocess), so one that hangs costs its own ``timeout`` and stalls no other.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["SandboxLimits", "SandboxResult", "Sandbox", "SandboxPool", "Job"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed program; every field is checked when the sandbox is built."""

    timeout: float = 5.0
    """Wall-clock seconds for the whole process (start-up, program, every test)."""
    test_timeout: float = 1.0
    """Seconds for each test; after one times out the rest are failed without running (a
    program that hangs on one input likely hangs on all, and each would cost this much)."""
    cpu_seconds: int = 5
    """RLIMIT_CPU: CPU seconds of the process (a busy loop that ignores the alarm dies here)."""
    memory_bytes: int = 1 << 30
    """RLIMIT_AS: address space; an allocation past it raises MemoryError in the program."""
    file_bytes: int = 1 << 20
    """RLIMIT_FSIZE: the largest file the program may write."""
    processes: int = 32
    """RLIMIT_NPROC: processes of the program's user (enforced for users other than root)."""
    output_bytes: int = 64 << 10
    """Bytes of output (stdout and stderr together) read; past them the program is killed."""
    user: str | int | None = "auto"
    """User the program runs as: a name or uid (switching needs root), None for the
    trainer's own user, or ``"auto"``: ``nobody`` when the trainer runs as root, else None."""
    python: str | None = None
    """Interpreter for the programs. None: the trainer's own (``sys.executable``) when it
    runs as that user; when switching user, ``sys.executable`` if that user can run it,
    else ``/usr/bin/python3`` (a virtual environment under ``/root`` is not reachable by
    ``nobody``). The choice is probed once when the sandbox is built; none working is an error."""

    def __post_init__(self):
        for name in ("timeout", "test_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 3600:
                raise ValueError(f"SandboxLimits.{name} must be a number of seconds in (0, 3600), got {value!r}")
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "processes", "output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be an integer >= 1, got {value!r}")
        if self.memory_bytes < 64 << 20:
            raise ValueError(
                f"SandboxLimits.memory_bytes must be >= 64 MiB (Python starts in ~20), got {self.memory_bytes}"
            )


@dataclass(frozen=True)
class Job:
    """One program and its tests. ``tests`` are Python sources run one by one after the
    program, each in a copy of the program's namespace; each must define ``check(candidate)``,
    which is called with the namespace's ``entry_point``."""

    program: str
    entry_point: str
    tests: tuple[str, ...] = ()
    helper: str | None = None
    """Name of a helper function whose calls during the tests are counted (None: none)."""


@dataclass(frozen=True)
class SandboxResult:
    """What running a ``Job`` showed. The stages are cumulative: a program that does not
    parse neither defines nor runs anything."""

    parsed: bool
    """The program compiles."""
    defined: bool
    """It has a top-level ``def`` (or ``async def``) of the entry point with a statement
    besides its docstring (a prompt's bare signature defines nothing)."""
    ran: bool
    """Its top level ran without an exception and left the entry point callable."""
    passed: tuple[bool, ...]
    """Per test: passed. A test never reported (the process died, timed out) failed."""
    helper_calls: int
    """Calls of the helper during the tests (0 without a helper)."""
    status: str
    """``finished`` (exited by itself), ``timeout``, ``output_limit``."""
    returncode: int | None
    output: str = field(repr=False)
    """Its output with the result lines removed, at most ``output_bytes`` (for debugging)."""
    seconds: float
    error: str = ""
    """The program's exception (type and message), or the process's failure, when it did not run."""
    pid: int | None = None
    """The process's pid, its process group's id (None when it did not start)."""

    @property
    def tests_passed(self) -> int:
        return sum(self.passed)

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


# The code each sandboxed process runs first, before any model code. Limits are set here,
# not in a Popen preexec_fn: that runs Python between fork and exec, which can deadlock in a
# parent with threads (a trainer has torch's and the pool's), while Popen's own user,
# group and start_new_session need no Python in the child. An unprivileged process cannot
# raise its hard limits again.
HARNESS = r"""
import json, os, resource, signal, sys
spec = json.loads(sys.stdin.read())
sys.stdin.close()
for name, value in spec["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
out = os.dup(1)
mark = spec["nonce"]

def report(*words):
    try:
        os.write(out, ("\n" + mark + " " + " ".join(words) + "\n").encode())
    except OSError:
        pass

class TestTimeout(BaseException):
    pass

def alarm(signum, frame):
    raise TestTimeout()

signal.signal(signal.SIGALRM, alarm)
program, entry = spec["program"], spec["entry_point"]
try:
    import ast
    tree = ast.parse(program)
    code = compile(tree, "<program>", "exec")
except BaseException as error:
    report("error", json.dumps(type(error).__name__ + ": " + str(error)[:200]))
    sys.exit(0)
report("parsed")
def has_body(function):
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)

if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry and has_body(n) for n in tree.body):
    report("defined")
namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
signal.setitimer(signal.ITIMER_REAL, spec["test_timeout"])
try:
    exec(code, namespace)
    ok = callable(namespace.get(entry))
    error = "" if ok else "entry point " + entry + " is not a callable after the program ran"
except BaseException as exc:
    ok, error = False, type(exc).__name__ + ": " + str(exc)[:200]
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
if not ok:
    report("error", json.dumps(error))
    sys.exit(0)
report("ran")
calls = [0]
helper = spec["helper"]
if helper and callable(namespace.get(helper)):
    inner = namespace[helper]
    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)
    namespace[helper] = counted
for index, test in enumerate(spec["tests"]):
    scope = dict(namespace)
    signal.setitimer(signal.ITIMER_REAL, spec["test_timeout"])
    try:
        exec(compile(test, "<test %d>" % index, "exec"), scope)
        scope["check"](namespace[entry])
        verdict = "pass"
    except TestTimeout:
        verdict = "timeout"
    except BaseException:
        verdict = "fail"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    report("test", str(index), verdict, str(calls[0]))
    if verdict == "timeout":
        break
report("done")
# os._exit skips atexit handlers the program may have registered (they could hang or print).
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(0)
"""

_RLIMITS = {
    "cpu_seconds": "RLIMIT_CPU",
    "memory_bytes": "RLIMIT_AS",
    "file_bytes": "RLIMIT_FSIZE",
    "processes": "RLIMIT_NPROC",
}


def _resolve_user(user: str | int | None) -> tuple[int, int] | None:
    """(uid, gid) to switch to, or None to stay the trainer's user."""
    if user == "auto":
        return _resolve_user("nobody") if os.geteuid() == 0 else None
    if user is None:
        return None
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"SandboxLimits.user: no user {user!r} on this machine") from None
    if entry.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise ValueError(f"SandboxLimits.user={user!r}: switching user needs root; pass user=None to run as yourself")
    return entry.pw_uid, entry.pw_gid


class Sandbox:
    """Runs one ``Job`` at a time in a fresh limited process (see the module's docstring)."""

    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self.ids = _resolve_user(self.limits.user)
        self.python = self._choose_python()

    def describe(self) -> str:
        who = "the trainer's user" if self.ids is None else f"uid {self.ids[0]}"
        return f"{self.python} as {who}, {self.limits.timeout:g} s per program, {self.limits.test_timeout:g} s per test"

    def _choose_python(self) -> str:
        if self.limits.python is not None:
            candidates = [self.limits.python]
        elif self.ids is None:
            candidates = [sys.executable]
        else:
            candidates = [sys.executable, "/usr/bin/python3"]
        failures = []
        for python in candidates:
            probe = self._run(Job("def f():\n    return 1\n", "f", ("def check(c):\n    assert c() == 1\n",)), python)
            if probe.all_passed:
                return python
            failures.append(f"{python}: {probe.status}, exit {probe.returncode}, {probe.error or probe.output[:200]!r}")
        user = "the trainer's user" if self.ids is None else f"uid {self.ids[0]}"
        raise RuntimeError(
            f"no interpreter runs a trivial program in the sandbox as {user}: {'; '.join(failures)}. "
            "Pass SandboxLimits(python=...) with one that user can execute, or user=None."
        )

    def run(self, job: Job) -> SandboxResult:
        return self._run(job, self.python)

    def _run(self, job: Job, python: str) -> SandboxResult:
        limits = self.limits
        nonce = secrets.token_hex(16)
        spec = {
            "program": job.program,
            "entry_point": job.entry_point,
            "tests": list(job.tests),
            "helper": job.helper,
            "nonce": nonce,
            "test_timeout": limits.test_timeout,
            "limits": {_RLIMITS[name]: getattr(limits, name) for name in _RLIMITS},
        }
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="comlrl-sandbox-") as home:
            switch = {}
            if self.ids is not None:
                os.chown(home, *self.ids)
                switch = {"user": self.ids[0], "group": self.ids[1], "extra_groups": []}
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
            try:
                process = subprocess.Popen(
                    [python, "-I", "-S", "-c", HARNESS],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=home,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    **switch,
                )
            except OSError as error:
                return _failed(f"could not start {python}: {error}", started)
            try:
                status, raw = _exchange(
                    process, json.dumps(spec).encode(), started + limits.timeout, limits.output_bytes
                )
            finally:
                _kill_group(process)
        result = _parse(raw.decode("utf-8", "replace"), nonce, len(job.tests), status, process.returncode, started)
        return dataclasses.replace(result, pid=process.pid)


def _exchange(process: subprocess.Popen, data: bytes, deadline: float, cap: int) -> tuple[str, bytes]:
    """Feed ``data`` to the process and read its output until it ends, the deadline passes or
    the output passes ``cap`` bytes; returns the status and the output (at most ``cap`` bytes)."""
    stdin, stdout = process.stdin, process.stdout
    os.set_blocking(stdin.fileno(), False)
    os.set_blocking(stdout.fileno(), False)
    chunks, size = [], 0
    with selectors.DefaultSelector() as selector:
        selector.register(stdout, selectors.EVENT_READ)
        if data:
            selector.register(stdin, selectors.EVENT_WRITE)
        else:
            stdin.close()
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return "timeout", b"".join(chunks)[:cap]
            events = selector.select(min(remaining, 0.05))
            if not events and process.poll() is not None:
                # The program exited but a child it left holds the pipe open: no EOF will come.
                return "finished", _drain(stdout.fileno(), chunks, cap)
            for key, _ in events:
                if key.fileobj is stdin:
                    try:
                        written = os.write(stdin.fileno(), data[: 1 << 16])
                    except (BrokenPipeError, BlockingIOError) as error:
                        written = 0 if isinstance(error, BlockingIOError) else len(data)
                    data = data[written:]
                    if not data:
                        selector.unregister(stdin)
                        stdin.close()
                    continue
                chunk = os.read(stdout.fileno(), 1 << 16)
                if not chunk:
                    selector.unregister(stdout)
                    stdout.close()
                    if not stdin.closed:
                        selector.unregister(stdin)
                        stdin.close()
                    try:
                        process.wait(max(deadline - time.perf_counter(), 0.001))
                    except subprocess.TimeoutExpired:
                        return "timeout", b"".join(chunks)
                    return "finished", b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    return "output_limit", b"".join(chunks)[:cap]


def _drain(fd: int, chunks: list[bytes], cap: int) -> bytes:
    size = sum(len(chunk) for chunk in chunks)
    while size <= cap:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:cap]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the program's whole process group, reap the leader, and make sure no live
    member is left (its forked children die with it)."""
    for stream in (process.stdin, process.stdout):
        if stream is not None and not stream.closed:
            stream.close()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the leader exited and no child of it is left in the group
    process.wait()
    for _ in range(50):
        if not live_group_members(process.pid):
            break
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    else:
        raise RuntimeError(f"sandbox process group {process.pid} still has live members after SIGKILL")
    # Killed children are zombies until their new parent (init) reaps them, and zombies still
    # count against the user's RLIMIT_NPROC: the next program could not fork. Give init a moment.
    for _ in range(25):
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that are not zombies (a killed child whose
    new parent has not reaped it yet is dead: it holds no memory and runs nothing)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as file:
                stat = file.read()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(name))
    return members


_RESULT = re.compile(r"^([0-9a-f]{32}) (\w+)(?: (.*))?$")


def _parse(text: str, nonce: str, num_tests: int, status: str, returncode: int | None, started: float) -> SandboxResult:
    events, output = [], []
    for line in text.split("\n"):
        match = _RESULT.match(line)
        if match and match.group(1) == nonce:
            events.append((match.group(2), match.group(3) or ""))
        else:
            output.append(line)
    stages = {kind for kind, _ in events}
    passed = [False] * num_tests
    calls, error = 0, ""
    for kind, rest in events:
        if kind == "test":
            index, verdict, count = rest.split()
            if int(index) < num_tests:
                passed[int(index)] = verdict == "pass"
            calls = int(count)
        elif kind == "error":
            error = json.loads(rest)
    if not error and "done" not in stages:
        error = f"process {status}, exit code {returncode}"
    parsed = "parsed" in stages
    return SandboxResult(
        parsed=parsed,
        defined=parsed and "defined" in stages,
        ran=parsed and "defined" in stages and "ran" in stages,
        passed=tuple(passed),
        helper_calls=calls,
        status=status,
        returncode=returncode,
        output="\n".join(output).strip("\n"),
        seconds=time.perf_counter() - started,
        error=error,
    )


def _failed(error: str, started: float) -> SandboxResult:
    return SandboxResult(False, False, False, (), 0, "not_started", None, "", time.perf_counter() - started, error)


class SandboxPool:
    """Runs many jobs in parallel, each in its own ``Sandbox`` process, from ``workers``
    threads (default: the machine's CPU count). Results come back in the jobs' order."""

    def __init__(self, limits: SandboxLimits | None = None, workers: int | None = None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"SandboxPool workers must be an integer >= 1, got {workers!r}")
        self.sandbox = Sandbox(limits)
        self.workers = workers or os.cpu_count() or 1
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="comlrl-sandbox")

    def run(self, jobs: Sequence[Job]) -> list[SandboxResult]:
        return list(self._executor.map(self.sandbox.run, jobs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
