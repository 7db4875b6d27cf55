"""Open-loop load generation: requests leave at fixed intended times, latency counts from them.

Layer: I/O (asyncio, sockets). ``Schedule`` is its pure arithmetic, usable without a
loop; ``run_open_loop`` is the driver and ``Http1Connection`` a lean keep-alive HTTP/1.1
client. Time comes only from the injected ``Clock`` and the event loop's timers; the
module keeps no global state and never decides what a response means (the caller's
``send`` does: it raises ``RequestFailed`` for an answer it does not accept).

Why open loop: a closed-loop tool (send, wait, send the next) slows down with the server,
so a stall of 200 ms shows up as one slow request instead of the hundreds that real
clients would have queued behind it ("coordinated omission"). Here request ``i`` is due
at ``start + i / rate`` whatever happened before, and its latency is measured from that
intended time, so time spent waiting for a free connection or for a late timer counts.

How: ``connections`` workers, each owning one keep-alive connection, take the next index
as soon as they are free and wait until it is due. When every connection is busy, due
requests wait for one (as kube-apiserver's requests wait for its connection pool), and
that wait is part of their latency. ``lag`` is sent minus intended (connection wait and
the generator's own delay), ``late`` the generator's own delay alone: how long after a
request was due *and* a connection was free for it it left. A large ``late`` means the
generator, not the server, was the bottleneck. A run
that falls more than ``max_lag_s`` behind its schedule stops early (the server is
saturated; going on would only grow the queue), and every request is bounded by
``timeout_s``: a run always ends within about ``duration + max_lag_s + timeout_s``.

Timers of uvloop and of epoll have a millisecond grain, so the driver sleeps until
``spin_s`` before a due time and then yields to the loop until it is due: on a core of
its own the generator sends within microseconds of the schedule.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, cast

from cluster.clock import Clock
from loadtest.measure.stats import Histogram

DEFAULT_SPIN_S: Final = 0.002
DEFAULT_TIMEOUT_S: Final = 5.0
DEFAULT_MAX_LAG_S: Final = 1.0


# ---------------------------------------------------------------- the schedule (pure)


@dataclass(frozen=True, slots=True)
class Schedule:
    """``count`` requests at ``rate`` per second: request ``i`` is due ``i / rate`` after
    the start."""

    rate: float
    count: int

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate {self.rate} is not a positive number")
        if self.count < 0:
            raise ValueError(f"count {self.count} is negative")

    @classmethod
    def for_duration(cls, rate: float, duration_s: float, max_count: int | None = None) -> Schedule:
        """The requests that fall due within ``duration_s`` (at most ``max_count``)."""
        count = math.floor(round(rate * duration_s, 9))
        return cls(rate, count if max_count is None else min(count, max_count))

    def intended(self, index: int) -> float:
        """Seconds after the start at which request ``index`` is due."""
        if not 0 <= index < self.count:
            raise IndexError(f"request {index} is not in a schedule of {self.count}")
        return index / self.rate

    @property
    def duration_s(self) -> float:
        """The span the schedule covers: ``count`` intervals of ``1 / rate``."""
        return self.count / self.rate


def latency_from_intended(intended: float, done: float) -> float:
    """What the user of an open-loop request waited: from when it was due to its answer."""
    return done - intended


# ---------------------------------------------------------------- the driver


class RequestFailed(Exception):
    """An answer the benchmark does not accept; ``kind`` is what the results count."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


Send = Callable[[int], Awaitable[None]]
"""Sends request ``index`` on one connection; returns when its answer is accepted."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One open-loop run. Histograms are in seconds (see ``loadtest.measure.stats``)."""

    schedule: Schedule
    latency: Histogram
    """Intended send time → answer, successful requests only: the number to quote."""
    service: Histogram
    """Actual send time → answer: what a closed-loop tool would have reported."""
    lag: Histogram
    """Intended → actual send time: waiting for a free connection, and ``late``."""
    late: Histogram
    """The generator's own delay: from when the request was due and had a connection to
    when it left. Large means the generator, not the server, held the requests back."""
    sent: int
    ok: int
    errors: Mapping[str, int]
    elapsed_s: float
    """Start → last answer, and at least the span of the requests sent."""
    stopped: str = ""
    """Why the run stopped before its schedule ended; empty when it ran to the end."""
    per_second: tuple[int, ...] = field(default=())
    """Successful answers in each second after the start."""
    failed: Histogram = field(default_factory=Histogram)
    """Intended send time → failure (an answer not accepted, a broken connection, or
    the request timeout), failed requests only: a fast failure is a short one."""

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def achieved_rate(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(slots=True)
class _Tally:
    """What an open-loop run has recorded so far (one run, one event loop)."""

    start: float
    last_done: float
    latency: Histogram = field(default_factory=Histogram)
    service: Histogram = field(default_factory=Histogram)
    lag: Histogram = field(default_factory=Histogram)
    late: Histogram = field(default_factory=Histogram)
    failed: Histogram = field(default_factory=Histogram)
    errors: Counter[str] = field(default_factory=Counter)
    per_second: list[int] = field(default_factory=list)
    next: int = 0
    sent: int = 0
    ok: int = 0
    stopped: list[str] = field(default_factory=list)

    def failure(self, kind: str, due: float, now: float) -> None:
        self.errors[kind] += 1
        self.failed.record(latency_from_intended(due, now))

    def success(self, due: float, ready: float, sent: float, done: float) -> None:
        self.last_done = max(self.last_done, done)
        self.ok += 1
        self.latency.record(latency_from_intended(due, done))
        self.service.record(done - sent)
        self.lag.record(sent - due)
        self.late.record(sent - ready)
        second = int(done - self.start)
        per_second = self.per_second
        if second >= len(per_second):
            per_second.extend([0] * (second + 1 - len(per_second)))
        per_second[second] += 1

    def result(self, schedule: Schedule) -> RunResult:
        elapsed = max(self.last_done - self.start, self.sent / schedule.rate)
        return RunResult(
            schedule=schedule,
            latency=self.latency,
            service=self.service,
            lag=self.lag,
            late=self.late,
            sent=self.sent,
            ok=self.ok,
            errors=dict(self.errors),
            elapsed_s=elapsed,
            stopped=self.stopped[0] if self.stopped else "",
            per_second=tuple(self.per_second),
            failed=self.failed,
        )


async def run_open_loop(
    schedule: Schedule,
    senders: Sequence[Send],
    clock: Clock,
    *,
    spin_s: float = DEFAULT_SPIN_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_lag_s: float = DEFAULT_MAX_LAG_S,
) -> RunResult:
    """Run ``schedule`` over ``senders`` (one per connection) and measure it.

    ``spin_s`` = 0 sleeps on timers only (what a test with a virtual clock wants).
    Failures are counted by ``RequestFailed.kind``, ``timeout`` or the exception's type
    name (a reset connection is a ``ConnectionResetError``); they never stop the run.
    """
    if not senders:
        raise ValueError("an open-loop run needs at least one connection")
    start = clock.monotonic()
    tally = _Tally(start, start)

    async def wait_until(due: float) -> None:
        # A coarse timer sleep, then short yields (or, with no spin, exact timer sleeps):
        # polling the clock is the point here, there is no event to wait for.
        while (delay := due - clock.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay - spin_s if delay > spin_s else (0 if spin_s else delay))

    async def worker(send: Send) -> None:
        while not tally.stopped:
            index = tally.next
            if index >= schedule.count:
                return
            tally.next = index + 1
            due = start + schedule.intended(index)
            ready = max(due, clock.monotonic())
            await wait_until(due)
            sent = clock.monotonic()
            if sent - due > max_lag_s:
                tally.stopped.append(
                    f"fell {sent - due:.1f} s behind the schedule at request {index}"
                )
                return
            tally.sent += 1
            try:
                async with asyncio.timeout(timeout_s):
                    await send(index)
            except RequestFailed as exc:
                tally.failure(exc.kind, due, clock.monotonic())
                continue
            except TimeoutError:
                tally.failure("timeout", due, clock.monotonic())
                continue
            except Exception as exc:  # anything else a client can meet is a failed request
                tally.failure(type(exc).__name__, due, clock.monotonic())
                continue
            tally.success(due, ready, sent, clock.monotonic())

    await asyncio.gather(*(worker(send) for send in senders))
    return tally.result(schedule)


# ---------------------------------------------------------------- a lean HTTP/1.1 client


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes


class _Http1Protocol(asyncio.Protocol):
    """Reads one response at a time (no pipelining): status line, headers, a body of
    ``Content-Length`` bytes. Anything else (chunked bodies, a response nobody asked for)
    breaks the connection, which the next request replaces."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[HttpResponse] | None = None
        self.closed = False
        self._buffer = bytearray()
        self._head: tuple[int, int, int] | None = None  # status, body start, body length
        self._keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self.waiter is None or self.waiter.done():
            self._fail(ConnectionError("response data with no request outstanding"))
            return
        try:
            response = self._parse()
        except ValueError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))
            return
        if response is not None:
            self.waiter.set_result(response)
            if not self._keep_alive and self.transport is not None:
                self.closed = True
                self.transport.close()

    def _parse(self) -> HttpResponse | None:
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return None
            lines = bytes(self._buffer[:end]).split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            length = None
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    raise ValueError("chunked bodies are not supported")
                elif name == b"connection" and value.strip().lower() == b"close":
                    self._keep_alive = False
            if length is None:
                raise ValueError("no Content-Length")
            self._head = (status, end + 4, length)
        status, start, length = self._head
        if len(self._buffer) < start + length:
            return None
        body = bytes(self._buffer[start : start + length])
        del self._buffer[: start + length]
        self._head = None
        return HttpResponse(status, body)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("connection closed by the server"))


class Http1Connection:
    """One keep-alive HTTP/1.1 connection (TLS when ``ssl_context`` is given), reopened
    on the next request after a failure, a timeout or a ``Connection: close``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.host, self.port = host, port
        self._ssl = ssl_context
        self._server_hostname = server_hostname if ssl_context is not None else None
        authority = f"{server_hostname or host}:{port}"
        fixed = {"Host": authority, **(headers or {})}
        self._fixed_headers = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode()
        self._protocol: _Http1Protocol | None = None
        self.connects = 0

    async def connect(self) -> None:
        if self._protocol is not None and not self._protocol.closed:
            return
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            _Http1Protocol,
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self._server_hostname,
        )
        self._protocol = protocol
        self.connects += 1

    async def request(self, method: str, target: str, body: bytes = b"") -> HttpResponse:
        await self.connect()
        protocol = self._protocol
        assert protocol is not None
        assert protocol.transport is not None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[HttpResponse] = loop.create_future()
        protocol.waiter = waiter
        head = f"{method} {target} HTTP/1.1\r\n".encode() + self._fixed_headers
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        protocol.transport.write(head + body)
        try:
            return await waiter
        except BaseException:
            # Cancelled (timeout) or broken: the answer, if it ever comes, belongs to no one.
            self.close()
            raise

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None
