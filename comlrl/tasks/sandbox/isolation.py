"""What isolation this machine allows, found when a sandbox is built, and the error when it
allows less than was asked for (never a silent downgrade)."""

from __future__ import annotations

import os
import sys

PROCESS_ONLY_RISKS = (
    "it shares the trainer's network (a program can open sockets), the host's files (it reads "
    "what its user may read and writes /tmp and /dev/shm), the installed packages (a dataset's "
    "answers among them) and the process table (a process that calls setsid outlives it; "
    "without a user switch it can signal the trainer and its neighbours)"
)


def namespace_problem() -> str | None:
    """Why this machine cannot give each program namespaces of its own, or None when it
    seems to (the probe run of ``Sandbox`` settles the rest). Root unshares directly; an
    ordinary user needs unprivileged user namespaces."""
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces exist on Linux only (this is {sys.platform})"
    if not os.path.exists("/proc/self/ns/net"):
        return "the kernel has no network namespaces (/proc/self/ns/net is missing)"
    if os.geteuid() == 0:
        return None
    for path, refusing in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        try:
            with open(path, encoding="ascii") as file:
                value = file.read().strip()
        except OSError:
            continue
        if value == refusing:
            setting = path.removeprefix("/proc/sys/").replace("/", ".")
            return f"unprivileged user namespaces are disabled ({setting}={value})"
    return None


def unavailable(reason: str) -> RuntimeError:
    return RuntimeError(
        f"the sandbox cannot isolate programs with Linux namespaces: {reason}. Allow them (run as "
        "root, or enable unprivileged user namespaces), or accept plain process isolation "
        f"explicitly with SandboxLimits(isolation='process'), which does not protect against this: "
        f"{PROCESS_ONLY_RISKS}."
    )
