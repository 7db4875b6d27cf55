"""Overload curves of one server: what its clients get at 1, 2 and 3 times the rate it
sustains (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts a server and a load
generator process, prints a table). Must not be imported by the servers or run by pytest.

``python -m loadtest overload --server webhook|extender [--rate R] [--multiples 1,2,3]``:

1. starts ``python -m webhook`` (a generated policy of ``--queues`` LocalQueues) or
   ``python -m extender`` (a generated cluster of ``--nodes`` nodes), over TLS with
   fresh certificates, pinned to the server core, its metrics on a listener of their
   own, and waits for ``/readyz``;
2. takes ``--rate`` as the rate it sustains, or finds it: open-loop steps of
   ``--step-duration`` s, up by ``--factor`` until a step fails (an error, achieved
   below 97 % of offered, or p99 above ``--p99-bound-ms``), then ``--refine`` bisections;
   a failed step is run twice before it counts;
3. at each multiple of that rate, runs ``--duration`` s of open-loop load from a
   generator process pinned to the other core, over ``--connections`` keep-alive TLS
   connections (kube-apiserver opens as many as it needs), each request bounded by its
   deadline ``--deadline`` (what the webhook is sent as ``?timeout=``; for the extender,
   kube-scheduler's ``httpTimeout``) counted from when it was due;
4. per multiple: the share answered in time (200 within the deadline: allowed,
   denied, filtered), failed fast (any other answer, or a broken connection, within
   it: what kube-apiserver turns into the failure policy at once) and late (after the
   deadline, or never); the p99 of the answers in time; the server's shed counters by
   reason; its RSS before the run and ``--settle`` s after it.

Issue 20's target: at 3x, nothing late, and the RSS back within 10 % of its baseline
(taken after the search, or a warm-up at the given rate). Everything is bounded: steps,
seconds per step, requests per step and each request; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import uvloop
from prometheus_client.parser import text_string_to_metric_families

from cluster.clock import Clock, SystemClock
from loadtest.bench.command import run_and_report, temporary_folder
from loadtest.bench.extender_cluster import LEVELS, args_body, probe_pod, write_cluster
from loadtest.bench.overload_report import Outcome, Report, ms
from loadtest.bench.review_steps import (
    HEADERS,
    ReviewTemplate,
    check_answer,
    in_generator_process,
    uid_prefix,
    wait_ready,
)
from loadtest.bench.webhook_policy import DEFAULT_CAPTURES as CAPTURES
from loadtest.bench.webhook_policy import load_captured_review, policy_objects, write_policy
from loadtest.measure.openloop import Http1Connection, RequestFailed, RunResult, Schedule, Send
from loadtest.measure.openloop import run_open_loop as open_loop
from loadtest.measure.pinned import (
    SERVER_NAME,
    BenchError,
    Pinned,
    make_certs,
    proc_cpu_s,
    proc_memory,
)
from loadtest.ports import free_port
from server.tls import client_context

# ---------------------------------------------------------------- the load, in its own process


@dataclass(frozen=True, slots=True)
class Load:
    """One open-loop run against the server, as the generator process needs it."""

    server: str
    port: int
    ca: str
    path: str
    rate: float
    duration_s: float
    connections: int
    deadline_s: float
    core: int
    max_requests: int
    template: ReviewTemplate | None = None
    """The webhook's review, a fresh uid each time."""
    bodies: tuple[bytes, ...] = ()
    """The extender's ``/filter`` requests, in turn."""


def _sender(load: Load, connection: Http1Connection) -> Send:
    prefix = uid_prefix()

    async def review(index: int) -> None:
        assert load.template is not None
        uid = f"{prefix}{index:012x}"
        answer = await connection.request("POST", load.path, load.template.body(uid, index))
        check_answer(answer.status, answer.body, uid)

    async def verb(index: int) -> None:
        answer = await connection.request("POST", load.path, load.bodies[index % len(load.bodies)])
        if answer.status != 200:
            raise RequestFailed(f"http-{answer.status}")

    return review if load.template is not None else verb


async def _drive(load: Load) -> tuple[RunResult, float]:
    context = client_context(load.ca)
    connections = [
        Http1Connection(
            "127.0.0.1",
            load.port,
            ssl_context=context,
            server_hostname=SERVER_NAME,
            headers=HEADERS,
        )
        for _ in range(load.connections)
    ]
    senders = [_sender(load, c) for c in connections]
    # Handshakes (and a first request) on every connection before the clock starts.
    for n, send in enumerate(senders):
        try:
            await send(load.max_requests + n)
        except (RequestFailed, OSError):
            connections[n].close()
    schedule = Schedule.for_duration(load.rate, load.duration_s, load.max_requests)
    gc.collect()
    own_before = _own_cpu_s()
    # A request still waiting for a connection after its deadline is late whatever
    # happens next: stop there and count the rest as late.
    run = await open_loop(
        schedule, senders, SystemClock(), timeout_s=load.deadline_s, max_lag_s=load.deadline_s
    )
    own = (_own_cpu_s() - own_before) / max(run.elapsed_s, 1e-9)
    for connection in connections:
        connection.close()
    return run, own


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _generator_process(load: Load, pipe: Connection) -> None:
    os.sched_setaffinity(0, {load.core})
    gc.freeze()
    try:
        pipe.send(("ok", uvloop.run(_drive(load))))
    except Exception as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()


def run_load(load: Load) -> tuple[RunResult, float]:
    """The run, and the share of a CPU the generator itself used (near 1: it, not the
    server, may have been the bottleneck)."""
    bound = load.duration_s + 2 * load.deadline_s + 60
    run, own = in_generator_process(_generator_process, load, bound)
    return run, own


# ---------------------------------------------------------------- the server


@dataclass(slots=True)
class Server(Pinned):
    metrics_port: int = 0

    def rss(self) -> int:
        return proc_memory(self.pid).get("VmRSS", 0)

    async def ready(self, ca: Path, clock: Clock, deadline_s: float = 120.0) -> None:
        await wait_ready(self, ca, clock, deadline_s)

    async def shed(self) -> dict[str, float]:
        """The server's shed counters by reason, from its metrics listener."""
        connection = Http1Connection("127.0.0.1", self.metrics_port)
        try:
            page = (await connection.request("GET", "/metrics")).body.decode()
        finally:
            connection.close()
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            if family.name == f"tessera_{self.name}_shed_requests":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counts[sample.labels["reason"]] = sample.value
        return counts


# ---------------------------------------------------------------- the rate it sustains


def judge(run: RunResult, rate: float, p99_bound_s: float, min_achieved: float) -> str:
    """Why a step does not count as sustained; empty when it does."""
    problems = []
    if run.stopped:
        problems.append("fell behind")
    if run.error_count:
        problems.append(f"{run.error_count} errors")
    if run.ok and run.latency.percentile(99) > p99_bound_s:
        problems.append(f"p99 {ms(run.latency.percentile(99))}")
    if run.achieved_rate < min_achieved * rate:
        problems.append(f"achieved {run.achieved_rate / rate:.0%}")
    return "; ".join(problems)


def find_rate(
    step: Callable[[float], RunResult],
    *,
    start: float,
    factor: float,
    refine: int,
    max_steps: int,
    p99_bound_s: float,
    min_achieved: float,
) -> tuple[float, list[tuple[float, str]]]:
    """Up by ``factor`` until a step fails (twice), then ``refine`` bisections."""
    log: list[tuple[float, str]] = []

    def passes(rate: float) -> bool:
        for _ in range(2):  # a neighbour's burst on a shared machine gets a second chance
            problem = judge(step(rate), rate, p99_bound_s, min_achieved)
            log.append((rate, problem or "sustained"))
            if not problem:
                return True
            if len(log) >= max_steps:
                break
        return False

    good, bad, rate = 0.0, math.inf, start
    while len(log) < max_steps and bad == math.inf:
        if passes(rate):
            good, rate = rate, round(rate * factor)
        else:
            bad = rate
    for _ in range(refine):
        if len(log) >= max_steps or good == 0.0:
            break
        middle = round((good + bad) / 2)
        if middle in (good, bad):
            break
        if passes(middle):
            good = middle
        else:
            bad = middle
    return good, log


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest overload",
        description="Overload curves of one server: in time, failed fast and late at "
        "multiples of the rate it sustains, and its memory after.",
        epilog="examples:\n"
        "  python -m loadtest overload --server webhook\n"
        "  python -m loadtest overload --server extender --rate 300 --duration 8\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--server", choices=("webhook", "extender"), default="webhook")
    add("--rate", type=float, help="the rate it sustains (default: search for it)")
    add("--multiples", default="1,2,3", help="multiples of that rate to run (1,2,3)")
    add("--duration", type=float, default=10.0, help="seconds per multiple (10)")
    add("--deadline", type=float, default=5.0, help="each request's deadline, seconds (5)")
    add("--connections", type=int, default=128, help="keep-alive TLS connections (128)")
    add("--settle", type=float, default=3.0, help="idle seconds before reading RSS (3)")
    add("--search-start", type=float, default=200.0, help="first search rate (200)")
    add("--factor", type=float, default=1.5, help="search: rate multiplier per step (1.5)")
    add("--refine", type=int, default=2, help="search: bisections after the first failure (2)")
    add("--max-steps", type=int, default=12, help="search: steps at most (12)")
    add("--step-duration", type=float, default=4.0, help="search: seconds per step (4)")
    add("--p99-bound-ms", type=float, default=50.0, help="search: p99 bound of a step (50)")
    add("--warmup", type=float, default=3.0, help="with --rate: warm-up seconds at it (3)")
    add("--queues", type=int, default=1000, help="webhook: LocalQueues in the policy (1000)")
    add("--nodes", type=int, default=1000, help="extender: nodes in the cluster (1000)")
    add("--pods", type=int, default=20_000, help="extender: pods in the cluster (20,000)")
    add("--candidates", type=int, default=500, help="extender: node names per /filter (500)")
    add("--max-requests", type=int, default=200_000, help="requests per run at most")
    add("--server-core", type=int, default=0, help="CPU for the server (0)")
    add("--client-core", type=int, default=1, help="CPU for the load generator (1)")
    add("--captures", type=Path, default=CAPTURES, help="folder of the wire captures")
    add("--json", type=Path, help="write the results as JSON here")
    return parser.parse_args(argv)


def _start(args: argparse.Namespace, tmp: Path, stack: ExitStack) -> tuple[Server, Load]:
    """The server, started, and the load (at no rate yet) that drives it."""
    make_certs(tmp / "certs")
    port, metrics_port = free_port(), free_port()
    listen = ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)]
    common = ["--log-level", "WARNING", *listen]
    if args.server == "webhook":
        command, load = _webhook_load(args, tmp, port)
    else:
        command, load = _extender_load(args, tmp, port)
    server = Server(
        args.server,
        args.server,
        [*common, *command],
        args.server_core,
        tmp / f"{args.server}.log",
        0,
        port,
        metrics_port=metrics_port,
    )
    server.start(stack)
    return server, load


def _webhook_load(args: argparse.Namespace, tmp: Path, port: int) -> tuple[list[str], Load]:
    """The webhook's own arguments (TLS, a generated policy) and its load: the captured
    Job's review."""
    certs = tmp / "certs"
    policy = tmp / "policy.yaml"
    write_policy(policy, policy_objects(args.queues))
    tls = ["--tls-cert", str(certs / "webhook.crt"), "--tls-key", str(certs / "webhook.key")]
    template = ReviewTemplate.of(load_captured_review(args.captures))
    load = Load(
        "webhook",
        port,
        str(certs / "ca.crt"),
        f"/mutate?timeout={args.deadline:g}s",
        0.0,
        0.0,
        args.connections,
        args.deadline,
        args.client_core,
        args.max_requests,
        template=template,
    )
    return [*tls, "--policy-file", str(policy)], load


def _extender_load(args: argparse.Namespace, tmp: Path, port: int) -> tuple[list[str], Load]:
    """The extender's own arguments (TLS, a generated cluster file) and its load:
    ``/filter`` with ``--candidates`` names."""
    certs = tmp / "certs"
    cluster = write_cluster(tmp / "cluster.json", args.nodes, args.pods, seed=1)
    tls = ["--tls-cert", str(certs / "extender.crt"), "--tls-key", str(certs / "extender.key")]
    levels = ["--topology-levels", LEVELS, "--request-timeout", f"{args.deadline:g}"]
    rng = random.Random(7)
    bodies = tuple(
        args_body(probe_pod(), rng.sample(cluster.names, min(args.candidates, args.nodes)))
        for _ in range(16)
    )
    load = Load(
        "extender",
        port,
        str(certs / "ca.crt"),
        "/filter",
        0.0,
        0.0,
        args.connections,
        args.deadline,
        args.client_core,
        args.max_requests,
        bodies=bodies,
    )
    return [*tls, "--cluster-file", str(cluster.path), *levels], load


def _at(load: Load, rate: float, duration_s: float) -> Load:
    return Load(
        load.server,
        load.port,
        load.ca,
        load.path,
        rate,
        duration_s,
        load.connections,
        load.deadline_s,
        load.core,
        load.max_requests,
        load.template,
        load.bodies,
    )


def run(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> Report:
    available = os.sched_getaffinity(0)
    if {args.server_core, args.client_core} - available or args.server_core == args.client_core:
        raise BenchError(
            f"need two distinct CPUs for --server-core/--client-core, have {sorted(available)}"
        )
    multiples = [float(m) for m in args.multiples.split(",") if m.strip()]
    report = Report(args.server, args.deadline, args.connections, args.duration)
    # The orchestrator only waits; keep it off the server's core.
    os.sched_setaffinity(0, {args.client_core})
    with temporary_folder("tessera-overload-") as tmp, ExitStack() as stack:
        server, load = _start(args, tmp, stack)
        ca = Path(load.ca)
        uvloop.run(server.ready(ca, clock))
        say(f"{server.name}: ready on 127.0.0.1:{server.port}")

        def step(rate: float, duration_s: float = args.step_duration) -> RunResult:
            result, _ = run_load(_at(load, rate, duration_s))
            say(
                f"  {rate:>8,.0f}/s: ok {result.ok:,}, errors {dict(result.errors)}, p99 "
                f"{ms(result.latency.percentile(99) if result.ok else math.inf)}"
            )
            return result

        _sustained(args, step, report, say)
        uvloop.run(asyncio.sleep(args.settle))
        report.baseline_rss = server.rss()
        for multiple in multiples:
            report.outcomes.append(_at_multiple(args, server, load, report.rate, multiple, say))
    return report


def _sustained(
    args: argparse.Namespace,
    step: Callable[..., RunResult],
    report: Report,
    say: Callable[[str], None],
) -> None:
    """The rate the server sustains: ``--rate`` (after a warm-up), or found by search."""
    if args.rate is None:
        say("searching for the rate it sustains")
        report.rate, report.search = find_rate(
            step,
            start=args.search_start,
            factor=args.factor,
            refine=args.refine,
            max_steps=args.max_steps,
            p99_bound_s=args.p99_bound_ms / 1000,
            min_achieved=0.97,
        )
        if report.rate == 0.0:
            raise BenchError(f"no rate was sustained, from {args.search_start:g}/s down")
    else:
        report.rate = args.rate
        if args.warmup > 0:
            step(args.rate, args.warmup)


def _at_multiple(  # noqa: PLR0917 - the run's state, passed on
    args: argparse.Namespace,
    server: Server,
    load: Load,
    sustained: float,
    multiple: float,
    say: Callable[[str], None],
) -> Outcome:
    """``multiple`` times the sustained rate for ``--duration`` s: what the clients got,
    the server's CPU, memory and shed counters."""
    rate = sustained * multiple
    say(f"{multiple:g}x: {rate:,.0f}/s for {args.duration:g} s")
    before_rss = server.rss()
    shed_before = uvloop.run(server.shed())
    cpu_before = proc_cpu_s(server.pid)
    result, own = run_load(_at(load, rate, args.duration))
    cpu = (proc_cpu_s(server.pid) - cpu_before) / max(result.elapsed_s, 1e-9)
    uvloop.run(asyncio.sleep(args.settle))
    shed_after = uvloop.run(server.shed())
    outcome = Outcome(
        multiple,
        result,
        args.deadline,
        before_rss,
        server.rss(),
        {k: v - shed_before.get(k, 0.0) for k, v in shed_after.items()},
        cpu,
        own,
    )
    say(
        f"  in time {outcome.share(outcome.in_time):.1%}, failed fast "
        f"{outcome.share(outcome.failed_fast):.1%}, late {outcome.share(outcome.late):.1%}"
        f"; generator CPU {own:.0%}"
    )
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_report("python -m loadtest overload", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
