"""What a run found, three ways: a summary for the terminal, JSON, and an HTML page.

Layer: PURE. Turns a ``SimResult`` into numbers (nearest-rank percentiles from
``stats``), text lines, a JSON-ready dict and a self-contained HTML page with inline SVG
charts (``svg``). No I/O, no clock: ``write`` in ``__main__``'s hands puts them in files.
Must not change the result it reports on.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from loadtest.measure.stats import EMPTY_SUMMARY, Summary, percentile
from loadtest.report.svg import Series, cdf_points, line_chart
from loadtest.sim.cluster_sim import SimResult

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


def _rate_series(result: SimResult, attr: str) -> list[tuple[float, float]]:
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
            "peak_binds": max((v for _, v in _rate_series(result, "binds")), default=0.0),
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


# ---------------------------------------------------------------- text


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def latency_lines(summaries: Mapping[str, Summary], errors: Mapping[str, int]) -> list[str]:
    head = f"  {'verb':<22}{'count':>7}" + "".join(
        f" {h:>8}" for h in ("p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms")
    )
    head += f" {'errors':>6}"
    lines = [head]
    for verb, s in summaries.items():
        errs = sum(
            n
            for k, n in errors.items()
            if k.split(":", 1)[0] in (verb, "filter/prioritize") and verb in k.split(":", 1)[0]
        )
        lines.append(
            f"  {verb:<22}{s.count:>7} {_ms(s.p50)} {_ms(s.p90)} {_ms(s.p99)} "
            f"{_ms(s.p999)} {_ms(s.maximum)} {errs:>6}"
        )
    return lines


def placement_examples(result: SimResult, per_kind: int = 2) -> list[str]:
    """A few bound jobs of each interesting kind: gangs (with their racks), shares,
    multi-GPU and single-GPU jobs, with the GPU indices the extender chose."""
    out: list[str] = []
    for kind in ("gang", "share", "multi-gpu", "1-gpu"):
        shown = 0
        for job in result.jobs.values():
            placed = [result.pods[k] for k in job.pods if result.pods[k].bound_s is not None]
            if job.spec.kind != kind or not placed or len(placed) < len(job.pods):
                continue
            where = ", ".join(f"{p.node}[{p.indices}]" for p in placed)
            racks = sorted({p.rack for p in placed if p.rack})
            topology = f" in {', '.join(racks)}" if kind == "gang" and racks else ""
            out.append(f"{job.spec.name} ({kind}, {job.flavor}){topology}: {where}")
            shown += 1
            if shown >= per_kind:
                break
    return out


def summary_lines(result: SimResult, data: Mapping[str, Any], placements: int = 6) -> list[str]:
    jobs, pods = data["jobs"], data["pods"]
    lines = [
        f"cluster: {result.nodes} nodes, {result.gpus_total} GPUs; "
        f"run {result.duration_s:.1f} s (jobs arriving for {result.arrivals_s:.1f} s)",
        "",
        f"admission (webhook over TLS): {jobs['created']} jobs reviewed, "
        f"{jobs['created'] - jobs['denied']} allowed, {jobs['denied']} denied",
    ]
    for d in result.denials[:8]:
        lines.append(f"  denied {d.job} ({d.kind}, {d.code}): {d.message}")
    refused = sum(n for k, n in result.errors.items() if k.startswith("update:"))
    lines.append(
        f"  unsuspends (Kueue's UPDATE, reviewed too): {len(result.latencies['update'])} "
        f"answered, {refused} refused or failed"
    )
    lines += [
        "",
        f"Kueue: {jobs['admitted']} admitted "
        f"({jobs['admitted_borrowing']} borrowing from the cohort), "
        f"{jobs['waiting_at_end']} still waiting, {jobs['finished']} finished",
        f"  {'LocalQueue':<34}{'jobs':>6} {'wait p50':>9} {'p90':>8} {'max':>8}",
    ]
    for queue, waits in sorted(result.queue_waits().items()):
        s = summarize(waits)
        lines.append(f"  {queue:<34}{s.count:>6} {s.p50:>8.2f}s {s.p90:>7.2f}s {s.maximum:>7.2f}s")
    lines += [
        "",
        f"placement (kube-scheduler + extender): {pods['bound']} of {pods['created']} pods bound, "
        f"{pods['pending_at_end']} pending at the end",
    ]
    lines += [f"  {line}" for line in placement_examples(result, per_kind=placements // 3)]
    start = data["pod_start_s"]
    lines.append(
        f"  pod start (Kueue admission to bound, retries included): p50 {start['p50_s']:.3f} s, "
        f"p99 {start['p99_s']:.3f} s, max {start['max_s']:.3f} s"
    )
    if result.filter_reasons:
        lines.append("  why pods waited (retried later):")
        for reason, n in result.filter_reasons.most_common(4):
            lines.append(f"    {n:>5} x {reason}")
    util = data["gpu_utilisation"]
    lines += [
        "",
        "latency in the cluster run (reviews timed from their intended send time; extender "
        "verbs as one kube-scheduler loop sends them):",
        *latency_lines(latency_summaries(result.latencies), result.errors),
        f"  throughput: {data['throughput_per_s']['reviews']:.1f} reviews/s, "
        f"{data['throughput_per_s']['binds']:.1f} binds/s "
        f"(peak {data['throughput_per_s']['peak_binds']:.1f}/s)",
        "",
        f"GPU utilisation: {util['mean_pct_second_half']:.1f} % mean "
        "in the second half of arrivals, "
        f"peak {util['peak_pct']:.1f} % ({util['peak_gpus']:.1f} of {result.gpus_total} GPUs)",
    ]
    if result.open_loop:
        names = max((int(run.get("names", 0)) for run in result.open_loop.values()), default=0)
        lines += [
            "",
            "each verb alone, open loop (latency from the intended send time; "
            f"{names:,} candidate nodes per extender call, as kube-scheduler sends them):",
        ]
        lines.append(
            f"  {'verb':<12}{'rate/s':>8}{'achieved':>9}{'ok':>7}{'errors':>7}"
            + "".join(f" {h:>8}" for h in ("p50 ms", "p90 ms", "p99 ms", "p99.9 ms"))
        )
        for verb, run in result.open_loop.items():
            lat = run["latency_s"]
            errs = sum(run["errors"].values())
            lines.append(
                f"  {verb:<12}{run['rate']:>8.0f}{run['achieved_rate']:>9.1f}{run['ok']:>7}"
                f"{errs:>7} {_ms(lat['p50_s'])} {_ms(lat['p90_s'])} {_ms(lat['p99_s'])} "
                f"{_ms(lat['p99.9_s'])}"
            )
    for name, r in data["rss"].items():
        lines.append(
            f"RSS {name}: {r['first_mib']:.0f} MiB at start, peak {r['peak_mib']:.0f} MiB, "
            f"{r['last_mib']:.0f} MiB at the end"
        )
    c = data["checks"]
    if not result.gpus_checked:
        lines.append("GPU indices not checked: a remote extender records them in its own cluster")
    lines.append(
        "checks: "
        + ("all passed" if c["ok"] else "FAILED")
        + f" (GPU over-allocations {c['over_allocations']}, "
        f"unhealthy GPUs used {c['unhealthy_used']}, "
        f"pods lost {c['pods_lost']}, unexpected denials {c['unexpected_denials']})"
    )
    if result.bind_refusals:
        refused = sum(result.bind_refusals.values())
        lines.append(
            f"bind refusals (re-checked at bind, pod retried): {refused}, e.g. "
            + result.bind_refusals.most_common(1)[0][0]
        )
    if result.errors:
        lines.append("errors: " + ", ".join(f"{k} x{n}" for k, n in result.errors.most_common(5)))
    return lines


# ---------------------------------------------------------------- HTML


PAGE_STYLE = """\
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1340px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
td:first-child { text-align: left; }
th { background: #f4f4f4; text-align: left; }
.facts td { text-align: left; }
.grid { display: flex; flex-wrap: wrap; gap: 16px; }
.grid svg { border: 1px solid #ddd; }
li { margin: 4px 0; }
"""
"""The look every report shares (the demo's, the real demo's)."""


def page_head(title: str) -> str:
    """An HTML page up to the end of ``<body>``'s opening tag, in the reports' look."""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title>\n<style>\n{PAGE_STYLE}</style></head><body>"
    )


def html_page(result: SimResult, data: Mapping[str, Any], title: str) -> str:
    quota = float(data.get("meta", {}).get("quota_nominal_gpus", 0))
    lat = result.latencies
    cdf = line_chart(
        "Latency CDF per verb",
        [
            Series(
                verb, [(v * 1000, p) for v, p in cdf_points(lat[verb])], dashed=verb == "schedule"
            )
            for verb in ("mutate", "update", "filter", "prioritize", "bind", "schedule")
            if lat.get(verb)
        ],
        x_label="latency (log scale)",
        y_label="% of requests at or below",
        x_unit="ms",
        y_unit="%",
        log_x=True,
        y_max=100.0,
        step=True,
    )
    throughput = line_chart(
        "Throughput over time",
        [
            Series("reviews/s", _rate_series(result, "reviews")),
            Series("pods bound/s", _rate_series(result, "binds")),
        ],
        x_label="seconds since start",
        y_label="per second (1 s moving average)",
    )
    total = max(result.gpus_total, 1)
    gpu = line_chart(
        "GPU allocation over time",
        [
            Series(
                "GPUs allocated (% of fleet)",
                [(s.at_s, 100.0 * s.gpus_allocated / total) for s in result.samples],
            ),
            Series(
                "pods pending (count)",
                [(s.at_s, float(s.pods_pending)) for s in result.samples],
                dashed=True,
            ),
            Series(
                "nominal quota (% of fleet)",
                [(0.0, 100.0 * quota / total), (result.duration_s, 100.0 * quota / total)],
                dashed=True,
            ),
        ],
        x_label="seconds since start",
        y_label="% of GPUs / pods",
    )
    waits = result.queue_waits()
    queue_chart = line_chart(
        "Queue wait per LocalQueue (CDF)",
        [Series(q.split("/")[-1], list(cdf_points(w))) for q, w in sorted(waits.items())],
        x_label="seconds from creation to Kueue admission",
        y_label="% of jobs at or below",
        x_unit="",
        y_unit="%",
        y_max=100.0,
        step=True,
    )
    queues_over_time = line_chart(
        "Jobs waiting for quota",
        [
            Series(
                q.split("/")[-1],
                [(s.at_s, float(s.jobs_waiting.get(q, 0))) for s in result.samples],
            )
            for q in sorted(waits)
        ],
        x_label="seconds since start",
        y_label="jobs waiting",
        step=True,
    )
    rss_chart = line_chart(
        "Server memory (RSS)",
        [
            Series(name, [(t, b / 2**20) for t, b in samples])
            for name, samples in result.rss.items()
            if samples
        ],
        x_label="seconds since start",
        y_label="MiB",
        y_min=None,
    )
    summaries = latency_summaries(lat)
    rows = "".join(
        f"<tr><td>{escape(v)}</td><td>{s.count}</td>"
        + "".join(f"<td>{x * 1000:.2f}</td>" for x in (s.p50, s.p90, s.p99, s.p999, s.maximum))
        + "</tr>"
        for v, s in summaries.items()
    )
    denials = "".join(
        f"<li><b>{escape(d['job'])}</b> ({escape(d['kind'])}, {d['code']}): "
        f"{escape(d['message'])}</li>"
        for d in data["denials"]
    )
    open_loop = ""
    if result.open_loop:
        verb_rows = "".join(
            f"<tr><td>{escape(v)}</td><td>{r['rate']:.0f}</td><td>{r['achieved_rate']:.1f}</td>"
            f"<td>{sum(r['errors'].values())}</td>"
            + "".join(
                f"<td>{r['latency_s'][k] * 1000:.2f}</td>"
                for k in ("p50_s", "p90_s", "p99_s", "p99.9_s", "max_s")
            )
            + "</tr>"
            for v, r in result.open_loop.items()
        )
        open_loop = (
            "<h2>Each verb alone, open loop (ms from the intended send time)</h2><table><tr>"
            "<th>verb</th><th>rate/s</th><th>achieved/s</th><th>errors</th><th>p50</th>"
            f"<th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr>{verb_rows}</table>"
        )
    c = data["checks"]
    util = data["gpu_utilisation"]
    jobs, pods = data["jobs"], data["pods"]
    facts = [
        ("Fleet", f"{result.nodes} nodes, {result.gpus_total} GPUs"),
        (
            "Jobs",
            f"{jobs['created']} created, {jobs['denied']} denied, {jobs['admitted']} admitted "
            f"({jobs['admitted_borrowing']} borrowing), {jobs['finished']} finished",
        ),
        (
            "Pods",
            f"{pods['bound']} of {pods['created']} bound, "
            f"{pods['pending_at_end']} pending at the end",
        ),
        (
            "GPU utilisation",
            f"{util['mean_pct_second_half']:.1f} % mean (second half of arrivals), "
            f"peak {util['peak_pct']:.1f} %",
        ),
        (
            "Throughput",
            f"{data['throughput_per_s']['reviews']:.1f} reviews/s, "
            f"{data['throughput_per_s']['binds']:.1f} binds/s",
        ),
        ("Checks", "all passed" if c["ok"] else f"FAILED: {escape(str(c))}"),
    ]
    fact_rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    return f"""{page_head(title)}
<h1>{escape(title)}</h1>
<table class="facts">{fact_rows}</table>
<h2>Latency in the cluster run (ms; nearest-rank percentiles)</h2>
<table><tr><th>verb</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr>{rows}</table>
{open_loop}
<div class="grid">{cdf}{throughput}</div>
<h2>GPUs and queues</h2>
<div class="grid">{gpu}{queue_chart}{queues_over_time}{rss_chart}</div>
<h2>Denied at admission</h2><ul>{denials or "<li>none</li>"}</ul>
</body></html>
"""


# ---------------------------------------------------------------- placement (FGD method)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def placement_curves(data: Mapping[str, Any]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """trace → policy → (arrived %, median allocation % over seeds), from the ``runs`` of
    ``python -m loadtest placement --json``; published figures as ``<policy> (published)``."""
    curves: dict[str, dict[str, dict[int, list[float]]]] = {}
    for run in data.get("runs", []):
        per_x = curves.setdefault(run["trace"], {}).setdefault(run["policy"], {})
        for x, y in run["curve"].items():
            per_x.setdefault(int(x), []).append(float(y))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for trace, policies in curves.items():
        out[trace] = {
            policy: [(float(x), _median(ys)) for x, ys in sorted(per_x.items())]
            for policy, per_x in policies.items()
        }
    for key, points in data.get("published", {}).items():
        trace, _, policy = key.partition("/")
        if trace in out:
            out[trace][f"{policy} (published)"] = sorted(
                (float(x), float(y)) for x, y in points.items()
            )
    return out


def placement_page(data: Mapping[str, Any], title: str) -> str:
    """One chart per trace: GPU allocation vs arrived load, per policy (the FGD figure)."""
    charts = []
    for trace, policies in sorted(placement_curves(data).items()):
        ours = [Series(p, pts) for p, pts in policies.items() if not p.endswith("(published)")]
        published = [
            Series(p, pts, dashed=True)
            for p, pts in policies.items()
            if p.endswith("(published)") and any(k in p.lower() for k in ("fgd", "bestfit"))
        ]
        # The whole curve, then the part where policies differ (from 90 % arrived).
        for label, low in (("", 0.0), (" (from 90 % arrived)", 90.0)):
            charts.append(
                line_chart(
                    f"openb {trace}: GPU allocation vs arrived load{label}",
                    [
                        Series(s.label, [p for p in s.points if p[0] >= low], s.dashed)
                        for s in (*ours, *published)
                    ],
                    x_label="arrived GPU demand (% of capacity)",
                    y_label="GPUs allocated (% of capacity)",
                    x_unit="%",
                    y_unit="%",
                    y_min=None if low else 0.0,
                )
            )
    body = "".join(charts) or "<p>no runs in the file</p>"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}'
        "</title><style>body { font-family: sans-serif; margin: 24px; }"
        " .grid { display: flex; flex-wrap: wrap; gap: 16px; }"
        " .grid svg { border: 1px solid #ddd; }</style></head><body>"
        f'<h1>{escape(title)}</h1><div class="grid">{body}</div></body></html>\n'
    )
