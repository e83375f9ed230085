#!/usr/bin/env bash
# Install TRL (PyPI trl==1.16.0) in its own virtual environment, for benchmarks/bench_trl.py and
# benchmarks/compare_trl.py.
#
#   benchmarks/setup_trl.sh                          # -> benchmarks/.venv-trl
#   PYTHON=python3.11 benchmarks/setup_trl.sh DIR    # another interpreter or folder
#
# trl 1.16.0 declares accelerate, datasets, packaging and transformers. They go in at the
# versions requirements-dev.txt pins (read as a constraints file), with torch, so that both
# sides run the same torch (the 2.13.0 CPU wheel, no CUDA build) and transformers 5.24.0; pip
# fails here rather than move a pin if trl refuses one. No comlrl goes in: bench_trl.py imports
# only benchmarks/measure.py and benchmarks/workload.py, which do not import it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/benchmarks/.venv-trl}"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -c "$root/requirements-dev.txt" \
    torch transformers accelerate datasets numpy safetensors tokenizers
"$venv/bin/python" -m pip install -c "$root/requirements-dev.txt" trl==1.16.0
"$venv/bin/python" -I -c "
import importlib.metadata as m
print('TRL ready:', ', '.join(f'{p} {m.version(p)}' for p in ('trl', 'torch', 'transformers', 'accelerate', 'datasets')))
"
