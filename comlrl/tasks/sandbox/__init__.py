"""Run model-written Python programs and their tests in separate, isolated processes.

Model-written code will be wrong, slow or hostile, so it never runs in the trainer's process,
and its tests never run in the program's. Each program is two processes
(``harness.py``): a *judge*, which runs no model code, and the *program*, which it forks.

With ``SandboxLimits(isolation="namespace")`` (the default) the judge first unshares Linux
namespaces, and the program gets:

- a network namespace with no interface up: no connection, not even to 127.0.0.1;
- a PID namespace of its own, whose first process it is: it sees no process of the host, the
  trainer, the judge or another program (``kill(-1)`` reaches only its own), and when it ends,
  times out or the judge dies (``PR_SET_PDEATHSIG``) the kernel kills every process in it, a
  ``setsid`` one included;
- a mount namespace whose root is a tmpfs of ``work_bytes`` (its working folder ``/work`` and
  ``/tmp``; at most 4096 files) holding read-only binds of what the interpreter needs: the
  standard library, the system's shared libraries (``/usr/lib``) and ``/dev/null``, ``zero``,
  ``random``, ``urandom``. Every ``site-packages`` and ``dist-packages`` under them is hidden;
  there is no project, no host ``/tmp`` or ``/dev/shm``, no ``/proc``, no shell or other binary;
- IPC and UTS namespaces of its own;
- no privilege: every capability and the bounding set dropped, ``no_new_privs``; as root the
  trainer runs it as ``nobody``, as an ordinary user it runs in a user namespace mapped to the
  trainer's uid;
- resource limits set before any model code: CPU seconds, address space, size of any file
  written, processes (counted per user namespace, so per program when the trainer is not root);
- an environment of ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG`` only;
- a wall-clock ``timeout`` (the trainer kills the judge, and with it everything) and a
  ``test_timeout`` per test that the judge keeps, outside the program's reach; its output is
  read up to ``output_bytes``.

Mechanism: the harness calls ``unshare(2)`` and ``mount(2)`` from libc through ``ctypes`` and
chroots into the tmpfs. That needs nothing installed (bubblewrap is a package CI and users would
need; util-linux ``unshare`` sets up no root view and would cost an extra exec) and works on
Python 3.10+ (``os.unshare`` is 3.12+). Root unshares directly; an ordinary user needs
unprivileged user namespaces, which some distributions restrict. Where the kernel refuses,
building the sandbox raises an error that says why and names ``isolation="process"``, plain
process isolation, which must be chosen explicitly and does not contain network, files or
``setsid`` (``isolation.PROCESS_ONLY_RISKS``).

The rewards: the judge parses the program, then reads the tests and the random result marker
only after the fork, so neither is in any memory the program can read. It runs each ``check``
itself with stubs for the program's functions (never in place of a builtin the test uses,
such as ``abs``); a call goes over a pipe and its value comes
back as tagged plain data (builtin types, checked recursively) that the judge rebuilds, so an
object with its own ``__eq__`` fails, and nothing the program does to its ``builtins``,
``AssertionError`` or harness reaches the judge. A program that exits (at import, in a call)
fails every test not yet run.

What it still does not guarantee: the kernel is shared (a kernel exploit escapes; there is no
seccomp filter), ``helper_calls`` is counted in the program's process and can be overstated,
the program's CPU time and memory (``cpu_seconds``, ``memory_bytes``, tmpfs) are limited but
not its share of the machine, and programs run as ``nobody`` by a root trainer share one process
count, so a fork bomb can make a neighbour's fork fail until it is torn down. With
``isolation="process"`` see the risks above; without a user switch the judge is guarded from
the program only by ``PR_SET_DUMPABLE`` (no ptrace) and the program can signal it.

A ``SandboxPool`` runs many programs at once from threads (each thread waits on its
subprocess), so one that hangs costs its own ``timeout`` and stalls no other.
"""

from .launch import Sandbox, SandboxPool
from .limits import Job, SandboxLimits, SandboxResult

__all__ = ["SandboxLimits", "SandboxResult", "Sandbox", "SandboxPool", "Job"]
