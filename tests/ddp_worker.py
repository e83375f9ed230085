"""torchrun entry point for tests/test_distributed.py and tests/test_sharding.py (``-m
tests.ddp_worker ALGORITHM OUT PER_DEVICE_ROWS [SHARDING [CHECKPOINT]]``): every rank runs
tests.helpers.run_ddp_worker, or, given a CHECKPOINT, run_resume_worker."""

import sys

from tests.helpers import run_ddp_worker, run_resume_worker

if __name__ == "__main__":
    algorithm, out, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sharding = sys.argv[4] if len(sys.argv) > 4 else "replicate"
    if len(sys.argv) > 5:
        run_resume_worker(algorithm, out, rows, sharding, sys.argv[5])
    else:
        run_ddp_worker(algorithm, out, rows, sharding=sharding)
