"""Command line: ``python -m comlrl plot RUN_DIR [--out FILE]``."""

from __future__ import annotations

import argparse
import sys

from comlrl.metrics.plot import draw_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m comlrl", description="comlrl tools")
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="write a PNG of a run's reward, completion length and loss curves")
    plot.add_argument("run_dir", help="the run's output_dir (holds metrics.jsonl)")
    plot.add_argument(
        "--out", default=None, help="PNG path (default: RUN_DIR/metrics.png; give one when RUN_DIR is read-only)"
    )
    args = parser.parse_args(argv)
    try:
        out, steps = draw_run(args.run_dir, args.out)
        print(f"{out} ({steps} training steps drawn)")
    except (OSError, ValueError, ImportError) as error:  # OSError: a log or PNG path it cannot read or write
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
