"""What both servers do around their own routes: the probes, the metrics page, serving
until SIGTERM, and the process's exit code.

Layer: I/O (sockets, signals, stderr for the one-line start-up failure). Must not decide
anything, read the environment or hold state between calls: each server's
``create_app`` and ``__main__`` hand in what differs (readiness, exposition, listen
address, TLS, the errors that mean "cannot start").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from itertools import accumulate
from typing import Any

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from cluster import heap, logs
from cluster.tls import CertReloader

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


class MetricChildren:
    """A labelled metric's children by label values, each made once. ``labels()`` costs
    more than the update it leads to (a lock, a look-up by values), and the servers
    update their metrics on every request."""

    __slots__ = ("_made", "_metric")

    def __init__(self, metric: MetricWrapperBase) -> None:
        self._metric = metric
        self._made: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child


def add_probes(
    app: web.Application,
    *,
    ready: Callable[[], bool],
    not_ready: str | Callable[[], str],
    exposition: Callable[[], bytes],
) -> None:
    """``GET /healthz`` (the process answers), ``/readyz`` (503 with ``not_ready``, or
    what ``not_ready()`` says at that moment, until ``ready()``) and ``/metrics``
    (Prometheus text from ``exposition()``)."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        reason = not_ready if isinstance(not_ready, str) else not_ready()
        return web.Response(status=NOT_READY, text=reason)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


async def serve(
    app: web.Application,
    host: str,
    port: int,
    reloader: CertReloader | None,
    describe: Mapping[str, object],
) -> None:
    """Serve ``app`` (over TLS when ``reloader`` is given, its certificates reloaded as
    they change) until SIGTERM, then finish the requests under way and return."""
    # What is loaded by now (a cluster file, imported modules) lives as long as the
    # process, and the caches' objects survive many collections: see cluster.heap.
    with heap.short_pauses(record=app.get(GC_PAUSES)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await _serve_until_stopped(runner, host, port, reloader, describe)
        finally:
            await runner.cleanup()


async def _serve_until_stopped(
    runner: web.AppRunner,
    host: str,
    port: int,
    reloader: CertReloader | None,
    describe: Mapping[str, object],
) -> None:
    context = reloader.context if reloader is not None else None
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info(
        "serving", extra=logs.fields(host=host, port=bound, tls=context is not None, **describe)
    )
    stop = asyncio.Event()
    # Kubernetes stops a pod with SIGTERM: answer what is under way, then exit.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        if reloader is not None:
            await stack.enter_async_context(background(reloader.run(), "reload certificates"))
        await stop.wait()
        log.info("stopping")


def run(
    prog: str,
    main: Coroutine[Any, Any, None],
    fatal: tuple[type[BaseException], ...],
) -> int:
    """Run ``main`` on uvloop: 0 when it ends (or on Ctrl-C), 1 with one line on stderr
    for an error in ``fatal`` (a file that cannot be read, a port in use)."""
    try:
        uvloop.run(main)
    except fatal as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
