"""What a simulated run found, as numbers: nearest-rank summaries per verb, the run's
checks, GPU utilisation, memory, and the JSON document (``<mode>.json``) they make up.

Layer: PURE. A ``SimResult`` in, numbers and a JSON-ready dict out; ``terminal`` and
``page`` turn them into text and HTML. No I/O, no clock: ``loadtest.demo`` writes the
files. Must not change the result it reports on.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster import labels
from loadtest.measure.stats import EMPTY_SUMMARY, Summary, percentile
from loadtest.sim.kueue import KueueSetup
from loadtest.sim.records import SimResult

EXTENDER_VERBS = ("filter", "prioritize", "bind")
ALL_EXTENDER = "extender (all verbs)"


def summarize(values: Sequence[float]) -> Summary:
    """Exact nearest-rank summary of raw samples (seconds)."""
    if not values:
        return EMPTY_SUMMARY
    ordered = sorted(values)
    return Summary(
        count=len(ordered),
        minimum=ordered[0],
        mean=sum(ordered) / len(ordered),
        p50=percentile(ordered, 50.0),
        p90=percentile(ordered, 90.0),
        p99=percentile(ordered, 99.0),
        p999=percentile(ordered, 99.9),
        maximum=ordered[-1],
    )


def latency_summaries(latencies: Mapping[str, Sequence[float]]) -> dict[str, Summary]:
    """One summary per verb, plus the extender's verbs pooled: the percentile of all
    its requests together (not an average of per-verb percentiles, which means nothing)."""
    out = {verb: summarize(values) for verb, values in latencies.items()}
    pooled = [v for verb in EXTENDER_VERBS for v in latencies.get(verb, ())]
    out[ALL_EXTENDER] = summarize(pooled)
    return out


@dataclass(frozen=True, slots=True)
class Checks:
    """Invariants a correct run keeps; the integration test and the CLI assert them."""

    over_allocations: int
    unhealthy_used: int
    pods_lost: int
    """Pods of admitted jobs that are neither bound, pending nor ended (must be 0)."""
    quota_overrun: int
    unexpected_denials: int
    expected_denials_missing: int

    @property
    def ok(self) -> bool:
        return not any(
            (
                self.over_allocations,
                self.unhealthy_used,
                self.pods_lost,
                self.quota_overrun,
                self.unexpected_denials,
                self.expected_denials_missing,
            )
        )


def checks(result: SimResult, quota_nominal_gpus: int) -> Checks:
    lost = 0
    for job in result.jobs.values():
        if job.admitted_s is None:
            continue
        expected = job.demand.pods if job.demand is not None else 0
        if len(job.pods) != expected:
            lost += abs(expected - len(job.pods))
    peak = max((s.gpus_allocated for s in result.samples), default=0.0)
    bad_expected = sum(1 for j in result.jobs.values() if j.spec.kind.startswith("bad-"))
    bad_denied = sum(1 for d in result.denials if d.kind.startswith("bad-"))
    return Checks(
        over_allocations=len(result.over_allocations),
        unhealthy_used=len(result.unhealthy_used),
        pods_lost=lost,
        quota_overrun=int(peak > quota_nominal_gpus + 1e-6),
        unexpected_denials=result.unexpected_denials,
        expected_denials_missing=bad_expected - bad_denied,
    )


def rate_series(result: SimResult, attr: str) -> list[tuple[float, float]]:
    """Per-interval rates from the cumulative counters in the samples."""
    out: list[tuple[float, float]] = []
    samples = result.samples
    for prev, cur in itertools.pairwise(samples):
        dt = cur.at_s - prev.at_s
        if dt > 0:
            out.append((cur.at_s, (getattr(cur, attr) - getattr(prev, attr)) / dt))
    return _smooth(out, 4)


def _smooth(points: list[tuple[float, float]], window: int) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for i in range(len(points)):
        chunk = points[max(0, i - window + 1) : i + 1]
        out.append((points[i][0], sum(p[1] for p in chunk) / len(chunk)))
    return out


def utilisation(result: SimResult) -> dict[str, float]:
    """Allocated share of the fleet's GPUs: mean while jobs arrived, and peak."""
    total = max(result.gpus_total, 1)
    during = [s.gpus_allocated for s in result.samples if s.at_s <= result.arrivals_s]
    busy_half = [
        s.gpus_allocated
        for s in result.samples
        if result.arrivals_s / 2 <= s.at_s <= result.arrivals_s
    ]
    peak = max((s.gpus_allocated for s in result.samples), default=0.0)
    return {
        "mean_pct_while_arriving": 100.0 * sum(during) / len(during) / total if during else 0.0,
        "mean_pct_second_half": 100.0 * sum(busy_half) / len(busy_half) / total
        if busy_half
        else 0.0,
        "peak_pct": 100.0 * peak / total,
        "peak_gpus": peak,
    }


def rss_summary(rss: Mapping[str, Sequence[tuple[float, int]]]) -> dict[str, dict[str, float]]:
    """MiB per server: first sample, peak, last, and growth over the second half of the
    run (after warm-up: what a leak looks like)."""
    out: dict[str, dict[str, float]] = {}
    for name, samples in rss.items():
        if not samples:
            continue
        mib = [(t, b / 2**20) for t, b in samples]
        half = mib[len(mib) // 2][1]
        out[name] = {
            "first_mib": mib[0][1],
            "peak_mib": max(v for _, v in mib),
            "last_mib": mib[-1][1],
            "growth_second_half_mib": mib[-1][1] - half,
        }
    return out


def to_json(result: SimResult, meta: Mapping[str, Any], quota_nominal_gpus: int) -> dict[str, Any]:
    jobs = list(result.jobs.values())
    pods = list(result.pods.values())
    c = checks(result, quota_nominal_gpus)
    return {
        "meta": dict(meta),
        "duration_s": result.duration_s,
        "arrivals_s": result.arrivals_s,
        "fleet": {"nodes": result.nodes, "gpus": result.gpus_total},
        "jobs": {
            "created": len(jobs),
            "denied": len(result.denials),
            "admitted": sum(j.admitted_s is not None for j in jobs),
            "admitted_borrowing": sum(j.borrowed for j in jobs),
            "waiting_at_end": sum(j.stored is not None and j.admitted_s is None for j in jobs),
            "finished": sum(j.finished_s is not None for j in jobs),
        },
        "pods": {
            "created": len(pods),
            "bound": sum(p.bound_s is not None for p in pods),
            "pending_at_end": sum(p.bound_s is None and not p.ended for p in pods),
            "ended": sum(p.ended for p in pods),
            "gpus_bound_total": sum(p.gpus + p.milli / 1000 for p in pods if p.bound_s is not None),
        },
        "denials": [
            {"job": d.job, "kind": d.kind, "code": d.code, "message": d.message}
            for d in result.denials
        ],
        "latency_s": {k: v.to_json() for k, v in latency_summaries(result.latencies).items()},
        "throughput_per_s": {
            "reviews": len(result.latencies["mutate"]) / max(result.arrivals_s, 1e-9),
            "update_reviews": len(result.latencies["update"]) / max(result.duration_s, 1e-9),
            "binds": len(result.latencies["schedule"]) / max(result.duration_s, 1e-9),
            "peak_binds": max((v for _, v in rate_series(result, "binds")), default=0.0),
        },
        "errors": dict(result.errors),
        "filter_reasons": dict(result.filter_reasons.most_common(20)),
        "bind_refusals": dict(result.bind_refusals.most_common(20)),
        "pod_start_s": summarize(
            [p.bound_s - p.created_s for p in pods if p.bound_s is not None]
        ).to_json(),
        "queue_wait_s": {
            q: summarize(w).to_json() for q, w in sorted(result.queue_waits().items())
        },
        "gpu_utilisation": utilisation(result),
        "rss": rss_summary(result.rss),
        "open_loop_per_verb": dict(result.open_loop),
        "checks": {**{k: getattr(c, k) for k in c.__slots__}, "ok": c.ok},
    }


def _gpus(resource: str, amount: float) -> float:
    """Whole GPUs, shares of one as milli / 1000, as the fleet's allocation counts them."""
    return amount / 1000 if resource == labels.GPU_MILLI_RESOURCE else float(amount)


def capacity_json(result: SimResult, setup: KueueSetup) -> dict[str, Any]:
    """What ``tessera capacity --from-run`` reads: the ClusterQueues' nominal GPUs, each
    job's way through Kueue (queue, flavor, GPUs, created, admitted, finished) and the
    GPUs the extender had allocated at each sample. Only jobs that reached Kueue (not
    denied at admission) are listed."""
    queues = []
    for name, cq in sorted(setup.cluster_queues.items()):
        nominal: dict[str, float] = {}
        for (flavor, resource), quota in cq.quotas.items():
            nominal[flavor] = nominal.get(flavor, 0.0) + _gpus(resource, quota.nominal)
        queues.append({"name": name, "cohort": cq.cohort, "nominal_gpus": nominal})
    jobs = [
        {
            "cluster_queue": job.cluster_queue,
            "flavor": job.flavor or None,
            "gpus": _gpus(job.demand.resource, job.demand.total),
            "created_s": round(job.created_s, 3),
            "admitted_s": None if job.admitted_s is None else round(job.admitted_s, 3),
            "finished_s": None if job.finished_s is None else round(job.finished_s, 3),
        }
        for job in result.jobs.values()
        if job.cluster_queue and job.demand is not None
    ]
    allocated = [[round(s.at_s, 3), round(s.gpus_allocated, 3)] for s in result.samples]
    return {"cluster_queues": queues, "jobs": jobs, "gpus_allocated": allocated}
