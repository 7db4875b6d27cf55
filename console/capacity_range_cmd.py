"""``tessera capacity --prometheus URL --range 7d`` and ``tessera capacity --from-run
F.json``: the capacity report over a time range, from Prometheus or from a load-test run,
as a table, JSON, and with ``--html F`` a page with plots.

Layer: I/O (it awaits Prometheus through ``console.prometheus``, reads the run's file and
writes the page). Takes the range's end from the injected clock, lets the PURE
``console.capacity_run`` turn a run into series, ``console.capacity_range`` sum them up
and ``console.capacity_html`` draw them. Must not judge anything itself, nor read the
environment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cluster import jsonio
from cluster.clock import Clock
from console import render
from console.capacity_html import html_page
from console.capacity_range import (
    QUERIES,
    QUEUE_COLUMNS,
    RangeReport,
    queue_cells,
    range_report,
    wait_text,
)
from console.capacity_run import run_series
from console.output import ConsoleError, Output, json_text
from console.prometheus import query_ranges

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
HOURLY_FROM_S: Final = 86400
"""A range of a day or more is read hour by hour; a shorter one in about 60 steps."""


def range_seconds(text: str) -> float:
    """``7d``, ``36h``, ``90m``, ``2w`` as seconds; ``ConsoleError`` for anything else."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", text)
    if match is None or float(match[1]) <= 0:
        raise ConsoleError(f"--range {text!r}: use a number and s, m, h, d or w (7d, 36h)")
    return float(match[1]) * _UNITS[match[2]]


def step_for(range_s: float) -> float:
    return 3600.0 if range_s >= HOURLY_FROM_S else max(60.0, float(round(range_s / 60)))


async def capacity_over_range(
    url: str, range_text: str, clock: Clock, *, output: str = "table", html: Path | None = None
) -> Output:
    span = range_seconds(range_text)
    step = step_for(span)
    end = float(int(clock.now().timestamp() // step * step))  # on a step, as Prometheus' rate is
    start = end - span
    queries = {name: q.replace("{step}", f"{int(step)}s") for name, q in QUERIES.items()}
    data = await query_ranges(url, queries, start=start, end=end, step_s=step)
    report = range_report(data, start=start, end=end, step_s=step)
    heading = f"over the last {range_text.strip()} (step {render.duration(report.step_s)})"
    facts = (("Source", f"Prometheus at {url}"), ("Range", heading))
    return _shown(report, heading, facts, output=output, html=html)


def capacity_from_run(path: Path, *, output: str = "table", html: Path | None = None) -> Output:
    """The same report from a load-test run's JSON (``python -m loadtest demo --out``)."""
    try:
        run = jsonio.loads(path.read_bytes())
    except OSError as exc:
        raise ConsoleError(f"--from-run {path}: {exc.strerror or exc}") from None
    except jsonio.JsonError as exc:
        raise ConsoleError(f"--from-run {path}: not JSON: {exc}") from None
    series = run_series(run)
    long_s = series.median_run_s
    report = range_report(
        series.data,
        start=series.start,
        end=series.end,
        step_s=series.step_s,
        **({} if long_s is None else {"wait_long_s": long_s}),
    )
    heading = (
        f"over the run in {path.name} ({wait_text(report.end)}, step {wait_text(report.step_s)})"
    )
    facts = [("Source", f"load-test run {path}"), ("Range", heading)]
    if long_s is not None:
        facts.append(
            ("Long wait", f"a p90 wait of the median job run or more ({wait_text(long_s)})")
        )
    return _shown(report, heading, facts, output=output, html=html)


def _shown(
    report: RangeReport,
    heading: str,
    facts: Sequence[tuple[str, str]],
    *,
    output: str,
    html: Path | None,
) -> Output:
    notes: tuple[str, ...] = ()
    if html is not None:
        page = html_page(report, f"Tessera capacity {heading}", facts)
        try:
            html.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise ConsoleError(f"--html {html}: {exc.strerror or exc}") from None
        notes = (f"report: {html}",)
    if output == "json":
        return Output(json_text(report.to_json()), notes)
    return Output(report_text(report, heading), notes)


def range_text_of(report: RangeReport, range_text: str) -> str:
    return report_text(
        report, f"over the last {range_text.strip()} (step {render.duration(report.step_s)})"
    )


def report_text(report: RangeReport, heading: str) -> str:
    parts = [
        f"{heading}\n\n",
        render.table(QUEUE_COLUMNS, [queue_cells(q) for q in report.queues]),
    ]
    if report.utilisation is not None:
        parts.append(
            f"\nallocated GPUs: {report.allocated_mean or 0:.1f} on average, busy "
            f"{100 * report.utilisation:.0f} % of the time (DCGM_FI_DEV_GPU_UTIL)\n"
        )
    elif report.allocated_mean is not None:
        parts.append(
            f"\nallocated GPUs: {report.allocated_mean:.1f} on average (no utilisation "
            "series to compare with)\n"
        )
    if report.fragmentation:
        parts.append(
            "\n"
            + render.table(
                ("PRODUCT", "FREE-GPUS-STRANDED"),
                [(p, f"{100 * v:.0f} %") for p, v in sorted(report.fragmentation.items())],
            )
        )
    if report.recommendations:
        parts.append("\n" + "".join(f"* {r}\n" for r in report.recommendations))
    else:
        parts.append("\nno queue waited long, and allocation and fragmentation look sound\n")
    return "".join(parts)
