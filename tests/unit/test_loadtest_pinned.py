"""The benchmarks' probe of this machine's own steadiness."""

from __future__ import annotations

import os

from cluster.clock import SystemClock
from loadtest.measure.pinned import fixed_work_seconds


def test_the_fixed_task_runs_as_often_as_asked_on_the_core_asked() -> None:
    before = os.sched_getaffinity(0)
    core = max(before)
    timings = fixed_work_seconds(core, SystemClock(), size_s=0.0005, runs=20)
    assert len(timings) == 20
    assert all(seconds > 0 for seconds in timings)
    assert os.sched_getaffinity(0) == before  # the benchmark's own pinning is kept
