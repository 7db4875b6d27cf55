"""The load-test harness's own arithmetic: nearest-rank percentiles, the log-linear
histogram, the open-loop schedule, the driver measuring latency from intended send times
(on a virtual clock: no test here waits for real time), and the max-throughput search."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client import Histogram as PromHistogram

from cluster import jsonio
from cluster.clock import ManualClock, SystemClock
from loadtest.bench.review_steps import VARIANT_ANNOTATION, ReviewTemplate, StepResult, StepSpec
from loadtest.bench.search import Criteria, SearchPlan, max_sustained, search
from loadtest.measure.openloop import (
    Http1Connection,
    RequestFailed,
    RunResult,
    Schedule,
    Send,
    latency_from_intended,
    run_open_loop,
)
from loadtest.measure.stats import (
    Histogram,
    nearest_rank,
    percentile,
    scrape_counters,
    scrape_histogram,
)

T = TypeVar("T")
MS = 0.001
US = 0.000001


# ---------------------------------------------------------------- percentiles


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0, 15), (5, 15), (30, 20), (40, 20), (50, 35), (75, 40), (90, 50), (100, 50)],
)
def test_nearest_rank_percentiles_of_a_hand_computed_sample(q: float, expected: float) -> None:
    # ranks ceil(q/100 * 5): 30 % -> 2nd, 40 % -> 2nd, 50 % -> 3rd, 75 % -> 4th, 90 % -> 5th
    assert percentile([15, 20, 35, 40, 50], q) == expected


@pytest.mark.parametrize(
    ("q", "rank"), [(50, 500), (90, 900), (99, 990), (99.9, 999), (99.99, 1000), (0.05, 1)]
)
def test_ranks_of_a_thousand_samples_are_exact(q: float, rank: int) -> None:
    # 99.9 % of 1000 is 999 exactly, though 99.9 * 1000 / 100 is not in binary floating point.
    assert nearest_rank(q, 1000) == rank
    assert percentile(list(range(1, 1001)), q) == rank


@pytest.mark.parametrize(("q", "count"), [(50, 0), (-1, 10), (100.5, 10)])
def test_percentiles_refuse_what_has_no_answer(q: float, count: int) -> None:
    with pytest.raises(ValueError, match="percentile"):
        nearest_rank(q, count)


# ---------------------------------------------------------------- the histogram


def test_histogram_is_exact_below_half_a_millisecond() -> None:
    histogram = Histogram.of([u * US for u in (120, 80, 300, 450, 200, 90, 310, 95, 150, 500)])
    summary = histogram.summary()
    # sorted: 80 90 95 120 150 200 300 310 450 500
    assert summary.count == 10
    assert summary.minimum == pytest.approx(80 * US)
    assert summary.p50 == pytest.approx(150 * US)
    assert summary.p90 == pytest.approx(450 * US)
    assert summary.p99 == pytest.approx(500 * US)
    assert summary.maximum == pytest.approx(500 * US)
    assert summary.mean == pytest.approx(229.5 * US)


def test_a_slow_percentile_reports_the_top_of_its_bucket() -> None:
    # 50 ms falls in a bucket 128 µs wide (50,000 µs needs 16 bits: 7 bits of shift).
    histogram = Histogram.of([1 * MS] * 98 + [50 * MS, 80 * MS])
    assert histogram.percentile(99) == pytest.approx(50.047 * MS)
    assert histogram.percentile(100) == pytest.approx(80 * MS)  # capped at the largest sample


durations_us = st.lists(st.integers(min_value=0, max_value=60_000_000), min_size=1, max_size=300)


@given(durations_us, st.sampled_from([0.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0]))
def test_histogram_percentiles_err_at_most_0_4_percent_on_the_slow_side(
    samples: list[int], q: float
) -> None:
    histogram = Histogram()
    for micros in samples:
        histogram.record_micros(micros)
    exact = percentile(sorted(samples), q)
    reported = histogram.percentile(q) * 1_000_000
    assert exact <= reported + 1e-6
    assert reported <= max(exact * (1 + 2**-8), exact + 1) + 1e-6


@given(durations_us, durations_us)
def test_merged_histograms_equal_one_histogram_of_everything(a: list[int], b: list[int]) -> None:
    left, right, both = Histogram(), Histogram(), Histogram()
    for micros in a:
        left.record_micros(micros)
        both.record_micros(micros)
    for micros in b:
        right.record_micros(micros)
        both.record_micros(micros)
    left.merge(right)
    assert left.to_json() == both.to_json()
    assert Histogram.from_json(both.to_json()).summary() == both.summary()


PAUSES = "tessera_extender_gc_pause_seconds"


def pause_page(observed: dict[str, list[float]]) -> tuple[CollectorRegistry, PromHistogram]:
    registry = CollectorRegistry()
    histogram = PromHistogram(
        PAUSES, "pauses", ("generation",), buckets=(0.001, 0.01, 0.1), registry=registry
    )
    for generation, seconds in observed.items():
        for s in seconds:
            histogram.labels(generation).observe(s)
    return registry, histogram


def test_a_servers_histogram_is_read_back_from_its_metrics_page() -> None:
    registry, _ = pause_page({"0": [0.0005, 0.002], "2": [0.05]})
    scraped = scrape_histogram(generate_latest(registry).decode(), PAUSES, "generation")
    assert set(scraped) == {"0", "2"}
    young, full = scraped["0"], scraped["2"]
    assert young.count == 2
    assert young.total == pytest.approx(0.0025)
    assert young.at_most == 0.01  # the bound that holds the 2 ms one
    assert (full.count, full.at_most) == (1, 0.1)


def test_what_was_observed_between_two_scrapes() -> None:
    registry, histogram = pause_page({"2": [0.5]})
    before = scrape_histogram(generate_latest(registry).decode(), PAUSES, "generation")
    histogram.labels("2").observe(0.005)
    histogram.labels("2").observe(0.004)
    after = scrape_histogram(generate_latest(registry).decode(), PAUSES, "generation")
    made = after["2"].since(before["2"])
    # the half-second pause was before: only the two small ones count
    assert (made.count, made.at_most) == (2, 0.01)
    assert made.total == pytest.approx(0.009)
    assert before["2"].at_most == float("inf")  # above every bound


def test_a_page_without_the_histogram_reads_as_nothing() -> None:
    assert scrape_histogram("# HELP other x\nother_total 1.0\n", PAUSES, "generation") == {}


def test_a_servers_counters_are_read_back_by_the_labels_asked_for() -> None:
    registry = CollectorRegistry()
    requests = Counter("apiserver_request", "x", ["verb", "resource", "code"], registry=registry)
    requests.labels("POST", "pods", "201").inc(3)
    requests.labels("POST", "pods", "409").inc()
    requests.labels("GET", "nodes", "200").inc(2)
    page = generate_latest(registry).decode()
    assert scrape_counters(page, "apiserver_request_total", ("verb", "resource")) == {
        ("POST", "pods"): 4,  # the codes summed
        ("GET", "nodes"): 2,
    }
    assert scrape_counters(page, "apiserver_request_total", ("subresource",)) == {("",): 6}
    assert scrape_counters(page, "other_total", ("verb",)) == {}


def test_every_microsecond_falls_in_exactly_one_bucket() -> None:
    histogram = Histogram()
    previous_top = -1
    for index in range(3000):
        low, high = histogram.bucket_bounds(index)
        assert low == previous_top + 1
        assert histogram.bucket_of(low) == index
        assert histogram.bucket_of(high) == index
        previous_top = high


# ---------------------------------------------------------------- the schedule


def test_requests_are_due_at_fixed_intervals_from_the_start() -> None:
    schedule = Schedule(rate=4.0, count=4)
    assert [schedule.intended(i) for i in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert schedule.duration_s == 1.0
    assert latency_from_intended(schedule.intended(2), 0.5 + 0.003) == pytest.approx(0.003)
    with pytest.raises(IndexError):
        schedule.intended(4)


@pytest.mark.parametrize(
    ("rate", "duration", "cap", "count"),
    [(2000, 10, None, 20_000), (3, 0.5, None, 1), (0.1, 10, None, 1), (2000, 10, 500, 500)],
)
def test_a_duration_holds_the_requests_due_within_it(
    rate: float, duration: float, cap: int | None, count: int
) -> None:
    assert Schedule.for_duration(rate, duration, cap).count == count


@pytest.mark.parametrize("rate", [0.0, -5.0, float("inf"), float("nan")])
def test_a_schedule_needs_a_positive_rate(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        Schedule(rate, 10)


# ---------------------------------------------------------------- the driver, on virtual time


class _VirtualSelector(selectors.BaseSelector):
    """A selector that never blocks: waiting for ``timeout`` moves the clock instead."""

    def __init__(self, clock: ManualClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            self._clock.advance(timeout)
        return self._real.select(0)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(_VirtualSelector(clock))
        self._virtual = clock

    def time(self) -> float:
        return self._virtual.monotonic()


def on_virtual_time(make: Callable[[ManualClock], Coroutine[Any, Any, T]]) -> T:
    clock = ManualClock()
    loop = _VirtualLoop(clock)
    try:
        return loop.run_until_complete(make(clock))
    finally:
        loop.close()


def server(service_s: Callable[[int], float], connections: int = 1) -> list[Send]:
    """Fake connections to a server that answers request ``i`` after ``service_s(i)``."""

    def one() -> Send:
        async def send(index: int) -> None:
            await asyncio.sleep(service_s(index))

        return send

    return [one() for _ in range(connections)]


def run(schedule: Schedule, senders: list[Send], **options: Any) -> RunResult:
    async def go(clock: ManualClock) -> RunResult:
        return await run_open_loop(schedule, senders, clock, spin_s=0.0, **options)

    return on_virtual_time(go)


def test_latency_counts_from_the_intended_send_time_not_from_the_actual_one() -> None:
    # One connection, a request due every 1 ms, each answered in 3 ms: request i is sent
    # when the connection frees at 3i ms, answered at 3(i+1) ms, but was due at i ms.
    result = run(Schedule(rate=1000, count=5), server(lambda i: 3 * MS))
    latencies = [3, 5, 7, 9, 11]  # 3(i+1) - i, in ms
    assert result.latency.summary().maximum == pytest.approx(11 * MS)
    # 7 ms lies in a bucket 16 µs wide; a percentile reports the bucket's top.
    assert result.latency.percentile(50) == pytest.approx(latencies[2] * MS, rel=2**-8)
    assert result.latency.summary().minimum == pytest.approx(3 * MS)
    # What a closed-loop tool would have seen: every request "took 3 ms".
    assert result.service.summary().maximum == pytest.approx(3 * MS)
    assert result.service.summary().minimum == pytest.approx(3 * MS)
    # The difference is time spent waiting to be sent: 0, 2, 4, 6, 8 ms.
    assert result.lag.summary().maximum == pytest.approx(8 * MS)
    assert result.late.summary().maximum == 0.0  # the server held them, not the generator
    assert (result.sent, result.ok, result.errors, result.stopped) == (5, 5, {}, "")


def test_a_server_that_keeps_up_is_measured_at_its_service_time() -> None:
    result = run(Schedule(rate=1000, count=200), server(lambda i: 0.4 * MS, connections=2))
    assert result.latency.summary().maximum == pytest.approx(0.4 * MS)
    assert result.lag.summary().maximum == 0.0
    assert result.achieved_rate == pytest.approx(1000, rel=0.01)
    assert sum(result.per_second) == 200


def test_one_stall_shows_in_every_request_queued_behind_it() -> None:
    # 100 requests, 1 ms apart, answered in 0.5 ms, except request 10, which takes 50 ms.
    result = run(Schedule(rate=1000, count=100), server(lambda i: 50 * MS if i == 10 else 0.5 * MS))
    slow_service = result.service.fraction_above(5 * MS) * result.service.count
    slow_latency = result.latency.fraction_above(5 * MS) * result.latency.count
    assert round(slow_service) == 1  # the closed-loop view: one slow request
    assert slow_latency >= 40  # the users' view: every request due during the stall waited
    assert result.latency.percentile(99) > 40 * MS
    assert result.service.percentile(99) < 1 * MS


def test_failures_and_timeouts_are_counted_and_the_run_goes_on() -> None:
    async def send(index: int) -> None:
        if index % 10 == 3:
            await asyncio.sleep(1 * MS)
            raise RequestFailed("wrong-uid")
        await asyncio.sleep(30.0 if index == 5 else 1 * MS)

    result = run(Schedule(rate=100, count=20), [send, send], timeout_s=2.0)
    assert result.errors == {"wrong-uid": 2, "timeout": 1}
    assert (result.sent, result.ok) == (20, 17)
    assert result.latency.count == 17
    assert result.latency.summary().maximum < 0.1
    # how soon each failure came, from when it was due: two fast, one at the timeout
    assert result.failed.count == 3
    assert result.failed.count_within(0.1) == 2
    assert result.failed.summary().maximum >= 2.0


def test_what_came_within_a_deadline_and_its_tail() -> None:
    histogram = Histogram.of([0.001 * i for i in range(1, 101)] + [6.0, 7.0, 9.0])
    assert histogram.count_within(5.0) == 100
    assert histogram.count_within(6.5) == 101
    assert histogram.count_within(0.0) == 0
    # the slowest of those in time, not one of the late ones
    assert histogram.percentile_within(99, 5.0) == pytest.approx(0.099, rel=2**-8)
    assert histogram.percentile_within(100, 5.0) == pytest.approx(0.1, rel=2**-8)
    assert histogram.percentile(99) > 5.0


def test_a_run_that_falls_behind_stops_early() -> None:
    # The server needs 10 ms per request and is offered one every 1 ms: it falls 9 ms
    # further behind with every request, past 0.2 s by the 23rd.
    result = run(Schedule(rate=1000, count=10_000), server(lambda i: 10 * MS), max_lag_s=0.2)
    assert result.stopped.startswith("fell")
    assert result.sent < 30
    assert result.achieved_rate == pytest.approx(100, rel=0.05)


# ---------------------------------------------------------------- over a real socket


async def test_keep_alive_connection_answers_open_loop_requests() -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"n": int(request.query["n"]), "body": await request.text()})

    app = web.Application()
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    connections = [Http1Connection("127.0.0.1", port) for _ in range(2)]
    answers: list[bytes] = []

    def sender(connection: Http1Connection) -> Callable[[int], Awaitable[None]]:
        async def send(index: int) -> None:
            response = await connection.request("POST", f"/echo?n={index}", b"x" * index)
            if response.status != 200:
                raise RequestFailed(f"http-{response.status}")
            answers.append(response.body)

        return send

    try:
        result = await run_open_loop(
            Schedule(rate=2000, count=40), [sender(c) for c in connections], SystemClock()
        )
    finally:
        for connection in connections:
            connection.close()
        await runner.cleanup()
    assert (result.ok, result.errors) == (40, {})
    assert sorted(answers) == sorted(
        f'{{"n": {i}, "body": "{"x" * i}"}}'.encode() for i in range(40)
    )
    assert [c.connects for c in connections] == [1, 1]  # kept alive


# ---------------------------------------------------------------- the max-throughput search


def step_of(rate: float, capacity: float) -> StepResult:
    """What a step shows against a server that keeps up to ``capacity`` reviews/s: below
    it p99 is 2 ms and every request is answered on time; above it the queue grows."""
    keeps_up = rate <= capacity
    tail = 2 * MS if keeps_up else 500 * MS
    run = RunResult(
        schedule=Schedule(rate, 100),
        latency=Histogram.of([1 * MS] * 98 + [tail, tail]),
        service=Histogram.of([1 * MS] * 100),
        lag=Histogram.of([0.0] * 100),
        late=Histogram.of([0.0] * 100),
        sent=100,
        ok=100,
        errors={},
        elapsed_s=100 / rate if keeps_up else 100 / max(capacity, 1.0),
    )
    spec = StepSpec(
        server="webhook",
        mode="search",
        port=0,
        server_pid=0,
        ca="",
        template=ReviewTemplate((b"", b""), ("uid",)),
        rate=rate,
        duration_s=1.0,
        connections=1,
        core=1,
        nice=0,
        timeout_s=1.0,
        max_lag_s=1.0,
        max_requests=100,
    )
    return StepResult(spec, run, server_cpu=1.0, generator_cpu=0.5, server_memory={})


CRITERIA = Criteria(p99_bound_s=50 * MS, min_achieved=0.97)


def plan(**overrides: Any) -> SearchPlan:
    return SearchPlan(
        **{"start": 1000, "factor": 1.5, "refine": 3, "max_steps": 16, "duration_s": 1.0}
        | overrides
    )


@pytest.mark.parametrize(("capacity", "found"), [(3000, 2950), (400, 400), (1000, 1000)])
def test_the_search_finds_the_rate_a_server_sustains(capacity: float, found: float) -> None:
    results = search(plan(), CRITERIA, lambda rate: step_of(rate, capacity), lambda: False)
    best = max_sustained(results)
    assert best is not None
    assert best.spec.rate == found
    assert all(r.passed == (r.spec.rate <= capacity) for r in results)
    assert len(results) <= 16


def bursty(capacity: float, burst_at: float) -> Callable[[float], StepResult]:
    """A server of ``capacity`` whose first step at ``burst_at`` meets a neighbour's burst."""
    bursts = {burst_at}

    def step(rate: float) -> StepResult:
        if rate in bursts:
            bursts.discard(rate)
            return step_of(rate, capacity=0.0)
        return step_of(rate, capacity)

    return step


def test_one_bad_step_is_run_again_before_it_ends_the_climb() -> None:
    again = max_sustained(search(plan(), CRITERIA, bursty(3000, 1500), lambda: False))
    assert again is not None
    assert again.spec.rate == 2950
    once = max_sustained(search(plan(retry=False), CRITERIA, bursty(3000, 1500), lambda: False))
    assert once is not None
    assert once.spec.rate < 1500  # believed the burst


def test_the_search_is_bounded_in_steps_and_time() -> None:
    never = search(plan(max_steps=5), CRITERIA, lambda rate: step_of(rate, 0.0), lambda: False)
    assert len(never) == 5
    assert max_sustained(never) is None
    assert search(plan(), CRITERIA, lambda rate: step_of(rate, 3000), lambda: True) == []


def test_review_templates_put_the_uid_and_the_template_number_in_the_captured_review() -> None:
    captured: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "x", "object": {"kind": "Job", "metadata": {"name": "a"}}},
    }
    one = ReviewTemplate.of(captured)
    assert jsonio.loads(one.body("u-1", 7)) == {
        **captured,
        "request": {**captured["request"], "uid": "u-1"},
    }
    three = ReviewTemplate.of(captured, templates=3)
    for index, expected in ((0, "0"), (4, "1"), (5, "2")):
        review = jsonio.loads(three.body(f"u-{index}", index))
        assert review["request"]["uid"] == f"u-{index}"
        metadata = review["request"]["object"]["metadata"]
        assert metadata == {"name": "a", "annotations": {VARIANT_ANNOTATION: expected}}


def test_renamed_review_templates_differ_only_in_the_name_they_give_the_job() -> None:
    obj = {"kind": "Job", "metadata": {"generateName": "finetune-", "labels": {"q": "a"}}}
    captured: dict[str, Any] = {"kind": "AdmissionReview", "request": {"uid": "x", "object": obj}}
    renamed = ReviewTemplate.of(captured, renamed=True)
    first, second = (jsonio.loads(renamed.body(f"u-{i}", i)) for i in (10, 11))
    assert first["request"]["object"]["metadata"] == {"labels": {"q": "a"}, "name": "finetune-a"}
    assert second["request"]["object"]["metadata"]["name"] == "finetune-b"
    distinct = ReviewTemplate.of(captured, templates=2**40, renamed=True)
    metadata = jsonio.loads(distinct.body("u", 2**33))["request"]["object"]["metadata"]
    assert metadata["name"] == "finetune-200000000"
    assert metadata["annotations"] == {VARIANT_ANNOTATION: str(2**33)}
