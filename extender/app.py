"""The extender's aiohttp application: routes, wiring, lifecycle.

Layer: ROOT. ``create_app(settings, ...)`` builds everything into typed app keys. The
handlers read the body, take one ``cache.snapshot()``, call a pure ``extender.verbs``
function with no ``await`` in between, and write its answer. Must not read the
environment (``__main__`` does) or hold module-level state.

``/bind`` is the one handler that awaits in the middle, so its order matters: the GPUs
are chosen on the snapshot and assumed in the cache before the first ``await``. The next
``/filter`` (kube-scheduler sends it before the bind is answered, see the captures)
already counts them, and two binds can never both take one GPU: the second one's
snapshot has the first one's assumption in it. Then the binder writes to the API; if it
fails the assumption is forgotten and kube-scheduler gets ``Error``. The one exception is
a bind that may have landed (the connection broke and the pod could not be read back):
its GPUs stay assumed until the watch shows the truth or the assumption expires.

Every verb's deadline is kube-scheduler's ``httpTimeout`` (``request_timeout_s``) from
its request's first byte (``cluster.guard``): a request that is already too late once
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

Packing judges a node by the pods the cluster runs (``ExtenderConfig.pod_mix``). With
``pod_mix=learned`` a background task counts the cache's pods into that mix: before the
first request when a cluster file is loaded, right after the informers have listed, then
every interval; a batch of pods at a time, so that requests are answered in between.

A gang's first member reads the room per topology domain for its shape, and each
node's domain and verdict by name, which take tens of milliseconds over every node the
first time. For each gang shape the cluster's pods show, they are made ahead: with the
cluster file before the first request, else once the informers have listed, and again
under each newly learned pod mix (whose config starts with nothing kept).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import attrgetter
from typing import Protocol

from aiohttp import web

from cluster import logs, serving
from cluster.cache import AllocationConflict, ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.feed import CacheFeed, run_all
from cluster.informer import Informer
from cluster.kube import KubeClient, KubeConfig
from cluster.model import NodeName, PodDemand, PodInfo, PodKey
from cluster.snapshot import Snapshot, batches
from extender import verbs, wire
from extender.binder import ApiBinder, Binder, BindError, MemoryBinder, Placement
from extender.config import (
    ExtenderConfig,
    PodShape,
    count_shapes,
    mix_distance,
    mix_from_counts,
)
from extender.decide import BindPlan
from extender.gangs import prepare_gang_shape
from extender.memo import DecisionCache
from extender.metrics import ExtenderMetrics
from extender.settings import ExtenderSettings

log = logging.getLogger(__name__)

JSON = "application/json"
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


@dataclass(slots=True)
class _InFlight:
    node: str
    done: asyncio.Future[str]


class Binds:
    """What ``/bind`` keeps between requests: the binder, the pods of recent requests
    (kube-scheduler may bind a pod before the watch shows it; ``/prioritize`` reads the
    pod ``/filter`` decoded), and the binds under way (a bind kube-scheduler repeats
    after its timeout waits for the first one)."""

    def __init__(self, binder: Binder | None, recent_limit: int) -> None:
        self.binder = binder
        self.recent = wire.RecentPods(recent_limit)
        self.inflight: dict[PodKey, _InFlight] = {}


class LiveConfig:
    """The ``ExtenderConfig`` decisions read now, and its decision cache. The learned
    pod mix replaces both whole (``use``): a new frozen config gets a new, empty cache,
    so nothing decided under the old one is read again. A handler takes ``memo`` once
    and decides with it and its config. A holder rather than a new value under the app
    key: aiohttp freezes an app's state when it starts."""

    __slots__ = ("memo", "mix_pods")

    def __init__(self, config: ExtenderConfig) -> None:
        self.memo = DecisionCache(config)
        self.mix_pods = 0
        """GPU pods the current pod mix was learned from (0: not learned)."""

    @property
    def current(self) -> ExtenderConfig:
        return self.memo.config

    def use(self, config: ExtenderConfig) -> None:
        """Decide with ``config`` from now on, with a cache of its own."""
        self.memo = DecisionCache(config)


SETTINGS = web.AppKey("settings", ExtenderSettings)
CONFIG = web.AppKey("config", LiveConfig)
CACHE = web.AppKey("cache", ClusterCache)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", ExtenderMetrics)
SOURCE = web.AppKey("source", Source)
BINDS = web.AppKey("binds", Binds)
ENVIRON = web.AppKey("environ", Mapping[str, str])


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


# ---------------------------------------------------------------- plumbing


def _respond(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON)


async def _body(request: web.Request) -> bytes | web.Response:
    """The request body, or the 400 to answer when it cannot be read."""
    settings = request.app[SETTINGS]
    try:
        return await serving.read_body(request, settings.max_body_bytes, settings.body_timeout_s)
    except serving.BodyRefused as refused:
        answer = _respond(verbs.BAD_REQUEST, wire.encode_bad_request(refused.reason))
        if refused.close:
            answer.force_close()
        return answer


def _not_ready() -> web.Response:
    reason = "the extender's cache is not synced with the cluster yet"
    return _respond(NOT_READY, wire.encode_bad_request(reason))


def _early(
    request: web.Request, verb: str, body: bytes | web.Response
) -> tuple[web.Response, str] | None:
    """The answer and its metrics result when there is nothing to decide: unreadable
    body, too late, cache not synced, cache stale."""
    if isinstance(body, web.Response):
        return body, "bad_request"
    late = request.app[serving.GUARD].answer_if_late(request)
    if late is not None:
        return late, "shed"
    source = request.app[SOURCE]
    if not source.synced:
        return _not_ready(), "not_ready"
    stale = source.stale()
    if stale:
        reply = verbs.stale_reply(verb, stale)
        return _respond(reply.status, reply.body), "stale"
    return None


# ---------------------------------------------------------------- the four verbs


async def _decide(request: web.Request, verb: str, handle: Handle) -> web.Response:
    app = request.app
    clock, metrics = app[CLOCK], app[METRICS]
    start = clock.monotonic()
    body = await _body(request)
    early = _early(request, verb, body)
    if early is not None:
        metrics.answered(verb, early[1], clock.monotonic() - start)
        return early[0]
    assert isinstance(body, bytes)
    began = clock.monotonic()
    memo = app[CONFIG].memo
    snapshot = app[CACHE].snapshot()
    reply = handle(body, snapshot, memo.config, clock.now(), recent=app[BINDS].recent, memo=memo)
    metrics.decided(verb, clock.monotonic() - began)
    if reply.outcome is not None:
        metrics.filtered(reply.outcome)
    if reply.status == verbs.BAD_REQUEST:
        result = "bad_request"
        log.info("bad request", extra=logs.fields(verb=verb, reason=reply.note))
    else:
        result = "error" if reply.note else "ok"
    metrics.answered(verb, result, clock.monotonic() - start)
    return _respond(reply.status, reply.body)


async def filter_nodes(request: web.Request) -> web.Response:
    return await _decide(request, "filter", verbs.handle_filter)


async def prioritize(request: web.Request) -> web.Response:
    return await _decide(request, "prioritize", verbs.handle_prioritize)


async def preempt(request: web.Request) -> web.Response:
    return await _decide(request, "preempt", verbs.handle_preempt)


async def bind(request: web.Request) -> web.Response:
    app = request.app
    clock, metrics, binds, cache = app[CLOCK], app[METRICS], app[BINDS], app[CACHE]
    start = clock.monotonic()
    body = await _body(request)
    early = _early(request, "bind", body)
    if early is not None:
        metrics.answered("bind", early[1], clock.monotonic() - start)
        return early[0]
    assert isinstance(body, bytes)

    # From here to the binder's first await: no await, so no other request runs between
    # the snapshot and the assumption.
    began = clock.monotonic()
    memo = app[CONFIG].memo
    step = verbs.plan_bind(
        body, cache.snapshot(), memo.config, clock.now(), seen=binds.recent, memo=memo
    )
    if isinstance(step, verbs.Reply):
        metrics.decided("bind", clock.monotonic() - began)
        result = "bad_request" if step.status == verbs.BAD_REQUEST else "refused"
        if step.note:
            log.info("bind refused", extra=logs.fields(result=result, reason=step.note))
        metrics.answered("bind", result, clock.monotonic() - start)
        return _respond(step.status, step.body)
    args, plan = step.args, step.plan
    pod = plan.pod
    if not pod.uid and args.pod_uid:
        pod = replace(pod, uid=args.pod_uid)
    running = binds.inflight.get(pod.key)
    if running is not None:
        error = await _join(pod.key, running, args.node)
    else:
        refused = _assume(cache, pod, plan)
        metrics.decided("bind", clock.monotonic() - began)
        if refused is not None:
            error = refused
        else:
            indices = () if plan.allocation is None else plan.allocation.indices
            placement = Placement(pod, NodeName(args.node), indices)
            error = await _carry_out(app, placement)
    metrics.answered("bind", "error" if error else "ok", clock.monotonic() - start)
    return _respond(verbs.OK, verbs.bind_reply(error).body)


def _assume(cache: ClusterCache, pod: PodInfo, plan: BindPlan) -> str | None:
    """Count the planned GPUs as taken; the refusal to answer if the cache says no."""
    if plan.allocation is None:
        return None
    try:
        cache.assume(pod, plan.allocation)
    except (AllocationConflict, ValueError) as exc:
        # plan_bind checked the same snapshot: reaching this is a bug, said not hidden
        log.error("assume refused a planned bind", extra=logs.fields(pod=pod.key, error=str(exc)))
        return f"cannot bind pod {pod.key}: {exc}"
    return None


async def _join(key: PodKey, running: _InFlight, node: str) -> str:
    """A bind for a pod whose bind is under way: kube-scheduler retried after a timeout."""
    if running.node != node:
        return f"pod {key} is already being bound to node {running.node}"
    log.info("bind repeated while under way", extra=logs.fields(pod=key, node=node))
    return await asyncio.shield(running.done)


async def _carry_out(app: web.Application, placement: Placement) -> str:
    """Run the binder for an assumed placement; the ``Error`` to answer (``""``: bound)."""
    binds, cache, clock = app[BINDS], app[CACHE], app[CLOCK]
    binder = binds.binder
    key = placement.pod.key
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    binds.inflight[key] = _InFlight(placement.node, done)
    error = "the bind was interrupted (extender shutting down)"
    began = clock.monotonic()
    try:
        if binder is None:
            raise BindError("the extender has no binder yet (still starting)")
        await binder.bind(placement)
        error = ""
        binds.recent.forget(placement.pod.uid)
        if log.isEnabledFor(logging.INFO):  # the fields are built before the level is read
            log.info(
                "bound",
                extra=logs.fields(pod=key, node=placement.node, gpus=placement.annotation),
            )
    except BindError as exc:
        error = str(exc)
        if not exc.uncertain:
            cache.forget(key)
        log.warning(
            "bind failed",
            extra=logs.fields(pod=key, node=placement.node, error=error, kept=exc.uncertain),
        )
    except Exception as exc:
        error = f"cannot bind pod {key}: internal error: {exc}"
        cache.forget(key)
        log.exception("binder crashed", extra=logs.fields(pod=key, node=placement.node))
    finally:
        # On cancellation the bind may or may not have landed: the assumption stays
        # until the watch tells or its TTL ends.
        app[METRICS].bind_api.observe(clock.monotonic() - began)
        del binds.inflight[key]
        done.set_result(error)
    return error


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


MIX_BATCH_PODS = 1_000
"""Pods counted for the pod mix between two turns of the event loop: about 1 ms, where
counting 150,000 pods at once (~200 ms on a loaded core) would hold every request."""
MIX_TOLERANCE = 0.01
"""The share of the mix's weight that must move before a learned mix replaces the one
in use: counts change with every pod, and each replacement makes every node score its
pods afresh (the memos are keyed by the config), for a difference in fragmentation of
at most this share of a node's free GPUs."""


_DEMAND = attrgetter("demand")


async def learn_pod_mix(snapshot: Snapshot, batch: int = MIX_BATCH_PODS) -> Counter[PodShape]:
    """How many of the snapshot's pods have each shape (``count_shapes``), counted
    ``batch`` pods at a time with a turn of the event loop in between: the snapshot never
    changes, so the count is exact however the cache moves on meanwhile."""
    counts: Counter[PodShape] = Counter()
    for pods in batches(snapshot.pods, batch):
        counts.update(count_shapes(map(_DEMAND, pods)))
        await asyncio.sleep(0)
    return counts


async def relearn_pod_mix(app: web.Application, snapshot: Snapshot) -> bool:
    """Count the snapshot's pods and put their mix in use when it moved by more than
    ``MIX_TOLERANCE``; whether it did. Without GPU pods the mix in use stays (the
    built-in one until pods are seen; a cluster that emptied still expects its pods)."""
    counts = await learn_pod_mix(snapshot)
    pods = sum(n for (gpus, milli, _, _), n in counts.items() if gpus or milli)
    if not pods:
        return False
    live = app[CONFIG]
    mix = mix_from_counts(counts)
    moved = mix_distance(live.current.pod_mix, mix)
    if moved <= MIX_TOLERANCE:
        return False
    live.use(replace(live.current, pod_mix=mix))
    live.mix_pods = pods
    app[METRICS].pod_mix(len(mix), pods)
    log.info(
        "pod mix learned",
        extra=logs.fields(sizes=len(mix), pods=pods, moved=round(moved, 4)),
    )
    # what the last config kept is gone with it
    await prepare_gang_shapes(app, snapshot)
    return True


_TOPOLOGY_SHAPE = attrgetter("gpus", "gpu_milli", "products", "topology")


async def gang_demands(snapshot: Snapshot, batch: int = MIX_BATCH_PODS) -> list[PodDemand]:
    """One demand per gang shape among the snapshot's pods (whole GPUs or share,
    products, topology): what a gang's first member counts rooms by. Read ``batch`` pods
    at a time, with a turn of the event loop in between."""
    found: dict[object, PodDemand] = {}
    for pods in batches(snapshot.pods, batch):
        for demand in map(_DEMAND, pods):
            if demand.gang is not None and demand.topology is not None:
                found.setdefault(_TOPOLOGY_SHAPE(demand), demand)
        await asyncio.sleep(0)
    return list(found.values())


async def prepare_gang_shapes(app: web.Application, snapshot: Snapshot) -> int:
    """Make ahead, under the config in use, what the first member of a gang reads, for
    every gang shape the cluster's pods show (``gangs.prepare_gang_shape``), one shape
    per turn of the event loop: such a member then redoes only the nodes changed since,
    instead of every node while every request waits. How many shapes were prepared."""
    prepared = 0
    for demand in await gang_demands(snapshot):
        prepared += prepare_gang_shape(snapshot, demand, app[CONFIG].memo, app[CLOCK].now())
        await asyncio.sleep(0)
    if prepared:
        log.info("gang shapes prepared", extra=logs.fields(shapes=prepared))
    return prepared


async def _prepare_gang_shapes(app: web.Application) -> AsyncIterator[None]:
    """With the built-in pod mix (a learned one prepares when it is put in use): the
    gang shapes before serving when a cluster file is loaded, else as soon as the
    informers have listed."""
    source, cache = app[SOURCE], app[CACHE]
    if source.synced:
        await prepare_gang_shapes(app, cache.snapshot())
        yield
        return

    async def once() -> None:
        await source.wait_synced()
        await prepare_gang_shapes(app, cache.snapshot())

    async with serving.background(once(), "prepare gang shapes"):
        yield


async def _learn_pod_mix(app: web.Application) -> AsyncIterator[None]:
    """With ``pod_mix=learned``: the pod mix from the cache's pods, once before serving
    when the cluster is already loaded (a cluster file), else as soon as the informers
    have listed, then every ``pod_mix_interval_s`` when the cache changed."""
    settings, source, cache = app[SETTINGS], app[SOURCE], app[CACHE]
    learned_at = -1
    if source.synced:
        learned_at = cache.generation
        await relearn_pod_mix(app, cache.snapshot())

    async def loop(learned_at: int) -> None:
        await source.wait_synced()
        while True:
            snapshot = cache.snapshot()
            if snapshot.generation != learned_at:
                learned_at = snapshot.generation
                await relearn_pod_mix(app, snapshot)
            await asyncio.sleep(settings.pod_mix_interval_s)

    async with serving.background(loop(learned_at), "learn pod mix"):
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
        async with (
            serving.background(run_all(informers), "watch nodes and pods"),
            serving.background(_keep_listed(app[SOURCE]), "keep the listed cluster"),
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
    app[serving.GC_PAUSES] = app[METRICS].gc_pauses
    timeout = settings.request_timeout_s
    serving.guard_app(
        app,
        limits=settings.limits(),
        clock=clock,
        timeout_of=lambda request: timeout if request.method == "POST" else None,
        registry=app[METRICS].registry,
        prefix="tessera_extender",
    )
    if settings.cluster_file is not None:
        CacheFeed(cache, levels=config.level_labels).load_file(settings.cluster_file)
        source.loaded = True
        binder = binder or MemoryBinder(cache)
    else:
        app.cleanup_ctx.append(_watch_cluster)
    app[BINDS] = Binds(binder, settings.recent_pods)
    app.cleanup_ctx.append(_expire_assumptions)
    if settings.pod_mix == "learned":
        app.cleanup_ctx.append(_learn_pod_mix)
    else:
        app.cleanup_ctx.append(_prepare_gang_shapes)
    app.router.add_post("/filter", filter_nodes)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_post("/preempt", preempt)
    serving.add_probes(
        app,
        ready=lambda: source.synced and not source.stale(),
        not_ready=source.not_ready,
        exposition=app[METRICS].exposition,
    )
    return app
