"""``tessera capacity --html F``: the range report as an HTML page with plots, in the look
of the load test's reports (``cluster.svg``).

Layer: PURE. A ``RangeReport`` in, HTML text out; no I/O, no clock (the command writes
the file). Must not compute any figure itself: it shows the report's, step by step
from its ``Timeline``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from cluster.svg import Series, line_chart, page_head
from console.capacity_range import QUEUE_COLUMNS, RangeReport, queue_cells


def _points(
    at: Sequence[float], values: Sequence[float], scale: float
) -> list[tuple[float, float]]:
    return [(t / scale, v) for t, v in zip(at, values, strict=True) if not math.isnan(v)]


def _time_axis(report: RangeReport) -> tuple[float, str]:
    """Seconds, minutes or hours since the start, whichever reads best for the range."""
    span = report.end - report.start
    if span >= 2 * 86400:
        return 3600.0, "hours since the start"
    if span >= 2 * 3600:
        return 60.0, "minutes since the start"
    return 1.0, "seconds since the start"


def charts(report: RangeReport) -> tuple[str, str, str]:
    """Pending time per queue, allocation against utilisation, borrowed against lent."""
    line = report.timeline
    scale, x_label = _time_axis(report)
    waits = line_chart(
        "Pending time per ClusterQueue (p90 of the workloads admitted in each step)",
        [Series(q, _points(line.at_s, v, scale)) for q, v in sorted(line.wait_p90_s.items())],
        x_label=x_label,
        y_label="seconds from creation to admission",
    )
    allocation = [
        Series("GPUs admitted by Kueue", _points(line.at_s, line.admitted, scale)),
        Series("GPUs allocated (extender)", _points(line.at_s, line.allocated, scale)),
    ]
    if any(not math.isnan(v) for v in line.busy):
        allocation.append(
            Series("GPUs busy (DCGM)", _points(line.at_s, line.busy, scale), dashed=True)
        )
    usage = line_chart(
        "Allocation against utilisation", allocation, x_label=x_label, y_label="GPUs"
    )
    lending = line_chart(
        "Borrowed (solid) and lent (dashed) per ClusterQueue",
        [
            series
            for q in sorted(line.borrowed)
            for series in (
                Series(f"{q} borrowed", _points(line.at_s, line.borrowed[q], scale)),
                Series(f"{q} lent", _points(line.at_s, line.lent.get(q, ()), scale), dashed=True),
            )
        ],
        x_label=x_label,
        y_label="GPUs beyond / under nominal",
    )
    return waits, usage, lending


def _cell(value: object) -> str:
    return f"<td>{escape('-' if value is None else str(value))}</td>"


def _queue_rows(report: RangeReport) -> str:
    return "".join(
        "<tr>" + "".join(_cell(v) for v in queue_cells(q)) + "</tr>" for q in report.queues
    )


def html_page(report: RangeReport, title: str, facts: Sequence[tuple[str, str]]) -> str:
    """The page: ``facts`` (where the figures came from), the queues' table, the plots,
    fragmentation per product and the recommendations."""
    waits, usage, lending = charts(report)
    fact_rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    if report.utilisation is not None:
        busy = f"busy {100 * report.utilisation:.0f} % of the time (DCGM_FI_DEV_GPU_UTIL)"
    else:
        busy = "no utilisation series (DCGM) to compare with"
    allocated = (
        f"{report.allocated_mean:.1f} GPUs allocated on average, {busy}"
        if report.allocated_mean is not None
        else "no allocation series"
    )
    fragmentation = "".join(
        f"<tr><td>{escape(p)}</td><td>{100 * v:.0f} %</td></tr>"
        for p, v in sorted(report.fragmentation.items())
    )
    advice = "".join(f"<li>{escape(r)}</li>" for r in report.recommendations) or (
        "<li>no queue waited long, and allocation and fragmentation look sound</li>"
    )
    fragmentation = fragmentation or '<tr><td colspan="2">no fragmentation series</td></tr>'
    return f"""{page_head(title)}
<h1>{escape(title)}</h1>
<table class="facts">{fact_rows}<tr><th>Allocation</th><td>{escape(allocated)}</td></tr></table>
<h2>Recommendations</h2><ul>{advice}</ul>
<h2>Queues</h2>
<table><tr>{"".join(f"<th>{h}</th>" for h in QUEUE_COLUMNS)}</tr>{_queue_rows(report)}</table>
<div class="grid">{waits}{usage}{lending}</div>
<h2>Free GPUs stranded per product</h2>
<table><tr><th>product</th><th>stranded</th></tr>{fragmentation}</table>
</body></html>
"""
