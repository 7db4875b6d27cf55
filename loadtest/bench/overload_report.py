"""What ``overload`` found: per multiple of the sustained rate, the requests answered in
time, failed fast and late, the server's CPU, memory and shed counters, and the targets
(at 3x nothing late; RSS back within 10 % of its baseline).

Layer: PURE (records in, lines and a JSON-ready dict out). Must not change the results it
reports on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from loadtest.measure.openloop import RunResult

MB: Final = 1024 * 1024
TARGET_MULTIPLE: Final = 3.0
TARGET_RSS_RETURN: Final = 0.10


@dataclass(frozen=True, slots=True)
class Outcome:
    """One multiple of the sustained rate."""

    multiple: float
    run: RunResult
    deadline_s: float
    rss_before: int
    rss_after: int
    shed: dict[str, float]
    server_cpu: float
    generator_cpu: float

    @property
    def scheduled(self) -> int:
        return self.run.schedule.count

    @property
    def in_time(self) -> int:
        return self.run.latency.count_within(self.deadline_s)

    @property
    def failed_fast(self) -> int:
        return self.run.failed.count_within(self.deadline_s)

    @property
    def late(self) -> int:
        """Answered after the deadline, timed out, or never sent (the run stopped)."""
        return self.scheduled - self.in_time - self.failed_fast

    @property
    def p99_in_time(self) -> float:
        if not self.in_time:
            return math.inf
        return self.run.latency.percentile_within(99.0, self.deadline_s)

    def share(self, count: int) -> float:
        return count / self.scheduled if self.scheduled else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "multiple": self.multiple,
            "offered_rate": self.run.schedule.rate,
            "scheduled": self.scheduled,
            "sent": self.run.sent,
            "in_time": self.in_time,
            "failed_fast": self.failed_fast,
            "late": self.late,
            "p99_in_time_s": self.p99_in_time if self.in_time else None,
            "errors": dict(self.run.errors),
            "stopped": self.run.stopped,
            "latency": self.run.latency.summary().to_json(),
            "failed_latency": self.run.failed.summary().to_json(),
            "shed": self.shed,
            "rss_before": self.rss_before,
            "rss_after": self.rss_after,
            "server_cpu": self.server_cpu,
            "generator_cpu": self.generator_cpu,
        }


@dataclass(slots=True)
class Report:
    server: str
    deadline_s: float
    connections: int
    duration_s: float
    rate: float = 0.0
    search: list[tuple[float, str]] = field(default_factory=list)
    baseline_rss: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        yield (
            f"== {self.server} overload: sustained {self.rate:,.0f}/s, deadline "
            f"{self.deadline_s:g} s, {self.connections} TLS connections, "
            f"{self.duration_s:g} s per multiple, open loop =="
        )
        for rate, verdict in self.search:
            yield f"  search {rate:>8,.0f}/s  {verdict}"
        yield (
            f"{'multiple':>8} {'offered/s':>9} {'requests':>8} {'in time':>8} "
            f"{'failed fast':>11} {'late':>7} {'p99 in time':>11} {'srv CPU':>7} "
            f"{'RSS before':>10} {'after':>8}  shed"
        )
        for o in self.outcomes:
            shed = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(o.shed.items()) if v) or "-"
            stopped = f"  (stopped: {o.run.stopped})" if o.run.stopped else ""
            yield (
                f"{o.multiple:>7g}x {o.run.schedule.rate:>9,.0f} {o.scheduled:>8,} "
                f"{o.share(o.in_time):>8.1%} {o.share(o.failed_fast):>11.1%} "
                f"{o.share(o.late):>7.1%} {ms(o.p99_in_time):>11} {o.server_cpu:>7.0%} "
                f"{o.rss_before / MB:>8.1f}MB {o.rss_after / MB:>6.1f}MB  {shed}{stopped}"
            )
        yield f"baseline RSS {self.baseline_rss / MB:.1f} MB (idle, after the warm-up)"
        top = [o for o in self.outcomes if o.multiple >= TARGET_MULTIPLE]
        if top:
            worst = top[-1]
            back = worst.rss_after / self.baseline_rss - 1 if self.baseline_rss else math.inf
            yield _target(
                f"at {worst.multiple:g}x every request in time or failed fast",
                f"{worst.late:,} late",
                worst.late == 0,
            )
            yield _target(
                f"RSS after {worst.multiple:g}x within {TARGET_RSS_RETURN:.0%} of baseline",
                f"{back:+.1%}",
                back <= TARGET_RSS_RETURN,
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "deadline_s": self.deadline_s,
            "connections": self.connections,
            "duration_s": self.duration_s,
            "sustained_rate": self.rate,
            "search": [{"rate": r, "verdict": v} for r, v in self.search],
            "baseline_rss": self.baseline_rss,
            "multiples": [o.to_json() for o in self.outcomes],
        }


def ms(seconds: float) -> str:
    """Milliseconds for a table; ``-`` for none."""
    return "-" if seconds == math.inf else f"{seconds * 1000:.1f} ms"


def _target(what: str, value: str, met: bool) -> str:
    return f"{what:<52} {value:>12}  {'met' if met else 'MISSED'}"
