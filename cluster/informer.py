"""List-then-watch of one Kubernetes collection, delivered to callbacks.

Layer: I/O. Keeps a consumer (the cache) equal to kube-apiserver's view of one resource
path: a full list, then a watch from the list's resourceVersion with bookmarks; a re-watch
from the last seen resourceVersion when the stream ends or breaks; a fresh list when that
resourceVersion is gone (410). Must not interpret the objects it carries (that is
``cluster.convert``'s job) and must not hold state beyond the resourceVersion and when the
server was last heard; must not import kubernetes_asyncio (the client is ``cluster.kube``).
Sleeps, randomness and the clock are injected so tests are fast and deterministic.

How fresh the consumer's copy is (``age_s``) is the time since kube-apiserver was last
heard on this informer: a list, any watch event or bookmark, or a watch the server ended
after running its course. An open watch proves nothing by itself (a partitioned
connection stays open and silent), so a quiet but healthy watch has to end often enough
to prove the server is there: ``watch_timeout_s`` is the ``timeoutSeconds`` asked for,
and kube-apiserver also sends a bookmark 2 s before it (``cacheWatcher.nextBookmarkTime``).
A failed attempt is a WARNING naming the resource and the age, one per backoff step; the
first sign of the server after failures is an INFO line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol

from cluster import logs
from cluster.clock import Clock, SystemClock
from cluster.kube import (
    LIST_PAGE_SIZE,
    ApiError,
    JsonObject,
    JsonObjects,
    KubeError,
    Params,
    WatchEvent,
)

log = logging.getLogger(__name__)

OnReplace = Callable[[JsonObjects], None]
"""Called with every item after each (re)list: the consumer replaces its whole state."""
OnEvent = Callable[[str, JsonObject], None]
"""Called with ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object."""
Sleep = Callable[[float], Awaitable[None]]

EVENT_TYPES: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})
SHORT_WATCH_S: Final = 1.0
"""A watch that ends sooner than this with no events is treated as a failure."""


class ListWatchClient(Protocol):
    """What the informer needs from ``cluster.kube.KubeClient``."""

    async def list(
        self,
        path: str,
        params: Params | None = None,
        *,
        page_size: int = LIST_PAGE_SIZE,
        metadata_only: bool = False,
    ) -> tuple[JsonObjects, str]: ...

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_s: int,
        *,
        allow_bookmarks: bool = True,
        params: Params | None = None,
        metadata_only: bool = False,
    ) -> AsyncGenerator[WatchEvent, None]: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential delays with jitter that only shortens a delay.

    Delay ``n`` (from 0) is ``min(cap_s, initial_s * factor**n)`` scaled by a random factor
    in ``[1 - jitter, 1]``: spread out so that many informers do not retry in step, never
    above the cap, and still growing while ``factor * (1 - jitter) >= 1``.
    """

    initial_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 30.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.cap_s < self.initial_s or self.factor < 1:
            raise ValueError(f"backoff needs 0 < initial <= cap and factor >= 1: {self}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1): {self.jitter}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        # Capping the exponent first keeps factor**attempt finite however long it fails.
        base = self.cap_s
        if attempt < 64:
            base = min(self.cap_s, self.initial_s * self.factor**attempt)
        return base * (1.0 - self.jitter * rng.random())


class Informer:
    """Feeds ``on_replace``/``on_event`` from one resource path until stopped.

    ``path`` is a collection (``/api/v1/nodes``, ``/api/v1/pods``); ``field_selector`` and
    ``label_selector`` narrow it; ``metadata_only`` asks for each object's metadata alone,
    for a consumer that reads nothing else (a list of many large objects then costs
    little memory while it is read). The callbacks run on the event loop between awaits and
    must not block. An exception from a callback is logged and answered with a relist,
    since the consumer's state can no longer be trusted.
    """

    def __init__(
        self,
        client: ListWatchClient,
        path: str,
        *,
        on_replace: OnReplace,
        on_event: OnEvent,
        field_selector: str | None = None,
        label_selector: str | None = None,
        metadata_only: bool = False,
        page_size: int = LIST_PAGE_SIZE,
        watch_timeout_s: int = 300,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._path = path
        self._on_replace = on_replace
        self._on_event = on_event
        params: dict[str, str] = {}
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        self._params: Params = params
        self._metadata_only = metadata_only
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff or Backoff()
        # Jitter only: not security-sensitive randomness.
        self._rng = rng or random.Random()  # noqa: S311
        self._sleep = sleep
        self._clock = clock or SystemClock()
        self._heard_at = self._clock.monotonic()
        self._failing = False
        self._progressed = False
        self._synced = asyncio.Event()
        self._stopped = asyncio.Event()
        self._resource_version = ""
        self._lists = 0

    @property
    def path(self) -> str:
        return self._path

    @property
    def resource(self) -> str:
        """The collection's resource name (``nodes``, ``pods``): a bounded metric label."""
        return self._path.rsplit("/", 1)[-1]

    def age_s(self) -> float:
        """Seconds since kube-apiserver was last heard on this informer (since the
        informer was made, before it ever was)."""
        return self._clock.monotonic() - self._heard_at

    @property
    def synced(self) -> bool:
        """True once the first full list has been delivered; a later relist keeps it."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen (from a list, an event or a bookmark)."""
        return self._resource_version

    @property
    def lists(self) -> int:
        """How many full lists have been delivered: 1 plus the relists."""
        return self._lists

    def stop(self) -> None:
        """Make ``run`` return: at once if it is waiting, else at its next await."""
        self._stopped.set()

    async def run(self) -> None:
        """List and watch until ``stop()`` or cancellation; never returns on errors."""
        if self._stopped.is_set():
            return
        loop = asyncio.create_task(self._loop(), name=f"informer {self._path}")
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({loop, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.cancel()
            stopped.cancel()
            # Wait for the watch to close its connection before returning.
            await asyncio.gather(loop, stopped, return_exceptions=True)
        failure = None if loop.cancelled() else loop.exception()
        if failure is not None:
            raise failure

    async def _loop(self) -> None:
        need_list = True
        failures = 0
        relisted_for_gone = False
        while True:
            self._progressed = False
            try:
                if need_list:
                    await self._list()
                    need_list = False
                started = self._clock.monotonic()
                await self._watch()
                if self._progressed or self._clock.monotonic() - started >= SHORT_WATCH_S:
                    # the server ended it as asked (timeoutSeconds): it is there
                    self._heard()
                    log.debug(
                        "informer rewatch",
                        extra=logs.fields(path=self._path, resource_version=self._resource_version),
                    )
                    failures = 0
                    relisted_for_gone = False
                    continue
                # Closed at once with nothing in it: a proxy or a sick server, not a
                # timeout. Reconnecting at once would spin.
                reason = "watch closed at once with no events"
            except ApiError as exc:
                if self._progressed:
                    failures = 0
                    relisted_for_gone = False
                if exc.gone:
                    need_list = True
                    # A 410 is routine (the watch fell behind): relist at once, unless
                    # the last relist for a 410 was followed by another with no progress.
                    if not relisted_for_gone:
                        relisted_for_gone = True
                        log.info(
                            "informer relist",
                            extra=logs.fields(
                                path=self._path,
                                reason=f"resourceVersion gone: {exc}",
                                resource_version=self._resource_version,
                            ),
                        )
                        continue
                    reason = f"resourceVersion gone again: {exc}"
                else:
                    reason = f"api error: {exc}"
            except KubeError as exc:
                if self._progressed:
                    failures = 0
                    relisted_for_gone = False
                reason = f"connection: {exc}"
            except CallbackError as exc:
                need_list = True
                log.exception(
                    "informer callback failed",
                    extra=logs.fields(path=self._path, callback=exc.callback),
                )
                reason = f"callback {exc.callback} failed"
            delay = self._backoff.delay(failures, self._rng)
            failures += 1
            self._failing = True
            log.warning(
                "informer relist" if need_list else "informer rewatch",
                extra=logs.fields(
                    path=self._path,
                    resource=self.resource,
                    reason=reason,
                    age_s=round(self.age_s(), 3),
                    attempt=failures,
                    delay_s=round(delay, 3),
                    resource_version=self._resource_version,
                ),
            )
            await self._sleep(delay)

    async def _list(self) -> None:
        items, resource_version = await self._client.list(
            self._path, self._params, page_size=self._page_size, metadata_only=self._metadata_only
        )
        try:
            self._on_replace(items)
        except Exception as exc:
            raise CallbackError("on_replace") from exc
        self._resource_version = resource_version
        self._lists += 1
        self._heard()
        self._synced.set()
        log.info(
            "informer listed",
            extra=logs.fields(path=self._path, items=len(items), resource_version=resource_version),
        )

    async def _watch(self) -> None:
        """Deliver one watch's events; ``_progressed`` says whether it carried any."""
        # Spread the watches' ends over [t, 2t) so informers do not reconnect in step.
        timeout_s = int(self._watch_timeout_s * (1.0 + self._rng.random()))
        events = self._client.watch(
            self._path,
            self._resource_version,
            timeout_s,
            allow_bookmarks=True,
            params=self._params,
            metadata_only=self._metadata_only,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                self._progressed = True
                self._heard()
                if event.type in EVENT_TYPES:
                    try:
                        self._on_event(event.type, event.object)
                    except Exception as exc:
                        raise CallbackError("on_event") from exc
                elif event.type != "BOOKMARK":
                    log.warning(
                        "informer ignored an unknown watch event",
                        extra=logs.fields(path=self._path, type=event.type),
                    )
                    continue
                resource_version = event.resource_version
                if resource_version:
                    self._resource_version = resource_version

    def _heard(self) -> None:
        """kube-apiserver spoke on this informer just now."""
        now = self._clock.monotonic()
        if self._failing:
            self._failing = False
            log.info(
                "informer recovered",
                extra=logs.fields(
                    path=self._path,
                    resource=self.resource,
                    age_s=round(now - self._heard_at, 3),
                    resource_version=self._resource_version,
                ),
            )
        self._heard_at = now


class CallbackError(Exception):
    """A consumer callback raised; the informer relists rather than die."""

    def __init__(self, callback: str) -> None:
        super().__init__(callback)
        self.callback = callback
