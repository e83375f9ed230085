"""Sandbox overhead per program: a trivial program and one test, run one after another, then
through a pool of 2 workers. ``--module`` times another copy of the sandbox (the one before a
change, e.g. ``git show REV:comlrl/tasks/sandbox.py > /tmp/before.py``) in the same invocation.

    python benchmarks/bench_sandbox.py --runs 100 --module /tmp/before.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path


def load(path: str):
    """The sandbox module at ``path`` (a file, or a package folder), without importing comlrl."""
    file = Path(path)
    folder = [str(file)] if file.is_dir() else None
    name, source = f"sandbox_{len(sys.modules)}", file / "__init__.py" if folder else file
    spec = importlib.util.spec_from_file_location(name, source, submodule_search_locations=folder)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(module, runs: int, **limits) -> dict[str, float]:
    """Milliseconds per program: mean, median, p90 one after another, and per program in a pool."""
    job = module.Job("def f():\n    return 1\n", "f", ("def check(candidate):\n    assert candidate() == 1\n",))
    sandbox = module.Sandbox(module.SandboxLimits(**limits))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        assert sandbox.run(job).all_passed
        times.append(1000 * (time.perf_counter() - started))
    with module.SandboxPool(module.SandboxLimits(**limits), workers=2) as pool:
        started = time.perf_counter()
        assert all(result.all_passed for result in pool.run([job] * runs))
        pooled = 1000 * (time.perf_counter() - started) / runs
    ordered = sorted(times)
    return {"mean": statistics.mean(times), "median": statistics.median(times), "p90": ordered[int(0.9 * runs)],
            "pool": pooled}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--module", help="another sandbox module to time first (the 'before')")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "comlrl" / "tasks" / "sandbox"
    cases = [("before", args.module, {})] if args.module else []
    cases += [("namespace", str(here), {}), ("process", str(here), {"isolation": "process"})]
    for name, path, limits in cases:
        figures = measure(load(path), args.runs, **limits)
        print(f"{name:10s} " + "  ".join(f"{key} {value:.1f} ms" for key, value in figures.items()))


if __name__ == "__main__":
    main()
