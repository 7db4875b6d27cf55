"""The extender (or a baseline) over HTTP: started pinned to the server core, then driven
open loop, per verb and through kube-scheduler's filter → prioritize → bind cycle, with
its CPU from ``/proc`` and its collection pauses from its metrics.

Layer: I/O (processes, sockets, ``/proc``; time from the injected ``Clock``). Part of
``bench-extender``; must not judge the answers beyond what the cycle needs (the fitting
names, the best score, a bind's error).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from cluster.clock import Clock
from loadtest.bench.extender_cluster import Cluster, args_body, probe_pod
from loadtest.measure.openloop import (
    Http1Connection,
    RequestFailed,
    RunResult,
    Schedule,
    run_open_loop,
)
from loadtest.measure.pinned import Pinned, proc_cpu_s
from loadtest.measure.stats import Histogram, Scraped, Summary, scrape_histogram
from loadtest.ports import free_port


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


def fmt(s: Summary) -> str:
    return (
        f"n={s.count:<5} p50 {s.p50 * 1e3:7.3f}  p90 {s.p90 * 1e3:7.3f}  "
        f"p99 {s.p99 * 1e3:7.3f}  p99.9 {s.p999 * 1e3:7.3f}  max {s.maximum * 1e3:7.3f} ms"
    )


@dataclass(frozen=True, slots=True)
class _Drive:
    """One server being driven, and where its figures go."""

    name: str
    server: Server
    cluster: Cluster
    args: argparse.Namespace
    clock: Clock
    say: Callable[[str], None]
    out: dict[str, Summary]
    cpu: dict[str, float]
    """Server CPU seconds per request (per pod for the cycle), from /proc."""


async def serve_and_drive(
    servers: Sequence[tuple[str, Server]],
    cluster: Cluster,
    args: argparse.Namespace,
    *,
    clock: Clock,
    say: Callable[[str], None],
) -> dict[str, dict[str, Summary]]:
    """Drive the started servers, one at a time: the per-verb runs in turns
    (``_verb_turns``), then each server's warm-up cycle and cycle over the cluster's
    pending pods from the first, the same pods for every server."""
    waits = await asyncio.gather(*(server.ready(clock, 600) for _, server in servers))
    drives = []
    for (name, server), ready_s in zip(servers, waits, strict=True):
        say(f"[{name}] ready after {ready_s:.1f} s, RSS {server.rss_mib():.0f} MB")
        drives.append(_Drive(name, server, cluster, args, clock, say, {}, {}))
    await _verb_turns(drives, args.turns)
    for drive in drives:
        say(f"[{drive.name}] RSS after verbs {drive.server.rss_mib():.0f} MB")
    for drive in drives:
        await _cycles(drive)
    return {drive.name: drive.out for drive in drives}


async def _cycles(drive: _Drive) -> None:
    name, server, args, clock, say = drive.name, drive.server, drive.args, drive.clock, drive.say
    offset = 0
    if args.warm_cycle > 0:
        # a server that has run a while: the nodes' memos hold the pending pods' shapes
        warm = await cycle_run(
            server.port,
            drive.cluster,
            rate=100.0,
            duration_s=args.warm_cycle,
            clock=clock,
            offset=offset,
        )
        say(
            f"[{name}] warm-up cycle @100 pods/s for {args.warm_cycle:.0f} s: "
            f"{fmt(warm.result.latency.summary())}"
        )
        offset += int(100 * args.warm_cycle)
    await _cycle(drive, offset)
    say(f"[{name}] RSS at end {server.rss_mib():.0f} MB")
    out = drive.out
    out["rss"] = Summary(1, 0, 0, server.rss_mib(), 0, 0, 0, 0)
    for key, seconds in drive.cpu.items():
        out[f"cpu {key}"] = Summary(1, 0, 0, seconds, 0, 0, 0, 0)


def _verb_bodies(
    cluster: Cluster, args: argparse.Namespace
) -> list[tuple[str, str, list[bytes], float]]:
    """/filter and /prioritize alone, with 500 names and with all of them: (the path,
    the figure's key, the bodies sent in turn, requests a second)."""
    rng = random.Random(3)
    samples = [rng.sample(cluster.names, 500) for _ in range(20)]
    # /filter's pod is new at each request; /prioritize's is the pod kube-scheduler
    # filtered just before, same resourceVersion: the extender has it decoded already
    pods = {"filter": probe_pod(1), "prioritize": probe_pod(1, version="1")}
    runs = []
    for verb, pod in pods.items():
        some = [args_body(pod, names) for names in samples]
        runs.append((f"/{verb}", f"{verb} 500", some, args.rate_500))
        if len(cluster.names) != len(samples[0]):  # else the same run, under the same key
            everyone = [args_body(pod, cluster.names)]
            runs.append((f"/{verb}", f"{verb} {len(cluster.names)}", everyone, args.rate_all))
    return runs


async def _verb_turns(drives: Sequence[_Drive], turns: int) -> None:
    """Each per-verb run cut in ``turns`` parts, the servers taking turns (in the
    opposite order every other time). This machine is shared, and its speed drifts over
    seconds: run one after the other, a slow spell falls on one server's figures and
    the ratios between servers carry it; in turns, it falls on all of them alike."""
    first = drives[0]
    for path, key, bodies, rate in _verb_bodies(first.cluster, first.args):
        latency = {drive.name: Histogram() for drive in drives}
        cpu = dict.fromkeys(latency, 0.0)
        sent = dict.fromkeys(latency, 0)
        errors: dict[str, Counter[str]] = {name: Counter() for name in latency}
        stopped = dict.fromkeys(latency, "")
        for turn in range(turns):
            for drive in drives if turn % 2 == 0 else drives[::-1]:
                name, pid = drive.name, drive.server.pid
                before = proc_cpu_s(pid)
                run = await verb_run(
                    drive.server.port,
                    path,
                    bodies,
                    rate=rate,
                    duration_s=drive.args.duration / turns,
                    clock=drive.clock,
                )
                cpu[name] += proc_cpu_s(pid) - before
                sent[name] += run.sent
                latency[name].merge(run.latency)
                errors[name].update(run.errors)
                stopped[name] = stopped[name] or run.stopped
        for drive in drives:
            name = drive.name
            drive.out[key] = latency[name].summary()
            drive.cpu[key] = cpu[name] / max(1, sent[name])
            extra = f" errors {dict(errors[name])}" if errors[name] else ""
            extra += f" STOPPED: {stopped[name]}" if stopped[name] else ""
            drive.say(
                f"[{name}] /{key:<16} @{rate:>4.0f}/s {fmt(drive.out[key])}{extra}; "
                f"server CPU {drive.cpu[key] * 1e3:.2f} ms/request"
            )


async def _cycle(drive: _Drive, offset: int) -> None:
    """The cycle at ``--cycle-rate`` from pending pod ``offset`` on: latency per verb,
    CPU per pod, bind errors and the server's collections."""
    name, server, args, say, out = drive.name, drive.server, drive.args, drive.say, drive.out
    gc_before = await gc_pauses(server.metrics_port)
    cpu_before = proc_cpu_s(server.pid)
    client_before = proc_cpu_s(os.getpid())
    cycle = await cycle_run(
        server.port,
        drive.cluster,
        rate=args.cycle_rate,
        duration_s=args.duration,
        clock=drive.clock,
        offset=offset,
    )
    drive.cpu["cycle"] = (proc_cpu_s(server.pid) - cpu_before) / max(1, cycle.result.sent)
    busy = drive.cpu["cycle"] * cycle.result.sent / max(cycle.result.elapsed_s, 1e-9)
    # the load generator shares the machine: near a whole core, it adds its own queueing
    client_busy = (proc_cpu_s(os.getpid()) - client_before) / max(cycle.result.elapsed_s, 1e-9)
    out["cycle"] = cycle.result.latency.summary()
    extra = f" errors {dict(cycle.result.errors)}" if cycle.result.errors else ""
    extra += f" STOPPED: {cycle.result.stopped}" if cycle.result.stopped else ""
    say(
        f"[{name}] cycle @{args.cycle_rate:.0f} pods/s, achieved "
        f"{cycle.result.achieved_rate:.0f}/s, no fit {cycle.no_fit}, "
        f"bind errors {cycle.bind_errors}{extra}; server CPU {drive.cpu['cycle'] * 1e3:.2f} ms "
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
