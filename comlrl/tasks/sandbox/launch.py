"""Starting a sandboxed program, feeding it, reading it and killing what is left of it."""

from __future__ import annotations

import contextlib
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

from . import isolation
from .limits import Job, SandboxLimits, SandboxResult

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
# A pure-Python module the harness does not load itself: the probe sees whether the program
# can import from the standard library it is shown.
PROBE = Job("import colorsys\ndef f():\n    return 1\n", "f", ("def check(c):\n    assert c() == 1\n",))
PROBE_TIMEOUT = 30.0
"""Seconds the interpreter check may take at least, whatever the jobs' ``timeout``: a cold start
of an interpreter on a loaded machine can take longer than a job is allowed, and the check
asks whether it runs, not how fast."""

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
    """Runs one ``Job`` at a time in a fresh limited process (see ``comlrl.tasks.sandbox``)."""

    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self.ids = _resolve_user(self.limits.user)
        self.namespace = self._namespace()
        self.python = self._choose_python()

    def describe(self) -> str:
        who = "the trainer's user" if self.ids is None else f"uid {self.ids[0]}"
        return (
            f"{self.python} as {who}, {self.limits.isolation} isolation, "
            f"{self.limits.timeout:g} s per program, {self.limits.test_timeout:g} s per test"
        )

    def _namespace(self) -> dict | None:
        """What the harness needs to unshare, or None under plain process isolation."""
        if self.limits.isolation == "process":
            return None
        problem = isolation.namespace_problem()
        if problem is not None:
            raise isolation.unavailable(problem)
        return {"user": os.geteuid() != 0, "work_bytes": self.limits.work_bytes}

    def _choose_python(self) -> str:
        if self.limits.python is not None:
            candidates = [self.limits.python]
        elif self.ids is None or self.namespace is not None:
            candidates = [sys.executable]
        else:
            candidates = [sys.executable, "/usr/bin/python3"]
        failures = []
        for python in candidates:
            probe = self._run(PROBE, python, timeout=max(self.limits.timeout, PROBE_TIMEOUT))
            if probe.all_passed:
                return python
            failures.append(f"{python}: {probe.status}, exit {probe.returncode}, {probe.error or probe.output[:200]!r}")
        if self.namespace is not None and any("namespace set-up failed" in failure for failure in failures):
            raise isolation.unavailable("; ".join(failures))
        user = "the trainer's user" if self.ids is None else f"uid {self.ids[0]}"
        raise RuntimeError(
            f"no interpreter runs a trivial program in the sandbox as {user}: {'; '.join(failures)}. "
            "Pass SandboxLimits(python=...) with one that user can execute, or user=None."
        )

    def run(self, job: Job) -> SandboxResult:
        return self._run(job, self.python)

    def _run(self, job: Job, python: str, timeout: float | None = None) -> SandboxResult:
        limits = self.limits
        nonce = secrets.token_hex(16)
        # The first part reaches the program's process too; the tests and the marker are read by
        # the judge only after it has forked the program (see harness.py).
        program = json.dumps({
            "program": job.program,
            "entry_point": job.entry_point,
            "helper": job.helper,
            "limits": {_RLIMITS[name]: getattr(limits, name) for name in _RLIMITS},
            "namespace": self.namespace,
            "switch": self.ids,
        }).encode()  # fmt: skip
        tests = json.dumps({"nonce": nonce, "tests": list(job.tests), "test_timeout": limits.test_timeout}).encode()
        started = time.perf_counter()
        with self._folder() as (home, tmp):
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8"}
            try:
                process = subprocess.Popen(
                    [python, "-I", "-S", HARNESS],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=home if self.namespace is None else "/",
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as error:
                return _failed(f"could not start {python}: {error}", started)
            try:
                data = b"%10d" % len(program) + program + tests
                deadline = started + (limits.timeout if timeout is None else timeout)
                status, raw = _exchange(process, data, deadline, limits.output_bytes)
            finally:
                _kill_group(process)
        result = _parse(raw.decode("utf-8", "replace"), nonce, len(job.tests), status, process.returncode, started)
        return dataclasses.replace(result, pid=process.pid)

    @contextlib.contextmanager
    def _folder(self):
        """(HOME, TMPDIR) of the program: its tmpfs under namespaces, else a fresh host folder
        owned by its user, deleted after."""
        if self.namespace is not None:
            yield "/work", "/tmp"
            return
        with tempfile.TemporaryDirectory(prefix="comlrl-sandbox-") as home:
            if self.ids is not None:
                os.chown(home, *self.ids)
            yield home, home


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
