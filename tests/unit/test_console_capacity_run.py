"""A load-test run read as Prometheus would have kept it: the jobs' way through Kueue
becomes the same usage, pending and wait series, so the same report and recommendations
come out; and the report's HTML page."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from console.capacity_html import html_page
from console.capacity_range import range_report
from console.capacity_run import run_series
from console.output import ConsoleError


def job(cq: str, flavor: str, gpus: float, times: tuple[float, float | None, float | None]
        ) -> dict[str, Any]:  # fmt: skip
    """A job of ``gpus`` created, admitted and finished at ``times``."""
    created, admitted, finished = times
    return {"cluster_queue": cq, "flavor": flavor, "gpus": gpus, "created_s": created,
            "admitted_s": admitted, "finished_s": finished}  # fmt: skip


def contended_run() -> dict[str, Any]:
    """60 s: nlp (8 nominal) runs 16 GPUs all along, borrowing 8 of research's 16;
    its six later jobs wait 10 s each, as long as the median job runs; research runs 4."""
    jobs = [job("nlp", "h100", 16, (0, 0, 60)), job("research", "h100", 4, (0, 0, 60))]
    jobs += [job("nlp", "h100", 0, (10 * i, 10 * i + 10, 10 * i + 20)) for i in range(4)]
    jobs += [job("nlp", "h100", 0, (50, None, None)), job("nlp", "h100", 0, (55, 58, 60))]
    return {
        "duration_s": 60.0,
        "capacity": {
            "cluster_queues": [
                {"name": "nlp", "cohort": "pool", "nominal_gpus": {"h100": 8.0}},
                {"name": "research", "cohort": "pool", "nominal_gpus": {"h100": 16.0}},
            ],
            "jobs": jobs,
            "gpus_allocated": [[float(t), 20.0] for t in range(61)],
        },
    }


def test_a_run_gives_the_report_prometheus_would_have_given() -> None:
    series = run_series(contended_run())
    assert series.median_run_s == 10.0
    report = range_report(
        series.data, start=series.start, end=series.end, step_s=series.step_s,
        wait_long_s=series.median_run_s or 0.0,
    )  # fmt: skip
    by = {q.name: q for q in report.queues}
    assert by["nlp"].nominal == 8
    assert by["research"].nominal == 16
    assert by["nlp"].admitted == 6  # one job still waits at the end
    assert 5 <= (by["nlp"].wait_p90_s or 0) <= 16  # 10 s, in the 8-16 s bucket
    # 16 used against 8 nominal, all along but the first and last half steps
    assert by["nlp"].borrowed_max == pytest.approx(8)
    assert by["nlp"].borrowed_mean == pytest.approx(8, rel=0.05)
    assert by["research"].lent_mean == pytest.approx(8, rel=0.05)
    assert by["nlp"].pending_mean > 0
    assert report.allocated_mean == pytest.approx(20)
    assert report.utilisation is None  # a run has no DCGM
    # about half of research's 16 (the range's first and last half steps borrow less)
    assert re.fullmatch(
        r"nlp waited p90 1\ds while borrowing 4[5-9] % of research's nominal: raise nlp's "
        r"nominal by 8 GPUs of h100 or lower research's lending limit",
        report.recommendations[0],
    )


@pytest.mark.parametrize("bad", [{}, {"capacity": None}, [], {"capacity": {"jobs": "x"}}])
def test_json_without_a_capacity_section_is_refused(bad: Any) -> None:
    with pytest.raises(ConsoleError):
        run_series(bad)


VOID = {"meta", "br", "img", "input", "link", "hr"}


class Balance(HTMLParser):
    """Every element closed in order (SVG's self-closed ones included)."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.errors: list[str] = []
        self.svgs = 0
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.svgs += tag == "svg"
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.errors.append(tag)

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def well_formed(page: str) -> Balance:
    parser = Balance()
    parser.feed(page)
    parser.close()
    assert page.startswith("<!doctype html>")
    assert parser.errors == []
    assert parser.open == []
    return parser


def test_the_page_has_a_plot_each_and_the_recommendations() -> None:
    series = run_series(contended_run())
    report = range_report(
        series.data, start=series.start, end=series.end, step_s=series.step_s, wait_long_s=10
    )
    page = html_page(report, "capacity <run>", [("Source", "a & b")])
    parsed = well_formed(page)
    assert parsed.svgs == 3
    text = "".join(parsed.texts)
    for title in ("Pending time per ClusterQueue", "Allocation against utilisation",
                  "Borrowed (solid) and lent (dashed)"):  # fmt: skip
        assert title in text
    assert "capacity <run>" in text
    assert "a & b" in text
    assert report.recommendations
    assert all(r in text for r in report.recommendations)
    assert "nlp borrowed" in text
    assert "research lent" in text


def test_a_range_with_no_series_still_draws_each_plot() -> None:
    report = range_report({}, start=0, end=3600, step_s=60)
    parsed = well_formed(html_page(report, "empty", []))
    assert parsed.svgs == 3
    assert "no queue waited long" in "".join(parsed.texts)
    assert math.isnan(report.timeline.allocated[0])
