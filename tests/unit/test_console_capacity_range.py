"""The range report's arithmetic: Prometheus' histogram_quantile on summed buckets, and
what a queue borrowed and lent, step by step."""

from __future__ import annotations

import math

import pytest

from console.capacity_range import quantile, range_report

INF = math.inf


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        ([], None),
        ([(1.0, 0.0), (INF, 0.0)], None),
        ([(1.0, 10.0), (INF, 10.0)], 0.9),
        ([(1.0, 0.0), (2.0, 10.0), (INF, 10.0)], 1.9),
        ([(1.0, 5.0), (INF, 10.0)], 1.0),  # in the +Inf bucket: the last finite bound
    ],
)
def test_the_quantile_interpolates_as_prometheus_does(
    buckets: list[tuple[float, float]], expected: float | None
) -> None:
    got = quantile(0.9, buckets)
    assert got == expected if expected is None else got == pytest.approx(expected)


def s(queue: str, *values: float, **labels: str) -> tuple[dict[str, str], tuple[float, ...]]:
    return ({"cluster_queue": queue, "cohort": "c", **labels}, values)


def test_borrowing_is_counted_per_step_and_lent_by_whoever_had_room() -> None:
    data = {
        "usage": [s("a", 12, 8, math.nan), s("b", 0, 0, 0), s("c", 4, 4, 4)],
        "nominal": [s("a", 8, 8, 8), s("b", 6, 6, 6), s("c", 4, 4, 4)],
    }
    report = range_report(data, start=0, end=2, step_s=1)
    by = {q.name: q for q in report.queues}
    assert (by["a"].borrowed_mean, by["a"].borrowed_max) == (2, 4)  # 4, 0, no sample
    assert by["b"].lent_mean == pytest.approx(4 / 3)  # all of step 0's 4, nothing since
    assert (by["c"].borrowed_mean, by["c"].lent_mean) == (0, 0)
    assert report.recommendations == ()  # nobody waited
