#!/usr/bin/env bash
# Download the wheels that a GPU machine without a package index needs beside its own torch:
# transformers 5.24.0 for benchmarks/gpu_check.py's compiled-decoding cases, and `datasets`
# with the two of its requirements such an image tends to lack, for the examples and the
# tutorial test. About 14 MB, all pure Python, for CPython 3.12 on x86_64 Linux.
#
#     bash benchmarks/gpu_wheels.sh DIR          # here, where PyPI is reachable
#
# There (the repository is on the path, not installed):
#
#     pip install --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site:$PWD
#
# Why each pin:
#   transformers==5.24.0  requirements-dev.txt's. Its decoders take the `cache` argument that
#       comlrl's compiled decoding step passes; 5.17's name it `past_key_values`, and
#       compiled_decoding=True then falls back to the eager loop. It needs huggingface-hub>=1.31,
#       tokenizers>=0.23.1,<0.24, safetensors>=0.8, regex, typer: checked with hub 1.33.0 and
#       tokenizers 0.23.2.
#   datasets==5.2.0  requirements-dev.txt's. comlrl never imports it (its trainers take lists
#       of dicts); examples/*.py (`from datasets import Dataset`) and tests/test_tutorial.py do.
#   dill==0.4.1, multiprocess==0.70.19  the newest datasets 5.2.0 admits (dill<0.4.2,
#       multiprocess<0.70.20). The rest of what it requires must be there already: numpy,
#       pandas, pyarrow>=24, fsspec<=2026.9.0, xxhash, tqdm, filelock, pyyaml, packaging,
#       huggingface-hub>=1.31.
# PYTHON names the interpreter whose pip downloads (default: python3).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/gpu_wheels.sh DIR" >&2
    exit 2
fi
dir=$1
mkdir -p "$dir"
# --no-deps: each requirement the machine lacks is named here, so nothing else it has is
# replaced; the platform tags would let pip pick a manylinux wheel, should a pin need one.
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" \
    transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -l "$dir"/*.whl
du -ch "$dir"/*.whl | tail -n 1
