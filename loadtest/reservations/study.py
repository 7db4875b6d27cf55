"""``python -m loadtest reservations``: large gangs against a busy cluster, with and
without reservations and backfill, on the openb traces (issue 24).

Layer: I/O + ROOT (reads the trace CSVs, runs seeds on worker processes, prints the
table, writes JSON; ``main`` is the command). The workload, the simulated cluster, the
policies and the figures are the sub-package's PURE modules; Tessera's reservations are
``extender.reservations`` itself. Must not change what it measures: every policy gets
the same arrivals for a seed.

    python -m loadtest reservations
    python -m loadtest reservations --trace gpuspec20 --seeds 42-51 --json resv.json

Each seed: the trace's GPU pods arrive as single pods and gangs at ``--load`` of the
cluster's GPUs for ``--hours`` (measured), then go on arriving until every measured job
has started or the tail ends; per policy, medians over the seeds of each seed's
figures (``loadtest.reservations.summary``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from extender.reservations import ReservationRules
from loadtest.inputs.seeds import parse_seeds
from loadtest.inputs.traces import (
    DEFAULT_DATA_DIR,
    OPENB_POD_VARIANTS,
    TraceMissing,
    read_openb_nodes,
    read_openb_pods,
)
from loadtest.reservations.engine import simulate
from loadtest.reservations.policies import POLICIES
from loadtest.reservations.summary import Figures, document, run_figures, table
from loadtest.reservations.workload import TraceWithoutTimes, WorkloadSpec, trace_jobs

DEFAULT_POLICIES: Final = ("none", "tessera", "easy")


@dataclass(frozen=True, slots=True)
class Task:
    data_dir: Path
    trace: str
    policy: str
    seed: int
    spec: WorkloadSpec
    max_reservations: int


def run_task(task: Task) -> tuple[str, int, Figures, float]:
    """One seed of one policy: (policy, seed, figures, seconds)."""
    started = time.perf_counter()
    nodes = read_openb_nodes(task.data_dir)
    pool = trace_jobs(read_openb_pods(task.data_dir, task.trace), task.spec.max_hours)
    rules = ReservationRules(max_reservations=task.max_reservations)
    result = simulate(nodes, pool, task.spec, task.seed, task.policy, rules=rules)
    return task.policy, task.seed, run_figures(result), time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or args.trace not in OPENB_POD_VARIANTS:
        print(
            f"python -m loadtest reservations: unknown policy or trace: "
            f"{', '.join(unknown) or args.trace}",
            file=sys.stderr,
        )
        return 2
    spec = WorkloadSpec(
        load=args.load,
        gang_share=args.gang_share,
        limit_factor=args.limit_factor,
        hours=args.hours,
        max_hours=args.max_hours,
        tail_hours=args.tail_hours,
    )
    try:
        # read once here so that a missing or timeless trace is said once, not per worker
        trace_jobs(read_openb_pods(args.data, args.trace), spec.max_hours)
        read_openb_nodes(args.data)
    except (TraceMissing, TraceWithoutTimes) as exc:
        print(f"python -m loadtest reservations: {exc}", file=sys.stderr)
        return 2
    seeds = parse_seeds(args.seeds)
    tasks = [
        Task(args.data, args.trace, p, seed, spec, args.max_reservations)
        for seed in seeds
        for p in policies
    ]
    started = time.perf_counter()
    per_policy = _run_all(tasks, args.processes)
    elapsed = time.perf_counter() - started
    config = _config(args, spec, seeds)
    found = document({p: per_policy[p] for p in policies}, config)
    print(_heading(args, spec, seeds))
    print("\n".join(table(found["policies"])))
    print(f"\n{len(tasks)} runs in {elapsed:.0f} s on {args.processes} processes")
    if args.json is not None:
        args.json.write_bytes(jsonio.dumps(found))
        print(f"json: {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest reservations",
        description="Gang waits, job waits and GPU allocation on an openb trace, with no "
        "reservations (none), Tessera's reservations with backfill (tessera) and EASY "
        "backfilling (easy), on the same arrivals.",
        epilog="\n\n".join(__doc__.split("\n\n")[2:]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = WorkloadSpec()
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("TESSERA_DATA", DEFAULT_DATA_DIR)),
        help="folder with the shared traces (default: $TESSERA_DATA or ../shared/data)",
    )
    parser.add_argument(
        "--trace", default="default", help="openb pod list variant (default %(default)s)"
    )
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 (default) or 42,45")
    parser.add_argument(
        "--policies", default=",".join(DEFAULT_POLICIES), help="default %(default)s"
    )
    add = parser.add_argument
    add(
        "--load",
        type=float,
        default=defaults.load,
        help="GPU demand offered / GPUs (default %(default)s)",
    )
    add(
        "--gang-share",
        type=float,
        default=defaults.gang_share,
        help="of the demand, in gangs (default %(default)s)",
    )
    add(
        "--limit-factor",
        type=float,
        default=defaults.limit_factor,
        help="time limit / duration (default %(default)s)",
    )
    add(
        "--hours",
        type=float,
        default=defaults.hours,
        help="measured arrival window (default %(default)s)",
    )
    add(
        "--max-hours",
        type=float,
        default=defaults.max_hours,
        help="durations cut here (default %(default)s)",
    )
    add("--tail-hours", type=float, default=None, help="default: the longest time limit")
    add(
        "--max-reservations",
        type=int,
        default=ReservationRules().max_reservations,
        help="tessera: gangs holding a reservation at once (default %(default)s)",
    )
    add("--processes", type=int, default=2)
    add("--json", type=Path, default=None, help="write the figures here")
    return parser


def _run_all(tasks: Sequence[Task], processes: int) -> dict[str, list[Figures]]:
    """The tasks on ``processes`` forked workers, progress on stderr; each policy's
    figures in seed order."""
    found: dict[str, dict[int, Figures]] = {}
    with get_context("fork").Pool(max(1, processes)) as pool:
        for done, (policy, seed, figures, seconds) in enumerate(
            pool.imap_unordered(run_task, tasks), start=1
        ):
            found.setdefault(policy, {})[seed] = figures
            p99 = figures["gang16_p99_wait_s"]
            print(
                f"[{done}/{len(tasks)}] {policy} seed {seed}: gang16 p99 "
                f"{'-' if p99 is None else f'{p99 / 3600:.1f} h'}, "
                f"allocation {figures['mean_allocation_pct']:.2f} %, {seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return {p: [by_seed[s] for s in sorted(by_seed)] for p, by_seed in found.items()}


def _config(args: argparse.Namespace, spec: WorkloadSpec, seeds: Sequence[int]) -> dict[str, Any]:
    return {
        "trace": args.trace,
        "seeds": list(seeds),
        **asdict(spec),
        "stop_hours": spec.stop_s / 3600.0,
        "max_reservations": args.max_reservations,
        "overrun_grace_s": ReservationRules().overrun_grace / timedelta(seconds=1),
    }


def _heading(args: argparse.Namespace, spec: WorkloadSpec, seeds: Sequence[int]) -> str:
    return (
        f"== reservations on openb {args.trace}: load {spec.load:g}, gangs "
        f"{spec.gang_share:.0%} of it, time limits {spec.limit_factor:g} x duration, "
        f"{spec.hours:g} h measured (stop at {spec.stop_s / 3600:g} h), seeds "
        f"{seeds[0]}-{seeds[-1]} ({len(seeds)}), medians over seeds"
    )
