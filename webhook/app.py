"""The webhook's aiohttp application: routes, wiring, lifecycle.

Layer: ROOT. ``create_app(settings, ...)`` builds everything into typed app keys; the
handlers only read the body, call the pure ``review_flow`` and write its answer. Must not
read the environment (``__main__`` does) or hold module-level state.

Each review's deadline is the ``?timeout=`` kube-apiserver sends (``server.guard`` stamps
it from the review's first byte): one that is already too late, before or after its body
is read, is answered 504 at once instead of being decided. That is an error, never an
``allowed`` answer: kube-apiserver applies the webhook's ``failurePolicy``. The one GET
of an owner the watch has not seen waits only for what the review has left
(``ConnectionGuard.spare``), so it never makes the answer late: when it cannot finish
in that time, or there is none, the object is judged as its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from cluster.clock import Clock, SystemClock
from cluster.files import load_objects
from cluster.kube import KubeClient, KubeConfig
from server import serving
from server.deadline import asked_timeout
from server.direct import Call, Reply, Route, query_value
from server.guard import ConnectionGuard, TimeoutOf
from webhook.metrics import WebhookMetrics
from webhook.owners import ControllerUsers
from webhook.review import encode_status
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig
from webhook.settings import MAX_TIMEOUT_S, WebhookSettings
from webhook.source import OwnerSource, PolicyStore, watch_owners, watch_policy

SETTINGS = web.AppKey("settings", WebhookSettings)
STORE = web.AppKey("store", PolicyStore)
OWNERS = web.AppKey("owners", OwnerSource)
CONFIG = web.AppKey("config", AdmitConfig)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", WebhookMetrics)
ENVIRON = web.AppKey("environ", Mapping[str, str])


def _bad_request(reason: str) -> Reply:
    """A body that cannot be read: a ``Status``, as every other 400 of the webhook."""
    return Reply(400, encode_status(400, "BadRequest", reason))


KNOWN_QUERIES = 64
"""Distinct ``/mutate`` queries whose timeout is kept (any client may send others)."""


def review_timeout(settings: WebhookSettings) -> TimeoutOf:
    """How long kube-apiserver waits for a review: its ``?timeout=`` (a Go duration,
    at most ``MAX_TIMEOUT_S``), else ``request_timeout_s``; nothing else has a deadline."""
    default = settings.request_timeout_s
    # kube-apiserver sends one query for every review of a webhook (``timeout=10s``)
    known: dict[str, float] = {}

    def timeout_of(method: str, path: str, query: str) -> float | None:
        if path != "/mutate":
            return None
        timeout = known.get(query)
        if timeout is None:
            asked = query_value(query, "timeout")
            timeout = asked_timeout(asked, default_s=default, max_s=MAX_TIMEOUT_S)
            if len(known) >= KNOWN_QUERIES:
                known.clear()
            known[query] = timeout
        return timeout

    return timeout_of


def mutate_handler(  # noqa: PLR0917 - what the handler binds once, each by its type
    settings: WebhookSettings,
    store: PolicyStore,
    owners: OwnerSource,
    config: AdmitConfig,
    clock: Clock,
    metrics: WebhookMetrics,
    *,
    guard: ConnectionGuard,
) -> Route:
    """``POST /mutate``, with what it needs bound once rather than looked up per request."""

    async def mutate(call: Call) -> Reply:
        late = guard.late(call.method, call.path, call.deadline)
        if late is not None:
            return late
        start = clock.monotonic()
        outcome = review(call.body, store.current(), config, owners.view())
        if outcome.unconfirmed is not None:
            # the object names a controller the watch cache lacks: ask the API once, in
            # the time the review has left
            view = await owners.confirm(outcome.unconfirmed, within_s=guard.spare(call.deadline))
            if view is not None:
                outcome = review(call.body, store.current(), config, view)
        metrics.observe(outcome, clock.monotonic() - start)
        return Reply(outcome.status, outcome.body)

    return mutate


async def _watch_kueue(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    config = await KubeConfig.of(settings.kubeconfig, app[ENVIRON])
    owners = app[OWNERS]
    async with (
        KubeClient(config, user_agent="tessera-webhook") as client,
        serving.background(
            watch_policy(app[STORE], client, settings.kueue_version), "watch Kueue objects"
        ),
        serving.background(watch_owners(owners.store, client), "watch Jobs and JobSets"),
    ):
        owners.client = client
        try:
            yield
        finally:
            owners.client = None


def create_app(
    settings: WebhookSettings,
    *,
    store: PolicyStore | None = None,
    owners: OwnerSource | None = None,
    clock: Clock | None = None,
    environ: Mapping[str, str] | None = None,
) -> web.Application:
    """The webhook app. With no ``store``, the policy comes from ``settings``: a file now,
    or Kueue watches started with the app (in-cluster discovery reads ``environ``, which
    only ``__main__`` takes from the process); the Jobs and JobSets that may own what is
    reviewed come from the same place. With a ``store`` and no ``owners``, no owner is
    known: a claimed one is unverified, and the object is judged as its own."""
    clock = clock or SystemClock()
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app[ENVIRON] = dict(environ or {})
    app[CONFIG] = AdmitConfig(
        scheduler_name=settings.scheduler_name,
        managed_namespaces=settings.managed_namespaces,
        controllers=ControllerUsers(
            job=frozenset(settings.job_controller_usernames),
            jobset=frozenset(settings.jobset_controller_usernames),
        ),
    )
    if store is None:
        store = PolicyStore(clock)
        owners = owners or OwnerSource()
        if settings.policy_file is not None:
            # No API to ask: only the Jobs and JobSets the file holds are known to exist.
            objects = load_objects(settings.policy_file)
            store.load(objects)
            owners.store.load(objects)
        else:
            app.cleanup_ctx.append(_watch_kueue)
    app[STORE] = store
    app[OWNERS] = owners or OwnerSource()
    app[METRICS] = WebhookMetrics(store.age_s)
    app[serving.GC_PAUSES] = app[METRICS].gc_pauses
    guard = serving.guard_app(
        app,
        limits=settings.limits(),
        clock=clock,
        timeout_of=review_timeout(settings),
        registry=app[METRICS].registry,
        prefix="tessera_webhook",
    )
    serving.add_route(
        app,
        "POST",
        "/mutate",
        mutate_handler(settings, store, app[OWNERS], app[CONFIG], clock, app[METRICS], guard=guard),
        refused=_bad_request,
    )
    serving.add_probes(
        app,
        ready=lambda: store.synced,
        not_ready="queue policy not synced yet",
        exposition=app[METRICS].exposition,
    )
    return app
