"""Benchmark of the scheduler extender at fleet scale (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts servers, prints a
report). Must not be imported by the servers or run by pytest.

The parts: ``extender_cluster`` (the cluster file and the requests), ``extender_micro``
(in-process timings and the sweep), ``extender_drive`` (the servers over HTTP: per-verb
runs and the cycle); this module runs them in order and prints the comparisons.

``python -m loadtest.bench.extender [--nodes 5000 --pods 150000 --duration 8]``:

1. writes a cluster file: HGX nodes (8 GPUs, islands ``0-3,4-7``) with zone / block /
   rack / hostname labels (four levels), and pods mostly bound (``loadtest.bench.cache``'s
   shapes: shares, single GPUs, a few 4- and 8-GPU gangs), the rest pending;
2. in-process micro-timings of each stage of a request (decode, filter core, score
   core, encode, whole verb, bind plan): CPU-bound loops that a noisy machine slows but
   does not confuse with queueing;
3. starts ``python -m extender --cluster-file``, the naive
   ``loadtest.bench.baseline_extender`` and the floor (the baseline with ``--canned``:
   answers from the names alone, the latency this machine and this load generator give a
   server that decides nothing), side by side on one core, and drives them one at a time,
   open-loop (coordinated-omission-safe) over HTTP/1.1: ``/filter`` and ``/prioritize``
   with a 1-GPU pod and 500 or all node names (``nodeCacheCapable: true``; ``/filter``'s
   pod new at each request, ``/prioritize``'s the one kube-scheduler filtered before it,
   as it always is), each run cut in ``--turns`` parts the servers take in turn, so that a
   slow spell of the machine falls on all of them; then each server's sustained filter →
   prioritize → bind cycle of pending pods at ``--cycle-rate`` pods/s, with per-verb
   service times. Issue 22 sets the extender's ``/filter`` and ``/prioritize`` at 500
   names within ``FLOOR_MULTIPLE`` times the floor's p99;
4. a sweep of in-process filter / prioritize over 1k, 2.5k, 5k, 10k nodes: time per node.

Latencies are from the intended send time (open loop); p50/p90/p99/p99.9 per verb, the
ratio to the baseline measured in the same run, and the server's RSS.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Final

import uvloop

from cluster.clock import Clock, SystemClock
from loadtest.bench.cache import GPUS_PER_NODE
from loadtest.bench.extender_cluster import LEVELS, Cluster, write_cluster
from loadtest.bench.extender_drive import ClientPauses, Server, fmt, pinned_server, serve_and_drive
from loadtest.bench.extender_micro import config_of, load_cache, micro, sweep
from loadtest.measure.pinned import fixed_work_seconds
from loadtest.measure.stats import Histogram, Summary
from server import heap

TARGETS_MS: Final = {"filter 500": 2.0, "filter 5000": 8.0, "prioritize 500": 2.0}
FLOOR_MULTIPLE: Final = 2.0
"""The most the extender's p99 may be, as a multiple of the floor's, for these runs."""
FLOOR_TARGETS: Final = ("filter 500", "prioritize 500")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.extender")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per open-loop run")
    parser.add_argument("--rate-500", type=float, default=100.0, help="requests/s with 500 names")
    parser.add_argument("--rate-all", type=float, default=20.0, help="requests/s with all names")
    parser.add_argument("--cycle-rate", type=float, default=300.0, help="pods/s of the cycle")
    parser.add_argument(
        "--warm-cycle", type=float, default=5.0, help="seconds of cycle at 100/s before it"
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=4,
        help="parts each per-verb run is cut in, the servers taking turns (1: one after the other)",
    )
    parser.add_argument("--micro-budget", type=float, default=1.0, help="seconds per micro-timing")
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the server and this load generator (0); on a shared machine a "
        "negative value (root only) keeps co-tenants from taking the pinned cores",
    )
    parser.add_argument("--sweep", default="1000,2500,5000,10000", help="node counts ('' skips)")
    parser.add_argument("--skip", default="", help="comma list of: micro,http,floor,baseline,sweep")
    args = parser.parse_args(argv)
    if args.nodes < 500:
        parser.error(f"--nodes {args.nodes}: at least 500, the per-verb runs send 500 names")
    if args.turns < 1:
        parser.error(f"--turns {args.turns}: at least 1")
    return args


Results = dict[str, dict[str, Summary]]
"""Per server, per measurement (``filter 500``, ``cycle``, ``cpu cycle``, ``rss``...)."""


def run(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> None:
    skip = set(filter(None, args.skip.split(",")))
    os.sched_setaffinity(0, {args.client_core})
    if args.nice:
        if args.nice < 0 and os.geteuid() != 0:
            raise SystemExit("python -m loadtest.bench.extender: a negative --nice needs root")
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    with tempfile.TemporaryDirectory() as folder_name, ExitStack():
        folder = Path(folder_name)
        began = clock.monotonic()
        cluster = write_cluster(folder / "cluster.json", args.nodes, args.pods, args.seed)
        say(
            f"cluster: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.pods} pods "
            f"({cluster.bound} bound, {len(cluster.pending)} pending), levels {LEVELS}; "
            f"written in {clock.monotonic() - began:.1f} s"
        )
        _machine(args, clock, say)
        if "micro" not in skip:
            _micro(args, cluster, clock, say)
        if "http" not in skip:
            results = _over_http(_servers(args, cluster, folder, skip), args, cluster, clock, say)
            _ratios(results, say)
            _cycles(results, args, say)
            if results.get("extender"):
                _targets(results, args, say)
        sizes = [int(s) for s in args.sweep.split(",") if s]
        if sizes and "sweep" not in skip:
            say("\n== scaling sweep, in process, 1-GPU pod, all names, whole verb p50")
            for line in sweep(
                sizes, args.pods // max(1, args.nodes), args.seed, clock, args.micro_budget
            ):
                say(line)


def _machine(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> None:
    """How steady this machine's cores are: the floor under every percentile below."""
    say(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    say("\n== this machine: one fixed CPU-bound task of about 3 ms, 500 times per core, ms")
    for core in sorted({args.client_core, args.server_core}):
        steadiness = Histogram.of(fixed_work_seconds(core, clock))
        say(f"core {core}: {fmt(steadiness.summary())}")


def _micro(
    args: argparse.Namespace, cluster: Cluster, clock: Clock, say: Callable[[str], None]
) -> None:
    config = config_of()
    cache = load_cache(cluster.path, clock, config)
    say(f"\n== in-process micro-timings (client core {args.client_core}), ms")
    # the server's garbage collection policy, so that its pauses are the server's
    with heap.short_pauses():
        timings = micro(cache, cluster, config, clock, args.micro_budget)
    for what, summary in timings:
        say(f"{what:<66} {fmt(summary)}")
    del cache
    gc.collect()


def _servers(
    args: argparse.Namespace, cluster: Cluster, folder: Path, skip: set[str]
) -> list[tuple[str, Server]]:
    """The floor (canned answers), the naive baseline and the extender, in that order."""
    cluster_file = ["--cluster-file", str(cluster.path)]
    servers = []
    if "floor" not in skip:
        floor = pinned_server(
            "floor", "loadtest.bench.baseline_extender", [*cluster_file, "--canned"], args, folder
        )
        servers.append(("floor", floor))
    if "baseline" not in skip:
        baseline = pinned_server(
            "baseline", "loadtest.bench.baseline_extender", cluster_file, args, folder
        )
        servers.append(("baseline", baseline))
    extender = pinned_server(
        "extender",
        "extender",
        [*cluster_file, "--topology-levels", LEVELS, "--log-level", "WARNING"],
        args,
        folder,
        metrics=True,
    )
    servers.append(("extender", extender))
    return servers


def _over_http(
    servers: list[tuple[str, Server]],
    args: argparse.Namespace,
    cluster: Cluster,
    clock: Clock,
    say: Callable[[str], None],
) -> Results:
    """The servers started side by side on the server core and driven one at a time:
    an idle one takes no CPU from the one driven."""
    names = ", ".join(name for name, _ in servers)
    say(
        f"\n== over HTTP: {names} on core {args.server_core}, driven one at a time, the "
        f"per-verb runs in {args.turns} turns each; open loop, latency from intended send, ms"
    )
    own = ClientPauses()
    # The load generator on uvloop, and under the servers' collector policy, as the
    # servers are: its own stalls would add to every latency it measures.
    with ExitStack() as running, heap.short_pauses(record=own):
        full = own.restart()  # the one made on entry, over all it holds
        for _, server in servers:
            server.start(running)
        results = uvloop.run(serve_and_drive(servers, cluster, args, clock=clock, say=say))
    say(
        f"the load generator's longest collection pauses: {own.line()} "
        f"(a full one over all it holds: {full * 1e3:.0f} ms)"
    )
    return results


def _ratios(results: Results, say: Callable[[str], None]) -> None:
    for against in ("baseline", "floor"):
        if against in results and "extender" in results:
            _ratios_to(results["extender"], results[against], against, say)


def _ratios_to(
    ours_all: dict[str, Summary], theirs: dict[str, Summary], name: str, say: Callable[[str], None]
) -> None:
    say(f"\n== extender / {name} (p50 and p99 ratios, same run)")
    for key, ours in ours_all.items():
        base = theirs.get(key)
        if key.startswith("cpu ") and base is not None and base.p50 > 0:
            say(
                f"{key[4:]:<20} server CPU {ours.p50 * 1e3:.2f} vs "
                f"{base.p50 * 1e3:.2f} ms/request: {ours.p50 / base.p50:5.2f}x"
            )
            continue
        if key == "rss" or base is None or base.p99 <= 0:
            continue
        say(f"{key:<20} p50 {ours.p50 / base.p50:5.2f}x   p99 {ours.p99 / base.p99:5.2f}x")


def _cycles(results: Results, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    say(f"\n== the cycle at {args.cycle_rate:.0f} pods/s, same run")
    for name, summaries in results.items():
        cycle, cpu = summaries["cycle"], summaries["cpu cycle"]
        if cycle.count == 0:
            say(f"{name:<10} no samples (too few pending pods for the cycle?)")
            continue
        say(
            f"{name:<10} p50 {cycle.p50 * 1e3:7.3f}  p99 {cycle.p99 * 1e3:7.3f} ms; "
            f"server CPU {cpu.p50 * 1e3:.2f} ms per pod"
        )


def _targets(results: Results, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    ext = results["extender"]
    say("\n== targets (extender, p99)")
    targets = {
        **TARGETS_MS,
        "prioritize " + str(args.nodes): 8.0,
        "cycle bind": 1.0,
        "cycle": 10.0,
    }
    for key, limit in targets.items():
        got = ext.get(key)
        if got is not None and got.count == 0:
            say(f"{key:<20} no samples (too few pending pods for the cycle?)")
        elif got is not None:
            say(
                f"{key:<20} p99 {got.p99 * 1e3:7.3f} ms  target <= {limit} ms  "
                f"{'met' if got.p99 * 1e3 <= limit else 'NOT met'}"
            )
    floor = results.get("floor")
    if floor is not None and floor["cycle"].count:
        # a target the floor misses cannot be shown on this machine by any server
        got_ms, limit = floor["cycle"].p99 * 1e3, targets["cycle"]
        say(
            f"{'cycle, floor':<20} p99 {got_ms:7.3f} ms  target <= {limit} ms  "
            + (
                "met by a server that decides nothing"
                if got_ms <= limit
                else "NOT met by a server that decides nothing: out of this machine's reach"
            )
        )
    if floor is not None:
        for key in FLOOR_TARGETS:
            ours, base = ext.get(key), floor.get(key)
            if ours is None or base is None or base.p99 <= 0:
                continue
            multiple = ours.p99 / base.p99
            say(
                f"{key + ' / floor':<20} p99 {multiple:7.2f}x     target <= {FLOOR_MULTIPLE}x     "
                f"{'met' if multiple <= FLOOR_MULTIPLE else 'NOT met'} "
                f"({ours.p99 * 1e3:.3f} vs {base.p99 * 1e3:.3f} ms)"
            )
    say(
        f"{'RSS':<20} {ext['rss'].p50:7.0f} MB  target <= 250 MB  "
        f"{'met' if ext['rss'].p50 <= 250 else 'NOT met'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run(args, SystemClock(), lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
