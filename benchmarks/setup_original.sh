#!/usr/bin/env bash
# Install the ORIGINAL library (PyPI comlrl==1.4.3, same import name `comlrl` as ours) in its
# own virtual environment, for benchmarks/bench_original.py and benchmarks/compare_original.py.
#
#   benchmarks/setup_original.sh                          # -> benchmarks/.venv-original
#   PYTHON=python3.11 benchmarks/setup_original.sh DIR    # another interpreter or folder
#
# comlrl 1.4.3 declares datasets, numpy, openai, packaging, pyyaml, tqdm, transformers and
# wandb, and no torch. Its trainers import torch, transformers, datasets, wandb, tqdm and
# numpy; openai is never imported (its API calls go through urllib). So comlrl goes in with
# --no-deps, and the packages it imports go in beside it at the versions requirements-dev.txt
# pins (read as a constraints file): both sides run the same torch (the 2.13.0 CPU wheel,
# no CUDA build) and transformers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/benchmarks/.venv-original}"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -c "$root/requirements-dev.txt" \
    torch transformers datasets wandb tqdm numpy pyyaml packaging
"$venv/bin/python" -m pip install --no-deps comlrl==1.4.3
"$venv/bin/python" -I -c "
import importlib.metadata as m
print('original library ready:', ', '.join(f'{p} {m.version(p)}' for p in ('comlrl', 'torch', 'transformers')))
"
