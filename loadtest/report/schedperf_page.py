"""``sched-perf``'s page: the figures per profile, the ratios, latency CDFs and
throughput over time, from the JSON the run wrote.

Layer: PURE (the JSON in, HTML text out; no I/O, no clock). Must not change the figures
it shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any, Final

from cluster.svg import Series, cdf_points, line_chart, page_head

PROFILES: Final = ("in_tree", "in_tree_default", "tessera")
COMPONENTS: Final = ("scheduler", "extender", "apiserver", "etcd")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, Mapping):
        return escape(", ".join(f"{k}: {v}" for k, v in value.items()) or "none")
    return escape(f"{value:g}" if isinstance(value, float) else str(value))


def _figures_table(data: Mapping[str, Any]) -> str:
    head = (
        "<tr><th>profile</th><th>pods/s</th><th>p50 ms</th><th>p99 ms</th>"
        "<th>gang members: p99 ms</th><th>gang members unbound</th>"
        + "".join(f"<th>CPU ms/pod {c}</th>" for c in COMPONENTS)
        + "<th>unschedulable by size</th><th>stranded free GPUs</th><th>free GPUs</th>"
        "<th>GPUs given twice</th><th>gangs split over racks</th></tr>"
    )
    rows = []
    for profile in PROFILES:
        f = data.get(profile)
        if not f:
            continue
        place = f.get("placement", {})
        cells = [
            f.get("pods_per_s"),
            f.get("p50_ms"),
            f.get("p99_ms"),
            f.get("gang_p99_ms"),
            f.get("gang_members_unbound"),
            *(f.get("cpu_ms_per_pod", {}).get(c) for c in COMPONENTS),
            place.get("unschedulable_by_size"),
            place.get("stranded_free_gpus"),
            place.get("free_gpus"),
            place.get("gpu_conflicts"),
            place.get("gangs_split_over_racks"),
        ]
        rows.append(f"<tr><td>{profile}</td>{''.join(f'<td>{_cell(c)}</td>' for c in cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _ratio_rows(data: Mapping[str, Any]) -> str:
    rows = []
    for key, label in (
        ("ratio", "tessera / in_tree"),
        ("ratio_vs_default", "tessera / in_tree_default"),
    ):
        ratio = data.get(key) or {}
        per = "; ".join(
            f"#{r['repeat'] + 1}: {_cell(r['throughput'])} / {_cell(r['p99'])}"
            for r in ratio.get("per_repeat", [])
        )
        rows.append(
            f"<tr><td>{label}</td><td>{_cell(ratio.get('throughput'))}</td>"
            f"<td>{_cell(ratio.get('p99'))}</td><td>{escape(per)}</td></tr>"
        )
    return (
        "<table><tr><th>ratio</th><th>throughput</th><th>p99</th>"
        f"<th>per repeat (throughput / p99)</th></tr>{''.join(rows)}</table>"
    )


def _charts(data: Mapping[str, Any]) -> str:
    runs = data.get("runs", [])
    cdfs, rates = [], []
    for profile in PROFILES:
        mine = [r for r in runs if r["profile"] == profile]
        for r in mine:
            label = f"{profile} #{r['repeat'] + 1}" if len(mine) > 1 else profile
            cdfs.append(Series(label, cdf_points(r["latencies_ms"])))
            rates.append(
                Series(label, [(float(s), float(n)) for s, n in enumerate(r["bound_per_s"])])
            )
    cdf = line_chart(
        "creation → bound latency (CDF)",
        cdfs,
        x_label="latency",
        y_label="% of bound pods",
        x_unit="ms",
        y_unit="%",
        log_x=True,
        step=True,
    )
    rate = line_chart(
        "pods bound per second",
        rates,
        x_label="seconds since the first pod was created",
        y_label="pods bound in the second",
    )
    return f'<div class="grid">{cdf}{rate}</div>'


def schedperf_page(data: Mapping[str, Any], title: str) -> str:
    settings = data.get("settings", {})
    facts = [
        ("nodes", data.get("nodes")),
        ("pods", data.get("pods")),
        (
            "GPUs asked / GPUs in the cluster",
            f"{settings.get('gpus_asked')} / {settings.get('gpus')}",
        ),
        ("creation rate", f"{settings.get('rate') or 'all at once'}"),
        ("repeats", settings.get("repeats")),
        ("trace", f"openb {settings.get('trace')}, gangs {settings.get('gang_share')}"),
        (
            "tessera percentageOfNodesToScore (shipped); 0: adaptive",
            f"{settings.get('nodes_to_score', '-')} "
            f"({settings.get('nodes_to_score_shipped', '-')})",
        ),
        ("extender CPU / kube-scheduler CPU (tessera)", data.get("extender_cpu_over_scheduler")),
    ]
    fact_rows = "".join(f"<tr><th>{escape(k)}</th><td>{_cell(v)}</td></tr>" for k, v in facts)
    return f"""{page_head(title)}
<h1>{escape(title)}</h1>
<table class="facts">{fact_rows}</table>
<h2>Per profile (median over repeats)</h2>
{_figures_table(data)}
<h2>Ratios (within each repeat, then the median)</h2>
{_ratio_rows(data)}
{_charts(data)}
</body></html>
"""
