"""The extender's aiohttp application: routes, wiring, lifecycle.

Layer: ROOT. ``create_app(settings, ...)`` builds everything into typed app keys. The
handlers read the body, take one ``cache.snapshot()``, call a pure ``extender.verbs``
function with no ``await`` in between, and write its answer. Must not read the
environment (``__main__`` does) or hold module-level state.

``/bind`` is the one handler that awaits in the middle, so its order matters: the GPUs
are chosen on the snapshot (``verbs.plan_bind``) and assumed in the cache before the
first ``await`` (``binding.Binds``, which then runs the binder). The next ``/filter``
(kube-scheduler sends it before the bind is answered, see the captures) already counts
them, and two binds can never both take one GPU: the second one's snapshot has the
first one's assumption in it.

Every verb's deadline is kube-scheduler's ``httpTimeout`` (``request_timeout_s``) from
its request's first byte (``server.guard``): a request that is already too late once
its body is read is answered 504 without a decision, since kube-scheduler has given up
on it. For ``/bind`` that check comes before anything is planned or assumed, so a bind
is refused whole or carried out whole, never dropped half done; kube-scheduler retries
a refused one.

A cache is only as good as its watches. ``Source`` knows how long ago kube-apiserver
was last heard on each (``Informer.age_s``); past ``--max-cache-age`` the cache is stale:
``/readyz`` answers 503 naming the watch, and no verb decides from it (``verbs.stale_reply``:
filter and bind answer ``Error``, which kube-scheduler retries; prioritize and preempt 503).
The ages are on the metrics listener as ``tessera_extender_cache_age_seconds``. A request
already too late is shed before the cache is looked at: nobody reads its answer, stale
or not.

Reservations (``extender.reserving``): a ``/filter`` of a gang member that fits nowhere
asks the background planner for a plan; its promises reach the filters through the
cache's next snapshot, and a ``/bind`` on a node reserved for another gang is counted
as backfilled.

With ``pod_mix=learned`` a background task counts the cache's pods into the pod mix
(``learning.relearn_pod_mix``): before the first request when a cluster file is loaded,
right after the informers have listed, then every interval. Otherwise the gang shapes
the cluster's pods show are made ahead once (``learning.prepare_gang_shapes``), at the
same moments.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from aiohttp import web

from cluster import jsonio, logs
from cluster.cache import ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.echo import echo
from cluster.feed import CacheFeed, run_all
from cluster.informer import Informer
from cluster.kube import KubeClient, KubeConfig
from cluster.snapshot import Snapshot
from extender import verbs, wire
from extender.binder import ApiBinder, Binder, MemoryBinder
from extender.binding import Binds
from extender.config import ExtenderConfig
from extender.explain import Tallies
from extender.flavors import Flavors
from extender.learning import LiveConfig, prepare_gang_shapes, relearn_pod_mix
from extender.memo import DecisionCache
from extender.metrics import ExtenderMetrics
from extender.reasons import PODS_PER_QUERY, ReasonStore
from extender.reserving import LeaseHolds, Reserver, backfilled
from extender.settings import ExtenderSettings
from server import serving
from server.direct import Call, Reply, Route
from server.guard import ConnectionGuard

log = logging.getLogger(__name__)

NOT_READY = serving.NOT_READY


class Source:
    """Where the cache's content comes from, whether it is complete yet, and how long
    ago kube-apiserver was last heard on each watch."""

    def __init__(self, max_age_s: float = 0.0) -> None:
        self.loaded = False
        """Standalone mode: the cluster file is in the cache."""
        self.informers: Sequence[Informer] = ()
        self.max_age_s = max_age_s
        """The staleness limit (``--max-cache-age``); 0: none."""

    @property
    def synced(self) -> bool:
        if self.loaded:
            return True
        return bool(self.informers) and all(i.synced for i in self.informers)

    def ages(self) -> dict[str, float]:
        """Seconds since each watch last heard from kube-apiserver, by resource (none
        for a cluster file: nothing there can go stale)."""
        return {informer.resource: informer.age_s() for informer in self.informers}

    def stale(self) -> str:
        """Why the cache must not be decided with now (``""``: it may)."""
        if self.loaded or not self.max_age_s:
            return ""
        return verbs.stale_cache(self.ages(), self.max_age_s)

    def not_ready(self) -> str:
        """What ``/readyz`` says while not ready."""
        if not self.synced:
            return "cluster cache not synced yet"
        return self.stale() or "ready"

    async def wait_synced(self) -> None:
        """Until the cache is complete: at once for a cluster file, else once every
        informer has listed (they are set before the app's background work starts)."""
        if not self.loaded:
            await asyncio.gather(*(informer.wait_synced() for informer in self.informers))


SETTINGS = web.AppKey("settings", ExtenderSettings)
CONFIG = web.AppKey("config", LiveConfig)
CACHE = web.AppKey("cache", ClusterCache)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", ExtenderMetrics)
SOURCE = web.AppKey("source", Source)
BINDS = web.AppKey("binds", Binds)
REASONS = web.AppKey("reasons", ReasonStore)
FLAVORS = web.AppKey("flavors", Flavors)
ENVIRON = web.AppKey("environ", Mapping[str, str])
RESERVER = web.AppKey("reserver", Reserver)


class Handle(Protocol):
    def __call__(
        self,
        body: bytes,
        snapshot: Snapshot,
        config: ExtenderConfig,
        now: datetime,
        *,
        recent: wire.RecentPods | None = None,
        memo: DecisionCache | None = None,
    ) -> verbs.Reply: ...


# ---------------------------------------------------------------- the four verbs


@dataclass(frozen=True, slots=True)
class Verbs:
    """What the verbs' routes read, bound once by ``create_app`` (not looked up in the
    app per request)."""

    clock: Clock
    metrics: ExtenderMetrics
    config: LiveConfig
    cache: ClusterCache
    binds: Binds
    source: Source
    guard: ConnectionGuard
    reasons: ReasonStore
    reserver: Reserver

    def refused(self, verb: str) -> Callable[[str], Reply]:
        """The 400 for a body that cannot be read."""

        def refused(reason: str) -> Reply:
            self.metrics.answered(verb, "bad_request", 0.0)
            return Reply(verbs.BAD_REQUEST, wire.encode_bad_request(reason))

        return refused

    def early(self, call: Call, verb: str) -> tuple[Reply, str] | None:
        """The answer and its metrics result when there is nothing to decide: too late,
        cache not synced, cache stale."""
        late = self.guard.late(call.method, call.path, call.deadline)
        if late is not None:
            return late, "shed"
        if not self.source.synced:
            reason = "the extender's cache is not synced with the cluster yet"
            return Reply(NOT_READY, wire.encode_bad_request(reason)), "not_ready"
        stale = self.source.stale()
        if stale:
            reply = verbs.stale_reply(verb, stale)
            return Reply(reply.status, reply.body), "stale"
        return None

    def deciding(self, verb: str, handle: Handle) -> Route:
        """``/filter``, ``/prioritize`` or ``/preempt``: one snapshot, one pure call."""
        clock, metrics = self.clock, self.metrics

        async def decide(call: Call) -> Reply:
            start = clock.monotonic()
            early = self.early(call, verb)
            if early is not None:
                metrics.answered(verb, early[1], clock.monotonic() - start)
                return early[0]
            began = clock.monotonic()
            memo = self.config.memo
            snapshot = self.cache.snapshot()
            reply = handle(
                call.body, snapshot, memo.config, clock.now(), recent=self.binds.recent, memo=memo
            )
            metrics.decided(verb, clock.monotonic() - began)
            outcome = reply.outcome
            if outcome is not None:
                tallies = Tallies.of(outcome.failed, outcome.unresolvable)
                metrics.filtered(outcome, tallies)
                if reply.pod is not None:
                    self.reasons.record_filter(reply.pod, outcome, tallies)
                    self.reserver.wanted(reply.pod, len(outcome.fits))
            if reply.status == verbs.BAD_REQUEST:
                result = "bad_request"
                log.info("bad request", extra=logs.fields(verb=verb, reason=reply.note))
            else:
                result = "error" if reply.note else "ok"
            metrics.answered(verb, result, clock.monotonic() - start)
            return Reply(reply.status, reply.body)

        return decide

    async def bind(self, call: Call) -> Reply:
        clock, metrics, binds = self.clock, self.metrics, self.binds
        start = clock.monotonic()
        early = self.early(call, "bind")
        if early is not None:
            metrics.answered("bind", early[1], clock.monotonic() - start)
            return early[0]
        # From here to the binder's first await: no await, so no other request runs
        # between the snapshot and the assumption (``binding.Binds``).
        began = clock.monotonic()
        memo = self.config.memo
        snapshot = self.cache.snapshot()
        step = verbs.plan_bind(
            call.body, snapshot, memo.config, clock.now(), seen=binds.recent, memo=memo
        )
        if isinstance(step, verbs.Reply):
            metrics.decided("bind", clock.monotonic() - began)
            result = "bad_request" if step.status == verbs.BAD_REQUEST else "refused"
            if step.note:
                log.info("bind refused", extra=logs.fields(result=result, reason=step.note))
            if step.target is not None:
                self.reasons.record_bind(*step.target, step.note)
            metrics.answered("bind", result, clock.monotonic() - start)
            return Reply(step.status, step.body)
        error = await binds.bind(step, lambda: metrics.decided("bind", clock.monotonic() - began))
        self.reasons.record_bind(step.args.key, step.args.node, error)
        if not error and backfilled(snapshot, step.plan.pod, step.args.node):
            metrics.backfilled.inc()
        metrics.answered("bind", "error" if error else "ok", clock.monotonic() - start)
        return Reply(verbs.OK, verbs.bind_reply(error).body)

    def add_to(self, app: web.Application) -> None:
        """The four verbs' routes (``server.direct``: answered by the guard, or aiohttp)."""
        for path, verb, route in (
            ("/filter", "filter", self.deciding("filter", verbs.handle_filter)),
            ("/prioritize", "prioritize", self.deciding("prioritize", verbs.handle_prioritize)),
            ("/preempt", "preempt", self.deciding("preempt", verbs.handle_preempt)),
            ("/bind", "bind", self.bind),
        ):
            serving.add_route(app, "POST", path, route, refused=self.refused(verb))


# ---------------------------------------------------------------- /debug/reasons


def _respond(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json")


# namespace/name as Kubernetes allows them (DNS labels and subdomains)
_POD_KEY = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def reasons_page(store: ReasonStore) -> serving.Handler:
    """``GET /debug/reasons?pod=NS/NAME[,NS/NAME…]``, for the metrics listener: what
    the last ``/filter`` (and ``/bind``) of each named pod said, grouped
    (``explain.PodReasons``). Read-only, named pods only (there is no listing of every
    pod), at most ``reasons.PODS_PER_QUERY`` of them, each record bounded."""

    async def page(request: web.Request) -> web.Response:
        if not store.enabled:
            reason = "reasons are not kept (--reasons-kept 0)"
            return _respond(404, wire.encode_bad_request(reason))
        asked = [k for v in request.query.getall("pod", []) for k in v.split(",") if k]
        if not asked:
            reason = "name the pods: ?pod=NAMESPACE/NAME"
            return _respond(verbs.BAD_REQUEST, wire.encode_bad_request(reason))
        if len(asked) > PODS_PER_QUERY:
            reason = f"{len(asked)} pods asked for, at most {PODS_PER_QUERY} per request"
            return _respond(verbs.BAD_REQUEST, wire.encode_bad_request(reason))
        bad = next((k for k in asked if _POD_KEY.fullmatch(k) is None), None)
        if bad is not None:
            reason = f"{echo(bad[:300])} is not a pod's namespace/name"
            return _respond(verbs.BAD_REQUEST, wire.encode_bad_request(reason))
        pods: list[object] = []
        for key in dict.fromkeys(asked):
            record = store.get(key)
            pods.append({"pod": key, "found": False} if record is None else record.to_json())
        return _respond(verbs.OK, jsonio.dumps({"pods": pods, "kept": len(store)}))

    return page


# ---------------------------------------------------------------- background work


async def _expire_assumptions(app: web.Application) -> AsyncIterator[None]:
    """Assumptions the watch never confirmed give their GPUs back after the TTL."""
    cache, interval = app[CACHE], app[SETTINGS].expire_interval_s

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            cache.expire()

    async with serving.background(loop(), "expire assumptions"):
        yield


async def _prepare_gang_shapes(app: web.Application) -> AsyncIterator[None]:
    """With the built-in pod mix (a learned one prepares when it is put in use): the
    gang shapes before serving when a cluster file is loaded, else as soon as the
    informers have listed."""
    source, cache = app[SOURCE], app[CACHE]
    live, now = app[CONFIG], app[CLOCK].now
    if source.synced:
        await prepare_gang_shapes(live, cache.snapshot(), now)
        yield
        return

    async def once() -> None:
        await source.wait_synced()
        await prepare_gang_shapes(live, cache.snapshot(), now)

    async with serving.background(once(), "prepare gang shapes"):
        yield


async def _learn_pod_mix(app: web.Application) -> AsyncIterator[None]:
    """With ``pod_mix=learned``: the pod mix from the cache's pods, once before serving
    when the cluster is already loaded (a cluster file), else as soon as the informers
    have listed, then every ``pod_mix_interval_s`` when the cache changed."""
    settings, source, cache = app[SETTINGS], app[SOURCE], app[CACHE]
    live, metrics, now = app[CONFIG], app[METRICS], app[CLOCK].now
    learned_at = -1
    if source.synced:
        learned_at = cache.generation
        await relearn_pod_mix(live, cache.snapshot(), metrics, now)

    async def loop(learned_at: int) -> None:
        await source.wait_synced()
        while True:
            snapshot = cache.snapshot()
            if snapshot.generation != learned_at:
                learned_at = snapshot.generation
                await relearn_pod_mix(live, snapshot, metrics, now)
            await asyncio.sleep(settings.pod_mix_interval_s)

    async with serving.background(loop(learned_at), "learn pod mix"):
        yield


async def _reserve(app: web.Application) -> AsyncIterator[None]:
    """Reservations for waiting gangs (``extender.reserving``), once the cache is
    complete; nothing with ``--max-reservations 0``."""
    reserver = app[RESERVER]
    if not reserver.enabled:
        yield
        return
    async with serving.background(reserver.run(app[SOURCE].wait_synced), "reservations"):
        yield


async def _watch_cluster(app: web.Application) -> AsyncIterator[None]:
    """Nodes and pods from kube-apiserver into the cache; binds through the same client."""
    settings = app[SETTINGS]
    config = await KubeConfig.of(settings.kubeconfig, app[ENVIRON])
    async with KubeClient(config, user_agent="tessera-extender") as client:
        binds = app[BINDS]
        if binds.binder is None:
            binds.binder = ApiBinder(client, timeout_s=settings.bind_timeout_s)
        informers = CacheFeed(app[CACHE], levels=app[CONFIG].current.level_labels).informers(
            client, watch_timeout_s=settings.watch_timeout_s, clock=app[CLOCK]
        )
        app[SOURCE].informers = informers
        app[RESERVER].store = LeaseHolds(client, settings.reservation_namespace)
        flavors = app[FLAVORS].informer(
            client, watch_timeout_s=settings.watch_timeout_s, clock=app[CLOCK]
        )
        async with (
            serving.background(run_all(informers), "watch nodes and pods"),
            serving.background(_keep_listed(app[SOURCE]), "keep the listed cluster"),
            serving.background(flavors.run(), "watch resource flavors"),
        ):
            yield


async def _keep_listed(source: Source) -> None:
    """Once the informers have listed, move what is alive out of the collector's reach.

    The cluster they loaded is most of the heap (about 760,000 objects at 150,000 pods)
    and lives as long as the process; a full collection would walk all of it, holding
    every request for most of a second. A cluster file is kept the same way when the
    server starts (``serving.serve``).
    """
    await source.wait_synced()
    gc.collect(1)  # the young garbage, so that none of it is kept for good
    gc.freeze()
    log.info(
        "listed cluster kept out of garbage collection",
        extra=logs.fields(objects=gc.get_freeze_count()),
    )


# ---------------------------------------------------------------- the app


def create_app(
    settings: ExtenderSettings,
    *,
    cache: ClusterCache | None = None,
    binder: Binder | None = None,
    clock: Clock | None = None,
    environ: Mapping[str, str] | None = None,
) -> web.Application:
    """The extender app.

    The cluster comes from ``settings``: with ``cluster_file`` it is loaded into the
    cache now (``ObjectFileError`` if unreadable) and binds are recorded in memory;
    otherwise nodes and pods are watched through ``kubeconfig`` or the in-cluster
    service account (read from ``environ``, which only ``__main__`` takes from the
    process) once the app starts, and binds go to the API. ``cache``, ``binder`` and
    ``clock`` replace the ones the app would make (tests).
    """
    clock = clock or SystemClock()
    config = settings.to_config()
    cache = cache if cache is not None else ClusterCache(clock, settings.assume_ttl_s)
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[CONFIG] = LiveConfig(config)
    app[CLOCK] = clock
    app[CACHE] = cache
    app[ENVIRON] = dict(environ or {})
    source = Source(settings.max_cache_age_s)
    app[SOURCE] = source
    app[METRICS] = ExtenderMetrics(cache.counters, source.ages)
    app[METRICS].pod_mix(len(config.pod_mix), 0, changed=False)
    app[FLAVORS] = flavors = Flavors()
    live = app[CONFIG]
    app[METRICS].watch_capacity(cache.snapshot, lambda: live.current, flavors.table)
    app[REASONS] = ReasonStore(clock, max_pods=settings.reasons_kept)
    app[serving.DEBUG_ROUTES] = {"/debug/reasons": reasons_page(app[REASONS])}
    app[serving.GC_PAUSES] = app[METRICS].gc_pauses
    timeout = settings.request_timeout_s
    guard = serving.guard_app(
        app,
        limits=settings.limits(),
        clock=clock,
        timeout_of=lambda method, path, query: timeout if method == "POST" else None,
        registry=app[METRICS].registry,
        prefix="tessera_extender",
    )
    if settings.cluster_file is not None:
        others: list[Mapping[str, object]] = []
        CacheFeed(cache, levels=config.level_labels).load_file(
            settings.cluster_file, others=others.append
        )
        flavors.replace(o for o in others if o.get("kind") == "ResourceFlavor")
        source.loaded = True
        binder = binder or MemoryBinder(cache)
    else:
        app.cleanup_ctx.append(_watch_cluster)
    app[BINDS] = Binds(
        binder,
        settings.recent_pods,
        cache=cache,
        clock=clock,
        observe_api=app[METRICS].bind_api.observe,
    )
    app.cleanup_ctx.append(_expire_assumptions)
    app[RESERVER] = Reserver(
        cache,
        live,
        settings.hold_rules(),
        clock=clock,
        metrics=app[METRICS],
        interval_s=settings.reservation_interval_s,
    )
    app.cleanup_ctx.append(_reserve)
    if settings.pod_mix == "learned":
        app.cleanup_ctx.append(_learn_pod_mix)
    else:
        app.cleanup_ctx.append(_prepare_gang_shapes)
    Verbs(
        clock,
        app[METRICS],
        app[CONFIG],
        cache,
        app[BINDS],
        source,
        guard,
        app[REASONS],
        app[RESERVER],
    ).add_to(app)
    serving.add_probes(
        app,
        ready=lambda: source.synced and not source.stale(),
        not_ready=source.not_ready,
        exposition=app[METRICS].exposition,
    )
    return app
