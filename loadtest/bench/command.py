"""How a benchmark runs as a command: progress on stderr, the report on stdout and as
JSON, exit 1 with the reason when it cannot be measured; a temporary folder for its files.

Layer: ROOT (prints, writes files). Shared by ``webhook``, ``against_kueue`` and
``overload``; must not measure or judge anything itself.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from cluster import jsonio
from cluster.clock import Clock, SystemClock
from loadtest.measure.pinned import BenchError


@contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A folder of the run's own (policy, certificates, logs), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Reported(Protocol):
    """What a benchmark's ``run`` returns: its report as lines and as JSON."""

    def lines(self) -> Iterable[str]: ...
    def to_json(self) -> dict[str, Any]: ...


def run_and_report(
    prog: str,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, Clock, Callable[[str], None]], Reported],
) -> int:
    """A benchmark's command: progress on stderr, the report on stdout (and as JSON to
    ``args.json``), exit 1 with the reason when it cannot be measured."""
    try:
        report = run(args, SystemClock(), lambda line: print(line, file=sys.stderr, flush=True))
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    if args.json is not None:
        args.json.write_bytes(jsonio.dumps_pretty(report.to_json()))
    return 0
