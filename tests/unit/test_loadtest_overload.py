"""``python -m loadtest overload``'s arithmetic: the rate a server sustains, and how a
run's requests split into in time, failed fast and late."""

from __future__ import annotations

import pytest

from loadtest.bench.overload import find_rate
from loadtest.bench.overload_report import Outcome
from loadtest.measure.openloop import RunResult, Schedule
from loadtest.measure.stats import Histogram


def run_at(rate: float, capacity: float) -> RunResult:
    """What a server of ``capacity`` requests/s gives an open-loop step at ``rate``."""
    schedule = Schedule.for_duration(rate, 4.0)
    ok = min(schedule.count, int(capacity * 4.0))
    latency = Histogram.of([0.002 if rate <= capacity else 0.4] * ok)
    return RunResult(
        schedule, latency, latency, Histogram(), Histogram(), ok, ok, {}, schedule.duration_s
    )


@pytest.mark.parametrize(
    ("capacity", "found"),
    [(1000.0, 928.0), (250.0, 250.0), (120.0, 0.0)],
)
def test_the_rate_found_is_the_highest_one_sustained(capacity: float, found: float) -> None:
    tried: list[float] = []

    def step(rate: float) -> RunResult:
        tried.append(rate)
        return run_at(rate, capacity)

    rate, log = find_rate(
        step,
        start=200,
        factor=1.5,
        refine=2,
        max_steps=12,
        p99_bound_s=0.05,
        min_achieved=0.97,
    )
    assert rate == found
    assert len(tried) <= 12
    assert all(verdict == "sustained" for r, verdict in log if r <= capacity)


def test_every_request_is_in_time_failed_fast_or_late() -> None:
    schedule = Schedule(rate=100, count=10)
    latency = Histogram.of([0.01, 0.02, 0.03, 7.0])  # the last answer came after 5 s
    failed = Histogram.of([0.001, 0.002, 5.5])  # two fast errors, one timeout
    run = RunResult(
        schedule, latency, latency, Histogram(), Histogram(), 8, 4, {}, 1.0, failed=failed
    )
    outcome = Outcome(3.0, run, 5.0, 0, 0, {}, 0.0, 0.0)
    # 3 in time, 2 failed fast; late: 1 answer, 1 timeout and the 3 never sent
    assert (outcome.in_time, outcome.failed_fast, outcome.late) == (3, 2, 5)
    assert outcome.p99_in_time == pytest.approx(0.03, rel=2**-8)
