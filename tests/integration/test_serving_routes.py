"""A server's hot route answered on the connection by its guard (``server.direct``), and
the same route through aiohttp for what the guard does not frame: real sockets, raw
HTTP/1.1, a bare app with one route, so that each case shows one behaviour.

What a client would notice: the same request gets the same answer either way; a route
that fails is a 500 that closes the connection, logged once with its traceback; a
route still running after the shutdown grace is cancelled and its connection closed; a
keep-alive connection left idle after a route's answer is closed after the idle
timeout, never before; a body over the limit never reaches the route; a client that
hangs up while its route runs is one warning line.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from cluster.clock import ManualClock
from server import serving
from server.direct import Call, Reply, Route
from server.guard import ConnectionGuard
from server.serving_settings import Limits
from tests.rawhttp import read_answer

SLACK_S = 5.0


def request(
    body: bytes, *, target: str = "/verb?timeout=5s", extra: str = "", close: bool = False
) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}"]
    if extra:
        lines.append(extra)
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Served:
    port: int
    guard: ConnectionGuard
    calls: list[Call] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def served(
    route: Route | None = None, *, grace_s: float = 1.0, idle_timeout_s: float = 3630.0
) -> AsyncIterator[Served]:
    """A bare app whose ``POST /verb`` echoes what its route was called with."""
    app = web.Application()
    guard = serving.guard_app(
        app,
        limits=Limits(max_body_bytes=1000, idle_timeout_s=idle_timeout_s),
        clock=ManualClock(),
        timeout_of=lambda method, path, query: 5.0 if path == "/verb" else None,
        registry=CollectorRegistry(),
        prefix="test",
    )
    state = Served(0, guard)

    async def echo(call: Call) -> Reply:
        state.calls.append(call)
        said = f"{call.method} {call.path} {call.query} {call.body.decode()} {call.deadline}"
        return Reply(200, said.encode(), content_type="text/plain")

    serving.add_route(
        app,
        "POST",
        "/verb",
        route or echo,
        refused=lambda reason: Reply(400, reason.encode(), content_type="text/plain"),
    )
    async with serving.running(app, "127.0.0.1", 0, shutdown_grace_s=grace_s) as port:
        state.port = port
        yield state


async def test_a_request_gets_the_same_answer_from_the_guard_and_through_aiohttp() -> None:
    body = b'{"a":1}'
    async with served() as server:
        reader, writer = await server.connect()
        writer.write(request(body))
        direct = await read_answer(reader)
        # a coded body is one the guard leaves to aiohttp (it must be inflated)
        writer.write(request(gzip.compress(body), extra="Content-Encoding: gzip"))
        through = await read_answer(reader)
        writer.write(request(body))  # and the connection still carries requests
        again = await read_answer(reader)
        writer.close()
    assert direct.status == through.status == again.status == 200
    assert direct.body == through.body == again.body
    assert direct.body.startswith(b'POST /verb timeout=5s {"a":1} Deadline(')
    assert "connection" not in direct.headers
    assert [call.body for call in server.calls] == [body] * 3


async def test_a_route_that_fails_is_a_500_that_closes_and_one_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails(call: Call) -> Reply:
        raise RuntimeError("a bug")

    async with served(fails) as server:
        reader, writer = await server.connect()
        with caplog.at_level(logging.ERROR):
            writer.write(request(b"{}"))
            answer = await read_answer(reader)
            assert await reader.read() == b""
        writer.close()
        await asyncio.sleep(0)
        assert server.guard.in_flight == 0
    assert answer.status == 500
    assert answer.headers["connection"].lower() == "close"
    assert b"the server failed to answer" in answer.body
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in failures] == ["request handler failed"]
    assert failures[0].exc_info is not None


async def test_a_route_still_running_after_the_grace_is_cancelled_and_its_connection_closed() -> (
    None
):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hangs(call: Call) -> Reply:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("never answered")

    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(served(hangs, grace_s=0.2))
        reader, writer = await server.connect()
        writer.write(request(b"{}"))
        async with asyncio.timeout(SLACK_S):
            await started.wait()
        loop = asyncio.get_running_loop()
        began = loop.time()
        left = await server.guard.drain(0.2)
        took = loop.time() - began
    assert left == 1
    assert 0.2 <= took <= 0.2 + SLACK_S
    assert cancelled.is_set()
    async with asyncio.timeout(SLACK_S):
        assert await reader.read() == b""
    writer.close()
    assert server.guard.in_flight == 0


async def test_an_idle_connection_after_a_routes_answer_is_closed_after_the_idle_timeout() -> None:
    async with served(idle_timeout_s=0.3) as server:
        reader, writer = await server.connect()
        writer.write(request(b"{}"))
        await read_answer(reader)
        loop = asyncio.get_running_loop()
        answered = loop.time()
        async with asyncio.timeout(0.3 + SLACK_S):
            assert await reader.read() == b""
        idle = loop.time() - answered
        writer.close()
    assert idle >= 0.3


async def test_a_connection_in_use_is_not_closed_by_the_idle_timeout() -> None:
    async with served(idle_timeout_s=0.3) as server:
        reader, writer = await server.connect()
        statuses = []
        for _ in range(6):  # 0.6 s of requests 0.1 s apart: twice the idle timeout
            writer.write(request(b"{}"))
            statuses.append((await read_answer(reader)).status)
            await asyncio.sleep(0.1)
        writer.close()
    assert statuses == [200] * 6


async def test_a_body_over_the_limit_is_refused_in_the_servers_words_without_the_route() -> None:
    async with served() as server:
        reader, writer = await server.connect()
        writer.write(request(b"x" * 1001))
        answer = await read_answer(reader)
        writer.close()
    assert answer.status == 400
    assert b"exceeds 1000" in answer.body
    assert server.calls == []


async def test_a_client_that_hangs_up_while_its_route_runs_is_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def slow(call: Call) -> Reply:
        await release.wait()
        return Reply(200, b"late")

    async with served(slow) as server:
        _, writer = await server.connect()
        writer.write(request(b"{}"))
        async with asyncio.timeout(SLACK_S):
            while server.guard.in_flight == 0:  # noqa: ASYNC110 - the server's own state
                await asyncio.sleep(0.01)
        writer.close()
        await writer.wait_closed()
        with caplog.at_level(logging.WARNING):
            await asyncio.sleep(0.1)  # the server sees the connection go
            release.set()
            async with asyncio.timeout(SLACK_S):
                while server.guard.in_flight:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["client went away before its request was answered"]
    assert server.guard.shed.labels("client_gone")._value.get() == 1
