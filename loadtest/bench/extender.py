"""Benchmark of the scheduler extender at fleet scale (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts servers, prints a
report). Must not be imported by the servers or run by pytest.

``python -m loadtest.bench.extender [--nodes 5000 --pods 150000 --duration 8]``:

1. writes a cluster file: HGX nodes (8 GPUs, islands ``0-3,4-7``) with zone / block /
   rack / hostname labels (four levels), and pods mostly bound (``loadtest.bench.cache``'s
   shapes: shares, single GPUs, a few 4- and 8-GPU gangs), the rest pending;
2. in-process micro-timings of each stage of a request (decode, filter core, score
   core, encode, whole verb, bind plan): CPU-bound loops that a noisy machine slows but
   does not confuse with queueing;
3. starts ``python -m extender --cluster-file`` and the naive
   ``loadtest.bench.baseline_extender``, each pinned to one core (one after the other, never
   side by side), and drives them open-loop (coordinated-omission-safe) over HTTP/1.1:
   ``/filter`` and ``/prioritize`` with a 1-GPU pod and 500 or all node names
   (``nodeCacheCapable: true``), then the sustained filter → prioritize → bind cycle of
   pending pods at ``--cycle-rate`` pods/s, with per-verb service times. Before them the
   baseline with ``--canned`` (the floor: answers from the names alone) runs the cycle
   alone: the latency this machine and this load generator give a server that decides
   nothing;
4. a sweep of in-process filter / prioritize over 1k, 2.5k, 5k, 10k nodes: time per node.

Latencies are from the intended send time (open loop); p50/p90/p99/p99.9 per verb, the
ratio to the baseline measured in the same run, and the server's RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import uvloop

from cluster import jsonio
from cluster import labels as keys
from cluster.cache import ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.feed import CacheFeed
from extender import decide, verbs, wire
from extender.config import ExtenderConfig
from extender.memo import DecisionCache
from extender.settings import ExtenderSettings
from loadtest.bench.cache import BLOCK_LABEL, GPUS_PER_NODE, RACK_LABEL, write_fleet
from loadtest.measure.openloop import (
    Http1Connection,
    RequestFailed,
    RunResult,
    Schedule,
    run_open_loop,
)
from loadtest.measure.pinned import Pinned, fixed_work_seconds, free_port, proc_cpu_s, proc_memory
from loadtest.measure.stats import Histogram, Scraped, Summary, scrape_histogram
from server import heap

ZONE_LABEL: Final = "topology.tessera.dev/zone"
BLOCKS_PER_ZONE: Final = 4
LEVELS: Final = f"zone={ZONE_LABEL},block={BLOCK_LABEL},rack={RACK_LABEL},hostname={keys.HOSTNAME}"
MIB: Final = 1024 * 1024
TARGETS_MS: Final = {"filter 500": 2.0, "filter 5000": 8.0, "prioritize 500": 2.0}


# ---------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    path: Path
    names: list[str]
    pending: list[dict[str, Any]]
    """Pending GPU pods as JSON, in arrival order (what the cycle schedules)."""
    bound: int


def write_cluster(path: Path, nodes: int, pods: int, seed: int) -> Cluster:
    """The fleet of ``bench_cache`` with a fourth level (zone) above block."""
    names: list[str] = []
    pending: list[dict[str, Any]] = []

    def add_zone(node: dict[str, Any]) -> None:
        node_labels = node["metadata"]["labels"]
        block = int(node_labels[BLOCK_LABEL][1:])
        node_labels[ZONE_LABEL] = f"z{block // BLOCKS_PER_ZONE:02d}"
        names.append(node["metadata"]["name"])

    bound, _ = write_fleet(path, nodes, pods, seed, label_node=add_zone, on_pending=pending.append)
    return Cluster(path, names, pending, bound)


def probe_pod(gpus: int = 1, milli: int = 0) -> dict[str, Any]:
    """The pod of the per-verb runs: one GPU (or a share), not in the cache, no gang.
    Without a resourceVersion, so that each request decodes it, as a new pod's would."""
    resource = keys.GPU_RESOURCE if gpus else keys.GPU_MILLI_RESOURCE
    amount = str(gpus or milli)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe-0",
            "namespace": "team-00",
            "uid": "20000000-0000-4000-8000-000000000000",
            "labels": {keys.QUEUE_NAME: "research"},
        },
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "activeDeadlineSeconds": 3600,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:2026.01",
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", resource: amount},
                        "limits": {resource: amount},
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def args_body(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    return jsonio.dumps({"Pod": pod, "NodeNames": list(names), "Nodes": None})


# ---------------------------------------------------------------------------- in process


def config_of() -> ExtenderConfig:
    return ExtenderSettings(topology_levels=LEVELS).to_config()  # type: ignore[arg-type]


def load_cache(path: Path, clock: Clock, config: ExtenderConfig) -> ClusterCache:
    cache = ClusterCache(clock)
    CacheFeed(cache, levels=config.level_labels).load_file(path)
    return cache


def timed(clock: Clock, work: Callable[[], object], budget_s: float, at_least: int = 20) -> Summary:
    """Run ``work`` until ``budget_s`` is spent (and ``at_least`` times); its timings.

    A few untimed runs first: the first one fills the memos for its pod shape, a cost
    the cycle and the sweep show, which would otherwise sit in every stage's tail.
    """
    for _ in range(3):
        work()
    times: list[float] = []
    start = clock.monotonic()
    while len(times) < at_least or clock.monotonic() - start < budget_s:
        began = clock.monotonic()
        work()
        times.append(clock.monotonic() - began)
        if len(times) >= 5000:
            break
    return Histogram.of(times).summary()


def micro(
    cache: ClusterCache, cluster: Cluster, config: ExtenderConfig, clock: Clock, budget_s: float
) -> list[tuple[str, Summary]]:
    """Each stage of /filter and /prioritize on their own, then /bind's plan."""
    snapshot = cache.snapshot()
    now = clock.now()
    memo = DecisionCache(config)  # the server keeps one per config, across requests
    rng = random.Random(7)
    rows: list[tuple[str, Summary]] = []

    def stage(label: str, work: Callable[[], object]) -> None:
        rows.append((label, timed(clock, work, budget_s)))

    for shape, pod_json in (("1 GPU", probe_pod(1)), ("share 200m", probe_pod(0, 200))):
        for count in (500, len(cluster.names)):
            names = (
                cluster.names if count >= len(cluster.names) else rng.sample(cluster.names, count)
            )
            body = args_body(pod_json, names)
            args = wire.decode_extender_args(body)
            pod, candidates = args.pod, args.node_names or ()
            outcome = decide.filter_nodes(snapshot, pod, candidates, config, now, memo=memo)
            scores = decide.prioritize(snapshot, pod, outcome.fits, config, now, memo=memo)
            fits_body = args_body(pod_json, outcome.fits)
            tag = f"{shape}, {count} names"
            stage(f"decode ExtenderArgs ({tag})", partial(wire.decode_extender_args, body))
            stage(
                f"filter core ({tag})",
                partial(decide.filter_nodes, snapshot, pod, candidates, config, now, memo=memo),
            )
            stage(f"encode filter result ({tag})", partial(wire.encode_filter, args, outcome))
            stage(
                f"/filter whole verb ({tag})",
                partial(verbs.handle_filter, body, snapshot, config, now, memo=memo),
            )
            stage(
                f"score core, {len(outcome.fits)} fitting ({tag})",
                partial(decide.prioritize, snapshot, pod, outcome.fits, config, now, memo=memo),
            )
            stage(
                f"encode priorities ({tag})", partial(wire.encode_priorities, outcome.fits, scores)
            )
            stage(
                f"/prioritize whole verb, all names ({tag})",
                partial(verbs.handle_prioritize, body, snapshot, config, now, memo=memo),
            )
            stage(
                f"/prioritize whole verb, fitting only ({tag})",
                partial(verbs.handle_prioritize, fits_body, snapshot, config, now, memo=memo),
            )
    # bind plans of pending pods (shares, whole GPUs, gang members) on a node they fit
    plans: list[bytes] = []
    for pod_json in cluster.pending[:200]:
        meta = pod_json["metadata"]
        args = wire.decode_extender_args(args_body(pod_json, cluster.names[:500]))
        outcome = decide.filter_nodes(
            snapshot, args.pod, args.node_names or (), config, now, memo=memo
        )
        if outcome.fits:
            binding = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": outcome.fits[0],
            }
            plans.append(jsonio.dumps(binding))
    turn = iter(range(10**9))

    def plan_one() -> object:
        return verbs.plan_bind(plans[next(turn) % len(plans)], snapshot, config, now, memo=memo)

    stage(f"bind plan (verbs.plan_bind, {len(plans)} pending pods)", plan_one)
    return rows


def sweep(
    sizes: Sequence[int], pods_per_node: int, seed: int, clock: Clock, budget_s: float
) -> list[str]:
    """Whole-verb p50 with all names at each fleet size (``pods_per_node`` pods each)."""
    lines = [
        f"{'nodes':>6} {'pods':>7} {'filter p50':>11} {'us/node':>8} "
        f"{'prio p50':>9} {'us/node':>8} {'RSS':>7}"
    ]
    config = config_of()
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            cluster = write_cluster(Path(folder) / "c.json", size, size * pods_per_node, seed)
            cache = load_cache(cluster.path, clock, config)
        view, now = cache.snapshot(), clock.now()
        memo = DecisionCache(config)
        body = args_body(probe_pod(1), cluster.names)
        with heap.short_pauses():  # as the server collects
            f = timed(
                clock,
                partial(verbs.handle_filter, body, view, config, now, memo=memo),
                budget_s,
                10,
            )
            p = timed(
                clock,
                partial(verbs.handle_prioritize, body, view, config, now, memo=memo),
                budget_s,
                10,
            )
        rss = proc_memory(os.getpid()).get("VmRSS", 0) / MIB
        lines.append(
            f"{size:>6} {size * pods_per_node:>7} {f.p50 * 1e3:>9.2f}ms {f.p50 / size * 1e6:>8.2f} "
            f"{p.p50 * 1e3:>7.2f}ms {p.p50 / size * 1e6:>8.2f} {rss:>5.0f}MB"
        )
    return lines


# ---------------------------------------------------------------------------- servers


def pinned_server(
    name: str,
    module: str,
    extra: list[str],
    args: argparse.Namespace,
    folder: Path,
    *,
    metrics: bool = False,
) -> Server:
    """``metrics``: the server has a metrics listener (the extender), given a port."""
    port = free_port()
    metrics_port = free_port() if metrics else 0
    listen = ["--port", str(port)]
    if metrics:
        listen += ["--metrics-port", str(metrics_port)]
    return Server(
        name,
        module,
        [*extra, *listen],
        args.server_core,
        folder / f"{name}.log",
        args.nice,
        port,
        metrics_port=metrics_port,
    )


@dataclass(slots=True)
class Server(Pinned):
    """The extender or the naive baseline, file-fed, on the server core."""

    metrics_port: int = 0
    """Where its ``/metrics`` are (0: it has none, the baselines)."""

    async def ready(self, clock: Clock, deadline_s: float) -> float:
        start = clock.monotonic()
        conn = Http1Connection("127.0.0.1", self.port)
        while clock.monotonic() - start < deadline_s:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail(40)}")
            try:
                answer = await conn.request("GET", "/readyz")
                if answer.status == 200:
                    conn.close()
                    return clock.monotonic() - start
            except OSError:
                pass
            conn.close()
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {deadline_s} s")


class ClientPauses:
    """The load generator's own longest collection pause per generation. Kept in a
    list of floats: it is updated inside the collector's callback."""

    def __init__(self) -> None:
        self.longest = [0.0, 0.0, 0.0]

    def __call__(self, generation: int, seconds: float) -> None:
        self.longest[generation] = max(self.longest[generation], seconds)

    def restart(self) -> float:
        """Forget what was counted; the longest full collection until now."""
        full = self.longest[2]
        self.longest = [0.0, 0.0, 0.0]
        return full

    def line(self) -> str:
        return ", ".join(f"gen {g} {s * 1e3:.1f} ms" for g, s in enumerate(self.longest))


GC_PAUSES: Final = "tessera_extender_gc_pause_seconds"


async def gc_pauses(port: int) -> dict[str, Scraped]:
    """The server's garbage collection pauses so far, by generation, from its metrics
    listener on ``port`` (none for a server that has none: the baselines, port 0)."""
    if not port:
        return {}
    conn = Http1Connection("127.0.0.1", port)
    try:
        answer = await conn.request("GET", "/metrics")
    finally:
        conn.close()
    if answer.status != 200:
        return {}
    return scrape_histogram(answer.body.decode(), GC_PAUSES, "generation")


def gc_line(before: dict[str, Scraped], after: dict[str, Scraped]) -> str | None:
    """The collections made between two scrapes: how many per generation, their total
    and the bucket bound that holds the longest."""
    parts = []
    for generation, now in sorted(after.items()):
        made = now.since(before[generation]) if generation in before else now
        if made.count:
            parts.append(
                f"gen {generation}: {made.count} x, {made.total * 1e3:.0f} ms in all, "
                f"each <= {made.at_most * 1e3:g} ms"
            )
    return "; ".join(parts) or None


async def _post(conn: Http1Connection, path: str, body: bytes) -> Any:
    answer = await conn.request("POST", path, body)
    if answer.status != 200:
        raise RequestFailed(f"http {answer.status}", answer.body[:200].decode(errors="replace"))
    return jsonio.loads(answer.body)


async def verb_run(
    port: int,
    path: str,
    bodies: Sequence[bytes],
    *,
    rate: float,
    duration_s: float,
    clock: Clock,
    connections: int = 4,
) -> RunResult:
    conns = [Http1Connection("127.0.0.1", port) for _ in range(connections)]

    def sender(conn: Http1Connection) -> Callable[[int], Any]:
        async def send(i: int) -> None:
            await _post(conn, path, bodies[i % len(bodies)])

        return send

    for c in conns:  # warm: connections open, first requests out of the way
        for body in bodies[:3]:
            await _post(c, path, body)
    result = await run_open_loop(
        Schedule.for_duration(rate, duration_s), [sender(c) for c in conns], clock
    )
    for c in conns:
        c.close()
    return result


@dataclass
class Cycle:
    result: RunResult
    per_verb: dict[str, Histogram]
    no_fit: int
    bind_errors: int
    bind_error_kinds: dict[str, int]
    """Bind errors by message, node and pod names left out: a GPU another bind of the
    same moment took (the extender re-checks and kube-scheduler retries) or a bug."""


async def cycle_run(
    port: int,
    cluster: Cluster,
    *,
    rate: float,
    duration_s: float,
    clock: Clock,
    offset: int,
    connections: int = 8,
) -> Cycle:
    """kube-scheduler's loop per pending pod: filter 500 names, prioritize the fitting,
    bind the best; open loop at ``rate`` pods/s."""
    rng = random.Random(11)
    count = int(rate * duration_s)
    pods = cluster.pending[offset : offset + count]
    bodies = [args_body(p, rng.sample(cluster.names, min(500, len(cluster.names)))) for p in pods]
    per_verb = {v: Histogram() for v in ("filter", "prioritize", "bind")}
    counts = {"no_fit": 0, "bind_errors": 0}
    kinds: dict[str, int] = {}
    conns = [Http1Connection("127.0.0.1", port) for _ in range(connections)]

    def sender(conn: Http1Connection) -> Callable[[int], Any]:
        async def send(i: int) -> None:
            pod = pods[i % len(pods)]
            t0 = clock.monotonic()
            filtered = await _post(conn, "/filter", bodies[i % len(bodies)])
            t1 = clock.monotonic()
            per_verb["filter"].record(t1 - t0)
            fits = filtered.get("NodeNames") or []
            if not fits:
                counts["no_fit"] += 1
                return
            scores = await _post(conn, "/prioritize", args_body(pod, fits))
            t2 = clock.monotonic()
            per_verb["prioritize"].record(t2 - t1)
            best = max(scores, key=lambda s: s["Score"])["Host"]
            meta = pod["metadata"]
            binding = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": best,
            }
            answer = await _post(conn, "/bind", jsonio.dumps(binding))
            per_verb["bind"].record(clock.monotonic() - t2)
            if answer.get("Error"):
                counts["bind_errors"] += 1
                kind = str(answer["Error"]).replace(meta["name"], "<pod>").replace(best, "<node>")
                kinds[kind] = kinds.get(kind, 0) + 1

        return send

    result = await run_open_loop(Schedule(rate, len(pods)), [sender(c) for c in conns], clock)
    for c in conns:
        c.close()
    return Cycle(result, per_verb, counts["no_fit"], counts["bind_errors"], kinds)


# ---------------------------------------------------------------------------- report


def fmt(s: Summary) -> str:
    return (
        f"n={s.count:<5} p50 {s.p50 * 1e3:7.3f}  p90 {s.p90 * 1e3:7.3f}  "
        f"p99 {s.p99 * 1e3:7.3f}  p99.9 {s.p999 * 1e3:7.3f}  max {s.maximum * 1e3:7.3f} ms"
    )


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
    return args


async def serve_and_drive(
    name: str,
    server: Server,
    cluster: Cluster,
    args: argparse.Namespace,
    *,
    clock: Clock,
    say: Callable[[str], None],
    verb_runs: bool = True,
) -> dict[str, Summary]:
    """Drive one server: the per-verb runs (unless ``verb_runs`` is false), then the
    warm-up cycle and the cycle over the cluster's pending pods from the first, the
    same pods for every server."""
    ready_s = await server.ready(clock, 600)
    say(f"[{name}] ready after {ready_s:.1f} s, RSS {server.rss_mib():.0f} MB")
    rng = random.Random(3)
    pod = probe_pod(1)
    small = [args_body(pod, rng.sample(cluster.names, 500)) for _ in range(20)]
    full = [args_body(pod, cluster.names)]
    out: dict[str, Summary] = {}
    cpu: dict[str, float] = {}
    """Server CPU seconds per request (per pod for the cycle), from /proc."""
    for verb in ("filter", "prioritize") if verb_runs else ():
        for label, bodies, rate in (
            ("500", small, args.rate_500),
            (str(len(cluster.names)), full, args.rate_all),
        ):
            cpu_before = proc_cpu_s(server.pid)
            run = await verb_run(
                server.port, f"/{verb}", bodies, rate=rate, duration_s=args.duration, clock=clock
            )
            key = f"{verb} {label}"
            out[key] = run.latency.summary()
            cpu[key] = (proc_cpu_s(server.pid) - cpu_before) / max(1, run.sent)
            extra = f" errors {dict(run.errors)}" if run.errors else ""
            extra += f" STOPPED: {run.stopped}" if run.stopped else ""
            say(
                f"[{name}] /{key:<16} @{rate:>4.0f}/s {fmt(out[key])}{extra}; "
                f"server CPU {cpu[key] * 1e3:.2f} ms/request"
            )
    say(f"[{name}] RSS after verbs {server.rss_mib():.0f} MB")
    offset = 0
    if args.warm_cycle > 0:
        # a server that has run a while: the nodes' memos hold the pending pods' shapes
        warm = await cycle_run(
            server.port, cluster, rate=100.0, duration_s=args.warm_cycle, clock=clock, offset=offset
        )
        say(
            f"[{name}] warm-up cycle @100 pods/s for {args.warm_cycle:.0f} s: "
            f"{fmt(warm.result.latency.summary())}"
        )
        offset += int(100 * args.warm_cycle)
    gc_before = await gc_pauses(server.metrics_port)
    cpu_before = proc_cpu_s(server.pid)
    client_before = proc_cpu_s(os.getpid())
    cycle = await cycle_run(
        server.port,
        cluster,
        rate=args.cycle_rate,
        duration_s=args.duration,
        clock=clock,
        offset=offset,
    )
    cpu["cycle"] = (proc_cpu_s(server.pid) - cpu_before) / max(1, cycle.result.sent)
    busy = cpu["cycle"] * cycle.result.sent / max(cycle.result.elapsed_s, 1e-9)
    # the load generator shares the machine: near a whole core, it adds its own queueing
    client_busy = (proc_cpu_s(os.getpid()) - client_before) / max(cycle.result.elapsed_s, 1e-9)
    out["cycle"] = cycle.result.latency.summary()
    extra = f" errors {dict(cycle.result.errors)}" if cycle.result.errors else ""
    extra += f" STOPPED: {cycle.result.stopped}" if cycle.result.stopped else ""
    say(
        f"[{name}] cycle @{args.cycle_rate:.0f} pods/s, achieved "
        f"{cycle.result.achieved_rate:.0f}/s, no fit {cycle.no_fit}, "
        f"bind errors {cycle.bind_errors}{extra}; server CPU {cpu['cycle'] * 1e3:.2f} ms "
        f"per pod ({busy:.0%} of its core; load generator {client_busy:.0%} of its own)"
    )
    for kind, count in sorted(cycle.bind_error_kinds.items(), key=lambda kv: -kv[1])[:5]:
        say(f"[{name}]   bind error x{count}: {kind[:160]}")
    say(f"[{name}]   whole cycle (from intended) {fmt(out['cycle'])}")
    for verb, hist in cycle.per_verb.items():
        out[f"cycle {verb}"] = hist.summary()
        say(f"[{name}]   {verb:<10} (service)      {fmt(out[f'cycle {verb}'])}")
    collected = gc_line(gc_before, await gc_pauses(server.metrics_port))
    if collected is not None:
        say(f"[{name}]   garbage collection in the cycle: {collected}")
    say(f"[{name}] RSS at end {server.rss_mib():.0f} MB")
    out["rss"] = Summary(1, 0, 0, server.rss_mib(), 0, 0, 0, 0)
    for key, seconds in cpu.items():
        out[f"cpu {key}"] = Summary(1, 0, 0, seconds, 0, 0, 0, 0)
    return out


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
        say(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
        say("\n== this machine: one fixed CPU-bound task of about 3 ms, 500 times per core, ms")
        for core in sorted({args.client_core, args.server_core}):
            steadiness = Histogram.of(fixed_work_seconds(core, clock))
            say(f"core {core}: {fmt(steadiness.summary())}")
        if "micro" not in skip:
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
        results: dict[str, dict[str, Summary]] = {}
        if "http" not in skip:
            servers = []
            if "floor" not in skip:
                servers.append(
                    (
                        "floor",
                        pinned_server(
                            "floor",
                            "loadtest.bench.baseline_extender",
                            ["--cluster-file", str(cluster.path), "--canned"],
                            args,
                            folder,
                        ),
                    )
                )
            if "baseline" not in skip:
                servers.append(
                    (
                        "baseline",
                        pinned_server(
                            "baseline",
                            "loadtest.bench.baseline_extender",
                            ["--cluster-file", str(cluster.path)],
                            args,
                            folder,
                        ),
                    )
                )
            servers.append(
                (
                    "extender",
                    pinned_server(
                        "extender",
                        "extender",
                        [
                            "--cluster-file",
                            str(cluster.path),
                            "--topology-levels",
                            LEVELS,
                            "--log-level",
                            "WARNING",
                        ],
                        args,
                        folder,
                        metrics=True,
                    ),
                )
            )
            for name, server in servers:
                say(
                    f"\n== {name} over HTTP: server on core {args.server_core}, open loop, "
                    "latency from intended send, ms"
                )
                own = ClientPauses()
                # The load generator on uvloop, and under the servers' collector policy, as
                # the servers are: its own stalls would add to every latency it measures.
                with ExitStack() as one, heap.short_pauses(record=own):
                    full = own.restart()  # the one made on entry, over all it holds
                    server.start(one)
                    results[name] = uvloop.run(
                        serve_and_drive(
                            name,
                            server,
                            cluster,
                            args,
                            clock=clock,
                            say=say,
                            verb_runs=name != "floor",
                        )
                    )
                say(
                    f"[{name}] the load generator's longest collection pauses: {own.line()} "
                    f"(a full one over all it holds: {full * 1e3:.0f} ms)"
                )
            if "baseline" in results and "extender" in results:
                say("\n== extender / baseline (p99 ratio, same run)")
                for key, ours in results["extender"].items():
                    base = results["baseline"].get(key)
                    if key.startswith("cpu ") and base is not None and base.p50 > 0:
                        say(
                            f"{key[4:]:<20} server CPU {ours.p50 * 1e3:.2f} vs "
                            f"{base.p50 * 1e3:.2f} ms/request: {ours.p50 / base.p50:5.2f}x"
                        )
                        continue
                    if key == "rss" or base is None or base.p99 <= 0:
                        continue
                    say(
                        f"{key:<20} p50 {ours.p50 / base.p50:5.2f}x   "
                        f"p99 {ours.p99 / base.p99:5.2f}x"
                    )
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
            ext = results.get("extender")
            if ext:
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
                            else "NOT met by a server that decides nothing: "
                            "out of this machine's reach"
                        )
                    )
                say(
                    f"{'RSS':<20} {ext['rss'].p50:7.0f} MB  target <= 250 MB  "
                    f"{'met' if ext['rss'].p50 <= 250 else 'NOT met'}"
                )
        sizes = [int(s) for s in args.sweep.split(",") if s]
        if sizes and "sweep" not in skip:
            say("\n== scaling sweep, in process, 1-GPU pod, all names, whole verb p50")
            for line in sweep(
                sizes, args.pods // max(1, args.nodes), args.seed, clock, args.micro_budget
            ):
                say(line)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run(args, SystemClock(), lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
