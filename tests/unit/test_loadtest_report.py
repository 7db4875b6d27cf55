"""The load test's reporting arithmetic: exact nearest-rank summaries, the extender's verbs
pooled (a percentile of all requests, not an average of percentiles), chart helpers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import svg
from loadtest.measure.stats import percentile
from loadtest.report import placement_page, summary

MS = 0.001


def test_summary_is_nearest_rank_on_the_raw_samples() -> None:
    values = [i * MS for i in range(1, 101)]  # 1..100 ms
    s = summary.summarize(values)
    assert (s.count, s.p50, s.p90, s.p99, s.p999, s.maximum) == (
        100,
        50 * MS,
        90 * MS,
        99 * MS,
        100 * MS,
        100 * MS,
    )
    assert s.mean == pytest.approx(50.5 * MS)
    assert summary.summarize([]).count == 0


def test_pooled_extender_percentiles_weigh_every_request_once() -> None:
    # 90 fast filters at 1 ms and 10 slow binds at 100 ms: the pooled p90 is 1 ms and the
    # p99 is 100 ms; averaging per-verb p99s (1 and 100) would claim 50.5 ms.
    latencies = {
        "filter": [1 * MS] * 90,
        "prioritize": [],
        "bind": [100 * MS] * 10,
        "mutate": [5 * MS],
    }
    pooled = summary.latency_summaries(latencies)[summary.ALL_EXTENDER]
    assert pooled.count == 100
    assert pooled.p90 == 1 * MS
    assert pooled.p99 == 100 * MS
    assert summary.latency_summaries(latencies)["mutate"].p50 == 5 * MS


@given(
    st.dictionaries(
        st.sampled_from(["filter", "prioritize", "bind"]),
        st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=50),
        min_size=1,
    ),
    st.sampled_from([50.0, 90.0, 99.0, 99.9]),
)
def test_pooled_percentile_equals_the_percentile_of_all_samples(
    latencies: dict[str, list[float]], q: float
) -> None:
    everything = sorted(v for values in latencies.values() for v in values)
    pooled = summary.latency_summaries(latencies)[summary.ALL_EXTENDER]
    expected = {50.0: pooled.p50, 90.0: pooled.p90, 99.0: pooled.p99, 99.9: pooled.p999}[q]
    assert expected == percentile(everything, q)
    per_verb = [summary.summarize(v).maximum for v in latencies.values()]
    assert pooled.maximum == max(per_verb)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0, 34.8, [0, 10, 20, 30, 40]),
        (0, 100, [0, 20, 40, 60, 80, 100]),
        (0, 1.6, [0, 0.5, 1.0, 1.5, 2.0]),
    ],
)
def test_ticks_are_round_and_cover_the_data(low: float, high: float, expected: list[float]) -> None:
    assert svg.nice_ticks(low, high) == expected


def test_cdf_ends_at_one_hundred_percent_with_the_largest_value() -> None:
    points = svg.cdf_points([3.0, 1.0, 2.0])
    assert points == [(1.0, pytest.approx(100 / 3)), (2.0, pytest.approx(200 / 3)), (3.0, 100.0)]
    assert svg.cdf_points([]) == []


def test_a_chart_is_svg_with_a_line_per_series_and_escaped_labels() -> None:
    chart = svg.line_chart(
        "a <b>",
        [svg.Series("x&y", [(1.0, 1.0), (2.0, 3.0)]), svg.Series("z", [(1.0, 2.0)])],
        x_label="t",
        y_label="v",
    )
    assert chart.startswith("<svg")
    assert chart.count("<polyline") == 2
    assert "a &lt;b&gt;" in chart
    assert "x&amp;y" in chart


def test_placement_curves_take_the_median_over_seeds_and_keep_published_figures() -> None:
    data = {
        "runs": [
            {"trace": "default", "policy": "tessera", "curve": {"100": 90.0, "130": 95.0}},
            {"trace": "default", "policy": "tessera", "curve": {"100": 92.0, "130": 96.0}},
            {"trace": "default", "policy": "tessera", "curve": {"100": 91.0, "130": 99.0}},
        ],
        "published": {"default/06-FGD": {"130": 95.4, "100": 95.2}, "other/06-FGD": {"130": 1.0}},
    }
    curves = placement_page.placement_curves(data)
    assert curves == {
        "default": {
            "tessera": [(100.0, 91.0), (130.0, 96.0)],
            "06-FGD (published)": [(100.0, 95.2), (130.0, 95.4)],
        }
    }
    page = placement_page.placement_page(data, "t")
    assert page.count("<svg") == 2
