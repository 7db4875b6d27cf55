"""``tessera capacity --from-run F.json``: a load-test run's JSON turned into the series
``console.capacity_range`` reads from Prometheus, so that a run and a live cluster give
the same report.

Layer: PURE. The decoded JSON (its ``"capacity"`` section, written by the load test's
simulated modes) in, series by the names of ``capacity_range.QUERIES`` out; no I/O, no
clock. Must not import the load test (the console stands beside it), and must not judge:
the range report does.

How the run becomes what Prometheus would have kept, at steps of ``step_s`` from the
run's start (each step stands for the window of one step centred on it):

* ``usage``: the GPUs of the jobs Kueue had admitted (admitted to finished), per
  ClusterQueue, cohort and flavor, averaged over the window, as Kueue's usage gauge;
* ``nominal``: each ClusterQueue's nominal GPUs per flavor, constant;
* ``pending``: the jobs created and not yet admitted, averaged over the window;
* ``wait_buckets``: the waits (created to admitted) of the jobs admitted in the window,
  as the increase of cumulative histogram buckets (powers of two from 1 ms to 4.5 h,
  finer than Kueue's because a run's waits are short);
* ``allocated``: the mean of the run's samples of GPUs allocated in the window.

A run has no DCGM, so no ``busy`` (no utilisation), and no fragmentation series.
``median_run_s`` is the yardstick for a long wait in a run's compressed time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from console.capacity_range import Series
from console.output import ConsoleError

STEPS: Final = 60
"""About this many steps over the run."""
MIN_STEP_S: Final = 0.25
"""The load test samples the cluster this often: a finer step has nothing to show."""
BUCKETS: Final = tuple(2.0**k for k in range(-10, 15))


@dataclass(frozen=True, slots=True)
class RunSeries:
    data: Mapping[str, Sequence[Series]]
    start: float
    end: float
    step_s: float
    median_run_s: float | None
    """The admitted jobs' median time from admission to finish: a run's time is
    compressed (seconds, not hours), so a wait is long against this, not against an
    hour."""


@dataclass(frozen=True, slots=True)
class _Job:
    cluster_queue: str
    flavor: str
    gpus: float
    created_s: float
    admitted_s: float | None
    finished_s: float | None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConsoleError(f"the run's {what} is not a number: {value!r}")
    return float(value)


def _maybe(value: Any, what: str) -> float | None:
    return None if value is None else _number(value, what)


def _jobs(raw: Any) -> list[_Job]:
    if not isinstance(raw, list):
        raise ConsoleError("the run's capacity.jobs is not a list")
    jobs = []
    for item in raw:
        if not isinstance(item, Mapping):
            raise ConsoleError(f"a job of the run is not an object: {item!r}")
        jobs.append(
            _Job(
                str(item.get("cluster_queue") or ""),
                str(item.get("flavor") or ""),
                _number(item.get("gpus"), "job's gpus"),
                _number(item.get("created_s"), "job's created_s"),
                _maybe(item.get("admitted_s"), "job's admitted_s"),
                _maybe(item.get("finished_s"), "job's finished_s"),
            )
        )
    return jobs


def _overlap(lo: float, hi: float, begin: float, end: float) -> float:
    return max(0.0, min(hi, end) - max(lo, begin))


def run_series(run: Any) -> RunSeries:
    """The series of a run's JSON; ``ConsoleError`` if it has no ``"capacity"`` section
    (a run written before it, or a mode that does not write it)."""
    section = run.get("capacity") if isinstance(run, Mapping) else None
    if not isinstance(section, Mapping):
        raise ConsoleError(
            'this JSON has no "capacity" section: give the JSON of a simulated load-test '
            "run (python -m loadtest demo, latency or soak)"
        )
    jobs = _jobs(section.get("jobs"))
    samples = [
        (_number(p[0], "sample time"), _number(p[1], "GPUs allocated"))
        for p in section.get("gpus_allocated") or []
        if isinstance(p, list | tuple) and len(p) == 2
    ]
    end = _number(run.get("duration_s", 0.0), "duration_s")
    end = max([end, *(t for t, _ in samples), *(j.finished_s or 0.0 for j in jobs)])
    step = max(MIN_STEP_S, end / STEPS)
    steps = max(1, math.ceil(end / step) + 1)
    windows = [(i * step - step / 2, i * step + step / 2) for i in range(steps)]
    queues = _queues(section.get("cluster_queues"))
    cohorts = {name: cohort for name, cohort, _ in queues}

    def held(spans: Sequence[tuple[float, float, float]]) -> tuple[float, ...]:
        """The mean of what the spans (begin, end, amount) held in each window."""
        return tuple(
            sum(a * _overlap(lo, hi, b, e) for b, e, a in spans) / step for lo, hi in windows
        )

    usage: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    pending: dict[str, list[tuple[float, float, float]]] = {}
    waits: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        done = end if job.admitted_s is None else job.admitted_s
        pending.setdefault(job.cluster_queue, []).append((job.created_s, done, 1.0))
        if job.admitted_s is None:
            continue
        finished = end + step if job.finished_s is None else job.finished_s
        usage.setdefault((job.cluster_queue, job.flavor), []).append(
            (job.admitted_s, finished, job.gpus)
        )
        waits.setdefault(job.cluster_queue, []).append(
            (job.admitted_s, job.admitted_s - job.created_s)
        )
    for name, _, nominal in queues:
        for flavor in nominal:
            usage.setdefault((name, flavor), [])
    data: dict[str, list[Series]] = {
        "usage": [
            (_labels(cq, cohorts.get(cq), flavor), held(spans))
            for (cq, flavor), spans in sorted(usage.items())
        ],
        "nominal": [
            (_labels(name, cohort, flavor), (gpus,) * steps)
            for name, cohort, nominal in queues
            for flavor, gpus in sorted(nominal.items())
        ],
        "pending": [({"cluster_queue": q}, held(spans)) for q, spans in sorted(pending.items())],
        "wait_buckets": [
            series
            for q, found in sorted(waits.items())
            for series in _buckets(q, found, step, steps)
        ],
        "allocated": [({}, _sampled(samples, windows))],
    }
    runs = sorted(
        j.finished_s - j.admitted_s
        for j in jobs
        if j.admitted_s is not None and j.finished_s is not None
    )
    median = runs[len(runs) // 2] if runs else None
    return RunSeries(data, 0.0, (steps - 1) * step, step, median)


def _labels(cluster_queue: str, cohort: str | None, flavor: str) -> dict[str, str]:
    found = {"cluster_queue": cluster_queue, "flavor": flavor}
    return {**found, "cohort": cohort} if cohort else found


def _queues(raw: Any) -> list[tuple[str, str | None, dict[str, float]]]:
    found = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping) or not item.get("name"):
            continue
        nominal = item.get("nominal_gpus")
        found.append(
            (
                str(item["name"]),
                str(item["cohort"]) if item.get("cohort") else None,
                {
                    str(f): _number(g, "nominal GPUs")
                    for f, g in (nominal.items() if isinstance(nominal, Mapping) else ())
                },
            )
        )
    return found


def _buckets(
    queue: str, admitted: Sequence[tuple[float, float]], step: float, steps: int
) -> list[Series]:
    """Cumulative buckets of the waits of the jobs admitted in each window."""
    bounds = (*BUCKETS, math.inf)
    counts = [[0.0] * steps for _ in bounds]
    for at, wait in admitted:
        i = int((at + step / 2) // step)
        if 0 <= i < steps:
            for b, le in enumerate(bounds):
                if wait <= le:
                    counts[b][i] += 1
    return [
        ({"cluster_queue": queue, "le": "+Inf" if math.isinf(le) else repr(le)}, tuple(row))
        for le, row in zip(bounds, counts, strict=True)
    ]


def _sampled(
    samples: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]
) -> tuple[float, ...]:
    found = []
    for lo, hi in windows:
        inside = [v for t, v in samples if lo <= t < hi]
        found.append(sum(inside) / len(inside) if inside else math.nan)
    return tuple(found)
