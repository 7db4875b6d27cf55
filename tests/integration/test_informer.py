"""The informer against a fake kube-apiserver on a real socket.

Each test drives the server the way a cluster misbehaves (bookmarks, 410 Gone as an event
and as HTTP, dropped connections, server-side timeouts, failing requests) and checks what
the consumer would notice: its copy of the objects ends equal to the server's, ``synced``
flips once, reconnects resume from the right resourceVersion, and retries back off.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.clock import ManualClock
from cluster.informer import Backoff, Informer
from cluster.kube import KubeClient, KubeConfig
from tests.fakeapi import FakeApiServer, Fault, Recorded, make_tls, object_key

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
OTHER = "/api/v1/configmaps"
TOKEN = "s3cret-token"

Obj = dict[str, Any]


def node(name: str, **labels: str) -> Obj:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels}}


def pod(name: str, node_name: str = "", namespace: str = "default") -> Obj:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node_name},
    }


@dataclass
class Consumer:
    """What the cache does with the callbacks: a dict of key → object."""

    state: dict[str, Obj] = field(default_factory=dict)
    replaces: list[list[str]] = field(default_factory=list)
    fail_next_event: bool = False

    def on_replace(self, items: list[Obj]) -> None:
        self.state = {object_key(item): item for item in items}
        self.replaces.append(sorted(self.state))

    def on_event(self, kind: str, obj: Obj) -> None:
        if self.fail_next_event:
            self.fail_next_event = False
            raise RuntimeError("consumer bug")
        if kind == "DELETED":
            self.state.pop(object_key(obj), None)
        else:
            self.state[object_key(obj)] = obj


@dataclass
class FakeSleep:
    """Records the backoff delays and returns at once, moving ``clock`` by each delay."""

    delays: list[float] = field(default_factory=list)
    clock: ManualClock | None = None

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)
        await asyncio.sleep(0)


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``predicate()`` holds; the informer and the server share this loop."""
    async with asyncio.timeout(timeout_s):
        # Polling: the conditions span the server, the informer and the consumer.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.002)


@dataclass
class Rig:
    api: FakeApiServer
    client: KubeClient
    consumer: Consumer
    sleep: FakeSleep

    def informer(self, path: str = NODES, **kwargs: Any) -> Informer:
        kwargs.setdefault("rng", random.Random(1))
        return Informer(
            self.client,
            path,
            on_replace=self.consumer.on_replace,
            on_event=self.consumer.on_event,
            sleep=self.sleep,
            **kwargs,
        )

    def in_sync(self, path: str = NODES) -> bool:
        return self.consumer.state == self.api.objects(path)

    def watches(self) -> list[Recorded]:
        return self.api.requests_of("watch")


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with (
        FakeApiServer(token=TOKEN) as api,
        KubeClient(KubeConfig.explicit(api.url, token=TOKEN)) as client,
    ):
        yield Rig(api, client, Consumer(), FakeSleep())


@pytest.fixture
async def running(rig: Rig) -> AsyncIterator[tuple[Rig, Informer]]:
    """Three nodes, an informer that has listed them and has a watch open."""
    for name in ("n1", "n2", "n3"):
        rig.api.put(NODES, node(name))
    informer = rig.informer()
    async with run_informer(informer):
        await informer.wait_synced()
        await eventually(lambda: rig.api.watchers == 1)
        yield rig, informer


class run_informer:
    """Run an informer in a task for the body of an ``async with``; stop it after."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.informer.run())
        return self.task

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.informer.stop()
        async with asyncio.timeout(5):
            await asyncio.gather(self.task, return_exceptions=True)


# ---------------------------------------------------------------- list and sync


async def test_synced_is_false_until_the_first_list_and_stays_true_across_relists(
    rig: Rig,
) -> None:
    rig.api.put(NODES, node("n1"))
    gate = asyncio.Event()
    held: list[Recorded] = []

    async def hold(request: Recorded) -> None:
        held.append(request)
        await gate.wait()

    rig.api.before_list = hold
    informer = rig.informer()
    async with run_informer(informer):
        await eventually(lambda: len(held) == 1)
        synced_while_listing = informer.synced
        gate.set()
        await informer.wait_synced()
        assert not synced_while_listing
        assert informer.synced
        assert rig.in_sync()

        # A relist that is held mid-way must not make the informer look unsynced.
        gate.clear()
        with rig.api.withheld():
            rig.api.put(NODES, node("n2"))
        rig.api.compact()
        rig.api.expire_watches()
        await eventually(lambda: len(held) == 2)
        assert informer.synced
        gate.set()
        await eventually(lambda: informer.lists == 2 and rig.in_sync())
        assert informer.synced


async def test_a_paginated_list_is_one_snapshot_and_the_watch_catches_up(rig: Rig) -> None:
    for i in range(5):
        rig.api.put(NODES, node(f"n{i}"))
    list_rv = rig.api.resource_version

    async def change_between_pages(request: Recorded) -> None:
        if request.query.get("continue") and "n9" not in rig.api.objects(NODES):
            rig.api.put(NODES, node("n9"))
            rig.api.delete(NODES, "n0")

    rig.api.before_list = change_between_pages
    informer = rig.informer(page_size=2)
    async with run_informer(informer):
        await informer.wait_synced()
        await eventually(rig.in_sync)

    lists = rig.api.requests_of("list")
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    assert [bool(r.query.get("continue")) for r in lists] == [False, True, True]
    # The list shows the world as of its first page; the watch brings the changes after.
    assert rig.consumer.replaces == [["n0", "n1", "n2", "n3", "n4"]]
    assert rig.watches()[0].query["resourceVersion"] == list_rv
    assert sorted(rig.consumer.state) == ["n1", "n2", "n3", "n4", "n9"]


async def test_selectors_narrow_both_the_list_and_the_watch(rig: Rig) -> None:
    rig.api.put(PODS, pod("a", node_name="gpu-1"))
    rig.api.put(PODS, pod("b", node_name="gpu-2"))
    informer = rig.informer(PODS, field_selector="spec.nodeName=gpu-1", label_selector="")
    async with run_informer(informer):
        await informer.wait_synced()
        await eventually(lambda: rig.api.watchers == 1)
        rig.api.put(PODS, pod("c", node_name="gpu-1"))
        rig.api.put(PODS, pod("d", node_name="gpu-2"))
        await eventually(lambda: "default/c" in rig.consumer.state)

    assert sorted(rig.consumer.state) == ["default/a", "default/c"]
    for request in (rig.api.requests_of("list")[0], rig.watches()[0]):
        assert request.query["fieldSelector"] == "spec.nodeName=gpu-1"
        assert "labelSelector" not in request.query


# ---------------------------------------------------------------- watch


async def test_added_modified_deleted_events_keep_the_consumer_equal(
    running: tuple[Rig, Informer],
) -> None:
    rig, informer = running
    rig.api.put(NODES, node("n4"))
    rig.api.put(NODES, node("n1", role="gpu"))
    rig.api.delete(NODES, "n2")
    await eventually(rig.in_sync)

    assert sorted(rig.consumer.state) == ["n1", "n3", "n4"]
    assert rig.consumer.state["n1"]["metadata"]["labels"] == {"role": "gpu"}
    assert informer.lists == 1
    assert informer.resource_version == rig.api.resource_version
    first_watch = rig.watches()[0].query
    assert first_watch["allowWatchBookmarks"] == "true"
    assert first_watch["watch"] == "true"
    assert int(first_watch["timeoutSeconds"]) >= 300


async def test_a_short_watch_timeout_is_asked_for_and_spread_below_twice_itself(
    rig: Rig,
) -> None:
    rig.api.put(NODES, node("n1"))
    informer = rig.informer(watch_timeout_s=10)
    async with run_informer(informer):
        for watches in (1, 2, 3):
            await eventually(lambda n=watches: len(rig.watches()) == n)  # type: ignore[misc]
            rig.api.end_watches()

    asked = [int(w.query["timeoutSeconds"]) for w in rig.watches()]
    assert all(10 <= seconds < 20 for seconds in asked), asked


# ---------------------------------------------------------------- how long since it was heard


async def test_the_age_is_the_time_since_kube_apiserver_was_last_heard(rig: Rig) -> None:
    clock = ManualClock()
    rig.api.put(NODES, node("n1"))
    informer = rig.informer(clock=clock)
    assert informer.resource == "nodes"
    clock.advance(5)
    assert informer.age_s() == 5, "never heard: the age counts from the informer's start"
    async with run_informer(informer):
        await informer.wait_synced()
        assert informer.age_s() == 0, "a list is the server speaking"
        await eventually(lambda: rig.api.watchers == 1)
        clock.advance(12)
        assert informer.age_s() == 12, "an open watch proves nothing by itself"
        rig.api.send_bookmark()
        await eventually(lambda: informer.age_s() == 0)
        clock.advance(7)
        rig.api.put(NODES, node("n2"))
        await eventually(lambda: informer.age_s() == 0)
        clock.advance(9)
        # a quiet watch the server ends when its timeoutSeconds runs out: the server is there
        rig.api.end_watches()
        await eventually(lambda: len(rig.watches()) == 2)
        assert informer.age_s() == 0


async def test_a_lost_watch_ages_and_is_a_warning_until_the_server_is_heard_again(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cluster.informer")
    clock = ManualClock()
    rig.sleep.clock = clock
    rig.api.put(NODES, node("n1"))
    informer = rig.informer(clock=clock, backoff=Backoff(initial_s=1, cap_s=8, jitter=0))
    async with run_informer(informer):
        await informer.wait_synced()
        await eventually(lambda: rig.api.watchers == 1)
        caplog.clear()
        # kube-apiserver goes away: the open watch breaks, the next three attempts fail
        rig.api.faults.extend(Fault("watch", 503, "ServiceUnavailable") for _ in range(3))
        rig.api.drop_watches()
        await eventually(lambda: len(rig.sleep.delays) == 4 and rig.api.watchers == 1)
        assert informer.age_s() == 1 + 2 + 4 + 8
        rig.api.put(NODES, node("n2"))
        await eventually(lambda: informer.age_s() == 0)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    fields = [r.tessera_fields for r in warnings]  # type: ignore[attr-defined]
    assert len(warnings) == 4, "one line per attempt, no more"
    assert {f["resource"] for f in fields} == {"nodes"}
    assert [f["age_s"] for f in fields] == [0, 1, 3, 7]
    assert [f["delay_s"] for f in fields] == [1, 2, 4, 8]
    recovered = [r for r in caplog.records if r.message == "informer recovered"]
    assert len(recovered) == 1
    assert recovered[0].levelno == logging.INFO
    assert recovered[0].tessera_fields["age_s"] == 15  # type: ignore[attr-defined]


async def test_a_bookmark_moves_the_point_the_next_watch_resumes_from(
    running: tuple[Rig, Informer],
) -> None:
    rig, informer = running
    # Changes elsewhere move the resourceVersion without any event for nodes.
    rig.api.put(OTHER, {"metadata": {"name": "c1", "namespace": "default"}})
    rig.api.put(OTHER, {"metadata": {"name": "c2", "namespace": "default"}})
    bookmark = rig.api.send_bookmark()
    await eventually(lambda: informer.resource_version == bookmark)
    rig.api.end_watches()
    await eventually(lambda: len(rig.watches()) == 2)

    assert rig.watches()[1].query["resourceVersion"] == bookmark
    assert rig.sleep.delays == []
    assert informer.lists == 1


@dataclass(frozen=True)
class Disruption:
    name: str
    act: Callable[[FakeApiServer], None]
    relists: bool
    backs_off: bool


def _change_unseen(api: FakeApiServer) -> None:
    """Changes the open watch never carries: only a relist can show them."""
    with api.withheld():
        api.put(NODES, node("n4"))
        api.put(NODES, node("n1", role="gpu"))
        api.delete(NODES, "n2")
    api.compact()


def _timeout_after_events(api: FakeApiServer) -> None:
    api.put(NODES, node("n4"))
    api.end_watches()


def _drop_mid_stream(api: FakeApiServer) -> None:
    api.drop_watches(after_events=1)
    api.put(NODES, node("n4"))
    api.put(NODES, node("n5"))
    api.delete(NODES, "n1")


def _gone_as_error_event(api: FakeApiServer) -> None:
    _change_unseen(api)
    api.expire_watches()


def _gone_as_http_410_after_a_drop(api: FakeApiServer) -> None:
    api.too_old = "http"
    _change_unseen(api)
    api.drop_watches()


DISRUPTIONS = [
    Disruption("server-side timeout", _timeout_after_events, relists=False, backs_off=False),
    Disruption("connection dropped mid-stream", _drop_mid_stream, relists=False, backs_off=True),
    Disruption("410 as an ERROR event", _gone_as_error_event, relists=True, backs_off=False),
    Disruption("410 as HTTP on re-watch", _gone_as_http_410_after_a_drop, True, True),
]


@pytest.mark.parametrize("disruption", DISRUPTIONS, ids=lambda d: d.name)
async def test_after_a_disruption_the_consumer_ends_equal_to_the_server(
    running: tuple[Rig, Informer], disruption: Disruption
) -> None:
    rig, informer = running
    watched_from = informer.resource_version
    disruption.act(rig.api)
    await eventually(lambda: len(rig.watches()) >= 2 and rig.api.watchers == 1)
    await eventually(rig.in_sync)

    assert informer.lists == (2 if disruption.relists else 1)
    assert len(rig.sleep.delays) == (1 if disruption.backs_off else 0)
    assert informer.synced
    if not disruption.relists:
        # Resumed from the last event it saw, not from the start.
        second = rig.watches()[1].query["resourceVersion"]
        assert int(second) > int(watched_from)
    elif disruption.backs_off:
        # It tried to resume first; the 410 on that attempt sent it to relist.
        assert rig.watches()[1].query["resourceVersion"] == watched_from
        assert rig.watches()[2].query["resourceVersion"] == rig.api.resource_version


async def test_a_dropped_watch_resumes_from_the_last_event_delivered(
    running: tuple[Rig, Informer],
) -> None:
    rig, informer = running
    rig.api.drop_watches(after_events=1)
    first = rig.api.put(NODES, node("n4"))
    rig.api.put(NODES, node("n5"))
    await eventually(rig.in_sync)

    assert rig.watches()[1].query["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert informer.lists == 1


async def test_a_watch_that_closes_at_once_with_nothing_in_it_is_backed_off(
    rig: Rig,
) -> None:
    # The clock never moves, so every watch looks instantaneous.
    informer = rig.informer(clock=ManualClock())
    async with run_informer(informer):
        await informer.wait_synced()
        for expected in (1, 2, 3):
            await eventually(lambda: rig.api.watchers == 1)
            rig.api.end_watches()
            await eventually(lambda n=expected: len(rig.sleep.delays) == n)  # type: ignore[misc]

    assert rig.sleep.delays == sorted(rig.sleep.delays)
    assert informer.lists == 1


async def test_a_failing_callback_is_answered_with_a_relist(
    running: tuple[Rig, Informer],
) -> None:
    rig, informer = running
    rig.consumer.fail_next_event = True
    rig.api.put(NODES, node("n4"))
    await eventually(lambda: informer.lists == 2)
    await eventually(rig.in_sync)
    assert "n4" in rig.consumer.state


# ---------------------------------------------------------------- backoff


async def test_backoff_grows_is_capped_and_resets_after_success(rig: Rig) -> None:
    rig.api.put(NODES, node("n1"))
    rig.api.faults.extend(Fault("watch", 500) for _ in range(8))
    backoff = Backoff(initial_s=0.1, factor=2.0, cap_s=1.0, jitter=0.25)
    informer = rig.informer(backoff=backoff, rng=random.Random(42))
    async with run_informer(informer):
        await eventually(lambda: rig.api.watchers == 1)
        delays = list(rig.sleep.delays)
        rig.api.put(NODES, node("n2"))
        await eventually(rig.in_sync)
        rig.api.drop_watches()
        await eventually(lambda: len(rig.sleep.delays) == 9)

    # Doubling from 0.1 s up to the 1 s cap, each shortened by at most the 25% jitter.
    bases = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert len(delays) == len(bases)
    for delay, base in zip(delays, bases, strict=True):
        assert base * 0.75 <= delay <= base
    assert delays[:4] == sorted(delays[:4])
    assert len(set(delays[4:])) > 1, "jitter spreads the capped delays"
    # A watch that carried events resets the count: the next failure waits briefly again.
    assert 0.075 <= rig.sleep.delays[8] <= 0.1
    assert informer.lists == 1


async def test_failing_lists_back_off_and_leave_synced_false(rig: Rig) -> None:
    rig.api.put(NODES, node("n1"))
    rig.api.faults.extend(Fault("list", 503, "ServiceUnavailable") for _ in range(3))
    informer = rig.informer()
    async with run_informer(informer):
        await eventually(lambda: len(rig.sleep.delays) == 3)
        await informer.wait_synced()

    assert len(rig.api.requests_of("list")) == 4
    assert rig.sleep.delays == sorted(rig.sleep.delays)
    assert rig.in_sync()


@given(
    attempts=st.lists(st.integers(min_value=0, max_value=200), min_size=2, max_size=2),
    seed=st.integers(min_value=0, max_value=2**32),
    initial=st.floats(min_value=0.01, max_value=5),
    cap=st.floats(min_value=5, max_value=120),
)
def test_backoff_delays_never_exceed_the_cap_and_grow_with_attempts(
    attempts: list[int], seed: int, initial: float, cap: float
) -> None:
    backoff = Backoff(initial_s=initial, cap_s=cap, factor=2.0, jitter=0.25)
    low, high = sorted(attempts)
    first = backoff.delay(low, random.Random(seed))
    later = backoff.delay(high, random.Random(seed))
    assert 0 < first <= later <= cap


# ---------------------------------------------------------------- lifecycle


async def test_cancelling_run_closes_the_watch(running: tuple[Rig, Informer]) -> None:
    rig, informer = running
    task = asyncio.create_task(informer.run())
    await eventually(lambda: rig.api.watchers == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: rig.api.watchers == 1)


async def test_stop_returns_from_run_even_while_backing_off(rig: Rig) -> None:
    rig.api.faults.extend(Fault("list", 500) for _ in range(100))
    never = asyncio.Event()

    async def long_sleep(seconds: float) -> None:
        await never.wait()

    informer = Informer(
        rig.client,
        NODES,
        on_replace=rig.consumer.on_replace,
        on_event=rig.consumer.on_event,
        sleep=long_sleep,
    )
    task = asyncio.create_task(informer.run())
    await eventually(lambda: len(rig.api.requests_of("list")) == 1)
    informer.stop()
    async with asyncio.timeout(5):
        await task
    assert not informer.synced


# ---------------------------------------------------------------- TLS and token


async def test_the_informer_speaks_tls_against_the_cluster_ca_with_a_bearer_token(
    tmp_path: Path,
) -> None:
    tls = make_tls(tmp_path)
    consumer = Consumer()
    async with FakeApiServer(token=TOKEN, ssl_context=tls.server_context()) as api:
        api.put(NODES, node("n1"))
        config = KubeConfig.explicit(api.url, token=TOKEN, ca_file=tls.ca_cert)
        assert api.url.startswith("https://127.0.0.1:")
        async with KubeClient(config) as client:
            informer = Informer(
                client, NODES, on_replace=consumer.on_replace, on_event=consumer.on_event
            )
            async with run_informer(informer):
                await informer.wait_synced()
                await eventually(lambda: api.watchers == 1)
                api.put(NODES, node("n2"))
                await eventually(lambda: consumer.state == api.objects(NODES))

    assert {r.headers["Authorization"] for r in api.requests} == {f"Bearer {TOKEN}"}
