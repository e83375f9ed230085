"""What a sandboxed program may use (``SandboxLimits``), what it is given (``Job``) and what
running it showed (``SandboxResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field

ISOLATIONS = ("namespace", "process")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed program; every field is checked when the sandbox is built."""

    timeout: float = 5.0
    """Wall-clock seconds for the whole process (start-up, program, every test)."""
    test_timeout: float = 1.0
    """Seconds for the program's top level and for each test, kept by the judge (the program
    cannot stop that clock); after one test times out the rest are failed without running (a
    program that hangs on one input likely hangs on all, and each would cost this much)."""
    cpu_seconds: int = 5
    """RLIMIT_CPU: CPU seconds of the program's process."""
    memory_bytes: int = 1 << 30
    """RLIMIT_AS: address space; an allocation past it raises MemoryError in the program."""
    file_bytes: int = 1 << 20
    """RLIMIT_FSIZE: the largest file the program may write."""
    processes: int = 32
    """RLIMIT_NPROC: processes and threads of the program's user (the kernel ignores it for
    root; in a user namespace, as for a trainer that is not root, each program counts its own)."""
    output_bytes: int = 64 << 10
    """Bytes of output (stdout and stderr together) read; past them the program is killed."""
    user: str | int | None = "auto"
    """User the program runs as: a name or uid (switching needs root), None for the
    trainer's own user, or ``"auto"``: ``nobody`` when the trainer runs as root, else None."""
    python: str | None = None
    """Interpreter for the programs. None: the trainer's own (``sys.executable``); with
    ``isolation="process"`` and a user switch, ``/usr/bin/python3`` when that user cannot read
    the trainer's standard library (one under ``/root``). Probed once when the sandbox is
    built; none working is an error."""
    isolation: str = "namespace"
    """``"namespace"``: each program in Linux namespaces of its own (network, PID, mount, IPC,
    UTS; see ``comlrl.tasks.sandbox``); building the sandbox fails where the kernel refuses them.
    ``"process"``: plain process isolation, which shares the network, the host's files and the
    process table with the trainer (chosen explicitly, never as a fallback)."""
    work_bytes: int = 64 << 20
    """Size of the program's tmpfs (working folder and ``/tmp``) under ``"namespace"``."""

    def __post_init__(self):
        for name in ("timeout", "test_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 3600:
                raise ValueError(f"SandboxLimits.{name} must be a number of seconds in (0, 3600), got {value!r}")
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "processes", "output_bytes", "work_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be an integer >= 1, got {value!r}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"SandboxLimits.isolation={self.isolation!r}; expected one of {list(ISOLATIONS)}")
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
    """Per test: passed. A test never reported (the process died, timed out, exited) failed."""
    helper_calls: int
    """Calls of the helper during the tests (0 without a helper), as the program's process
    counts them: unlike the verdicts, a hostile program can overstate this number."""
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
