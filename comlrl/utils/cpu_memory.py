"""Freed CPU memory kept in the process while a trainer trains (glibc's allocator).

Left to itself, glibc hands a freed block back to the kernel when it was allocated with
``mmap`` (every block of 32 MiB and more: LM-head buffers, gradients of the embedding,
optimizer state) or when the free memory at the top of its heap passes its trim threshold
(the update's activations, once freed). Every training step then gets its tensors as fresh
pages, which the kernel maps and zeroes one 4 KiB page at a time as they are first written:
about a million faults per step for two 135M-parameter agents, and in a virtual machine whose
host takes freed pages back each of them costs a fault on the host as well. On the fixed
workload of benchmarks/README.md ("Memory": two agents, two steps, a 2-core CPU) keeping the
memory took the update from 34.5-36.5 s to 27.8-33.6 s, at a 2% lower peak (the tutorial
example, whose lengths vary from step to step: 4% higher, 7.8 against 7.5 GiB).

:func:`kept_freed_memory` has glibc serve every block from its heap and trim nothing while
``train()`` runs, then gives the free memory back to the kernel (``malloc_trim``). The
process's resident memory between steps stays at the step's peak instead of falling back,
and each step reuses the memory of the one before. It does nothing elsewhere than glibc,
inside another trainer's ``train()``, or when the environment tunes the allocator already
(``MALLOC_*`` variables, jemalloc's ``MALLOC_CONF`` among them, or ``glibc.malloc``
tunables): those settings are the user's.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
"""``mallopt`` parameters (glibc's malloc.h)."""

GLIBC_MMAP_MAX = 65536
"""glibc's default for ``M_MMAP_MAX``: how many blocks it may serve by ``mmap`` at once."""

TRIM_THRESHOLD_AFTER = 64 * 2**20
"""The trim threshold set back after training. glibc adapts its thresholds to the blocks it
sees until one is set; this is where its adaptation ends (twice its largest mmap threshold)."""

_active = False


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc with ``mallopt`` and ``malloc_trim``, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None  # musl and others
    return libc


def allocator_tuned_by_environment() -> bool:
    """Whether the environment sets glibc's allocator (``MALLOC_ARENA_MAX``, ``MALLOC_TRIM_THRESHOLD_``, ...)."""
    return any(name.startswith("MALLOC_") for name in os.environ) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


@contextlib.contextmanager
def kept_freed_memory(enabled: bool = True) -> Iterator[bool]:
    """While inside, freed memory stays in the process for the next allocation (see the
    module's docstring); yields whether it does."""
    global _active
    libc = glibc() if enabled and not _active and not allocator_tuned_by_environment() else None
    if libc is None:
        yield _active
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, -1)  # read as a size_t: no limit
    _active = True
    try:
        yield True
    finally:
        _active = False
        libc.mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_AFTER)
        libc.malloc_trim(0)
