"""torchrun entry point for tests/test_distributed.py (``-m tests.ddp_worker ALGORITHM OUT
PER_DEVICE_ROWS [SHARDING]``): every rank runs tests.helpers.run_ddp_worker."""

import sys

from tests.helpers import run_ddp_worker

if __name__ == "__main__":
    sharding = sys.argv[4] if len(sys.argv) > 4 else "replicate"
    run_ddp_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), sharding=sharding)
