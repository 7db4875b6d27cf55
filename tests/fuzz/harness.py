"""What every fuzz property shares: hypothesis settings, a server on a real socket, a
blocking client with a per-request time bound, the tally the closing summary prints, and
the process's resident memory.

Layer: I/O, tests only (threads, sockets, ``/proc``). Each server runs in a thread of
its own with its own event loop, apart from the client: a handler that held its loop
for seconds would not hold the client's socket timeout, which still fires and says so
(Python hands the interpreter between threads every few milliseconds). Says nothing
about what the answers must be: each property asserts that itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import gc
import http.client
import os
import resource
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pytest
from aiohttp import web
from hypothesis import HealthCheck, settings

from cluster import jsonio
from cluster.clock import SystemClock
from server import serving

T = TypeVar("T")

# ---------------------------------------------------------------- hypothesis settings

EXAMPLES_ENV: Final = "TESSERA_FUZZ_EXAMPLES"
"""Set to a number of inputs per property for a longer run (the ``fuzz-long`` profile)."""
DEFAULT_EXAMPLES: Final = 300

_COMMON: Final[dict[str, Any]] = {
    "deadline": None,  # the time bound is the client's, per request, below
    "suppress_health_check": (
        HealthCheck.too_slow,  # a body of megabytes takes a while to build
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ),
    "print_blob": True,  # a failure prints what reproduces it with @reproduce_failure
}
# The default run is part of `make test` and CI: the same inputs every time, so that it
# fails only when the servers change. The long run explores: new inputs each time (or
# those of `--hypothesis-seed=N`), and failures kept in .hypothesis/ are tried first.
settings.register_profile("fuzz", max_examples=DEFAULT_EXAMPLES, derandomize=True, **_COMMON)
settings.register_profile(
    "fuzz-long", max_examples=int(os.environ.get(EXAMPLES_ENV) or 5_000), **_COMMON
)


def profile(share: float = 1.0) -> settings:
    """The settings of every property: ``fuzz``, or ``fuzz-long`` when the environment
    asks for a number of inputs per property; ``share`` of its inputs for a property
    whose inputs are megabytes each. Applied per property, not loaded for the session,
    so that the other layers' hypothesis tests keep their own."""
    chosen = settings.get_profile("fuzz-long" if os.environ.get(EXAMPLES_ENV) else "fuzz")
    return settings(chosen, max_examples=max(1, int(chosen.max_examples * share)))


# ---------------------------------------------------------------- the tally


@dataclass(slots=True)
class Tally:
    """What one property sent and how it went."""

    name: str
    expected_to_fail: bool = False
    """The property is marked xfail: a defect another branch fixes."""
    inputs: int = 0
    failures: int = 0
    max_ms: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)
    rss_growth_mib: float | None = None

    def send(
        self,
        client: Client,
        path: str,
        body: bytes,
        check: Callable[[Answer], None],
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """POST ``body`` to ``path`` and hold the answer to the properties every answer
        has (an answer, within the time bound, never a 5xx), then to ``check``."""
        self.inputs += 1
        try:
            answer = client.post(path, body, headers)
            self.max_ms = max(self.max_ms, answer.ms)
            self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
            if answer.ms > REQUEST_TIMEOUT_S * 1000:
                raise Failure(f"answered in {answer.ms:.0f} ms, over {REQUEST_TIMEOUT_S} s")
            if not (answer.status == 200 or 400 <= answer.status < 500):
                raise Failure(f"HTTP {answer.status}: {answer.body[:500]!r}")
            check(answer)
        except AssertionError:
            self.failures += 1
            raise
        return answer

    def line(self) -> str:
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        memory = "" if self.rss_growth_mib is None else f", RSS {self.rss_growth_mib:+.1f} MiB"
        expected = " (expected: xfail)" if self.expected_to_fail else ""
        return (
            f"fuzz {self.name}: {self.inputs} inputs, {self.failures} failures{expected}, "
            f"max {self.max_ms:.0f} ms ({counts}){memory}"
        )


TALLIES: list[Tally] = []
"""Every property's tally in this session, in order, for the closing summary."""


def tally(name: str, *, expected_to_fail: bool = False) -> Tally:
    found = Tally(name, expected_to_fail)
    TALLIES.append(found)
    return found


# ---------------------------------------------------------------- memory


MEMORY_BOUND_MIB: Final = 128
"""How much a server module's whole run may grow the process. What the servers keep on
purpose is bounded: the webhook's memo (1,024 answers, patches of at most 8 KiB: about
40 MiB), the extender's recent pods (10,000 of about 2 KiB: about 20 MiB) and its
per-node memos (a few shapes per node of the golden cluster: little); the rest is what
stays fragmented after the largest inputs come and go. A run of 1,000 inputs per
property grew less than half of it."""


def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, where there is one."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM: Final = _trim()


def rss_mib() -> float:
    """This process's resident memory now, after a full collection and with what the C
    allocator kept of freed memory given back: megabyte bodies come and go, and without
    it the allocator's high-water mark, not what is alive, would show (hypothesis, in the
    same process, holds hundreds of megabytes while a property runs and frees them)."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    with open("/proc/self/statm", "rb") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / (1024 * 1024)


# ---------------------------------------------------------------- one answer


REQUEST_TIMEOUT_S: Final = 2.0
"""The bound on one answer: kube-apiserver's webhook timeout is 10 s at most and the
captures ask for 5 s; kube-scheduler's extender httpTimeout defaults to 30 s. Every
input here is small enough to be answered in milliseconds on the shared machine."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    ms: float

    def json(self) -> Any:
        return jsonio.loads(self.body)


class Failure(AssertionError):
    """An answer broke a property: the message says which and shows the answer."""


class Client:
    """HTTP/1.1 over one kept-alive connection, as kube-apiserver and kube-scheduler
    call; a new connection after the server closes one. Any error but an answer
    (a timeout, a reset, a closed socket) is a ``Failure``."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self._host, self._port, self._tls = host, port, tls
        self._clock = SystemClock()
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._tls is not None:
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=REQUEST_TIMEOUT_S, context=self._tls
                )
            else:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=REQUEST_TIMEOUT_S
                )
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        sent = {"Content-Type": "application/json", **(headers or {})}
        start = self._clock.monotonic()
        connection = self._connect()
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            elapsed = (self._clock.monotonic() - start) * 1000
            raise Failure(
                f"{method} {path} got no answer after {elapsed:.0f} ms: {exc!r}"
            ) from None
        if response.will_close:
            self.close()
        return Answer(response.status, data, (self._clock.monotonic() - start) * 1000)

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        return self.request("POST", path, body, headers)

    def get(self, path: str) -> Answer:
        return self.request("GET", path)


FUZZ_MARKS: Final = [
    pytest.mark.fuzz,
    # a failing body of megabytes is still worth reporting
    pytest.mark.filterwarnings(
        "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
    ),
]
"""What every fuzz module is marked with (its ``pytestmark``)."""


# ---------------------------------------------------------------- a server in a thread


class ServedApp:
    """An aiohttp app made and served on a loopback port by a thread of its own."""

    def __init__(
        self, make_app: Callable[[], web.Application], tls: ssl.SSLContext | None = None
    ) -> None:
        self._make_app, self._tls = make_app, tls
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzzed server")
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def app(self) -> web.Application:
        assert self._runner is not None
        return self._runner.app

    def __enter__(self) -> ServedApp:
        self._thread.start()
        self.port = self.wait(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.wait(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> int:
        # access_log=None: as ``server.serving.serve`` runs the servers
        self._runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._tls)
        await site.start()
        port: int = self._runner.addresses[0][1]
        return port

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def metrics(self) -> bytes:
        """The app's Prometheus text, as its metrics listener (never the serving port,
        which answers 404 for ``/metrics``) serves it, read on the server's loop."""
        return self.read(self.app[serving.EXPOSITION])

    def wait(self, work: Awaitable[T], timeout_s: float = 30.0) -> T:
        """Run ``work`` on the server's loop and wait for its result."""

        async def run() -> T:
            return await work

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(timeout_s)

    def read(self, what: Callable[[], T]) -> T:
        """``what()`` run on the server's loop, between two of its steps (a snapshot of
        its state, as a handler would take it)."""

        async def run() -> T:
            return what()

        return self.wait(run())


@contextlib.contextmanager
def measured(name: str, *, expected_to_fail: bool = False) -> Iterator[Tally]:
    """A property's tally, with the process's resident memory before and after."""
    found = tally(name, expected_to_fail=expected_to_fail)
    before = rss_mib()
    yield found
    found.rss_growth_mib = rss_mib() - before


def check_memory(baseline_mib: float) -> None:
    """The process has not grown more than ``MEMORY_BOUND_MIB`` since ``baseline_mib``."""
    grown = rss_mib() - baseline_mib
    assert grown < MEMORY_BOUND_MIB, f"resident memory grew {grown:.0f} MiB in the run"
