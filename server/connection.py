"""One connection between its transport and aiohttp's protocol: the state machine that
holds a request head back until it is complete, hands framed requests on byte-exact,
drops the body of a request answered here, and keeps the connection's one timer.

Layer: I/O (an ``asyncio.Protocol`` around aiohttp's). Must not decide anything about a
request's content, nor hold the bounds shared by all connections: the guard
(``server.guard.ConnectionGuard``) says whether a head is refused, reserves and releases
body bytes, counts what is shed and writes the refusals; ``server.httphead`` says
where a head ends. Why it is done at the connection, and the deadlines it keeps,
are in ``server.guard``'s docstring.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from aiohttp import web

from cluster import logs
from server.direct import Call, Reply, Route, response_bytes, status_body
from server.httphead import Head, HeadTooLarge, read_head

if TYPE_CHECKING:
    from server.guard import ConnectionGuard

log = logging.getLogger(__name__)


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
    COLLECTING = enum.auto()
    """Reading the body of a request for one of the guard's routes (``server.direct``)."""
    CALLING = enum.auto()
    """That route's handler is running; what comes after the request is held."""
    CLOSED = enum.auto()


class Connection(asyncio.Protocol):
    """Between one connection's transport and aiohttp's protocol for it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop that made the connection, kept because asking for it costs a
        ``getpid()`` each time on Python 3.11, which showed in the profile of a busy
        webhook (three asks per request)."""
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
        self.body = bytearray()
        """COLLECTING: the body of the request for a route, so far."""
        self.route: Route | None = None
        self.idle: asyncio.TimerHandle | None = None
        """After a route's answer: aiohttp never saw that request, so it keeps no
        keep-alive timer for the connection; this one stands in for it."""

    @property
    def opaque(self) -> bool:
        """aiohttp has the connection to itself: its response must close it."""
        return self.state is _State.OPAQUE

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.loop = asyncio.get_running_loop()
        self.inner.connection_made(transport)
        self.guard.register(self.inner, self)
        # a new connection owes its first head at once (the TLS handshake had its own bound)
        self._arm(self.guard.limits.header_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is _State.COLLECTING:
            self._collect(data)
        elif state is _State.CALLING:
            self._hold(data)
        elif state is _State.PASSING:
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
        self._wake()
        if self.state is _State.COLLECTING and not self.cut_off:
            head = cast(Head, self.head)
            self.guard.went_away(head.method, head.path, self._peer())
        self.state = _State.CLOSED
        self.guard.stop_waiting(self)
        self._settle()
        self.guard.unregister(self.inner)
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
            self.guard.stop_waiting(self)
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
        self._wake()
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
            reason = self.guard.verdict(head)
            if reason is not None:
                self._refuse(head, reason)
                continue
            need = self.guard.need(head)
            if need and not self.guard.reserve(need):
                self._wait_for_budget()
                return
            self._pass(head, need)

    def _pass(self, head: Head, reserved: int) -> None:
        guard = self.guard
        self.reserved = reserved
        self.counted = True
        guard.enter()
        self.ended = False
        route = guard.route_of(head)
        if route is not None:
            self._start_call(head, route)
        elif head.framed:
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
            self._hold(data[taken:])
        if self.left == 0:
            self._disarm()
        if taken:
            self.inner.data_received(data if taken == len(data) else data[:taken])
        if self.left == 0 and self.ended and self.state is _State.PASSING:
            self._next()

    def _hold(self, data: bytes) -> None:
        """What came after the request in flight, kept until it is answered."""
        self.buf += data
        if len(self.buf) > self.guard.limits.max_head_bytes:
            self._pause()  # a pipelining client waits for its answers

    # ------------------------------------------------------------ the guard's routes

    def _start_call(self, head: Head, route: Route) -> None:
        self.state = _State.COLLECTING
        self.left = head.body
        self.route = route
        held, self.buf = bytes(self.buf), bytearray()
        if len(held) - head.size < self.left:
            self._arm(self.guard.limits.body_timeout_s, self._body_timed_out)
        self._collect(held[head.size :])

    def _collect(self, data: bytes) -> None:
        """COLLECTING: keep what belongs to the body, hold the rest; once the body is
        whole, call the route."""
        taken = min(len(data), self.left)
        self.left -= taken
        self.body += data if taken == len(data) else data[:taken]
        if taken < len(data):
            self._hold(data[taken:])
        if self.left:
            return
        self._disarm()
        head, guard = cast(Head, self.head), self.guard
        path, query = head.path, head.query
        call = Call(
            head.method,
            path,
            query,
            bytes(self.body),
            guard.deadline(head.method, path, query, self.arrived),
        )
        self.body = bytearray()
        self.state = _State.CALLING
        guard.track(self._loop().create_task(self._answer(cast(Route, self.route), call, head)))

    async def _answer(self, route: Route, call: Call, head: Head) -> None:
        """Run the route, write its reply, then go on to the next request (if the
        connection goes on)."""
        guard = self.guard
        try:
            reply = await route(call)
        except asyncio.CancelledError:
            self._settle()
            self._abort()
            raise
        except Exception:
            log.exception(
                "request handler failed", extra=logs.fields(method=call.method, path=call.path)
            )
            message = f"{call.method} {call.path}: the server failed to answer"
            reply = Reply(500, status_body(500, "InternalError", message), close=True)
        if self.state is _State.CLOSED or self.transport is None or self.transport.is_closing():
            self._settle()
            if not self.cut_off:
                guard.went_away(call.method, call.path, self._peer())
            return
        keep_alive = head.keep_alive and not reply.close and not guard.draining
        self._write(response_bytes(reply, keep_alive=keep_alive))
        self._settle()
        if not keep_alive:
            self._close()
            return
        self._next()
        if self.state is _State.HEAD and not self.buf:
            idle_s = guard.limits.idle_timeout_s
            self.idle = self._loop().call_later(idle_s, self._idle_timed_out)

    def _wake(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None

    def _idle_timed_out(self) -> None:
        self.idle = None
        if self.state is _State.HEAD and not self.buf:
            self._close()

    def _peer(self) -> object:
        return None if self.transport is None else self.transport.get_extra_info("peername")

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
            guard.leave()
        if self.reserved:
            reserved, self.reserved = self.reserved, 0
            guard.release(reserved)

    # ------------------------------------------------------------ refusals

    def _refuse(self, head: Head, reason: str) -> None:
        """Answer here; keep the connection if the body is small enough to drop."""
        guard = self.guard
        guard.count(reason)
        here = len(self.buf) - head.size
        if head.framed and head.keep_alive and head.body - here <= guard.limits.skip_body_bytes:
            answer = guard.refusal(reason, close=False)
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
        self._write(guard.refusal(reason, close=True))
        self._close()

    def _skipped(self) -> None:
        self._disarm()
        self.state = _State.HEAD
        answer, self.answer = self.answer, b""
        self._write(answer)

    def _refuse_and_close(self, reason: str) -> None:
        self.guard.count(reason)
        self._write(self.guard.refusal(reason, close=True))
        self._close()

    def _wait_for_budget(self) -> None:
        self.state = _State.WAITING
        self.guard.wait(self)
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
        self.guard.stop_waiting(self)
        self.state = _State.HEAD
        self._resume()
        self._refuse(cast(Head, self.head), "body_budget")
        self._read_heads()

    # ------------------------------------------------------------ timers

    def _loop(self) -> asyncio.AbstractEventLoop:
        return self.loop if self.loop is not None else asyncio.get_running_loop()

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer = self._loop().call_later(delay, callback)

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
        if self.state not in (_State.PASSING, _State.SKIPPING, _State.OPAQUE, _State.COLLECTING):
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
        self.body.clear()
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self.state = _State.CLOSED
        self._disarm()
        self.buf.clear()
        self.body.clear()
        if self.transport is not None:
            self.transport.abort()
