"""torchrun entry point for tests/test_distributed.py (``-m tests.ddp_worker ALGORITHM OUT
PER_DEVICE_ROWS``): every rank runs tests.helpers.run_ddp_worker."""

import sys

from tests.helpers import run_ddp_worker

if __name__ == "__main__":
    run_ddp_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
