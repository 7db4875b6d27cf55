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

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web

from cluster import jsonio
from cluster.clock import Clock, SystemClock
from cluster.files import load_objects
from cluster.kube import KubeClient, KubeConfig
from server import serving
from server.deadline import asked_timeout
from server.guard import ConnectionGuard, TimeoutOf
from webhook.metrics import WebhookMetrics
from webhook.owners import ControllerUsers
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

JSON = "application/json"


def _bad_request(reason: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 400,
        "reason": "BadRequest",
        "message": reason,
    }
    return web.Response(status=400, body=jsonio.dumps(body), content_type=JSON)


def review_timeout(settings: WebhookSettings) -> TimeoutOf:
    """How long kube-apiserver waits for a review: its ``?timeout=`` (a Go duration,
    at most ``MAX_TIMEOUT_S``), else ``request_timeout_s``; nothing else has a deadline."""
    default = settings.request_timeout_s

    def timeout_of(request: web.Request) -> float | None:
        if request.path != "/mutate":
            return None
        return asked_timeout(request.query.get("timeout"), default_s=default, max_s=MAX_TIMEOUT_S)

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
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``POST /mutate``, with what it needs bound once rather than looked up per request."""
    limit = settings.max_body_bytes

    async def mutate(request: web.Request) -> web.Response:
        try:
            body = await serving.read_body(request, limit, settings.body_timeout_s)
        except serving.BodyRefused as refused:
            answer = _bad_request(refused.reason)
            if refused.close:
                answer.force_close()
            return answer
        late = guard.answer_if_late(request)
        if late is not None:
            return late
        start = clock.monotonic()
        outcome = review(body, store.current(), config, owners.view())
        if outcome.unconfirmed is not None:
            # the object names a controller the watch cache lacks: ask the API once, in
            # the time the review has left
            view = await owners.confirm(outcome.unconfirmed, within_s=guard.spare(request))
            if view is not None:
                outcome = review(body, store.current(), config, view)
        metrics.observe(outcome, clock.monotonic() - start)
        return web.Response(status=outcome.status, body=outcome.body, content_type=JSON)

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
    app.router.add_post(
        "/mutate",
        mutate_handler(settings, store, app[OWNERS], app[CONFIG], clock, app[METRICS], guard=guard),
    )
    serving.add_probes(
        app,
        ready=lambda: store.synced,
        not_ready="queue policy not synced yet",
        exposition=app[METRICS].exposition,
    )
    return app
