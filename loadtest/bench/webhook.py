"""Benchmark of the admission webhook: one core, TLS, keep-alive, open loop (a measurement,
not a test).

Layer: ROOT (a script: reads argv, writes temporary files, starts processes, prints a
table). Must not be imported by the servers or run by pytest.

The parts: ``webhook_policy`` (the generated policy and the captured review),
``review_steps`` (one step), ``search`` (judging steps, the max-rate search),
``webhook_in_process`` (the pure path's cost in process), ``webhook_report`` (tables
and JSON); this module starts the servers and runs the steps in order.

``python -m loadtest.bench.webhook [--rate 2000 --duration 10 --queues 1000 --json F]``:

1. writes a queue policy with ``--queues`` LocalQueues (namespaces of teams, ClusterQueues
   in cohorts, H100/H200/A100/L40S flavors reserved and spot, a Topology, priority
   classes and the ``tessera.dev/*`` annotations), in which the captured Job's queue
   ``team-nlp/team-nlp-queue`` exists;
2. makes fresh certificates with ``python -m certs`` in a temporary folder;
3. starts ``python -m webhook`` and ``python -m loadtest.bench.baseline_webhook`` (decode and a
   fixed patch, nothing else) on 127.0.0.1, each pinned to the server core, and waits
   for ``/readyz``;
4. from a separate process pinned to the other core, sends the captured Job's
   AdmissionReview (``../shared/captures/000-webhook-mutate-request.json``, a fresh uid
   per request) over a pool of keep-alive TLS connections that verify the CA, open loop
   (``loadtest.measure.openloop``): a warm-up, a fixed-rate run, then a search for the highest
   rate each server sustains (no errors, no backlog, achieved rate close to the offered
   one, p99 under a bound that catches a queue building up);
5. runs the targets of issue 4 once more scaled to this machine (``--scaled``): they were
   set where the baseline served 10,000 reviews/s, so both rates are multiplied by the
   baseline's capacity here (one core over its CPU per review) divided by 10,000;
6. prints a table (latency percentiles from intended send times, throughput, server CPU
   and RSS from ``/proc``, webhook/baseline ratios, the targets of issue 4 as written and
   scaled) and, with ``--json``, writes the same as JSON.

Everything is bounded: requests per step, seconds per step, steps per search, a search
time budget and a request timeout; the default run takes two to three minutes.

On a shared machine the neighbours' processes take turns on the pinned cores, and their
time slices show up as milliseconds of tail latency for both servers. The figures to
quote are therefore the ratios to the baseline measured in the same run, and the server
CPU per review (from ``/proc``), which queueing does not distort. ``--nice -10`` (root)
gives the servers and the generator sessions of their own at a higher priority, which
keeps most of the neighbours off the pinned cores for the few minutes of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import uvloop
import yaml

from cluster import jsonio
from cluster.clock import Clock
from loadtest.bench.command import run_and_report, temporary_folder
from loadtest.bench.review_steps import (
    HEADERS,
    MUTATE_PATH,
    ReviewTemplate,
    Server,
    StepResult,
    StepSpec,
    check_answer,
    ms,
    run_step,
    step_line,
    uid_prefix,
)
from loadtest.bench.search import Criteria, SearchPlan, round_rate, search
from loadtest.bench.webhook_in_process import measure_in_process
from loadtest.bench.webhook_policy import (
    DEFAULT_CAPTURES,
    load_captured_review,
    policy_objects,
    write_policy,
)
from loadtest.bench.webhook_report import (
    ISSUE_BASELINE_RATE,
    TARGET_P99_AT,
    TARGET_P99_S,
    TARGET_RATE,
    Report,
    Scaled,
)
from loadtest.measure.openloop import Http1Connection, RequestFailed
from loadtest.measure.pinned import SERVER_NAME, BenchError, make_certs
from loadtest.ports import free_port
from server.tls import client_context

# ---------------------------------------------------------------- servers


async def _probe(
    server: Server, ca: Path, template: ReviewTemplate, clock: Clock, deadline_s: float
) -> None:
    """Wait for ``/readyz``, then send one review and time it: the first review may pay
    for building the policy."""
    context = client_context(ca)
    connection = Http1Connection(
        "127.0.0.1", server.port, ssl_context=context, server_hostname=SERVER_NAME, headers=HEADERS
    )
    give_up = clock.monotonic() + deadline_s
    while True:
        if server.process is not None and server.process.poll() is not None:
            raise BenchError(f"{server.name} exited at start:\n{server.log_tail()}")
        try:
            ready = await connection.request("GET", "/readyz")
            if ready.status == 200:
                break
        except OSError:
            connection.close()
        if clock.monotonic() > give_up:
            raise BenchError(f"{server.name} was not ready in {deadline_s:.0f} s")
        await asyncio.sleep(0.1)
    server.note_memory("idle")
    uid = uid_prefix() + "0" * 12
    start = clock.monotonic()
    answer = await connection.request("POST", MUTATE_PATH, template.body(uid))
    server.first_review_s = clock.monotonic() - start
    try:
        response = check_answer(answer.status, answer.body, uid)
    except RequestFailed as exc:
        raise BenchError(f"{server.name} did not admit the captured Job: {exc}") from None
    finally:
        connection.close()
    patch = jsonio.loads(base64.b64decode(response["patch"]))
    server.patch_ops = len(patch)
    server.note_memory("first-review")


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.webhook",
        description="Benchmark the admission webhook against a bare baseline server, "
        "both on one core, open loop over TLS.",
        epilog="examples:\n"
        "  python -m loadtest.bench.webhook\n"
        "  python -m loadtest.bench.webhook --rate 2000 --duration 10 --queues 1000 "
        "--json bench.json\n"
        "  python -m loadtest.bench.webhook --no-search --servers webhook --profile 25\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_flags(parser)
    _add_search_flags(parser)
    _add_bounds_and_output_flags(parser)
    return parser.parse_args(argv)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rate", type=float, default=2000.0, help="fixed-rate run, reviews/s (2000)")
    add("--duration", type=float, default=10.0, help="fixed-rate run, seconds (10)")
    add("--warmup", type=float, default=2.0, help="warm-up per server, seconds (2)")
    add("--queues", type=int, default=1000, help="LocalQueues in the generated policy (1000)")
    add(
        "--templates",
        type=int,
        default=1,
        help="distinct Jobs sent in turn, each the captured one annotated with its number "
        "(1: the captured Job every time, so from the second review on the webhook answers "
        "from what it kept for it; above 1,024 every review runs the rules)",
    )
    add("--policy-file", type=Path, help="use this policy instead of generating one")
    add("--captures", type=Path, default=DEFAULT_CAPTURES, help="folder of the wire captures")
    add("--connections", type=int, default=8, help="keep-alive TLS connections (8)")
    add("--servers", default="baseline,webhook", help="which servers (baseline,webhook)")


def _add_search_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--search", action=argparse.BooleanOptionalAction, default=True, help="max-rate search")
    add("--search-start", type=float, default=1000.0, help="first search rate (1000)")
    add("--search-factor", type=float, default=1.5, help="rate multiplier per step (1.5)")
    add("--refine", type=int, default=3, help="bisection steps after the first failure (3)")
    add(
        "--retry",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a failed search step once more before believing it",
    )
    add("--max-steps", type=int, default=16, help="search steps per server at most (16)")
    add("--step-duration", type=float, default=5.0, help="seconds per search step (5)")
    add(
        "--p99-bound-ms",
        type=float,
        default=50.0,
        help="search: a step whose p99 exceeds this failed (50: a queue building up "
        "at saturation, not the odd co-tenant on a shared machine)",
    )
    add("--min-achieved", type=float, default=0.97, help="search: achieved/offered (0.97)")


def _add_bounds_and_output_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--timeout", type=float, default=5.0, help="request timeout, seconds (5)")
    add("--max-lag", type=float, default=1.0, help="stop a step this far behind, s (1)")
    add("--max-requests", type=int, default=500_000, help="requests per step at most")
    add("--budget", type=float, default=420.0, help="stop searching after this many s (420)")
    add("--server-core", type=int, default=0, help="CPU for the servers (0)")
    add("--client-core", type=int, default=1, help="CPU for the load generator (1)")
    add(
        "--nice",
        type=int,
        default=0,
        help="niceness of servers and load generator (0); on a shared machine a negative "
        "value (root only) keeps co-tenants from taking the pinned cores",
    )
    add(
        "--scaled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the issue's rate targets scaled by this run's baseline capacity "
        "(needs both servers)",
    )
    add("--in-process", type=int, default=1000, help="review() calls timed in process (1000)")
    add("--profile", type=int, default=0, metavar="N", help="cProfile: print the top N")
    add("--seed", type=int, default=1, help="seed of the generated policy")
    add("--json", type=Path, help="write the results as JSON here")


def _check_cores(args: argparse.Namespace) -> None:
    available = os.sched_getaffinity(0)
    wanted = {args.server_core, args.client_core}
    if not wanted <= available or len(wanted) < 2:
        raise BenchError(
            f"need two distinct CPUs for --server-core/--client-core, this process may use "
            f"{sorted(available)}"
        )
    if args.nice < 0 and os.geteuid() != 0:
        raise BenchError("a negative --nice needs root")


def _server_names(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if not names or not set(names) <= {"baseline", "webhook"}:
        raise BenchError("--servers takes baseline, webhook or both")
    return names


def _policy(args: argparse.Namespace, tmp: Path) -> tuple[Path, int]:
    """The policy file the webhook serves (``--policy-file``, or one generated into
    ``tmp``) and its number of LocalQueues."""
    if args.policy_file is not None:
        policy_path: Path = args.policy_file
        queues = sum(
            1
            for o in yaml.safe_load_all(policy_path.read_text())
            if o and o.get("kind") == "LocalQueue"
        )
        return policy_path, queues
    policy_path = tmp / "policy.yaml"
    objects = policy_objects(args.queues, args.seed)
    write_policy(policy_path, objects)
    return policy_path, sum(1 for o in objects if o["kind"] == "LocalQueue")


def _server(name: str, args: argparse.Namespace, tmp: Path, policy_path: Path) -> Server:
    """The webhook (serving ``policy_path``) or the baseline, on a free port with the
    certificates in ``tmp / "certs"``."""
    cert, key = (tmp / "certs" / n for n in ("webhook.crt", "webhook.key"))
    port = free_port()
    listen = ["--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert)]
    listen += ["--tls-key", str(key)]
    if name == "webhook":
        module, argv = "webhook", [*listen, "--policy-file", str(policy_path)]
    else:
        module, argv = "loadtest.bench.baseline_webhook", listen
    return Server(name, module, argv, args.server_core, tmp / f"{name}.log", args.nice, port)


@dataclass(frozen=True, slots=True)
class _Steps:
    """Runs one step against a server with this run's settings, and says its line."""

    args: argparse.Namespace
    ca: Path
    template: ReviewTemplate
    say: Callable[[str], None]

    def run(self, server: Server, mode: str, rate: float, duration: float) -> StepResult:
        args = self.args
        return run_step(
            StepSpec(
                server=server.name,
                mode=mode,
                port=server.port,
                server_pid=server.pid,
                ca=str(self.ca),
                template=self.template,
                rate=rate,
                duration_s=duration,
                connections=args.connections,
                core=args.client_core,
                nice=args.nice,
                timeout_s=args.timeout,
                max_lag_s=args.max_lag,
                max_requests=args.max_requests,
            )
        )

    def judged(
        self, criteria: Criteria, server: Server, mode: str, rate: float, duration: float
    ) -> StepResult:
        result = criteria.judge(self.run(server, mode, rate, duration))
        self.say(step_line(result))
        return result


def _warm_up_and_fixed(steps: _Steps, report: Report) -> None:
    """Each server warmed up, then each at the fixed rate, judged against issue 4's p99."""
    args = steps.args
    for server in report.servers.values():
        if args.warmup > 0:
            report.warmups[server.name] = steps.run(server, "warm-up", args.rate, args.warmup)
        server.note_memory("warm")
    fixed = Criteria(TARGET_P99_S, args.min_achieved)
    for server in report.servers.values():
        report.fixed[server.name] = steps.judged(fixed, server, "fixed", args.rate, args.duration)


def _search_each(steps: _Steps, report: Report, out_of_time: Callable[[], bool]) -> None:
    """The max-rate search, one server after the other."""
    args = steps.args
    criteria = Criteria(args.p99_bound_ms / 1000, args.min_achieved)
    plan = SearchPlan(
        args.search_start,
        args.search_factor,
        args.refine,
        args.max_steps,
        args.step_duration,
        args.retry,
    )
    for server in report.servers.values():

        def step(rate: float, server: Server = server) -> StepResult:
            result = steps.run(server, "search", rate, plan.duration_s)
            steps.say(step_line(criteria.judge(result)))
            return result

        report.searches[server.name] = search(plan, criteria, step, out_of_time)


def _scaled(steps: _Steps, report: Report) -> None:
    """Issue 4's rate targets scaled by the baseline's capacity in this run."""
    args = steps.args
    base_fixed = report.fixed.get("baseline")
    if not (args.scaled and "webhook" in report.servers and base_fixed is not None):
        return
    factor = 1 / (base_fixed.cpu_per_review * ISSUE_BASELINE_RATE)
    criteria = Criteria(args.p99_bound_ms / 1000, args.min_achieved)
    throughput = steps.judged(
        criteria,
        report.servers["webhook"],
        "scaled",
        round_rate(TARGET_RATE * factor),
        args.duration,
    )
    latency = {}
    for server in report.servers.values():
        rate = round_rate(TARGET_P99_AT * factor)
        latency[server.name] = steps.judged(criteria, server, "scaled", rate, args.duration)
    report.scaled = Scaled(factor, throughput, latency)


def run(args: argparse.Namespace, clock: Clock, say: Callable[[str], None]) -> Report:
    started = clock.monotonic()
    _check_cores(args)
    names = _server_names(args)
    captured = load_captured_review(args.captures)
    template = ReviewTemplate.of(captured, args.templates)
    # The orchestrator only waits; keep it off the servers' core.
    os.sched_setaffinity(0, {args.client_core})
    with temporary_folder("tessera-bench-") as tmp, ExitStack() as stack:
        policy_path, queues = _policy(args, tmp)
        report = Report(args, queues)
        report.load["start"] = os.getloadavg()
        say(f"policy: {queues:,} LocalQueues in {policy_path}")
        make_certs(tmp / "certs")
        ca = tmp / "certs" / "ca.crt"
        for name in names:
            server = _server(name, args, tmp, policy_path)
            server.start(stack)
            report.servers[name] = server
        for server in report.servers.values():
            uvloop.run(_probe(server, ca, template, clock, deadline_s=60.0))
            say(f"{server.name}: ready, first review {ms(server.first_review_s)}")
        steps = _Steps(args, ca, template, say)
        _warm_up_and_fixed(steps, report)
        if args.search:
            _search_each(steps, report, lambda: clock.monotonic() - started > args.budget)
        _scaled(steps, report)
        for server in report.servers.values():
            server.note_memory("end")
        if "webhook" in report.servers and (args.in_process or args.profile):
            report.in_process = measure_in_process(
                policy_path, template, max(args.in_process, 1), args.profile, clock
            )
    report.load["end"] = os.getloadavg()
    report.wall_s = clock.monotonic() - started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return run_and_report("python -m loadtest.bench.webhook", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
