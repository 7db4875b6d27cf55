"""Counters and histograms updated on every request, in plain Python, and written as
Prometheus metric families only when scraped.

Layer: I/O (exposition). Must not decide anything or read a clock: the servers count
what their handlers report.

Why not ``prometheus_client``'s own: each ``inc`` takes a lock and each ``observe``
walks its buckets under it, several microseconds a call, and a review decided from a
kept answer costs a few tens. Both servers update their metrics from the event loop's
one thread, and the scrape runs on that loop too, so nothing here needs a lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector


class Counts(Collector):
    """A counter by label values (``<name>_total``)."""

    def __init__(
        self, registry: CollectorRegistry, name: str, documentation: str, labels: Sequence[str]
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, tuple(labels)
        self.counts: dict[tuple[str, ...], int] = {}
        registry.register(self)

    def inc(self, *values: str) -> None:
        counts = self.counts
        counts[values] = counts.get(values, 0) + 1

    def add(self, amount: int, *values: str) -> None:
        counts = self.counts
        counts[values] = counts.get(values, 0) + amount

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, count in sorted(self.counts.items()):
            family.add_metric(values, count)
        yield family


class Timings(Collector):
    """A histogram of seconds, by label values when ``labels`` are given
    (``<name>_bucket``, ``_sum``, ``_count``)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labels: Sequence[str] = (),
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, tuple(labels)
        self.bounds = tuple(sorted(buckets))
        # per label values: one count per bucket, not cumulative, +Inf last; then the sum
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        registry.register(self)

    def observe(self, seconds: float, *values: str) -> None:
        series = self.series.get(values)
        if series is None:
            series = self.series[values] = ([0] * (len(self.bounds) + 1), [0.0])
        counts, total = series
        counts[bisect_left(self.bounds, seconds)] += 1
        total[0] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        bounds = [*map(str, self.bounds), "+Inf"]
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, (counts, total) in sorted(self.series.items()):
            buckets = list(zip(bounds, accumulate(counts), strict=True))
            family.add_metric(list(values), buckets, total[0])
        if not self.labels and not self.series:
            family.add_metric([], [(bound, 0) for bound in bounds], 0.0)
        yield family
