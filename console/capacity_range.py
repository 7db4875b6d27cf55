"""``tessera capacity`` over a time range: what Prometheus kept of Kueue's and Tessera's
metrics, summed up per ClusterQueue and GPU product, with plain recommendations.

Layer: PURE. Range series (as Prometheus' ``query_range`` returns them, decoded) to a
frozen report: no I/O, no clock, no aiohttp. Must not ask for anything: the queries it
needs are ``QUERIES``, and ``console.prometheus`` runs them.

What each figure is:

* **wait p90** per ClusterQueue: Kueue's ``kueue_admission_wait_time_seconds`` buckets,
  increased per step and added up over the range, then the 90th percentile of that one
  histogram, interpolated inside its bucket as Prometheus' ``histogram_quantile`` does.
* **borrowed** per ClusterQueue: at each step, the GPUs it uses beyond its nominal
  (``kueue_cluster_queue_resource_usage`` over ``kueue_cluster_queue_nominal_quota``,
  ``nvidia.com/gpu``), averaged over the range; **lent**: what the others of its cohort
  borrowed at that step, shared among the queues with unused nominal in proportion to it.
* **allocation against utilisation**: ``tessera:gpus_busy:sum`` over
  ``tessera:gpus_allocated:sum`` (DCGM's ``DCGM_FI_DEV_GPU_UTIL`` against the extender's
  allocation), averaged over the steps with both.
* **fragmentation** per GPU product: the mean of ``tessera:gpus_fragmented:ratio``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from console.render import duration

QUERIES: Final = {
    "wait_buckets": (
        "sum by (cluster_queue, le) (increase(kueue_admission_wait_time_seconds_bucket[{step}]))"
    ),
    "usage": (
        "sum by (cluster_queue, cohort, flavor) "
        '(kueue_cluster_queue_resource_usage{resource="nvidia.com/gpu"})'
    ),
    "nominal": (
        "sum by (cluster_queue, cohort, flavor) "
        '(kueue_cluster_queue_nominal_quota{resource="nvidia.com/gpu"})'
    ),
    "pending": 'sum by (cluster_queue) (kueue_pending_workloads{status="active"})',
    "allocated": "tessera:gpus_allocated:sum",
    "busy": "tessera:gpus_busy:sum",
    "fragmented": "max by (product) (tessera:gpus_fragmented:ratio)",
}
"""What the report reads, by name; ``{step}`` is the query step (``1h``)."""

WAIT_LONG_S: Final = 3600.0
"""A p90 wait at or above this is worth a recommendation."""
IDLE_BELOW: Final = 0.5
"""Allocated GPUs busy less than this share of the time are worth a word."""
STRANDED_ABOVE: Final = 0.3
"""A product whose free GPUs are this share unusable on average is worth a word."""
RAISE_STEP: Final = 8
"""Nominal quota is raised in whole 8-GPU nodes."""

Series = tuple[Mapping[str, str], tuple[float, ...]]
"""One series: its labels, and its values at the report's steps (NaN where absent)."""


@dataclass(frozen=True, slots=True)
class QueueRange:
    name: str
    cohort: str | None
    flavor: str | None
    """The GPU flavor it borrowed most of."""
    nominal: float
    wait_p90_s: float | None
    admitted: int
    pending_mean: float
    borrowed_mean: float
    borrowed_max: float
    lent_mean: float

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_queue": self.name,
            "cohort": self.cohort,
            "flavor": self.flavor,
            "nominal_gpus": self.nominal,
            "wait_p90_seconds": self.wait_p90_s,
            "admitted": self.admitted,
            "pending_mean": _round(self.pending_mean),
            "borrowed_gpus_mean": _round(self.borrowed_mean),
            "borrowed_gpus_max": _round(self.borrowed_max),
            "lent_gpus_mean": _round(self.lent_mean),
        }


@dataclass(frozen=True, slots=True)
class Timeline:
    """The report's figures step by step, for its plots (NaN where a step had none)."""

    at_s: tuple[float, ...]
    """Seconds since the range's start, one per step."""
    wait_p90_s: Mapping[str, tuple[float, ...]]
    """ClusterQueue → p90 wait of the workloads admitted in each step."""
    borrowed: Mapping[str, tuple[float, ...]]
    lent: Mapping[str, tuple[float, ...]]
    admitted: tuple[float, ...]
    """GPUs Kueue had admitted, all queues together."""
    allocated: tuple[float, ...]
    busy: tuple[float, ...]


NO_TIMELINE: Final = Timeline((), {}, {}, {}, (), (), ())


@dataclass(frozen=True, slots=True)
class RangeReport:
    start: float
    end: float
    step_s: float
    queues: tuple[QueueRange, ...]
    utilisation: float | None
    """Busy over allocated, averaged over the range; ``None`` without both series."""
    allocated_mean: float | None
    fragmentation: Mapping[str, float]
    """GPU product → mean share of its free GPUs unusable."""
    recommendations: tuple[str, ...]
    timeline: Timeline = NO_TIMELINE
    """Not in the JSON, whose shape scripts rely on: the HTML page plots it."""

    def to_json(self) -> dict[str, object]:
        return {
            "range": {"start": self.start, "end": self.end, "step_seconds": self.step_s},
            "queues": [q.to_json() for q in self.queues],
            "allocation": {
                "allocated_gpus_mean": _round(self.allocated_mean),
                "busy_over_allocated": _round(self.utilisation),
            },
            "fragmentation": {p: _round(v) for p, v in sorted(self.fragmentation.items())},
            "recommendations": list(self.recommendations),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _present(values: Iterable[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _mean(values: Iterable[float]) -> float | None:
    found = _present(values)
    return sum(found) / len(found) if found else None


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """``histogram_quantile`` of cumulative ``(le, count)`` buckets; ``None`` if empty."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower  # as Prometheus: the upper bound of the last finite bucket
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, count
    return lower


def _by_queue(series: Iterable[Series]) -> dict[str, list[Series]]:
    found: dict[str, list[Series]] = {}
    for labels, values in series:
        found.setdefault(labels.get("cluster_queue", ""), []).append((labels, values))
    return found


def _sum_steps(series: Sequence[Series], steps: int) -> list[float]:
    total = [math.nan] * steps
    for _, values in series:
        for i, v in enumerate(values):
            if not math.isnan(v):
                total[i] = v if math.isnan(total[i]) else total[i] + v
    return total


def _wait_steps(series: Sequence[Series], steps: int) -> tuple[float, ...]:
    """The p90 of each step's own histogram (the workloads admitted in that step)."""
    found = []
    for i in range(steps):
        counts: dict[float, float] = {}
        for labels, values in series:
            if not math.isnan(values[i]):
                le = float(labels.get("le", "+Inf"))
                counts[le] = counts.get(le, 0.0) + values[i]
        p90 = quantile(0.9, list(counts.items()))
        found.append(math.nan if p90 is None else p90)
    return tuple(found)


def _wait(series: Sequence[Series]) -> tuple[float | None, int]:
    counts: dict[float, float] = {}
    for labels, values in series:
        le = float(labels.get("le", "+Inf"))
        counts[le] = counts.get(le, 0.0) + sum(_present(values))
    total = counts.get(math.inf, 0.0)
    return quantile(0.9, list(counts.items())), round(total)


def range_report(
    data: Mapping[str, Sequence[Series]],
    *,
    start: float,
    end: float,
    step_s: float,
    wait_long_s: float = WAIT_LONG_S,
) -> RangeReport:
    """The report of the series read for ``QUERIES`` (by the same names); a queue whose
    p90 wait reaches ``wait_long_s`` gets a recommendation."""
    steps = max(1, round((end - start) / step_s) + 1)
    usage, nominal = _by_queue(data.get("usage", ())), _by_queue(data.get("nominal", ()))
    waits, pending = _by_queue(data.get("wait_buckets", ())), _by_queue(data.get("pending", ()))
    names = sorted({*usage, *nominal, *waits} - {""})
    used = {n: _sum_steps(usage.get(n, []), steps) for n in names}
    quota = {n: _sum_steps(nominal.get(n, []), steps) for n in names}
    cohorts = {n: _label(usage.get(n, []) + nominal.get(n, []), "cohort") for n in names}
    borrowed = {n: [_over(u, q) for u, q in zip(used[n], quota[n], strict=True)] for n in names}
    lent = _lent(names, cohorts, used=used, quota=quota, borrowed=borrowed, steps=steps)
    queues = []
    for n in names:
        p90, admitted = _wait(waits.get(n, []))
        queues.append(
            QueueRange(
                name=n,
                cohort=cohorts[n],
                flavor=_flavor(usage.get(n, []), nominal.get(n, [])),
                nominal=max(_present(quota[n]), default=0.0),
                wait_p90_s=p90,
                admitted=admitted,
                pending_mean=_mean(_sum_steps(pending.get(n, []), steps)) or 0.0,
                borrowed_mean=_mean(borrowed[n]) or 0.0,
                borrowed_max=max(_present(borrowed[n]), default=0.0),
                lent_mean=_mean(lent[n]) or 0.0,
            )
        )
    allocated = _sum_steps(data.get("allocated", ()), steps)
    busy = _sum_steps(data.get("busy", ()), steps)
    ratio = _mean(b / a for a, b in zip(allocated, busy, strict=True) if a > 0)
    fragmentation = {
        labels.get("product", "?"): mean
        for labels, values in data.get("fragmented", ())
        if (mean := _mean(values)) is not None
    }
    timeline = Timeline(
        at_s=tuple(i * step_s for i in range(steps)),
        wait_p90_s={n: _wait_steps(waits.get(n, []), steps) for n in names},
        borrowed={n: tuple(borrowed[n]) for n in names},
        lent={n: tuple(lent[n]) for n in names},
        admitted=tuple(_sum_steps([s for n in names for s in usage.get(n, [])], steps)),
        allocated=tuple(allocated),
        busy=tuple(busy),
    )
    report = RangeReport(
        start, end, step_s, tuple(queues), ratio, _mean(allocated), fragmentation, ()
    )
    return RangeReport(
        start, end, step_s, report.queues, ratio, report.allocated_mean, fragmentation,
        recommendations(report, wait_long_s=wait_long_s), timeline,
    )  # fmt: skip


def _over(used: float, nominal: float) -> float:
    if math.isnan(used):
        return math.nan
    return max(0.0, used - (0.0 if math.isnan(nominal) else nominal))


def _label(series: Sequence[Series], key: str) -> str | None:
    for labels, _ in series:
        if labels.get(key):
            return labels[key]
    return None


def _flavor(usage: Sequence[Series], nominal: Sequence[Series]) -> str | None:
    """The flavor where usage rose furthest above nominal (the one borrowed)."""
    quota = {labels.get("flavor"): max(_present(v), default=0.0) for labels, v in nominal}
    best, most = None, 0.0
    for labels, values in usage:
        flavor = labels.get("flavor")
        over = max(_present(values), default=0.0) - quota.get(flavor, 0.0)
        if over > most:
            best, most = flavor, over
    return best


def _lent(
    names: Sequence[str],
    cohorts: Mapping[str, str | None],
    *,
    used: Mapping[str, list[float]],
    quota: Mapping[str, list[float]],
    borrowed: Mapping[str, list[float]],
    steps: int,
) -> dict[str, list[float]]:
    lent = {n: [0.0] * steps for n in names}
    for cohort in {c for c in cohorts.values() if c}:
        members = [n for n in names if cohorts[n] == cohort]
        for i in range(steps):
            taken = sum(_zero(borrowed[n][i]) for n in members)
            unused = {n: max(0.0, _zero(quota[n][i]) - _zero(used[n][i])) for n in members}
            spare = sum(unused.values())
            if taken > 0 and spare > 0:
                for n in members:
                    lent[n][i] = taken * unused[n] / spare
    return lent


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _nodes(gpus: float) -> int:
    return max(RAISE_STEP, math.ceil(gpus / RAISE_STEP) * RAISE_STEP)


def wait_text(seconds: float) -> str:
    """A wait as ``render.duration`` writes it, but a load test's short waits to two
    digits (``0.65s``) rather than ``0s``."""
    return f"{seconds:.2g}s" if seconds < 10 else duration(seconds)


def recommendations(report: RangeReport, *, wait_long_s: float = WAIT_LONG_S) -> tuple[str, ...]:
    """Plain sentences, most urgent first: queues that waited long while borrowing (more
    nominal, or less lending by the queue they borrowed from), queues that waited long
    and borrowed nothing, idle allocation, stranded GPUs."""
    found: list[str] = []
    # per cohort, the queue that lent most (the last one written wins)
    lenders = {q.cohort: q for q in sorted(report.queues, key=lambda q: q.lent_mean)}
    for q in sorted(report.queues, key=lambda q: -(q.wait_p90_s or 0.0)):
        if q.wait_p90_s is None or q.wait_p90_s < wait_long_s:
            continue
        lender = lenders.get(q.cohort)
        on = f" of {q.flavor}" if q.flavor else ""
        if q.borrowed_mean > 0 and lender is not None and lender.name != q.name:
            share = 100 * q.borrowed_mean / lender.nominal if lender.nominal else 0.0
            found.append(
                f"{q.name} waited p90 {wait_text(q.wait_p90_s)} while borrowing {share:.0f} % "
                f"of {lender.name}'s nominal: raise {q.name}'s nominal by "
                f"{_nodes(q.borrowed_max)} GPUs{on} or lower {lender.name}'s lending limit"
            )
        else:
            found.append(
                f"{q.name} waited p90 {wait_text(q.wait_p90_s)} and borrowed nothing: raise "
                f"its nominal, or let its cohort lend to it"
            )
    if report.utilisation is not None and report.utilisation < IDLE_BELOW:
        found.append(
            f"allocated GPUs were busy {100 * report.utilisation:.0f} % of the time on "
            f"average: look for idle jobs (tessera:namespace_gpu_utilisation:avg) before "
            "buying GPUs"
        )
    for product, share in sorted(report.fragmentation.items()):
        if share > STRANDED_ABOVE:
            found.append(
                f"{100 * share:.0f} % of the free {product} GPUs were stranded on average for "
                "the pods the cluster runs: pack smaller jobs (GPU shares) or keep whole "
                "nodes for 8-GPU pods"
            )
    return tuple(found)


def parse_range(data: Any, start: float, step_s: float, steps: int) -> list[Series]:
    """Prometheus' ``query_range`` ``data`` (a matrix) as series at the report's steps;
    a sample off the steps is put on the nearest one."""
    found: list[Series] = []
    result = data.get("result") if isinstance(data, Mapping) else None
    for item in result if isinstance(result, list) else []:
        if not isinstance(item, Mapping):
            continue
        metric = item.get("metric")
        labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, Mapping) else {}
        values = [math.nan] * steps
        for pair in item.get("values") or []:
            try:
                at, value = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                continue
            index = round((at - start) / step_s)
            if 0 <= index < steps:
                values[index] = value
        found.append((labels, tuple(values)))
    return found


QUEUE_COLUMNS: Final = (
    "CLUSTERQUEUE",
    "COHORT",
    "NOMINAL",
    "WAIT-P90",
    "ADMITTED",
    "PENDING",
    "BORROWED",
    "BORROWED-MAX",
    "LENT",
)
"""The queues' table, as the terminal and the HTML page both show it (``queue_cells``)."""


def queue_cells(q: QueueRange) -> tuple[object, ...]:
    """One ClusterQueue's row under ``QUEUE_COLUMNS`` (None: no figure)."""
    return (
        q.name,
        q.cohort,
        round(q.nominal),
        None if q.wait_p90_s is None else wait_text(q.wait_p90_s),
        q.admitted,
        round(q.pending_mean, 1),
        round(q.borrowed_mean, 1),
        round(q.borrowed_max, 1),
        round(q.lent_mean, 1),
    )
