"""What stands between a server's sockets and aiohttp: read deadlines, a budget for the
request bodies being received, and fast answers instead of late ones.

Layer: I/O (transports, timers, aiohttp's middleware). Must not decide anything about a
request's content: the pure parts are ``server.httphead`` (where a head ends) and
``server.deadline`` (when an answer is too late); the servers say how long their
clients wait (``TimeoutOf``) and what a late request is answered (through
``answer_if_late``).

Why at the connection: aiohttp (3.14) bounds nothing while a request arrives. Its only
timer is the keep-alive one (an hour by default), measured from the last response, so a
client that sends a head one byte a second, or a body that never comes, holds its
connection, its handler and whatever it buffered for as long as it likes. A middleware
runs too late to help: it starts once the head is in. So each connection's protocol is
wrapped (``ConnectionGuard.protocol_factory`` around aiohttp's own factory, the
``runner.server`` every ``TCPSite`` uses): the wrapper sees every byte before aiohttp
does and keeps one timer per connection.

* **Head deadline** (``header_timeout_s``): from the first byte of a request head (for a
  new connection: from the end of its TLS handshake, which has the same bound) to its
  blank line. The head is held back until it is complete, so aiohttp never sees a
  partial one; a connection that misses the deadline is aborted. An idle keep-alive
  connection (no byte of a next request yet) keeps aiohttp's keep-alive timeout.
* **Body deadline** (``body_timeout_s``): from the end of the head to the body's last
  byte. A body still incomplete then gets its connection aborted; the handler's read
  fails and the middleware ends the request quietly (one WARNING line, no traceback).
* **Body budget** (``max_buffered_body_bytes``): the declared ``Content-Length`` of every
  request handed to aiohttp and not yet answered is reserved before aiohttp reads a byte
  of its body. A request that does not fit waits (reading paused) up to
  ``budget_wait_s`` for others to finish, then is answered 429 and its connection
  closed. Memory held by bodies is bounded by the budget, whatever clients declare.
* **In-flight bound** (``max_in_flight``): a request whose head completes while that
  many are already handed to aiohttp and unanswered is answered 429 at once, before
  aiohttp parses it. That answer costs a quarter or less of a decided review (no request
  object, no task, no handler; a bare aiohttp handler costs half of one), so an
  overloaded server answers every request fast and decides as many as it can, instead of
  deciding all of them late. Probes (``/healthz``,
  ``/readyz``, ``/livez``) and ``/metrics`` are never refused.
* **Deadline** (the servers' ``TimeoutOf``): the middleware stamps each request with
  its deadline, counted from the first byte of its head (not from when its handler
  got to run: under load that is later); a request already too late when its handler
  would start is answered 504 without being decided, and handlers call
  ``answer_if_late`` again once they have read the body.

The fast answers are a Kubernetes ``Status`` with no ``Retry-After``: client-go's REST
client, which kube-apiserver calls webhooks with, retries a 429 or 5xx that carries one,
up to ten times, adding load exactly when a server sheds it. Without it kube-apiserver
applies the webhook's ``failurePolicy`` at once (``Fail``: the request is rejected, and
says why); kube-scheduler fails the scheduling cycle and retries the pod later.

Only heads ``server.httphead`` frames strictly are answered here; another head is handed
to aiohttp whole and its connection closed after it (``Connection: close`` on the
response), so that the two parsers never have to agree on it.

To know what aiohttp is doing, the wrapper only counts on its middleware: it sees a
request's handler start and end, and it writes the response itself before it reports
the end, so that an answer the wrapper writes afterwards can never come before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from cluster import jsonio, logs
from cluster.clock import Clock
from server.deadline import Deadline
from server.httphead import Head, HeadTooLarge, read_head
from server.serving_settings import Limits

log = logging.getLogger(__name__)

EXEMPT_PATHS: Final = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})
"""Never refused for load: kubelet must see a busy server as alive and ready, and
Prometheus must see it busy."""

REASONS: Final = (
    "deadline",
    "in_flight",
    "body_budget",
    "header_timeout",
    "body_timeout",
    "head_too_large",
    "client_gone",
)
"""The shed counter's label values: every way a request ends without being decided."""

DEADLINE = web.RequestKey("deadline", Deadline)
"""The request's deadline, for the handlers that wait on something (``answer_if_late``)."""

TimeoutOf = Callable[[web.Request], float | None]
"""Seconds the client of this request waits for its answer; ``None``: no deadline."""

JSON = "application/json"


def status_body(code: int, reason: str, message: str) -> bytes:
    """A Kubernetes ``Status`` (``metav1.Status``): what client-go decodes an error from."""
    return jsonio.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


_PHRASES: Final = {429: "Too Many Requests", 431: "Request Header Fields Too Large"}


def _raw_answer(code: int, body: bytes, *, close: bool) -> bytes:
    closing = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {code} {_PHRASES[code]}\r\nContent-Type: {JSON}\r\n"
        f"Content-Length: {len(body)}\r\n{closing}\r\n"
    )
    return head.encode() + body


class ConnectionGuard:
    """One server's guard: its limits, what is in flight and reserved, and the counters.

    ``registry`` and ``prefix`` name the metrics (``<prefix>_shed_requests_total`` by
    reason, ``<prefix>_requests_in_flight``, ``<prefix>_request_body_bytes_reserved``);
    with no registry they are kept in a private one.
    """

    def __init__(
        self,
        limits: Limits,
        clock: Clock,
        timeout_of: TimeoutOf,
        *,
        registry: CollectorRegistry | None = None,
        prefix: str = "tessera",
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._timeout_of = timeout_of
        self.in_flight = 0
        self.reserved = 0
        self.draining = False
        """Shutting down: no new request is read, each connection ends after its own."""
        self._drained: asyncio.Event | None = None
        self.peak_reserved = 0
        """The most body bytes ever reserved at once (never above the budget)."""
        self._waiting: deque[_Connection] = deque()
        self._connections: dict[object, _Connection] = {}
        registry = registry if registry is not None else CollectorRegistry()
        self.shed = Counter(
            f"{prefix}_shed_requests",
            "Requests answered with a fast error or cut off before they were decided, by "
            "reason: deadline (504: the client's timeout would pass first), in_flight "
            "(429: too many under way), body_budget (429: too many body bytes being "
            "received), header_timeout and body_timeout (connection closed: the client "
            "was too slow), head_too_large (431), client_gone (the client hung up).",
            ("reason",),
            registry=registry,
        )
        self._shed = {reason: self.shed.labels(reason) for reason in REASONS}
        Gauge(
            f"{prefix}_requests_in_flight",
            "Requests handed to the server and not yet answered (probes included).",
            registry=registry,
        ).set_function(lambda: self.in_flight)
        Gauge(
            f"{prefix}_request_body_bytes_reserved",
            "Declared body bytes of the requests in flight, counted against the budget.",
            registry=registry,
        ).set_function(lambda: self.reserved)

    # ------------------------------------------------------------ for the servers

    def protocol_factory(
        self, server: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """Wrap aiohttp's protocol factory (``runner.server``)."""

        def make() -> _Connection:
            return _Connection(self, server())

        return make

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Stamps the deadline, answers a request already too late, ends a request whose
        client went away without a traceback, and writes the response before telling
        the connection that the request is over."""
        conn = self._connections.get(request.protocol)
        arrived = conn.arrived if conn is not None else self.clock.monotonic()
        timeout = self._timeout_of(request)
        if timeout is not None:
            request[DEADLINE] = Deadline.after(arrived, timeout, self.limits.deadline_margin_s)
        if conn is not None:
            conn.begin(request)
        clean = False
        try:
            response: web.StreamResponse | None = self.answer_if_late(request)
            if response is None:
                try:
                    response = await handler(request)
                except web.HTTPException as exc:
                    await _send(request, exc, conn)
                    clean = True
                    raise
                except ConnectionResetError:
                    if not _closing(request):
                        raise
                    self._gone(request, conn)
                    return web.Response(status=400)  # never delivered: the client is gone
            await _send(request, response, conn)
            clean = True
            return response
        finally:
            if conn is not None:
                conn.end(clean)

    async def drain(self, grace_s: float) -> int:
        """Read no new request: close idle connections (and those that are between
        requests), let each request under way finish and close its connection after
        it, for up to ``grace_s``. How many were still under way then.

        aiohttp's own shutdown cannot do this: once it closes a connection it drops the
        bytes that still come on it, so a request whose body was arriving could never
        finish.
        """
        self.draining = True
        for conn in list(self._connections.values()):
            conn.drain()
        if self.in_flight:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._drained.wait()
        return self.in_flight

    def answer_if_late(self, request: web.Request) -> web.Response | None:
        """The 504 to answer when the request's deadline (less the margin) has passed,
        counted as shed; ``None`` while an answer can still be on time."""
        deadline = request.get(DEADLINE)
        if deadline is None:
            return None
        now = self.clock.monotonic()
        if not deadline.too_late(now):
            return None
        self.count("deadline")
        late = now - (deadline.at - deadline.margin)
        message = (
            f"{request.method} {request.path}: the client's deadline would pass before an "
            f"answer (less than {deadline.margin:g} s left, {late:.3f} s after the last "
            "moment to start); answered at once rather than late"
        )
        return web.Response(
            status=504, body=status_body(504, "Timeout", message), content_type=JSON
        )

    def spare(self, request: web.Request) -> float | None:
        """Seconds the handler may still wait on something (an API call) and answer on
        time: the deadline less the margin, from now; ``None``: no deadline."""
        deadline = request.get(DEADLINE)
        return None if deadline is None else deadline.spare(self.clock.monotonic())

    def count(self, reason: str) -> None:
        self._shed[reason].inc()

    # ------------------------------------------------------------ for the connections

    def _verdict(self, head: Head) -> str | None:
        """Why the request of this head is refused at once, if it is."""
        if head.path in EXEMPT_PATHS:
            return None
        if self.in_flight >= self.limits.max_in_flight:
            return "in_flight"
        return None

    def _need(self, head: Head) -> int:
        """Body bytes a request reserves: its declared length, bounded by what a handler
        reads at most; the most for a head that declares none it can be held to."""
        if head.framed:
            return min(head.body, self.limits.max_body_bytes)
        return self.limits.max_body_bytes

    def _reserve(self, need: int) -> bool:
        """Reserve ``need`` body bytes now, if they fit and nobody waits before them (a
        lone request always fits: the settings keep the budget above the largest body)."""
        if self._waiting:
            return False
        if self.reserved and self.reserved + need > self.limits.max_buffered_body_bytes:
            return False
        self.reserved += need
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return True

    def _release(self, amount: int) -> None:
        self.reserved -= amount
        while self._waiting:
            first = self._waiting[0]
            need = self._need(cast(Head, first.head))
            if self.reserved and self.reserved + need > self.limits.max_buffered_body_bytes:
                return
            self._waiting.popleft()
            self.reserved += need
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            first.granted(need)

    def _refusal(self, reason: str) -> tuple[int, bytes]:
        limits = self.limits
        if reason == "in_flight":
            message = (
                f"overloaded: {self.in_flight} requests under way (at most "
                f"{limits.max_in_flight}); answered at once rather than late"
            )
            return 429, status_body(429, "TooManyRequests", message)
        if reason == "body_budget":
            message = (
                f"overloaded: the request bodies being received take {self.reserved} of "
                f"{limits.max_buffered_body_bytes} bytes, and none freed up within "
                f"{limits.budget_wait_s:g} s"
            )
            return 429, status_body(429, "TooManyRequests", message)
        message = f"the request head exceeds {limits.max_head_bytes} bytes"
        return 431, status_body(431, "RequestHeaderFieldsTooLarge", message)

    def _gone(self, request: web.Request, conn: _Connection | None) -> None:
        if conn is not None and conn.cut_off:
            return  # the body deadline closed it, and said so
        self.count("client_gone")
        log.warning(
            "client went away before its request was answered",
            extra=logs.fields(method=request.method, path=request.path, peer=request.remote),
        )


async def _send(
    request: web.Request, response: web.StreamResponse, conn: _Connection | None
) -> None:
    """Write the whole response now (aiohttp's own write after the middleware then finds
    it sent and does nothing); after an unframed request, with ``Connection: close``."""
    if conn is not None and (conn.state is _State.OPAQUE or conn.guard.draining):
        response.force_close()
    if _closing(request):
        return
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away meanwhile; aiohttp finds the same and stays quiet


def _closing(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class _State(enum.Enum):
    HEAD = enum.auto()
    """Reading a request head (or idle, with nothing of one yet)."""
    PASSING = enum.auto()
    """A framed request handed to aiohttp; its remaining bytes follow it."""
    SKIPPING = enum.auto()
    """Dropping the body of a request answered here."""
    WAITING = enum.auto()
    """A head waits for the body budget, reading paused."""
    OPAQUE = enum.auto()
    """aiohttp has the connection to itself until it ends: an unframed request, or a
    handler that failed."""
    CLOSED = enum.auto()


class _Connection(asyncio.Protocol):
    """Between one connection's transport and aiohttp's protocol for it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.state = _State.HEAD
        self.buf = bytearray()
        """Bytes not handed on: a head being read, or what came after the request in
        flight (a pipelined one), held until that request is over."""
        self.timer: asyncio.TimerHandle | None = None
        self.arrived = 0.0
        self.head: Head | None = None
        self.left = 0
        """PASSING or SKIPPING: bytes of the request still to come."""
        self.reserved = 0
        self.counted = False
        """Counted in the guard's ``in_flight``."""
        self.ended = False
        """PASSING: the handler is done, the rest of an unread body goes to aiohttp."""
        self.request: web.Request | None = None
        self.answer = b""
        """SKIPPING: what to write once the body is dropped."""
        self.cut_off = False
        self.paused = False
        """Reading paused by the guard (``_pause``)."""

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(transport)
        self.guard._connections[self.inner] = self
        # a new connection owes its first head at once (the TLS handshake had its own bound)
        self._arm(self.guard.limits.header_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is _State.PASSING:
            self._feed(data)
        elif state is _State.OPAQUE:
            self.inner.data_received(data)
        elif state is _State.HEAD:
            if self.guard.draining:
                self._close()
                return
            if not self.buf:
                self._stamp()
            self.buf += data
            self._read_heads()
        elif state is _State.SKIPPING:
            taken = min(len(data), self.left)
            self.left -= taken
            if self.left == 0:
                self._skipped()
                if taken < len(data):
                    self.data_received(data[taken:])
        elif state is _State.WAITING:
            self.buf += data

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.state = _State.CLOSED
        if self in self.guard._waiting:
            self.guard._waiting.remove(self)
        self._settle()
        self.guard._connections.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # ------------------------------------------------------------ from the middleware

    def begin(self, request: web.Request) -> None:
        self.request = request

    def drain(self) -> None:
        """Shutting down: close now if no request is under way (aiohttp closes it after
        the response of the one that is: ``Connection: close``)."""
        if self.state in (_State.HEAD, _State.WAITING, _State.SKIPPING):
            if self in self.guard._waiting:
                self.guard._waiting.remove(self)
            self._close()

    def end(self, clean: bool) -> None:
        """The handler is done and its response written (``clean``), or it failed:
        aiohttp answers 500 and closes, so the connection is left to it."""
        self.request = None
        self._settle()
        if not clean and self.state is not _State.CLOSED:
            self.state = _State.OPAQUE
            self._disarm()
            if self.buf:
                held, self.buf = bytes(self.buf), bytearray()
                self.inner.data_received(held)
        elif self.state is _State.OPAQUE:
            self._disarm()  # the answer is out; aiohttp closes the connection
        elif self.state is _State.PASSING:
            self.ended = True
            if self.left == 0:
                self._next()

    # ------------------------------------------------------------ heads

    def _stamp(self) -> None:
        """The first byte of a head: when the request arrived, and its head deadline
        (unless a new connection's is running already)."""
        self.arrived = self.guard.clock.monotonic()
        if self.timer is None:
            self._arm(self.guard.limits.header_timeout_s, self._head_timed_out)

    def _read_heads(self) -> None:
        while self.state is _State.HEAD and self.buf:
            try:
                head = read_head(self.buf, self.guard.limits.max_head_bytes)
            except HeadTooLarge:
                self._disarm()
                self._refuse_and_close("head_too_large")
                return
            if head is None:
                return
            self._disarm()
            self.head = head
            reason = self.guard._verdict(head)
            if reason is not None:
                self._refuse(head, reason)
                continue
            need = self.guard._need(head)
            if need and not self.guard._reserve(need):
                self._wait_for_budget()
                return
            self._pass(head, need)

    def _pass(self, head: Head, reserved: int) -> None:
        guard = self.guard
        self.reserved = reserved
        self.counted = True
        guard.in_flight += 1
        self.ended = False
        if head.framed:
            self.state = _State.PASSING
            self.left = head.size + head.body
            held, self.buf = bytes(self.buf), bytearray()
            if len(held) < self.left:
                self._arm(guard.limits.body_timeout_s, self._body_timed_out)
            self._feed(held)
        else:
            self.state = _State.OPAQUE
            self._arm(guard.limits.body_timeout_s, self._body_timed_out)
            held, self.buf = bytes(self.buf), bytearray()
            self.inner.data_received(held)

    def _feed(self, data: bytes) -> None:
        """PASSING: hand on what belongs to the request in flight, hold the rest."""
        taken = min(len(data), self.left)
        self.left -= taken
        if taken < len(data):
            self.buf += data[taken:]
            if len(self.buf) > self.guard.limits.max_head_bytes:
                self._pause()  # a pipelining client waits for its answers
        if self.left == 0:
            self._disarm()
        if taken:
            self.inner.data_received(data if taken == len(data) else data[:taken])
        if self.left == 0 and self.ended and self.state is _State.PASSING:
            self._next()

    def _next(self) -> None:
        """The request is over and all of it was handed on: read what came after it."""
        self.state = _State.HEAD
        self.head = None
        self._disarm()
        if self.guard.draining:
            self._close()
            return
        self._resume()
        if self.buf:
            self._stamp()
            self._read_heads()

    def _settle(self) -> None:
        """Give back what the request in flight held of the guard's bounds."""
        guard = self.guard
        if self.counted:
            self.counted = False
            guard.in_flight -= 1
            if guard.in_flight == 0 and guard._drained is not None:
                guard._drained.set()
        if self.reserved:
            reserved, self.reserved = self.reserved, 0
            guard._release(reserved)

    # ------------------------------------------------------------ refusals

    def _refuse(self, head: Head, reason: str) -> None:
        """Answer here; keep the connection if the body is small enough to drop."""
        guard = self.guard
        guard.count(reason)
        code, body = guard._refusal(reason)
        here = len(self.buf) - head.size
        if head.framed and head.keep_alive and head.body - here <= guard.limits.skip_body_bytes:
            answer = _raw_answer(code, body, close=False)
            if here >= head.body:
                del self.buf[: head.size + head.body]
                self._write(answer)
                if self.buf:
                    self._stamp()
                return
            self.buf.clear()
            self.state = _State.SKIPPING
            self.left = head.body - here
            self.answer = answer
            self._arm(guard.limits.body_timeout_s, self._body_timed_out)
            return
        self._write(_raw_answer(code, body, close=True))
        self._close()

    def _skipped(self) -> None:
        self._disarm()
        self.state = _State.HEAD
        answer, self.answer = self.answer, b""
        self._write(answer)

    def _refuse_and_close(self, reason: str) -> None:
        self.guard.count(reason)
        code, body = self.guard._refusal(reason)
        self._write(_raw_answer(code, body, close=True))
        self._close()

    def _wait_for_budget(self) -> None:
        self.state = _State.WAITING
        self.guard._waiting.append(self)
        self._pause()
        self._arm(self.guard.limits.budget_wait_s, self._budget_timed_out)

    def granted(self, reserved: int) -> None:
        """The guard reserved this head's body: hand it on."""
        self._disarm()
        self._resume()
        self._pass(cast(Head, self.head), reserved)

    def _budget_timed_out(self) -> None:
        self.timer = None
        if self.state is not _State.WAITING:
            return
        self.guard._waiting.remove(self)
        self.state = _State.HEAD
        self._resume()
        self._refuse(cast(Head, self.head), "body_budget")
        self._read_heads()

    # ------------------------------------------------------------ timers

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(delay, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_timed_out(self) -> None:
        self.timer = None
        if self.state is not _State.HEAD:
            return
        self.guard.count("header_timeout")
        log.info(
            "request head not received in time: connection closed",
            extra=logs.fields(seconds=self.guard.limits.header_timeout_s, received=len(self.buf)),
        )
        self._abort()

    def _body_timed_out(self) -> None:
        self.timer = None
        if self.state is _State.OPAQUE and (
            self.request is not None and self.request.content.is_eof()
        ):
            return
        if self.state not in (_State.PASSING, _State.SKIPPING, _State.OPAQUE):
            return
        if self.state is _State.PASSING and self.left == 0:
            return
        self.guard.count("body_timeout")
        head = self.head
        log.warning(
            "request body not received in time: connection closed",
            extra=logs.fields(
                seconds=self.guard.limits.body_timeout_s,
                method=head.method if head else "",
                path=head.path if head else "",
                missing=self.left if self.state is not _State.OPAQUE else "unknown",
            ),
        )
        self.cut_off = True
        self._abort()

    # ------------------------------------------------------------ the transport

    def _pause(self) -> None:
        """Stop reading (what aiohttp pauses for its own buffers it resumes itself; this
        is for what the guard holds: a head waiting for the budget, pipelined bytes)."""
        # again even when paused already: aiohttp may have resumed it meanwhile
        if self.transport is not None and not self.transport.is_closing():
            self.paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            self.transport.resume_reading()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        self.state = _State.CLOSED
        self._disarm()
        self.buf.clear()
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self.state = _State.CLOSED
        self._disarm()
        self.buf.clear()
        if self.transport is not None:
            self.transport.abort()
