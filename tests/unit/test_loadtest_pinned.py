"""The benchmarks' probes of this machine: its own steadiness, and when the processes
under benchmark have gone quiet."""

from __future__ import annotations

import os

import pytest

from cluster.clock import ManualClock, SystemClock
from loadtest.measure.pinned import fixed_work_seconds, wait_settled


def test_the_fixed_task_runs_as_often_as_asked_on_the_core_asked() -> None:
    before = os.sched_getaffinity(0)
    core = max(before)
    timings = fixed_work_seconds(core, SystemClock(), size_s=0.0005, runs=20)
    assert len(timings) == 20
    assert all(seconds > 0 for seconds in timings)
    assert os.sched_getaffinity(0) == before  # the benchmark's own pinning is kept


class _Busy:
    """CPU seconds of two fake processes that use ``cores`` of a core per second of
    ``clock``, by window: a controller reconciling, then idle."""

    def __init__(self, clock: ManualClock, cores: list[float]) -> None:
        self.clock = clock
        self.cores = cores
        self.used = {1: 0.0, 2: 0.0}

    def sleep(self, seconds: float) -> None:
        share = self.cores.pop(0) if self.cores else 0.0
        self.used[1] += share * seconds
        self.clock.advance(seconds)

    def cpu_s(self, pid: int) -> float:
        return self.used[pid]


def test_the_run_waits_until_the_processes_go_quiet() -> None:
    clock = ManualClock()
    busy = _Busy(clock, [0.9, 0.6, 0.2, 0.01])
    settled = wait_settled([1, 2], clock, busy.sleep, cpu_s=busy.cpu_s, window_s=2.0)
    assert (settled.waited_s, settled.settled) == (8.0, True)
    assert settled.cores == pytest.approx(0.01)


def test_a_process_that_never_goes_quiet_is_measured_anyway_and_said_so() -> None:
    clock = ManualClock()
    busy = _Busy(clock, [0.5] * 100)
    settled = wait_settled([1, 2], clock, busy.sleep, cpu_s=busy.cpu_s, limit_s=10.0)
    assert settled.waited_s == 10.0
    assert not settled.settled
    assert settled.cores == pytest.approx(0.5)
