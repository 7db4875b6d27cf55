"""What stands between a server's sockets and aiohttp: read deadlines, a budget for the
request bodies being received, and fast answers instead of late ones.

Layer: I/O (transports, timers, aiohttp's middleware). Holds what all of a server's
connections share: the in-flight count, the body budget and its queue, the shed
counters, the refusals' bytes, the middleware and the drain. Must not decide anything
about a request's content: the pure parts are ``server.httphead`` (where a head ends)
and ``server.deadline`` (when an answer is too late); the servers say how long their
clients wait (``TimeoutOf``) and what a late request is answered (through
``answer_if_late``); what one connection does with its bytes is ``server.connection``'s.

Why at the connection: aiohttp (3.14) bounds nothing while a request arrives. Its only
timer is the keep-alive one (an hour by default), measured from the last response, so a
client that sends a head one byte a second, or a body that never comes, holds its
connection, its handler and whatever it buffered for as long as it likes. A middleware
runs too late to help: it starts once the head is in. So each connection's protocol is
wrapped (``ConnectionGuard.protocol_factory`` around aiohttp's own factory, the
``runner.server`` every ``TCPSite`` uses): the wrapper (``server.connection``) sees
every byte before aiohttp does and keeps one timer per connection.

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
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from cluster import logs
from cluster.clock import Clock
from server.connection import Connection
from server.deadline import Deadline
from server.direct import JSON, Reply, Route, status_body
from server.httphead import Head
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

TimeoutOf = Callable[[str, str, str], float | None]
"""Seconds the client of a request waits for its answer, from its method, path and
undecoded query; ``None``: no deadline."""

CANCEL_WAIT_S: Final = 0.5
"""After the shutdown grace: how long a cancelled handler has to end."""


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
        self._waiting: deque[Connection] = deque()
        self._connections: dict[object, Connection] = {}
        self._routes: dict[tuple[str, str], Route] = {}
        """Answered on the connection for the heads framed strictly (``server.direct``)."""
        self._calls: set[asyncio.Task[None]] = set()
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

    def route(self, method: str, path: str, handler: Route) -> None:
        """Call ``handler`` on the connection for each strictly framed ``method path``
        request with a plain body of at most ``max_body_bytes`` (``server.direct``);
        the server routes the same path to it through aiohttp for the others."""
        self._routes[method, path] = handler

    def protocol_factory(
        self, server: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """Wrap aiohttp's protocol factory (``runner.server``)."""

        def make() -> Connection:
            return Connection(self, server())

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
        deadline = self.deadline(request.method, request.path, request.query_string, arrived)
        if deadline is not None:
            request[DEADLINE] = deadline
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
        left = self.in_flight
        # aiohttp's runner cancels its own handlers afterwards; the routes' calls are ours
        for call in self._calls:
            call.cancel()
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=CANCEL_WAIT_S)
        return left

    def answer_if_late(self, request: web.Request) -> web.Response | None:
        """``late`` for an aiohttp request, as its response."""
        reply = self.late(request.method, request.path, request.get(DEADLINE))
        if reply is None:
            return None
        return web.Response(status=reply.status, body=reply.body, content_type=JSON)

    def late(self, method: str, path: str, deadline: Deadline | None) -> Reply | None:
        """The 504 to answer when the request's deadline (less the margin) has passed,
        counted as shed; ``None`` while an answer can still be on time."""
        if deadline is None:
            return None
        now = self.clock.monotonic()
        if not deadline.too_late(now):
            return None
        self.count("deadline")
        late = now - (deadline.at - deadline.margin)
        message = (
            f"{method} {path}: the client's deadline would pass before an "
            f"answer (less than {deadline.margin:g} s left, {late:.3f} s after the last "
            "moment to start); answered at once rather than late"
        )
        return Reply(504, status_body(504, "Timeout", message))

    def spare(self, deadline: Deadline | None) -> float | None:
        """Seconds a handler may still wait on something (an API call) and answer on
        time: the deadline less the margin, from now; ``None``: no deadline."""
        return None if deadline is None else deadline.spare(self.clock.monotonic())

    def deadline(self, method: str, path: str, query: str, arrived: float) -> Deadline | None:
        """The deadline of a request whose head began at ``arrived``."""
        timeout = self._timeout_of(method, path, query)
        if timeout is None:
            return None
        return Deadline.after(arrived, timeout, self.limits.deadline_margin_s)

    def count(self, reason: str) -> None:
        self._shed[reason].inc()

    # ------------------------------------------------------------ for the connections

    def register(self, inner: object, conn: Connection) -> None:
        """A new connection, under aiohttp's protocol for it (what a request names)."""
        self._connections[inner] = conn

    def unregister(self, inner: object) -> None:
        self._connections.pop(inner, None)

    def route_of(self, head: Head) -> Route | None:
        """The route that answers this head's request on the connection, if one does."""
        if not self._routes or not head.framed or head.encoded:
            return None
        if head.body > self.limits.max_body_bytes:
            return None  # aiohttp refuses it, in the server's own words
        return self._routes.get((head.method, head.path))

    def track(self, task: asyncio.Task[None]) -> None:
        """A route's call (``Connection``'s task), for drain to cancel."""
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def enter(self) -> None:
        """A request is handed to aiohttp: one more in flight."""
        self.in_flight += 1

    def leave(self) -> None:
        """A request in flight is over (answered, or its connection gone)."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()

    def wait(self, conn: Connection) -> None:
        """``conn``'s head waits for the body budget, after those waiting already."""
        self._waiting.append(conn)

    def stop_waiting(self, conn: Connection) -> None:
        if conn in self._waiting:
            self._waiting.remove(conn)

    def verdict(self, head: Head) -> str | None:
        """Why the request of this head is refused at once, if it is."""
        if head.path in EXEMPT_PATHS:
            return None
        if self.in_flight >= self.limits.max_in_flight:
            return "in_flight"
        return None

    def need(self, head: Head) -> int:
        """Body bytes a request reserves: its declared length, bounded by what a handler
        reads at most; the most for a head that declares none it can be held to."""
        if head.framed:
            return min(head.body, self.limits.max_body_bytes)
        return self.limits.max_body_bytes

    def reserve(self, need: int) -> bool:
        """Reserve ``need`` body bytes now, if they fit and nobody waits before them (a
        lone request always fits: the settings keep the budget above the largest body)."""
        if self._waiting:
            return False
        if self.reserved and self.reserved + need > self.limits.max_buffered_body_bytes:
            return False
        self.reserved += need
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return True

    def release(self, amount: int) -> None:
        self.reserved -= amount
        while self._waiting:
            first = self._waiting[0]
            need = self.need(cast(Head, first.head))
            if self.reserved and self.reserved + need > self.limits.max_buffered_body_bytes:
                return
            self._waiting.popleft()
            self.reserved += need
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            first.granted(need)

    def refusal(self, reason: str, *, close: bool) -> bytes:
        """The whole HTTP response refusing a request for ``reason`` (``in_flight``,
        ``body_budget`` or ``head_too_large``), written before aiohttp sees it; with
        ``close``, one that closes the connection."""
        code, body = self._refusal_body(reason)
        return _raw_answer(code, body, close=close)

    def _refusal_body(self, reason: str) -> tuple[int, bytes]:
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

    def _gone(self, request: web.Request, conn: Connection | None) -> None:
        if conn is not None and conn.cut_off:
            return  # the body deadline closed it, and said so
        self.went_away(request.method, request.path, request.remote)

    def went_away(self, method: str, path: str, peer: object) -> None:
        """A request's client hung up before its answer."""
        self.count("client_gone")
        log.warning(
            "client went away before its request was answered",
            extra=logs.fields(method=method, path=path, peer=peer),
        )


async def _send(
    request: web.Request, response: web.StreamResponse, conn: Connection | None
) -> None:
    """Write the whole response now (aiohttp's own write after the middleware then finds
    it sent and does nothing); after an unframed request, with ``Connection: close``."""
    if conn is not None and (conn.opaque or conn.guard.draining):
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
