"""Latency statistics for the load tests: exact percentiles, and a fine log-linear histogram.

Layer: PURE. Plain arithmetic on numbers a benchmark has already measured: no async, no
I/O, no clock, no aiohttp. The benchmarks (``bench-webhook``, ``bench-extender``) record into
a ``Histogram`` and print ``Summary`` rows; they never compute a percentile themselves.

Percentiles are *nearest-rank*: the p-th percentile of n samples is the smallest sample
such that at least p % of the samples are at or below it (rank ``ceil(p/100 * n)``, at
least 1). It is always a value that was observed, never an interpolation between two, so
"p99 = 4.2 ms" means that 1 % of the requests really took 4.2 ms or longer.

The histogram keeps whole microseconds in log-linear buckets (the HdrHistogram layout):
below ``2 ** (precision + 1)`` µs (512 µs at the default precision) every microsecond
has its own bucket, and above that each power of two is cut into ``2 ** precision``
equal buckets, so a reported value is never more than ``2 ** -precision`` (0.4 %) above
the sample it stands for. A percentile is reported as the highest value of its bucket
(capped at the largest sample), i.e. it errs on the slow side. Memory is one dict entry
per bucket in use: a few hundred for a real run, whatever the number of requests, and
histograms from several connections or processes merge exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

DEFAULT_PRECISION: Final = 8
REPORTED_PERCENTILES: Final = (50.0, 90.0, 99.0, 99.9)
_US: Final = 1_000_000


def nearest_rank(q: float, count: int) -> int:
    """The 1-based rank of the ``q``-th percentile among ``count`` sorted samples."""
    if count < 1:
        raise ValueError("a percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is not within 0..100")
    # Rounded before ceil: 99.9 * 1000 / 100 is 999.0000000000001 in binary floating point.
    return min(count, max(1, math.ceil(round(q * count / 100.0, 9))))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``sorted_values`` (ascending)."""
    return sorted_values[nearest_rank(q, len(sorted_values)) - 1]


def to_micros(seconds: float) -> int:
    """Whole microseconds, rounded; a negative duration (clock noise) counts as zero."""
    return max(0, int(seconds * _US + 0.5))


@dataclass(frozen=True, slots=True)
class Summary:
    """What a results table shows for one latency distribution; seconds throughout."""

    count: int
    minimum: float
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float
    maximum: float

    def to_json(self) -> dict[str, float | int]:
        return {
            "count": self.count,
            "min_s": self.minimum,
            "mean_s": self.mean,
            "p50_s": self.p50,
            "p90_s": self.p90,
            "p99_s": self.p99,
            "p99.9_s": self.p999,
            "max_s": self.maximum,
        }


EMPTY_SUMMARY: Final = Summary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class Histogram:
    """Counts of durations in log-linear microsecond buckets (see the module docstring).

    A mutable accumulator: one owner records into it (one task or one process), and
    owners combine theirs with ``merge``. ``to_json``/``from_json`` carry it between
    processes and into result files.
    """

    __slots__ = ("_counts", "_max_us", "_min_us", "_sum_us", "count", "precision")

    def __init__(self, precision: int = DEFAULT_PRECISION) -> None:
        if not 1 <= precision <= 16:
            raise ValueError(f"precision {precision} is not within 1..16")
        self.precision = precision
        self.count = 0
        self._counts: dict[int, int] = {}
        self._sum_us = 0
        self._min_us = 0
        self._max_us = 0

    # ------------------------------------------------------------ buckets

    def bucket_of(self, micros: int) -> int:
        """The bucket index of a value in microseconds; buckets are ordered by value."""
        sub = 1 << self.precision
        if micros < 2 * sub:
            return micros
        shift = micros.bit_length() - self.precision - 1
        return sub * shift + (micros >> shift)

    def bucket_bounds(self, index: int) -> tuple[int, int]:
        """The lowest and highest microsecond value that fall in bucket ``index``."""
        sub = 1 << self.precision
        if index < 2 * sub:
            return index, index
        # index = sub * shift + mantissa, the mantissa in [sub, 2 * sub): see bucket_of.
        octave, rest = divmod(index, sub)
        shift, mantissa = octave - 1, rest + sub
        return mantissa << shift, ((mantissa + 1) << shift) - 1

    # ------------------------------------------------------------ recording

    def record(self, seconds: float) -> None:
        self.record_micros(to_micros(seconds))

    def record_micros(self, micros: int) -> None:
        if micros < 0:
            raise ValueError(f"a duration of {micros} µs")
        index = self.bucket_of(micros)
        self._counts[index] = self._counts.get(index, 0) + 1
        if self.count == 0 or micros < self._min_us:
            self._min_us = micros
        self._max_us = max(self._max_us, micros)
        self._sum_us += micros
        self.count += 1

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s samples to this one (both must have the same precision)."""
        if other.precision != self.precision:
            raise ValueError("histograms of different precision do not merge")
        if other.count == 0:
            return
        for index, n in other._counts.items():
            self._counts[index] = self._counts.get(index, 0) + n
        self._min_us = other._min_us if self.count == 0 else min(self._min_us, other._min_us)
        self._max_us = max(self._max_us, other._max_us)
        self._sum_us += other._sum_us
        self.count += other.count

    # ------------------------------------------------------------ reading

    def percentile(self, q: float) -> float:
        """Nearest-rank ``q``-th percentile in seconds: its bucket's top, at most the max."""
        rank = nearest_rank(q, self.count)
        seen = 0
        for index in sorted(self._counts):
            seen += self._counts[index]
            if seen >= rank:
                return min(self.bucket_bounds(index)[1], self._max_us) / _US
        raise AssertionError("bucket counts add up to less than count")  # pragma: no cover

    def fraction_above(self, seconds: float) -> float:
        """Share of samples in buckets wholly above ``seconds`` (for SLO checks)."""
        if self.count == 0:
            return 0.0
        limit = to_micros(seconds)
        above = sum(n for i, n in self._counts.items() if self.bucket_bounds(i)[0] > limit)
        return above / self.count

    def count_within(self, seconds: float) -> int:
        """Samples in buckets not wholly above ``seconds`` (the complement of
        ``fraction_above``): within a deadline, to the histogram's precision."""
        limit = to_micros(seconds)
        return sum(n for i, n in self._counts.items() if self.bucket_bounds(i)[0] <= limit)

    def percentile_within(self, q: float, seconds: float) -> float:
        """The ``q``-th percentile of the samples ``count_within(seconds)`` counts: the
        tail of the answers that came in time, late ones left out."""
        rank = nearest_rank(q, self.count_within(seconds))
        seen = 0
        for index in sorted(self._counts):
            seen += self._counts[index]
            if seen >= rank:
                return min(self.bucket_bounds(index)[1], self._max_us) / _US
        raise AssertionError("bucket counts add up to less than count")  # pragma: no cover

    @property
    def minimum(self) -> float:
        return self._min_us / _US

    @property
    def maximum(self) -> float:
        return self._max_us / _US

    @property
    def mean(self) -> float:
        return self._sum_us / self.count / _US if self.count else 0.0

    def summary(self) -> Summary:
        if self.count == 0:
            return EMPTY_SUMMARY
        p50, p90, p99, p999 = (self.percentile(q) for q in REPORTED_PERCENTILES)
        return Summary(self.count, self.minimum, self.mean, p50, p90, p99, p999, self.maximum)

    # ------------------------------------------------------------ wire

    def to_json(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "count": self.count,
            "sum_us": self._sum_us,
            "min_us": self._min_us,
            "max_us": self._max_us,
            # Bucket index → count, as string keys so that the dict is valid JSON.
            "buckets": {str(i): n for i, n in sorted(self._counts.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        histogram = cls(int(data["precision"]))
        histogram._counts = {int(i): int(n) for i, n in data["buckets"].items()}
        histogram.count = int(data["count"])
        histogram._sum_us = int(data["sum_us"])
        histogram._min_us = int(data["min_us"])
        histogram._max_us = int(data["max_us"])
        if sum(histogram._counts.values()) != histogram.count:
            raise ValueError("histogram buckets do not add up to its count")
        return histogram

    @classmethod
    def of(cls, seconds: Iterable[float], precision: int = DEFAULT_PRECISION) -> Histogram:
        histogram = cls(precision)
        for value in seconds:
            histogram.record(value)
        return histogram


# ---------------------------------------------------------------- a server's histograms


@dataclass(frozen=True, slots=True)
class Scraped:
    """One child of a Prometheus histogram as a ``/metrics`` page shows it: how many
    observations, their sum, and the cumulative count at each bucket bound (ascending,
    ``inf`` last)."""

    count: int
    total: float
    buckets: tuple[tuple[float, int], ...]

    def since(self, before: Scraped) -> Scraped:
        """What was observed after ``before`` was scraped (same buckets)."""
        earlier = dict(before.buckets)
        return Scraped(
            self.count - before.count,
            self.total - before.total,
            tuple((bound, n - earlier.get(bound, 0)) for bound, n in self.buckets),
        )

    @property
    def at_most(self) -> float:
        """The smallest bucket bound that holds every observation (a histogram keeps no
        maximum); 0 without observations."""
        if self.count == 0:
            return 0.0
        return next((bound for bound, n in self.buckets if n >= self.count), math.inf)


def scrape_histogram(text: str, name: str, label: str) -> dict[str, Scraped]:
    """The children of histogram ``name`` on a Prometheus text page, by the value of
    ``label``; a page without it gives ``{}``."""
    counts: dict[str, int] = {}
    totals: dict[str, float] = {}
    buckets: dict[str, list[tuple[float, int]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name or family.type != "histogram":
            continue
        for sample in family.samples:
            key = sample.labels.get(label)
            if key is None:
                continue
            if sample.name == f"{name}_count":
                counts[key] = int(sample.value)
            elif sample.name == f"{name}_sum":
                totals[key] = sample.value
            elif sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                buckets.setdefault(key, []).append((bound, int(sample.value)))
    return {
        key: Scraped(count, totals.get(key, 0.0), tuple(sorted(buckets.get(key, ()))))
        for key, count in counts.items()
    }


def scrape_counters(text: str, name: str, labels: Sequence[str]) -> dict[tuple[str, ...], float]:
    """The children of counter ``name`` on a Prometheus text page, keyed by the values of
    ``labels`` (a missing label reads as ""), children with equal keys summed; a page
    without it gives ``{}``."""
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        # the parser names a counter family without its ``_total``
        if family.type != "counter" or name not in {family.name, f"{family.name}_total"}:
            continue
        for sample in family.samples:
            if sample.name != f"{family.name}_total":
                continue
            key = tuple(sample.labels.get(label, "") for label in labels)
            found[key] = found.get(key, 0.0) + sample.value
    return found
