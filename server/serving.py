"""What both servers do around their own routes: the probes, the metrics page on a port
of its own, the connection guard, serving until SIGTERM and draining, and the process's
exit code.

Layer: I/O (sockets, signals, stderr for the one-line start-up failure). Must not decide
anything, read the environment or hold state between calls: each server's
``create_app`` and ``__main__`` hand in what differs (readiness, exposition, guard,
listen addresses, TLS, the errors that mean "cannot start").

``/metrics`` is never on the serving port. Its names and labels (queues, namespaces,
GPU products, how busy the server is) are for the operator's Prometheus, and the
serving port is open to whoever reaches the Service (the webhook's) or the pod. It is
served in plain HTTP on ``metrics_host:metrics_port`` (0: not at all), as kube-proxy
does and kubebuilder's managers do: loopback by default, the pod's address when the
manifests open it to a scrape. The probes stay on the serving port, where the kubelet
looks. An app may add read-only ``GET`` pages for the same readers there
(``DEBUG_ROUTES``: the extender's ``/debug/reasons``), never anything that writes.

Serving goes through ``running``: aiohttp's runner, with the listening socket made here
so that each connection goes through the app's ``server.guard.ConnectionGuard``. On
SIGTERM the listener closes (no new connection), idle connections are closed, the
requests under way have ``shutdown_grace_s`` to finish (then they are cancelled), and
the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from itertools import accumulate
from typing import Any

import uvloop
from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from cluster import logs
from cluster.clock import Clock, SystemClock
from cluster.echo import echo
from server import compiled, heap
from server.direct import Call, Reply, Route
from server.guard import CANCEL_WAIT_S, DEADLINE, ConnectionGuard, TimeoutOf
from server.serving_settings import Limits, ServingSettings
from server.tls import CertReloader

log = logging.getLogger(__name__)

NOT_READY = 503


@contextlib.asynccontextmanager
async def background(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """Run ``work`` as a task for as long as the block lasts, then cancel it. A task that
    ends with an error on its own is logged at once: a watch that died must not go
    unnoticed until the pod is restarted."""
    task = asyncio.create_task(work, name=name)
    task.add_done_callback(_report_end)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _report_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "background task ended",
            exc_info=task.exception(),
            extra=logs.fields(task=task.get_name()),
        )


class GcPauses(Collector):
    """The garbage collector's pauses, as a histogram by generation in a server's
    registry: a full collection holds every request, so an operator should see it.

    Counted in plain lists and turned into a histogram when scraped: the counting runs
    inside the collector's callback, where taking a metric's lock could wait on the
    very code the collection interrupted.
    """

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
    GENERATIONS = 3

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.name = f"{prefix}_gc_pause_seconds"
        # per generation: one count per bucket (not cumulative), +Inf last
        self._counts = [[0] * (len(self.BUCKETS) + 1) for _ in range(self.GENERATIONS)]
        self._sums = [0.0] * self.GENERATIONS
        registry.register(self)

    def __call__(self, generation: int, seconds: float) -> None:
        self._counts[generation][bisect_left(self.BUCKETS, seconds)] += 1
        self._sums[generation] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.name,
            "Time each garbage collection held the process, by generation (2: full).",
            labels=("generation",),
        )
        bounds = [*map(str, self.BUCKETS), "+Inf"]
        for generation, counts in enumerate(self._counts):
            family.add_metric(
                (str(generation),),
                list(zip(bounds, accumulate(counts), strict=True)),
                self._sums[generation],
            )
        yield family


GC_PAUSES = web.AppKey("gc_pauses", GcPauses)
"""Where ``serve`` reports the collector's pauses, when the app has it."""


GUARD = web.AppKey("guard", ConnectionGuard)
"""The app's connection guard (``guard_app``); ``running`` wraps its connections."""
EXPOSITION: web.AppKey[Callable[[], bytes]] = web.AppKey("exposition")
"""The app's Prometheus text, for the metrics listener."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DEBUG_ROUTES: web.AppKey[Mapping[str, Handler]] = web.AppKey("debug_routes")
"""Read-only ``GET`` pages the app adds to its metrics listener, by path (the
extender's ``/debug/reasons``): for the same operators as ``/metrics``, never on the
serving port."""


def guard_app(
    app: web.Application,
    *,
    limits: Limits,
    clock: Clock,
    timeout_of: TimeoutOf,
    registry: CollectorRegistry,
    prefix: str,
) -> ConnectionGuard:
    """Give ``app`` its connection guard (counted in ``registry`` under ``prefix``)."""
    guard = ConnectionGuard(limits, clock, timeout_of, registry=registry, prefix=prefix)
    app[GUARD] = guard
    app.middlewares.append(guard.middleware)
    return guard


def add_probes(
    app: web.Application,
    *,
    ready: Callable[[], bool],
    not_ready: str | Callable[[], str],
    exposition: Callable[[], bytes],
) -> None:
    """``GET /healthz`` (the process answers) and ``/readyz`` (503 with ``not_ready``, or
    what ``not_ready()`` says at that moment, until ``ready()``); ``exposition`` is kept
    for the metrics listener."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        reason = not_ready if isinstance(not_ready, str) else not_ready()
        return web.Response(status=NOT_READY, text=reason)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app[EXPOSITION] = exposition


class BodyRefused(Exception):
    """A request body the handler does not read to the end; ``reason`` says why, for the
    400 each server writes in its own wire shape; with ``close``, the rest of the stream
    cannot be read, so the answer must close the connection."""

    def __init__(self, reason: str, *, close: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.close = close


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole request body, inflated as its Content-Encoding says, or ``BodyRefused``.

    The guard's body deadline ends a body whose bytes stop coming; this one also ends a
    read that aiohttp never finishes although every byte came (a deflate stream cut short
    inside its last chunk: the inflater waits for an end that will not come), which would
    otherwise hold a slot of ``--max-in-flight`` for good."""
    length = request.content_length
    if length is not None and length > limit:
        raise BodyRefused(f"request body of {length} bytes exceeds {limit}", close=False)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyRefused(f"request body exceeds {limit} bytes", close=False) from None
    except web.RequestPayloadError:
        encoding = echo(request.headers.get(hdrs.CONTENT_ENCODING, "identity"), quote=False)
        reason = f"request body cannot be read as {encoding}"
    except TimeoutError:
        reason = f"request body not read to its end within {timeout_s:g} s"
    # nothing more is read: aiohttp would drain the rest and log the same error
    request.content.feed_eof()
    raise BodyRefused(reason, close=True)


def add_route(
    app: web.Application,
    method: str,
    path: str,
    route: Route,
    *,
    refused: Callable[[str], Reply],
) -> None:
    """Serve ``method path`` by ``route``: on the connection, by the app's guard, for
    the requests it frames strictly (``server.direct``); through aiohttp for the others,
    whose body ``read_body`` reads within the guard's limits (one it refuses is answered
    ``refused(reason)``)."""
    guard = app[GUARD]
    guard.route(method, path, route)
    limit, body_timeout_s = guard.limits.max_body_bytes, guard.limits.body_timeout_s

    async def through_aiohttp(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, limit, body_timeout_s)
        except BodyRefused as exc:
            reply = refused(exc.reason)
            close = exc.close
        else:
            deadline = request.get(DEADLINE)
            call = Call(request.method, request.path, request.query_string, body, deadline)
            reply = await route(call)
            close = reply.close
        response = web.Response(
            status=reply.status, body=reply.body, content_type=reply.content_type
        )
        if close:
            response.force_close()
        return response

    app.router.add_route(method, path, through_aiohttp)


def metrics_app(
    exposition: Callable[[], bytes], clock: Clock, debug: Mapping[str, Handler] | None = None
) -> web.Application:
    """``GET /metrics`` (Prometheus text from ``exposition()``) and the ``debug`` pages,
    nothing else, guarded too."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    for path, handler in (debug or {}).items():
        app.router.add_get(path, handler)
    app[GUARD] = ConnectionGuard(Limits(max_in_flight=8), clock, lambda method, path, query: None)
    app.middlewares.append(app[GUARD].middleware)
    return app


@contextlib.asynccontextmanager
async def listening(
    runner: web.BaseRunner,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    guard: ConnectionGuard | None,
) -> AsyncIterator[int]:
    """A listening socket for ``runner``'s server, each connection through ``guard``;
    the port it got (``port`` 0: any free one). Closing it stops new connections only:
    the runner's cleanup ends the open ones."""
    server = runner.server
    if server is None:
        raise RuntimeError("the runner is not set up")
    factory: Callable[[], asyncio.BaseProtocol] = server
    handshake = None
    if guard is not None:
        factory = guard.protocol_factory(server)
        handshake = guard.limits.header_timeout_s if ssl_context is not None else None
    listener = await asyncio.get_running_loop().create_server(
        factory, host, port, ssl=ssl_context, ssl_handshake_timeout=handshake
    )
    try:
        yield listener.sockets[0].getsockname()[1]
    finally:
        listener.close()


@contextlib.asynccontextmanager
async def running(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    *,
    shutdown_grace_s: float = 10.0,
) -> AsyncIterator[int]:
    """``app`` served on ``host:port`` (guarded when it has a ``GUARD``) for the block;
    the port. At the end: no new connections, idle ones closed, the requests under way
    given ``shutdown_grace_s`` to finish (``ConnectionGuard.drain``), those still under
    way then cancelled, and the app's cleanup."""
    guard = app.get(GUARD)
    # aiohttp's own wait is for an unguarded app; a guarded one has drained by then
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_grace_s if guard is None else CANCEL_WAIT_S,
    )
    await runner.setup()
    try:
        async with listening(runner, host, port, ssl_context, guard) as bound:
            yield bound
    finally:
        if guard is not None:
            left = await guard.drain(shutdown_grace_s)
            if left:
                log.warning(
                    "requests still under way after the shutdown grace: cancelled",
                    extra=logs.fields(requests=left, grace_s=shutdown_grace_s),
                )
        await runner.cleanup()


async def serve(
    app: web.Application,
    host: str,
    port: int,
    reloader: CertReloader | None,
    describe: Mapping[str, object],
    *,
    settings: ServingSettings,
) -> None:
    """Serve ``app`` (over TLS when ``reloader`` is given, its certificates reloaded as
    they change) and its metrics (when ``settings.metrics_port`` is set) until SIGTERM,
    then drain (``running``) and return."""
    # What is loaded by now (a cluster file, imported modules) lives as long as the
    # process, and the caches' objects survive many collections: see server.heap.
    with heap.short_pauses(record=app.get(GC_PAUSES)):
        context = reloader.context if reloader is not None else None
        guard = app.get(GUARD)
        clock = guard.clock if guard is not None else SystemClock()
        async with contextlib.AsyncExitStack() as stack:
            bound = await stack.enter_async_context(
                running(app, host, port, context, shutdown_grace_s=settings.shutdown_grace_s)
            )
            fields: dict[str, object] = {"host": host, "port": bound, "tls": context is not None}
            if settings.metrics_port:
                exposition = app[EXPOSITION]
                metrics_port = await stack.enter_async_context(
                    running(
                        metrics_app(exposition, clock, app.get(DEBUG_ROUTES)),
                        settings.metrics_host,
                        settings.metrics_port,
                        shutdown_grace_s=0,
                    )
                )
                fields["metrics"] = f"{settings.metrics_host}:{metrics_port}"
            log.info("serving", extra=logs.fields(**fields, **describe))
            await _until_sigterm(reloader)
            log.info(
                "stopping",
                extra=logs.fields(
                    in_flight=guard.in_flight if guard is not None else 0,
                    grace_s=settings.shutdown_grace_s,
                ),
            )
        log.info("stopped")


async def _until_sigterm(reloader: CertReloader | None) -> None:
    stop = asyncio.Event()
    # Kubernetes stops a pod with SIGTERM: answer what is under way, then exit.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        if reloader is not None:
            await stack.enter_async_context(background(reloader.run(), "reload certificates"))
        await stop.wait()


def run(
    prog: str,
    main: Coroutine[Any, Any, None],
    fatal: tuple[type[BaseException], ...],
) -> int:
    """Run ``main`` on uvloop: 0 when it ends (or on Ctrl-C), 1 with one line on stderr
    for an error in ``fatal`` (a file that cannot be read, a port in use), or for a
    compiled module older than its source (``server.compiled``)."""
    edited = compiled.stale()
    if edited:
        main.close()
        print(f"{prog}: {compiled.stale_message(edited)}", file=sys.stderr)
        return 1
    try:
        uvloop.run(main)
    except fatal as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
