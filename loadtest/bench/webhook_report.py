"""What ``bench-webhook`` found, for people and as JSON: the steps of each server, the
webhook/baseline ratios, the max-throughput search, memory, the in-process cost, and the
targets of issue 4 as written and scaled to this machine.

Layer: PURE (records in, lines and a JSON-ready dict out; ``cpu_model`` reads
``/proc``). Must not change the results it reports on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loadtest.bench.review_steps import STEP_HEADER, Server, StepResult, ms, step_line
from loadtest.bench.search import max_sustained
from loadtest.bench.webhook_in_process import InProcess
from loadtest.measure.pinned import cpu_model
from webhook.answers import ANSWERS_KEPT

MB: Final = 1024 * 1024

# Targets of issue 4.
TARGET_RATE: Final = 4000.0


TARGET_P99_S: Final = 0.005


TARGET_P99_AT: Final = 2000.0
TARGET_RSS: Final = 150 * MB
ISSUE_BASELINE_RATE: Final = 10_000.0
"""What the bare baseline served on one core of the machine issue 4 was written on: the
targets above are that machine's. ``--scaled`` scales them by this run's baseline."""


def _templates(count: int) -> str:
    if count <= 1:
        return "the same Job each time, renamed"
    kept = "all kept" if count <= ANSWERS_KEPT else "more than the webhook keeps"
    return f"{count:,} distinct Jobs in turn, {kept}"


def _mb(value: int) -> str:
    return f"{value / MB:.1f} MB"


def _per_core(cpu_per_review: float) -> str:
    return f"{1 / cpu_per_review:,.0f}" if cpu_per_review > 0 else "-"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


@dataclass(frozen=True, slots=True)
class Scaled:
    """Issue 4's rate targets scaled to this machine by the baseline's capacity here.

    The baseline's capacity is one core over its CPU per review at the fixed rate (from
    ``/proc``: a neighbour's time slice delays requests but does not bill the server),
    so the factor holds when tail latencies are a co-tenant's."""

    factor: float
    """This run's baseline capacity over ``ISSUE_BASELINE_RATE``."""
    throughput: StepResult
    """The webhook at ``TARGET_RATE * factor``, judged like a search step."""
    latency: dict[str, StepResult]
    """Each server at ``TARGET_P99_AT * factor``."""

    def lines(self) -> Iterator[str]:
        yield (
            f"== targets of issue 4 scaled to this machine: the baseline's capacity here is "
            f"{self.factor * ISSUE_BASELINE_RATE:,.0f}/s, x{self.factor:.2f} the "
            f"{ISSUE_BASELINE_RATE:,.0f}/s of the issue's machine =="
        )
        yield STEP_HEADER
        yield step_line(self.throughput)
        for result in self.latency.values():
            yield step_line(result)
        hook = self.latency.get("webhook")
        base = self.latency.get("baseline")
        yield _target(
            f">= {TARGET_RATE * self.factor:,.0f} reviews/s sustained",
            f"{self.throughput.run.achieved_rate:,.0f}/s",
            self.throughput.passed,
        )
        if hook is not None:
            p99 = hook.latency.p99
            yield _target(
                f"p99 <= {ms(TARGET_P99_S)} at {hook.spec.rate:,.0f} reviews/s",
                ms(p99),
                p99 <= TARGET_P99_S and hook.run.error_count == 0,
            )
            if base is not None:
                yield f"  (the baseline's p99 at the same rate: {ms(base.latency.p99)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "baseline_capacity_per_s": self.factor * ISSUE_BASELINE_RATE,
            "throughput": self.throughput.to_json(),
            "latency": {name: r.to_json() for name, r in self.latency.items()},
        }


@dataclass(slots=True)
class Report:
    args: argparse.Namespace
    queues: int
    servers: dict[str, Server] = field(default_factory=dict)
    warmups: dict[str, StepResult] = field(default_factory=dict)
    fixed: dict[str, StepResult] = field(default_factory=dict)
    searches: dict[str, list[StepResult]] = field(default_factory=dict)
    scaled: Scaled | None = None
    in_process: InProcess | None = None
    wall_s: float = 0.0
    load: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """``os.getloadavg()`` at the start and the end: how busy the (shared) machine was."""

    def lines(self) -> Iterator[str]:
        yield from self._header()
        if self.fixed:
            yield ""
            yield from self._fixed_lines()
        if self.searches:
            yield ""
            yield from self._search_lines()
        yield ""
        yield from self._memory_lines()
        if self.in_process is not None:
            yield ""
            yield from self._in_process_lines(self.in_process)
        yield from self._targets()
        if self.scaled is not None:
            yield ""
            yield from self.scaled.lines()
        yield ""
        yield f"wall time {self.wall_s:.0f} s"

    def _header(self) -> Iterator[str]:
        args = self.args
        yield (
            f"Tessera webhook benchmark: captured Job review "
            f"({_templates(args.templates)}), {self.queues:,} LocalQueues, "
            f"TLS, {args.connections} keep-alive connections, open loop"
        )
        yield (
            f"servers pinned to CPU {args.server_core}, load generator to CPU "
            f"{args.client_core}{f' (nice {args.nice})' if args.nice else ''}; latency is "
            "measured from each request's intended send time"
        )
        for server in self.servers.values():
            yield f"  {server.name:<9} {server.command}"
        yield f"CPU: {cpu_model()}; load average {_loads(self.load)}"

    def _fixed_lines(self) -> Iterator[str]:
        args = self.args
        yield f"== fixed rate: {args.rate:,.0f} reviews/s for {args.duration:g} s =="
        yield STEP_HEADER
        for result in self.fixed.values():
            yield step_line(result)
        yield from self._fixed_ratios()

    def _search_lines(self) -> Iterator[str]:
        args = self.args
        yield (
            f"== max-throughput search: p99 <= {args.p99_bound_ms:g} ms, no errors, "
            f"achieved >= {args.min_achieved:.0%} of offered; {args.step_duration:g} s steps =="
        )
        yield STEP_HEADER
        for results in self.searches.values():
            for result in results:
                yield step_line(result)
        yield from self._search_summary()

    def _memory_lines(self) -> Iterator[str]:
        yield "== memory (/proc VmRSS; peak = VmHWM) =="
        yield (
            f"{'server':<9} {'idle':>9} {'1st review':>10} {'end':>9} {'peak':>9}  "
            "first review (cold)"
        )
        for server in self.servers.values():
            rss = {m: v.get("VmRSS", 0) for m, v in server.memory.items()}
            peak = max((v.get("VmHWM", 0) for v in server.memory.values()), default=0)
            yield (
                f"{server.name:<9} {_mb(rss.get('idle', 0)):>9} "
                f"{_mb(rss.get('first-review', 0)):>10} {_mb(rss.get('end', 0)):>9} "
                f"{_mb(peak):>9}  {ms(server.first_review_s)}"
                f" ({server.patch_ops} patch operations)"
            )

    def _in_process_lines(self, ip: InProcess) -> Iterator[str]:
        yield "== in process (no HTTP, no TLS), per call, best of 5 passes =="
        calls = f"({ip.reviews:,} calls)"
        yield f"review() as the server calls it   {ip.review_s * 1e6:>7.0f} us  {calls}"
        yield "  (a renamed Job gets the answer kept for its template: webhook.answers)"
        yield f"review() of a template's first Job {ip.first_s * 1e6:>6.0f} us, in parts:"
        for name, seconds in ip.stages:
            yield f"  {name:<31} {seconds * 1e6:>7.0f} us"
        yield f"policy build ({self.queues:,} LocalQueues)  {ms(ip.policy_build_s):>10}"
        yield f"review after a LocalQueue update  {ms(ip.after_change_s):>10}  (median of 5)"
        if ip.profile:
            yield ip.profile.rstrip()

    def _fixed_ratios(self) -> Iterator[str]:
        hook, base = self.fixed.get("webhook"), self.fixed.get("baseline")
        if hook is None or base is None:
            return
        h, b = hook.latency, base.latency
        yield (
            f"webhook/baseline: p50 x{_ratio(h.p50, b.p50)}, p90 x{_ratio(h.p90, b.p90)}, "
            f"p99 x{_ratio(h.p99, b.p99)}, p99.9 x{_ratio(h.p999, b.p999)}"
        )
        hook_cpu, base_cpu = hook.cpu_per_review, base.cpu_per_review
        yield (
            f"server CPU per review: webhook {hook_cpu * 1e6:.0f} us, baseline "
            f"{base_cpu * 1e6:.0f} us (x{_ratio(hook_cpu, base_cpu)}): a whole core would "
            f"answer about {_per_core(hook_cpu)} and {_per_core(base_cpu)} reviews/s"
        )

    def _search_summary(self) -> Iterator[str]:
        best = {name: max_sustained(results) for name, results in self.searches.items()}
        parts = []
        for name, result in best.items():
            if result is None:
                parts.append(f"{name}: none sustained")
            else:
                parts.append(
                    f"{name}: {result.spec.rate:,.0f}/s (p99 {ms(result.latency.p99)}, "
                    f"server CPU {result.server_cpu:.0%})"
                )
        yield "max sustained: " + "; ".join(parts)
        hook, base = best.get("webhook"), best.get("baseline")
        if hook is not None and base is not None:
            yield f"webhook/baseline max throughput: {_ratio(hook.spec.rate, base.spec.rate)}"

    def _targets(self) -> Iterator[str]:
        server = self.servers.get("webhook")
        if server is None:
            return
        yield ""
        yield "== targets of issue 4 (webhook) =="
        results = self.searches.get("webhook")
        if results:
            best = max_sustained(results)
            rate = best.spec.rate if best else 0.0
            yield _target(
                f">= {TARGET_RATE:,.0f} reviews/s sustained",
                f"{rate:,.0f}/s",
                rate >= TARGET_RATE,
            )
        fixed = self.fixed.get("webhook")
        if fixed is not None and self.args.rate == TARGET_P99_AT:
            yield _target(
                f"p99 <= {ms(TARGET_P99_S)} at {self.args.rate:,.0f} reviews/s",
                ms(fixed.latency.p99),
                fixed.latency.p99 <= TARGET_P99_S and fixed.run.error_count == 0,
            )
        peak = max((v.get("VmHWM", 0) for v in server.memory.values()), default=0)
        yield _target(
            f"RSS <= {_mb(TARGET_RSS)} with {self.queues:,} LocalQueues",
            f"peak {_mb(peak)}",
            peak <= TARGET_RSS,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()
            },
            "local_queues": self.queues,
            "cpus": sorted(os.sched_getaffinity(0)),
            "python": sys.version.split()[0],
            "wall_s": self.wall_s,
            "cpu_model": cpu_model(),
            "load_average": self.load,
            "servers": {},
        }
        for name, server in self.servers.items():
            results = self.searches.get(name, [])
            best = max_sustained(results)
            out["servers"][name] = {
                "command": server.command,
                "memory": server.memory,
                "first_review_s": server.first_review_s,
                "patch_ops": server.patch_ops,
                "warm_up": self.warmups[name].to_json() if name in self.warmups else None,
                "fixed": self.fixed[name].to_json() if name in self.fixed else None,
                "search": [r.to_json() for r in results],
                "max_sustained_rate": best.spec.rate if best else None,
            }
        if self.scaled is not None:
            out["scaled"] = self.scaled.to_json()
        if self.in_process is not None:
            ip = self.in_process
            out["in_process"] = {
                "reviews": ip.reviews,
                "review_s": ip.review_s,
                "first_review_s": ip.first_s,
                "stages_s": dict(ip.stages),
                "policy_build_s": ip.policy_build_s,
                "review_after_change_s": ip.after_change_s,
            }
        return out


def _loads(load: dict[str, tuple[float, float, float]]) -> str:
    return ", ".join(f"{moment} {avg[0]:.1f}" for moment, avg in load.items())


def _target(what: str, value: str, met: bool) -> str:
    return f"{what:<40} {value:>14}  {'met' if met else 'MISSED'}"
