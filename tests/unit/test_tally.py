"""The servers' plain-Python counters and histograms, as Prometheus scrapes them: the same
text prometheus_client's own would write for the same observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from server.tally import Counts, Timings

BUCKETS = (0.001, 0.01, 0.1)
SECONDS = (0.0005, 0.001, 0.001, 0.05, 0.5, 2.0)


def samples(registry: CollectorRegistry) -> set[str]:
    """The sample lines, without the ``_created`` series only prometheus_client adds."""
    lines = generate_latest(registry).decode().splitlines()
    return {line for line in lines if not line.startswith("#") and "_created" not in line}


def test_a_histogram_by_verb_scrapes_as_prometheus_clients_own() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    timings = Timings(ours, "t_seconds", "doc", BUCKETS, ("verb",))
    histogram = Histogram("t_seconds", "doc", ("verb",), buckets=BUCKETS, registry=theirs)
    for i, seconds in enumerate(SECONDS):
        verb = "filter" if i % 2 else "bind"
        timings.observe(seconds, verb)
        histogram.labels(verb).observe(seconds)
    assert samples(ours) == samples(theirs)
    # an observation on a bound counts in that bucket (Prometheus' le is inclusive)
    assert 't_seconds_bucket{le="0.001",verb="bind"} 2.0' in samples(ours)  # 0.0005, 0.001


def test_a_histogram_without_labels_scrapes_zeros_before_its_first_observation() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    timings = Timings(ours, "t_seconds", "doc", BUCKETS)
    Histogram("t_seconds", "doc", buckets=BUCKETS, registry=theirs)
    assert samples(ours) == samples(theirs)
    timings.observe(0.05)
    assert "t_seconds_count 1.0" in samples(ours)


def test_counts_by_labels_scrape_as_prometheus_clients_counter() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counts = Counts(ours, "reviews", "doc", ("kind", "decision"))
    counter = Counter("reviews", "doc", ("kind", "decision"), registry=theirs)
    for kind, decision, amount in (("Job", "mutated", 3), ("Pod", "denied", 1), ("Job", "x", 2)):
        counts.add(amount, kind, decision)
        counter.labels(kind, decision).inc(amount)
    counts.inc("Pod", "denied")
    counter.labels("Pod", "denied").inc()
    assert samples(ours) == samples(theirs)
