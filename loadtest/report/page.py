"""A simulated run's HTML page: facts, latency tables, and inline SVG charts of latency,
throughput, GPU allocation, queues and memory (drawn with ``cluster.svg``).

Layer: PURE. A ``SimResult`` and its JSON in, HTML text out; no I/O, no clock. Must not
change the result it reports on.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from cluster.svg import Series, cdf_points, line_chart, page_head
from loadtest.measure.stats import Summary
from loadtest.report.summary import latency_summaries, rate_series
from loadtest.sim.records import SimResult


def html_page(result: SimResult, data: Mapping[str, Any], title: str) -> str:
    cdf, throughput = _latency_charts(result)
    gpu, queue_chart, queues_over_time, rss_chart = _cluster_charts(result, data)
    rows = _latency_rows(latency_summaries(result.latencies))
    denials = "".join(
        f"<li><b>{escape(d['job'])}</b> ({escape(d['kind'])}, {d['code']}): "
        f"{escape(d['message'])}</li>"
        for d in data["denials"]
    )
    open_loop = _open_loop_table(result)
    fact_rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in _facts(result, data))
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


def _latency_charts(result: SimResult) -> tuple[str, str]:
    """The latency CDF per verb, and reviews and binds per second over the run."""
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
            Series("reviews/s", rate_series(result, "reviews")),
            Series("pods bound/s", rate_series(result, "binds")),
        ],
        x_label="seconds since start",
        y_label="per second (1 s moving average)",
    )
    return cdf, throughput


def _cluster_charts(result: SimResult, data: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """GPU allocation, queue waits, jobs waiting over time, and the servers' memory."""
    gpu = _gpu_chart(result, data)
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
    return gpu, queue_chart, queues_over_time, rss_chart


def _latency_rows(summaries: Mapping[str, Summary]) -> str:
    return "".join(
        f"<tr><td>{escape(v)}</td><td>{s.count}</td>"
        + "".join(f"<td>{x * 1000:.2f}</td>" for x in (s.p50, s.p90, s.p99, s.p999, s.maximum))
        + "</tr>"
        for v, s in summaries.items()
    )


def _open_loop_table(result: SimResult) -> str:
    if not result.open_loop:
        return ""
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
    return (
        "<h2>Each verb alone, open loop (ms from the intended send time)</h2><table><tr>"
        "<th>verb</th><th>rate/s</th><th>achieved/s</th><th>errors</th><th>p50</th>"
        f"<th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr>{verb_rows}</table>"
    )


def _facts(result: SimResult, data: Mapping[str, Any]) -> list[tuple[str, str]]:
    c = data["checks"]
    util = data["gpu_utilisation"]
    jobs, pods = data["jobs"], data["pods"]
    return [
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


def _gpu_chart(result: SimResult, data: Mapping[str, Any]) -> str:
    quota = float(data.get("meta", {}).get("quota_nominal_gpus", 0))
    total = max(result.gpus_total, 1)
    return line_chart(
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
