"""What ``demo --real`` measured on the real stack, three ways: a summary for the terminal,
JSON and an HTML page; and two runs (topology mode A and mode B) side by side.

Layer: PURE. Turns a ``RealRun`` (filled by ``loadtest.demo.real`` from what it read back
through the API) into numbers (nearest-rank percentiles), text lines, a JSON-ready dict
and a self-contained HTML page with inline SVG charts, in the layout of ``page`` (the
embedded demo's). No I/O, no clock. Must not change the run it reports on.

Times are seconds since the first job was created, as the driver saw them: a job's
creation when its POST was answered, its admission and its pods' binding when a sample
(every ``sample_every_s``) first saw them, so waits are exact to one sample period.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from cluster.svg import Series, cdf_points, line_chart, page_head
from loadtest.report.summary import summarize

GANG = "gang"
MODE_NAMES = {
    "tessera": "mode A: Tessera's webhook and extender keep gangs in a rack",
    "kueue": "mode B: Kueue's topology-aware scheduling assigns the hosts",
}


@dataclass(slots=True)
class JobRecord:
    namespace: str
    name: str
    kind: str
    """``1-gpu``, ``multi-gpu``, ``gang``, ``share`` or ``bad-*`` (as the stream drew it)."""
    local_queue: str
    pods: int
    run_s: float
    created_s: float
    denied: str | None = None
    admitted_s: float | None = None
    flavor: str = ""
    bound_s: float | None = None
    """When all its pods were first seen bound at once."""
    racks: tuple[str, ...] = ()
    """The racks of those pods, at that moment (a gang Kueue evicted and admitted again
    has pods of both attempts, on other racks)."""
    finished_s: float | None = None
    failed: bool = False
    evictions: set[str] = field(default_factory=set)
    """Kueue's reasons for evicting its workload (``PodsReadyTimeout``...), as seen."""


@dataclass(slots=True)
class PodRecord:
    namespace: str
    name: str
    job: str
    gpus: int
    milli: int
    node: str = ""
    rack: str = ""
    indices: tuple[int, ...] = ()
    bound_s: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    gpus_allocated: float
    """Whole GPUs plus shares (milli / 1000) held by bound pods that have not ended."""
    pods_running: int
    pods_pending: int
    jobs_waiting: Mapping[str, int]
    """LocalQueue → jobs created and not admitted yet."""
    free_gpus: int
    """Healthy GPUs no pod holds."""
    free_in_whole_islands: int
    """Of those, the ones in an NVLink island nobody uses (a 4-GPU pod could go there)."""


@dataclass(slots=True)
class RealRun:
    topology: str
    nodes: int
    gpus_total: int
    islands: Mapping[str, tuple[frozenset[int], ...]]
    """Node → its NVLink islands (GPU indices)."""
    quota_nominal_gpus: int
    arrivals_s: float = 0.0
    duration_s: float = 0.0
    sample_every_s: float = 0.5
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    """``namespace/name`` → the job."""
    pods: dict[str, PodRecord] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    double_booked: list[str] = field(default_factory=list)
    """Every distinct GPU accounting problem seen in a sample (must stay empty)."""


# ---------------------------------------------------------------- numbers


def _allowed(run: RealRun) -> list[JobRecord]:
    return [j for j in run.jobs.values() if j.denied is None]


def waits(run: RealRun, kinds: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Seconds from creation to Kueue's admission, from admission to all pods bound, and
    from creation to all pods bound, of the jobs (of ``kinds``) that got that far."""
    jobs = [j for j in _allowed(run) if kinds is None or j.kind in kinds]
    return {
        "admission": [j.admitted_s - j.created_s for j in jobs if j.admitted_s is not None],
        "placement": [
            j.bound_s - j.admitted_s
            for j in jobs
            if j.bound_s is not None and j.admitted_s is not None
        ],
        "total": [j.bound_s - j.created_s for j in jobs if j.bound_s is not None],
    }


def placement(run: RealRun) -> dict[str, Any]:
    """Gangs within one rack, multi-GPU pods (2 to 4 GPUs) within one NVLink island, and
    how fragmented the free GPUs were."""
    gangs = [j for j in _allowed(run) if j.kind == GANG and j.bound_s is not None]
    split = [
        f"{job.namespace}/{job.name} across racks {sorted(set(job.racks))}"
        for job in gangs
        if len(set(job.racks)) != 1
    ]
    small = [p for p in run.pods.values() if p.bound_s is not None and 2 <= p.gpus <= 4]
    spread = [
        f"{p.namespace}/{p.name} on {p.node} GPUs {list(p.indices)}"
        for p in small
        if not any(set(p.indices) <= island for island in run.islands.get(p.node, ()))
    ]
    during = [s for s in run.samples if s.at_s <= run.arrivals_s] or run.samples
    return {
        "gangs_placed": len(gangs),
        "gangs_in_one_rack": len(gangs) - len(split),
        "gangs_split": split,
        "pods_2_to_4_gpus": len(small),
        "pods_in_one_island": len(small) - len(spread),
        "pods_across_islands": spread,
        "fragmentation_mean_pct": _time_mean(during, _stranded_pct),
        "fragmentation_peak_pct": max((_stranded_pct(s) for s in during), default=0.0),
    }


def _time_mean(samples: Sequence[Sample], value: Callable[[Sample], float]) -> float:
    """The mean over time: each sample holds until the next one (samples run late when
    the machine is busy, so a plain mean would weigh busy moments less)."""
    if not samples:
        return 0.0
    if len(samples) == 1:
        return value(samples[0])
    total = sum(value(a) * (b.at_s - a.at_s) for a, b in itertools.pairwise(samples))
    span = samples[-1].at_s - samples[0].at_s
    return total / span if span > 0 else value(samples[0])


def allocation(run: RealRun) -> dict[str, float]:
    """Allocated share of the fleet's GPUs: mean over time while jobs arrived, over the
    second half of the arrivals (past the ramp-up), and peak."""
    total = max(run.gpus_total, 1)
    during = [s for s in run.samples if s.at_s <= run.arrivals_s]
    second = [s for s in during if s.at_s >= run.arrivals_s / 2]
    peak = max((s.gpus_allocated for s in run.samples), default=0.0)
    return {
        "mean_pct_while_arriving": 100.0 * _time_mean(during, _allocated) / total,
        "mean_pct_second_half": 100.0 * _time_mean(second, _allocated) / total,
        "peak_pct": 100.0 * peak / total,
        "peak_gpus": peak,
    }


def _allocated(sample: Sample) -> float:
    return sample.gpus_allocated


def _stranded_pct(sample: Sample) -> float:
    if not sample.free_gpus:
        return 0.0
    return 100.0 * (sample.free_gpus - sample.free_in_whole_islands) / sample.free_gpus


def to_json(run: RealRun, meta: Mapping[str, Any]) -> dict[str, Any]:
    allowed = _allowed(run)
    place = placement(run)
    checks = _checks(run, allowed, place)
    by_kind = {
        kind: {k: summarize(v).to_json() for k, v in waits(run, [kind]).items()}
        for kind in sorted({j.kind for j in allowed})
    }
    by_queue: dict[str, list[float]] = {}
    for job in allowed:
        if job.admitted_s is not None:
            by_queue.setdefault(job.local_queue, []).append(job.admitted_s - job.created_s)
    pods = list(run.pods.values())
    return {
        "meta": {**meta, "topology": run.topology, "sample_every_s": run.sample_every_s},
        "duration_s": run.duration_s,
        "arrivals_s": run.arrivals_s,
        "fleet": {"nodes": run.nodes, "gpus": run.gpus_total},
        "jobs": _job_counts(run, allowed),
        "pods": {
            "created": len(pods),
            "bound": sum(p.bound_s is not None for p in pods),
            "gpus_bound_total": sum(p.gpus + p.milli / 1000 for p in pods if p.bound_s),
        },
        "wait_s": {k: summarize(v).to_json() for k, v in waits(run).items()},
        "wait_s_by_kind": by_kind,
        "queue_wait_s": {q: summarize(w).to_json() for q, w in sorted(by_queue.items())},
        "gpu_allocation": allocation(run),
        "samples": [_sample_json(x) for x in run.samples],
        "placement": place,
        "denials": [
            {"job": f"{j.namespace}/{j.name}", "kind": j.kind, "message": j.denied}
            for j in run.jobs.values()
            if j.denied is not None
        ],
        "double_booked": list(run.double_booked),
        "checks": {**checks, "ok": not any(checks.values())},
        "per_job": [_job_json(j) for j in allowed],
    }


def _checks(run: RealRun, allowed: list[JobRecord], place: Mapping[str, Any]) -> dict[str, int]:
    bad = [j for j in run.jobs.values() if j.kind.startswith("bad-")]
    unexpected = [
        j for j in run.jobs.values() if j.denied is not None and not j.kind.startswith("bad-")
    ]
    unfinished = [j for j in allowed if j.finished_s is None or j.failed]
    return {
        "double_booked": len(run.double_booked),
        "gangs_split": len(place["gangs_split"]),
        "pods_across_islands": len(place["pods_across_islands"]),
        "jobs_unfinished": len(unfinished),
        "unexpected_denials": len(unexpected),
        "expected_denials_missing": sum(j.denied is None for j in bad),
    }


def _job_counts(run: RealRun, allowed: list[JobRecord]) -> dict[str, Any]:
    return {
        "created": len(run.jobs),
        "denied": len(run.jobs) - len(allowed),
        "submitted": len(allowed),
        "admitted": sum(j.admitted_s is not None for j in allowed),
        "all_pods_bound": sum(j.bound_s is not None for j in allowed),
        "completed": sum(j.finished_s is not None and not j.failed for j in allowed),
        "failed": sum(j.failed for j in allowed),
        "waiting_at_end": sum(j.admitted_s is None for j in allowed),
        "evicted": sum(bool(j.evictions) for j in allowed),
        "eviction_reasons": sorted({r for j in allowed for r in j.evictions}),
    }


def _sample_json(x: Sample) -> dict[str, Any]:
    return {
        "at_s": round(x.at_s, 3),
        "gpus_allocated": x.gpus_allocated,
        "pods_running": x.pods_running,
        "pods_pending": x.pods_pending,
        "jobs_waiting": sum(x.jobs_waiting.values()),
        "free_gpus": x.free_gpus,
        "free_in_whole_islands": x.free_in_whole_islands,
    }


def _job_json(j: JobRecord) -> dict[str, Any]:
    return {
        "job": f"{j.namespace}/{j.name}",
        "kind": j.kind,
        "queue": j.local_queue,
        "pods": j.pods,
        "run_s": j.run_s,
        "flavor": j.flavor,
        "created_s": j.created_s,
        "admitted_s": j.admitted_s,
        "bound_s": j.bound_s,
        "finished_s": j.finished_s,
        "failed": j.failed,
        "evictions": sorted(j.evictions),
    }


# ---------------------------------------------------------------- text


def _s(summary: Mapping[str, Any]) -> str:
    if not summary["count"]:
        return "        -        -        -"
    return f"{summary['p50_s']:8.2f}s {summary['p90_s']:7.2f}s {summary['max_s']:7.2f}s"


def summary_lines(run: RealRun, data: Mapping[str, Any]) -> list[str]:
    jobs, util = data["jobs"], data["gpu_allocation"]
    lines = [
        f"cluster: {run.nodes} nodes, {run.gpus_total} GPUs (fake nodes, real control plane); "
        f"{MODE_NAMES.get(run.topology, run.topology)}",
        f"run {run.duration_s:.1f} s (jobs arriving for {run.arrivals_s:.1f} s), "
        f"sampled every {run.sample_every_s:g} s",
        "",
        f"admission (kube-apiserver, Kueue's and Tessera's webhooks): {jobs['created']} jobs "
        f"created, {jobs['submitted']} allowed, {jobs['denied']} denied",
    ]
    for d in data["denials"][:8]:
        lines.append(f"  denied {d['job']} ({d['kind']}): {d['message']}")
    lines += ["", *_wait_lines(data), "", *_placement_lines(data)]
    lines += [
        "",
        f"GPU allocation: {util['mean_pct_second_half']:.1f} % mean in the second half of "
        f"arrivals, {util['mean_pct_while_arriving']:.1f} % while arriving, peak "
        f"{util['peak_pct']:.1f} % ({util['peak_gpus']:.1f} of {run.gpus_total} GPUs)",
    ]
    c = data["checks"]
    lines.append(
        "checks: "
        + ("all passed" if c["ok"] else "FAILED")
        + f" (double-booked {c['double_booked']}, gangs split {c['gangs_split']}, "
        f"pods across islands {c['pods_across_islands']}, jobs unfinished "
        f"{c['jobs_unfinished']}, unexpected denials {c['unexpected_denials']})"
    )
    return lines


def _wait_lines(data: Mapping[str, Any]) -> list[str]:
    """Kueue's admissions and evictions, the jobs' outcomes, and the waits per phase,
    kind and queue."""
    jobs = data["jobs"]
    lines = [
        f"Kueue: {jobs['admitted']} admitted, {jobs['waiting_at_end']} still waiting, "
        f"{jobs['evicted']} evicted at least once"
        + (f" ({', '.join(jobs['eviction_reasons'])})" if jobs["eviction_reasons"] else ""),
        f"jobs: {jobs['completed']} of {jobs['submitted']} completed, {jobs['failed']} failed",
        "",
        f"  {'wait':<34}{'jobs':>6} {'p50':>9} {'p90':>8} {'max':>8}",
    ]
    names = {
        "admission": "created -> Kueue admission",
        "placement": "admission -> all pods bound",
        "total": "created -> all pods bound",
    }
    for key, label in names.items():
        s = data["wait_s"][key]
        lines.append(f"  {label:<34}{s['count']:>6} {_s(s)}")
    for kind, phases in data["wait_s_by_kind"].items():
        s = phases["total"]
        lines.append(f"  {'  ' + kind + ' (created -> bound)':<34}{s['count']:>6} {_s(s)}")
    for queue, s in data["queue_wait_s"].items():
        lines.append(f"  {'  ' + queue + ' (to admission)':<34}{s['count']:>6} {_s(s)}")
    return lines


def _placement_lines(data: Mapping[str, Any]) -> list[str]:
    place = data["placement"]
    lines = [
        f"placement (kube-scheduler + extender): {data['pods']['bound']} of "
        f"{data['pods']['created']} pods bound",
        f"  gangs in one rack: {place['gangs_in_one_rack']} of {place['gangs_placed']}",
        f"  pods of 2-4 GPUs within one NVLink island: {place['pods_in_one_island']} of "
        f"{place['pods_2_to_4_gpus']}",
        f"  fragmentation (free GPUs outside a wholly free island): "
        f"{place['fragmentation_mean_pct']:.1f} % mean, {place['fragmentation_peak_pct']:.1f} % "
        "peak",
        f"  GPUs double-booked: {len(data['double_booked'])}",
    ]
    for problem in data["double_booked"][:5]:
        lines.append(f"    {problem}")
    for problem in (*place["gangs_split"][:3], *place["pods_across_islands"][:3]):
        lines.append(f"    {problem}")
    return lines


def _figures(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    jobs, place, util = data["jobs"], data["placement"], data["gpu_allocation"]
    gang = data["wait_s_by_kind"].get(GANG, {})
    rows = [
        ("jobs completed", f"{jobs['completed']} of {jobs['submitted']}"),
        ("jobs evicted by Kueue", str(jobs["evicted"])),
    ]
    for key, label in (("total", "all jobs: created -> bound"),):
        s = data["wait_s"][key]
        rows.append((f"{label} p50 / p90", f"{s['p50_s']:.1f} / {s['p90_s']:.1f} s"))
    for key, label in (
        ("admission", "gangs: created -> admitted"),
        ("placement", "gangs: admitted -> bound"),
        ("total", "gangs: created -> bound"),
    ):
        s = gang.get(key)
        value = f"{s['p50_s']:.1f} / {s['p90_s']:.1f} s" if s and s["count"] else "-"
        rows.append((f"{label} p50 / p90", value))
    rows += [
        ("GPU allocation, 2nd half of arrivals", f"{util['mean_pct_second_half']:.1f} %"),
        ("GPU allocation, peak", f"{util['peak_pct']:.1f} %"),
        ("gangs in one rack", f"{place['gangs_in_one_rack']} of {place['gangs_placed']}"),
        (
            "2-4 GPU pods in one island",
            f"{place['pods_in_one_island']} of {place['pods_2_to_4_gpus']}",
        ),
        ("fragmentation, mean", f"{place['fragmentation_mean_pct']:.1f} %"),
        ("GPUs double-booked", str(len(data["double_booked"]))),
        ("checks", "passed" if data["checks"]["ok"] else "FAILED"),
    ]
    return rows


def compare_lines(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The runs' headline figures side by side (``topology`` → its ``to_json``)."""
    names = list(runs)
    figures = {name: dict(_figures(data)) for name, data in runs.items()}
    first = next(iter(runs.values()))
    lines = [
        f"the same job stream (seed {first['meta'].get('seed')}, {first['jobs']['created']} "
        f"jobs) in each topology mode:",
        f"  {'':<40}" + "".join(f"{name:>18}" for name in names),
    ]
    for label, _ in _figures(first):
        lines.append(f"  {label:<40}" + "".join(f"{figures[n][label]:>18}" for n in names))
    return lines


# ---------------------------------------------------------------- HTML


def html_page(run: RealRun, data: Mapping[str, Any], title: str) -> str:
    gpu, cdf, waiting, frag = _charts(run, data)
    wait_rows = "".join(
        f"<tr><td>{escape(label)}</td><td>{s['count']}</td>"
        + "".join(f"<td>{s[k]:.2f}</td>" for k in ("p50_s", "p90_s", "p99_s", "max_s"))
        + "</tr>"
        for label, s in (
            *((f"all: {k}", v) for k, v in data["wait_s"].items()),
            *((f"{kind}: total", v["total"]) for kind, v in data["wait_s_by_kind"].items()),
        )
    )
    facts = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in _figures(data))
    denials = "".join(
        f"<li><b>{escape(d['job'])}</b> ({escape(d['kind'])}): {escape(str(d['message']))}</li>"
        for d in data["denials"]
    )
    problems = "".join(f"<li>{escape(p)}</li>" for p in data["double_booked"])
    return f"""{page_head(title)}
<h1>{escape(title)}</h1>
<p>{escape(MODE_NAMES.get(run.topology, run.topology))}. {run.nodes} fake nodes,
{run.gpus_total} GPUs; real kube-apiserver, Kueue, kube-scheduler with Tessera's extender.</p>
<table>{facts}</table>
<h2>Waits (s; sampled every {run.sample_every_s:g} s)</h2>
<table><tr><th>jobs</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>
{wait_rows}</table>
<div class="grid">{gpu}{cdf}{waiting}{frag}</div>
<h2>GPUs double-booked</h2><ul>{problems or "<li>none</li>"}</ul>
<h2>Denied at admission</h2><ul>{denials or "<li>none</li>"}</ul>
</body></html>
"""


def _charts(run: RealRun, data: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """GPU allocation, the waits' CDF per kind, jobs waiting, and fragmentation."""
    total = max(run.gpus_total, 1)
    quota = float(data.get("meta", {}).get("quota_nominal_gpus", 0))
    gpu_series = [
        Series("allocated", [(s.at_s, 100.0 * s.gpus_allocated / total) for s in run.samples])
    ]
    if quota:
        span = [run.samples[0].at_s, run.samples[-1].at_s] if run.samples else []
        gpu_series.append(Series("nominal quota", [(t, 100.0 * quota / total) for t in span], True))
    gpu = line_chart(
        "GPU allocation over time",
        gpu_series,
        x_label="seconds since the first job",
        y_label="GPUs allocated",
        y_unit="%",
        y_max=100.0,
    )
    frag = line_chart(
        "Free GPUs outside a wholly free NVLink island",
        [
            Series(
                "fragmentation",
                [
                    (s.at_s, 100.0 * (s.free_gpus - s.free_in_whole_islands) / s.free_gpus)
                    for s in run.samples
                    if s.free_gpus
                ],
            )
        ],
        x_label="seconds since the first job",
        y_label="of the free GPUs",
        y_unit="%",
        y_max=100.0,
    )
    queues = sorted({q for s in run.samples for q in s.jobs_waiting})
    waiting = line_chart(
        "Jobs waiting for Kueue's admission",
        [
            Series(
                q.split("/")[-1], [(s.at_s, float(s.jobs_waiting.get(q, 0))) for s in run.samples]
            )
            for q in queues
        ],
        x_label="seconds since the first job",
        y_label="jobs waiting",
        step=True,
    )
    allowed = _allowed(run)
    kinds = sorted({j.kind for j in allowed})
    cdf = line_chart(
        "Created -> all pods bound, per kind of job (CDF)",
        [Series(kind, cdf_points(waits(run, [kind])["total"])) for kind in kinds],
        x_label="seconds",
        y_label="jobs",
        y_unit="%",
        step=True,
    )
    return gpu, cdf, waiting, frag
