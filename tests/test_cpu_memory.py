"""Freed CPU memory kept in the process while a trainer trains: glibc told so and told back
once, nested calls and the user's own allocator settings left alone, a freed block reused
without page faults, and ``train()`` inside it unless the config says no; AdamW's state in
place before the first step."""

import os
import resource
import subprocess
import sys

import pytest

from comlrl.utils import cpu_memory
from comlrl.utils.cpu_memory import GLIBC_MMAP_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD, TRIM_THRESHOLD_AFTER

from .helpers import length_sum, make_trainer, small_config


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def untuned_environment(monkeypatch):
    """No allocator settings in the environment (which would make the trainer leave glibc alone)."""
    for name in [name for name in os.environ if name.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)


@pytest.fixture
def libc(monkeypatch, untuned_environment):
    fake = FakeLibc()
    monkeypatch.setattr(cpu_memory, "glibc", lambda: fake)
    return fake


KEEP = [("mallopt", M_MMAP_MAX, 0), ("mallopt", M_TRIM_THRESHOLD, -1)]
RESTORE = [("mallopt", M_MMAP_MAX, GLIBC_MMAP_MAX), ("mallopt", M_TRIM_THRESHOLD, TRIM_THRESHOLD_AFTER)]


def test_glibc_keeps_freed_memory_inside_and_gets_its_settings_back_after(libc):
    with cpu_memory.kept_freed_memory() as kept:
        assert kept and libc.calls == KEEP
        with cpu_memory.kept_freed_memory() as inner:  # another trainer's train() inside
            assert inner
        assert libc.calls == KEEP
    assert libc.calls == KEEP + RESTORE + [("malloc_trim", 0)]


def test_the_settings_come_back_after_an_error(libc):
    with pytest.raises(KeyError), cpu_memory.kept_freed_memory():
        raise KeyError("step")
    assert libc.calls == KEEP + RESTORE + [("malloc_trim", 0)]
    with cpu_memory.kept_freed_memory() as kept:  # and the next train() keeps memory again
        assert kept
    assert libc.calls[-3:] == RESTORE + [("malloc_trim", 0)]


@pytest.mark.parametrize(
    "variable, value", [("MALLOC_ARENA_MAX", "2"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000")]
)
def test_an_allocator_tuned_by_the_environment_is_left_alone(libc, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with cpu_memory.kept_freed_memory() as kept:
        assert not kept
    assert libc.calls == []


def test_disabled_or_without_glibc_nothing_is_called(libc, monkeypatch):
    with cpu_memory.kept_freed_memory(enabled=False) as kept:
        assert not kept
    assert libc.calls == []
    monkeypatch.setattr(cpu_memory, "glibc", lambda: None)
    with cpu_memory.kept_freed_memory() as kept:
        assert not kept


FAULTS_SCRIPT = """
import resource, torch
from comlrl.utils import cpu_memory

def faults():  # of writing a 64 MiB tensor allocated after two like it were freed
    for _ in range(2):  # the second fits where the first was even when glibc had to grow past its hole
        torch.empty(2**24).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(2**24).fill_(2.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults()
with cpu_memory.kept_freed_memory() as kept:
    inside = faults()
print(kept, default, inside, faults())
"""


@pytest.mark.skipif(cpu_memory.glibc() is None, reason="glibc's allocator only")
def test_a_freed_block_is_reused_without_page_faults(untuned_environment):
    # In a process of its own: its main thread allocates from glibc's main heap, as the
    # trainer's does (pytest's workers may run tests in another thread, whose heaps are
    # too small for such a block).
    run = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], capture_output=True, text=True, check=True)
    out = run.stdout.split()
    kept, default, inside, after = out[0] == "True", *map(int, out[1:])
    pages = 2**26 // resource.getpagesize()
    assert kept
    assert default > pages // 2 and after > pages // 2  # glibc gives a freed 64 MiB block back
    assert inside < pages // 20


@pytest.mark.parametrize("keep", [True, False])
def test_train_runs_with_freed_memory_kept_unless_the_config_says_no(tmp_path, libc, keep):
    seen = []

    def reward(*completions):  # runs in the first rollout, before any optimizer step
        optimizers = trainer.learners.optimizers
        state = all(p in o.state for o in optimizers for group in o.param_groups for p in group["params"])
        seen.append((cpu_memory._active, state))
        return length_sum(*completions)

    trainer = make_trainer(tmp_path, reward_func=reward, args=small_config(tmp_path, keep_freed_cpu_memory=keep))
    trainer.train()
    assert seen and set(seen) == {(keep, True)}
    assert (libc.calls == KEEP + RESTORE + [("malloc_trim", 0)]) is keep
    assert not cpu_memory._active
