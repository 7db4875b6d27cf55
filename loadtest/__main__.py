"""``python -m loadtest``: the performance engineer's tool and the project's demo.

Layer: ROOT. The only place in the load test that reads the environment
(``TESSERA_DATA``: the folder with the shared traces). Subcommands grow with the
servers; today: ``demo`` (the cluster-model self-check).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster.clock import SystemClock
from loadtest import demo
from loadtest.traces import DEFAULT_DATA_DIR

EXAMPLES = """\
examples:
  python -m loadtest demo                  # the self-check on the openb trace
  python -m loadtest demo --max-pods 2000  # a shorter run
  python -m loadtest.bench_cache --nodes 5000 --pods 150000
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description="Play the cluster around Tessera and measure it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("TESSERA_DATA", DEFAULT_DATA_DIR)),
        help="folder with the shared traces (default: $TESSERA_DATA or ../shared/data)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="the cluster-model self-check")
    demo_parser.add_argument("--max-pods", type=int, default=None)
    args = parser.parse_args(argv)

    if args.command == "demo":
        report = demo.run(SystemClock(), args.data, max_pods=args.max_pods)
        print("\n".join(report.lines()))
        if report.placed == 0:
            print("error: nothing was placed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
