"""Entry point for tests/test_faults.py's kill -9 loop (``-m tests.fault_worker OUT_DIR
WEIGHTS_FILE``): runs tests.helpers.run_killable."""

import sys

from tests.helpers import run_killable

if __name__ == "__main__":
    run_killable(sys.argv[1], sys.argv[2])
