"""What one plan of the live extender's reservations costs at fleet scale (a measurement,
not a test).

Layer: ROOT (a script: reads argv, writes a temporary file, prints a table). Must not be
imported by the servers or run by pytest. ``python -m loadtest.bench.reservations_plan
[--nodes 5000 --pods 150000 --plans 5]`` loads ``loadtest.bench.cache``'s fleet (whose
pending pods include 4- and 8-GPU gangs that require one rack) into a ``ClusterCache``
and times what ``extender.reserving.Reserver.plan`` runs on the event loop, with no
``await`` in it: ``extender.holds.next_holds`` on one snapshot (and its parts: finding
the waiting gangs, the pods holding GPUs per node, the plan itself), then the promises
put in the cache. The first plan finds nothing held; the next ones start from what the
previous one held and the plans' memo, ``INTERVAL`` later, after ``--churn`` bound pods
changed, as the live extender's do every ``--reservation-interval``. Bound pods are
given start times in the day before (a running pod has one).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path
from typing import TypeVar

from cluster.cache import ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.files import load_objects
from cluster.model import GangId, PodInfo
from extender.config import ExtenderConfig, levels_from_labels
from extender.holdings import holdings
from extender.holds import Hold, HoldRules, PlanMemo, next_holds
from extender.reservations import ReservationRules, gang_demands
from extender.reserving import idle_gpus
from loadtest.bench.cache import LEVELS, _convert, _Lap, _Stopwatch, _Table, write_fleet
from server.heap import short_pauses

T = TypeVar("T")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
"""Before the fleet's drain windows (2026-12-01), as a live cluster would be."""
INTERVAL = timedelta(seconds=10)
"""Between two plans (the extender's default ``--reservation-interval``)."""


def _timed(clock: Clock, step: Callable[[], T]) -> tuple[T, _Lap]:
    watch = _Stopwatch(clock)
    result = step()
    return result, watch.lap()


def _few_gangs(pods: list[PodInfo], keep: int | None) -> list[PodInfo]:
    """The pods, with the pending members of all but the first ``keep`` waiting gangs
    left out (None: all kept). The fleet's pending gangs all fit on its empty nodes at
    once, which a live cluster's would not wait long to do: a few waiting gangs is the
    case to measure, with every bound pod (the cost of a plan's walks) kept."""
    if keep is None:
        return pods
    placed = {p.demand.gang.id for p in pods if p.node is not None and p.demand.gang is not None}
    kept: set[GangId] = set()
    out = []
    for pod in pods:
        gang = pod.demand.gang
        if pod.node is None and gang is not None and gang.id not in placed:
            if gang.id not in kept and len(kept) >= keep:
                continue
            kept.add(gang.id)
        out.append(pod)
    return out


def _started(pods: list[PodInfo]) -> list[PodInfo]:
    """The pods, each bound one started some time in the day before ``NOW`` (its time
    limit is a day), as the kubelet reports a running pod's ``status.startTime``: the
    fleet file has none, and a plan takes a pod not started to start at its ``now``."""
    return [
        p if p.node is None else replace(p, started_at=NOW - timedelta(seconds=i * 7919 % 86_000))
        for i, p in enumerate(pods)
    ]


def _churn(cache: ClusterCache, count: int, turn: int, now: datetime) -> None:
    """``count`` bound pods (the ``turn``-th lot) restarted at ``now`` on the GPUs they
    hold: what changes between two plans of a busy cluster, pods ending and others
    taking their GPUs."""
    snapshot = cache.snapshot()
    bound = [key for key in snapshot.allocations if snapshot.pods.get(key) is not None]
    if not bound or count <= 0:
        return
    for at in range(turn * count, (turn + 1) * count):
        pod = snapshot.pods[bound[at % len(bound)]]
        cache.upsert_pod(replace(pod, started_at=now))


def run(
    nodes: int,
    pods: int,
    seed: int,
    *,
    plans: int,
    max_reservations: int,
    waiting_gangs: int | None,
    churn: int,
    clock: Clock,
) -> str:
    table = _Table([])
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        path = Path(tmp) / "fleet.json"
        bound, pending = write_fleet(path, nodes, pods, seed)
        node_states, pod_infos = _convert(load_objects(path))
    pod_infos = _started(_few_gangs(pod_infos, waiting_gangs))
    cache = ClusterCache(clock)
    cache.replace_nodes(node_states)
    cache.replace_pods(pod_infos)
    del node_states, pod_infos
    config = ExtenderConfig(levels=levels_from_labels(LEVELS))
    rules = HoldRules(ReservationRules(max_reservations=max_reservations))
    snapshot = cache.snapshot()
    waiting = gang_demands(snapshot, config, NOW)
    table.add("fleet", f"{nodes:,} nodes, {pods:,} GPU pods ({bound:,} bound, {pending:,} pending)")
    table.add("waiting gangs (none of their members placed)", f"{len(waiting):,}")
    table.add("max reservations", str(max_reservations))
    _, lap = _timed(clock, lambda: gang_demands(snapshot, config, NOW))
    table.add("part: the waiting gangs (gang_demands)", lap.ms())
    _, lap = _timed(clock, lambda: holdings(snapshot, NOW))
    table.add("part: pods holding GPUs per node (holdings)", lap.ms())
    with short_pauses(clock):  # the collector as the server runs it (server.heap)
        _plans(cache, config, rules, (plans, churn), clock, table)
    return table.render()


def _plans(  # noqa: PLR0917 - run's state
    cache: ClusterCache,
    config: ExtenderConfig,
    rules: HoldRules,
    counts: tuple[int, int],
    clock: Clock,
    table: _Table,
) -> None:
    plans, churn = counts
    held: dict[GangId, Hold] = {}
    memo = PlanMemo(config)  # kept from one plan to the next, as Reserver keeps it
    turn = count(0)

    def plan() -> int:
        # what Reserver.plan does, the awaits left out, INTERVAL after the last plan
        now = NOW + next(turn) * INTERVAL
        now_held = cache.snapshot()
        holds = next_holds(now_held, config, rules, held, now, memo=memo)
        idle_gpus(now_held, holds.held.values())
        cache.promise(holds.promises())
        held.clear()
        held.update(holds.held)
        return len(holds.held)

    for number in range(1, plans + 1):
        if number > 1:  # (untimed) what changed since the last plan
            _churn(cache, churn, number, NOW + (number - 1) * INTERVAL)
        found, lap = _timed(clock, plan)
        table.add(f"plan {number}: next_holds + idle GPUs + promise ({found} held)", lap.ms())
    table.add("", "")
    for where in ("on the event loop", "in a worker thread (extender.reserving)"):
        stall = asyncio.run(_loop_stall(plan, threaded=where.startswith("in"), clock=clock))
        table.add(f"longest event-loop stall, plan {where}", f"{stall * 1e3:>10,.1f} ms")


async def _loop_stall(plan: Callable[[], object], *, threaded: bool, clock: Clock) -> float:
    """The longest a 1 ms ticker on the loop waited past its due time while ``plan`` ran:
    what a /filter arriving then would wait before the loop reads it."""
    done = asyncio.Event()
    worst = 0.0

    async def tick() -> None:
        nonlocal worst
        while not done.is_set():
            due = clock.monotonic() + 0.001
            await asyncio.sleep(0.001)
            worst = max(worst, clock.monotonic() - due)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    if threaded:
        await asyncio.to_thread(plan)
    else:
        plan()
    await asyncio.sleep(0.01)
    done.set()
    await ticker
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.reservations_plan",
        description="Time one plan of the extender's reservations on a fleet in a cache.",
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plans", type=int, default=5)
    parser.add_argument("--max-reservations", type=int, default=4)
    parser.add_argument(
        "--churn",
        type=int,
        default=100,
        help="bound pods restarted between two plans (default 100)",
    )
    parser.add_argument(
        "--waiting-gangs",
        type=int,
        default=8,
        help="waiting gangs kept of the fleet's pending ones (-1: all; default 8)",
    )
    args = parser.parse_args(argv)
    print(
        run(
            args.nodes,
            args.pods,
            args.seed,
            plans=args.plans,
            max_reservations=args.max_reservations,
            waiting_gangs=None if args.waiting_gangs < 0 else args.waiting_gangs,
            churn=args.churn,
            clock=SystemClock(),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
