"""The webhook under clients that are slow, stall, hang up, or come too many at once:
real TLS sockets, raw HTTP/1.1 so that each byte goes when the test says.

What kube-apiserver and an operator would notice: a head sent one byte at a time and a
body that stops are cut off at their deadlines; forty clients that declare 3 MB bodies
and stall are held to the body budget (the rest are refused at once); a client that
hangs up mid-body is one WARNING line; a review whose deadline passed while its body
came is answered 504 at once; a burst over the in-flight bound gets fast 429s and no
late 200; and through all of it, probes are answered and the keep-alive connections
stay usable.

Deadlines here are real timers, kept short, and every assertion leaves seconds of slack:
a timer never fires early, so "not before" bounds are exact and "within" bounds generous.
Request deadlines run on the injected ``ManualClock``, which moves only when told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from cluster.clock import ManualClock
from server import serving
from server.guard import ConnectionGuard
from server.tls import CertReloader, client_context
from tests.certfiles import Material, make_material
from tests.rawhttp import Answer, read_answer
from webhook.app import METRICS, create_app
from webhook.settings import WebhookSettings
from webhook.source import PolicyStore

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "tests" / "golden" / "webhook" / "policy.yaml"
CAPTURED_JOB = ROOT.parent / "shared" / "captures" / "000-webhook-mutate-request.json"
SLACK_S = 5.0
"""Added to every "within" bound: a shared machine may stall the loop for a while."""
MB = 1_000_000


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


def review_body() -> bytes:
    if not CAPTURED_JOB.is_file():
        pytest.skip(f"captures not found at {CAPTURED_JOB.parent}")
    body: dict[str, Any] = jsonio.loads(CAPTURED_JOB.read_bytes())["body"]
    return jsonio.dumps(body)


def head(target: str = "/mutate?timeout=5s", length: int | None = 0, method: str = "POST") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request(body: bytes, target: str = "/mutate?timeout=5s") -> bytes:
    return head(target, len(body)) + body


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server still sends, until it closes the connection."""
    received = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        while chunk := await reader.read(65536):
            received += chunk
    return received


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class Guarded:
    port: int
    guard: ConnectionGuard
    clock: ManualClock
    context: ssl.SSLContext
    metrics: Any

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.context, server_hostname="localhost"
        )

    async def ask(self, data: bytes) -> Answer:
        reader, writer = await self.connect()
        try:
            writer.write(data)
            return await read_answer(reader)
        finally:
            writer.close()

    def shed(self, reason: str) -> float:
        value = self.guard.shed.labels(reason)._value.get()
        assert isinstance(value, float)
        return value

    async def until(self, what: str, check: Any) -> None:
        """Poll the server's own state (it has no event for it); bounded."""
        try:
            async with asyncio.timeout(SLACK_S * 2):
                while not check():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        except TimeoutError:
            pytest.fail(f"never happened: {what}")


@contextlib.asynccontextmanager
async def guarded(material: Material, **overrides: Any) -> AsyncIterator[Guarded]:
    clock = ManualClock()
    store = PolicyStore(clock)
    store.load_file(str(POLICY))
    app = create_app(WebhookSettings(**overrides), store=store, clock=clock)
    reloader = CertReloader(material["webhook.crt"], material["webhook.key"])
    async with serving.running(app, "127.0.0.1", 0, reloader.context, shutdown_grace_s=1) as port:
        yield Guarded(
            port, app[serving.GUARD], clock, client_context(material["ca.crt"]), app[METRICS]
        )


# ---------------------------------------------------------------- slow clients


async def test_heads_sent_one_byte_at_a_time_are_cut_off_at_the_head_deadline(
    material: Material,
) -> None:
    async with guarded(material, header_timeout_s=0.5) as server:

        async def slow_loris() -> float:
            reader, writer = await server.connect()
            began = now()

            async def drip() -> None:
                with contextlib.suppress(ConnectionError, ssl.SSLError, RuntimeError):
                    for byte in head(length=100) + b"x" * 1000:
                        writer.write(bytes([byte]))
                        await writer.drain()
                        await asyncio.sleep(0.05)

            dripping = asyncio.create_task(drip())
            await until_closed(reader)
            took = now() - began
            dripping.cancel()
            writer.close()
            return took

        async def silent() -> float:
            reader, writer = await server.connect()
            began = now()
            await until_closed(reader)
            writer.close()
            return now() - began

        async with asyncio.timeout(0.5 + SLACK_S * 2):
            took = await asyncio.gather(*(slow_loris() for _ in range(30)), silent())

        assert all(0.45 <= t <= 0.5 + SLACK_S for t in took), took
        assert server.shed("header_timeout") == 31
        # and the server answers the next client as if nothing happened
        assert (await server.ask(request(review_body()))).status == 200


async def test_a_stalled_body_is_cut_off_at_the_body_deadline_with_one_warning(
    material: Material, caplog: pytest.LogCaptureFixture
) -> None:
    async with guarded(material, body_timeout_s=0.5) as server:
        caplog.clear()  # what loading the policy said
        reader, writer = await server.connect()
        writer.write(head(length=1000) + b'{"kind":')
        began = now()
        with caplog.at_level(logging.INFO):
            async with asyncio.timeout(0.5 + SLACK_S):
                assert await until_closed(reader) == b""  # no answer: cut off
            took = now() - began
            writer.close()
            await server.until("the handler ended", lambda: server.guard.in_flight == 0)
        assert 0.45 <= took <= 0.5 + SLACK_S
        assert server.shed("body_timeout") == 1
        assert server.shed("client_gone") == 0
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == [
            "request body not received in time: connection closed"
        ]
        assert not [r for r in caplog.records if r.exc_info]


async def test_forty_stalled_3_mb_bodies_are_held_to_the_budget(material: Material) -> None:
    budget = 8 * 1024 * 1024  # two 3 MB bodies fit, a third does not
    async with guarded(material, max_buffered_body_bytes=budget, body_timeout_s=5.0) as server:

        async def stall() -> tuple[int | None, float]:
            reader, writer = await server.connect()
            writer.write(head(length=3 * MB) + b" " * 65536)
            began = now()
            try:
                answer = await read_answer(reader)
                return answer.status, now() - began
            except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
                return None, now() - began
            finally:
                writer.close()

        async with asyncio.timeout(5.0 + SLACK_S * 2):
            stalls = asyncio.gather(*(stall() for _ in range(40)))
            await server.until("two bodies admitted", lambda: server.guard.reserved == 6 * MB)
            # the kubelet's probe is not held behind the bodies waiting for room
            probe = await server.ask(head("/readyz", method="GET"))
            outcomes = await stalls
        assert probe.status == 200

    refused = [took for status, took in outcomes if status == 429]
    cut_off = [took for status, took in outcomes if status is None]
    assert len(refused) == 38, outcomes
    assert len(cut_off) == 2, outcomes
    # refused after the budget's short wait, not held: the body is never read
    assert all(took <= 0.5 + SLACK_S for took in refused), refused
    assert all(took >= 4.9 for took in cut_off), cut_off
    assert server.guard.peak_reserved <= budget
    assert server.shed("body_budget") == 38
    assert server.shed("body_timeout") == 2


async def test_a_client_that_hangs_up_mid_body_is_one_warning_and_no_traceback(
    material: Material, caplog: pytest.LogCaptureFixture
) -> None:
    async with guarded(material) as server:
        caplog.clear()  # what loading the policy said
        with caplog.at_level(logging.DEBUG):
            _, writer = await server.connect()
            writer.write(head(length=1000) + b'{"kind":')
            await server.until("the review is under way", lambda: server.guard.in_flight == 1)
            writer.close()
            await server.until("the server saw it go", lambda: server.shed("client_gone") == 1)
            await server.until("the handler ended", lambda: server.guard.in_flight == 0)
        problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [(r.name, r.getMessage()) for r in problems] == [
            ("server.guard", "client went away before its request was answered")
        ]
        assert not [r for r in caplog.records if r.exc_info]


# ---------------------------------------------------------------- deadlines and load


@pytest.mark.parametrize(
    ("asked", "waited_s", "status"),
    [
        pytest.param("1s", 2.0, 504, id="gone"),
        pytest.param("5s", 4.95, 504, id="within-the-margin"),
        pytest.param("1m0s", 31.0, 504, id="a-minute-is-bounded-to-30s"),
        pytest.param("30s", 29.0, 200, id="the-longest-in-time"),
        pytest.param("5s", 4.8, 200, id="in-time"),
    ],
)
async def test_a_review_is_answered_504_at_once_when_its_deadline_passed_while_its_body_came(
    material: Material, asked: str, waited_s: float, status: int
) -> None:
    body = review_body()
    async with guarded(material) as server:
        reader, writer = await server.connect()
        writer.write(head(f"/mutate?timeout={asked}", len(body)) + body[:100])
        await server.until("the review is under way", lambda: server.guard.in_flight == 1)
        server.clock.advance(waited_s)
        writer.write(body[100:])
        answer = await read_answer(reader)
        writer.close()
        text = server.metrics.exposition().decode()
    assert answer.status == status
    if status == 504:
        assert answer.json()["kind"] == "Status"
        assert answer.json()["reason"] == "Timeout"
        assert "deadline" in answer.json()["message"]
        assert server.shed("deadline") == 1
        assert "tessera_webhook_reviews_total{" not in text  # nothing was decided
    else:
        assert answer.json()["response"]["allowed"] is True


async def test_a_burst_over_the_in_flight_bound_is_refused_at_once_never_answered_late(
    material: Material,
) -> None:
    body = review_body()
    async with guarded(material, max_in_flight=2) as server:
        held = []
        for _ in range(2):
            reader, writer = await server.connect()
            writer.write(head(length=len(body)) + body[:100])
            held.append((reader, writer))
        await server.until("two reviews under way", lambda: server.guard.in_flight == 2)

        async def one() -> tuple[Answer, float, tuple[Any, Any]]:
            reader, writer = await server.connect()
            began = now()
            writer.write(request(body))
            return await read_answer(reader), now() - began, (reader, writer)

        async with asyncio.timeout(SLACK_S * 2):
            burst = await asyncio.gather(*(one() for _ in range(20)))
            probe = await server.ask(head("/readyz", method="GET"))
        assert [answer.status for answer, _, _ in burst] == [429] * 20
        assert all(took <= SLACK_S for _, took, _ in burst)
        assert burst[0][0].json()["reason"] == "TooManyRequests"
        assert "Retry-After".lower() not in burst[0][0].headers
        assert probe.status == 200  # the kubelet still sees it ready
        assert server.shed("in_flight") == 20

        for reader, writer in held:
            writer.write(body[100:])
            answer = await read_answer(reader)
            assert answer.status == 200
            assert answer.json()["response"]["allowed"] is True
            writer.close()
        # a connection that got a 429 is still good for the next review
        reader, writer = burst[0][2]
        writer.write(request(body))
        assert (await read_answer(reader)).status == 200
        for _, _, (_, other) in burst:
            other.close()


# ---------------------------------------------------------------- framing


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    material: Material,
) -> None:
    body = review_body()
    async with guarded(material) as server:
        reader, writer = await server.connect()
        writer.write(request(body) + head("/readyz", method="GET") + request(b"garbage"))
        statuses = [(await read_answer(reader)).status for _ in range(3)]
        writer.close()
    assert statuses == [200, 200, 400]


async def test_a_request_the_guard_cannot_frame_is_served_and_its_connection_closed(
    material: Material,
) -> None:
    body = review_body()
    chunked = (
        head(length=None).replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    async with guarded(material) as server:
        reader, writer = await server.connect()
        writer.write(chunked)
        answer = await read_answer(reader)
        assert answer.status == 200
        assert answer.headers.get("connection", "").lower() == "close"
        assert await until_closed(reader) == b""
        writer.close()


async def test_a_head_too_large_is_refused_431(material: Material) -> None:
    async with guarded(material) as server:
        answer = await server.ask(b"GET /readyz HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    assert answer.status == 431
    assert server.shed("head_too_large") == 1
