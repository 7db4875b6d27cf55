"""The webhook's aiohttp application: routes, wiring, lifecycle.

Layer: ROOT. ``create_app(settings, ...)`` builds everything into typed app keys; the
handlers only read the body, call the pure ``review_flow`` and write its answer. Must not
read the environment (``__main__`` does) or hold module-level state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import hdrs, web

from cluster import jsonio, serving
from cluster.clock import Clock, SystemClock
from cluster.echo import echo
from cluster.files import load_objects
from cluster.kube import KubeClient, KubeConfig
from webhook.metrics import WebhookMetrics
from webhook.owners import ControllerUsers
from webhook.policy import AdmitConfig
from webhook.review_flow import review
from webhook.settings import WebhookSettings
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


def unreadable_body(request: web.Request) -> str:
    """Why a body could not be read: it is not in the encoding it says it is in."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity")
    return f"request body cannot be read as {echo(encoding, quote=False)}"


def mutate_handler(  # noqa: PLR0917 - what the handler binds once, each by its type
    settings: WebhookSettings,
    store: PolicyStore,
    owners: OwnerSource,
    config: AdmitConfig,
    clock: Clock,
    metrics: WebhookMetrics,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``POST /mutate``, with what it needs bound once rather than looked up per request."""
    limit = settings.max_body_bytes

    async def mutate(request: web.Request) -> web.Response:
        length = request.content_length
        if length is not None and length > limit:
            return _bad_request(f"request body of {length} bytes exceeds {limit}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _bad_request(f"request body exceeds {limit} bytes")
        except web.RequestPayloadError:
            # aiohttp inflates a Content-Encoding as it reads, and raises when it cannot;
            # the rest of the stream cannot be read either, so the connection ends here;
            # nothing more is read: aiohttp would drain the rest and log the same error
            refused = _bad_request(unreadable_body(request))
            refused.force_close()
            request.content.feed_eof()
            return refused
        start = clock.monotonic()
        outcome = review(body, store.current(), config, owners.view())
        if outcome.unconfirmed is not None:
            # the object names a controller the watch cache lacks: ask the API once
            view = await owners.confirm(outcome.unconfirmed)
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
    app.router.add_post(
        "/mutate",
        mutate_handler(settings, store, app[OWNERS], app[CONFIG], clock, app[METRICS]),
    )
    serving.add_probes(
        app,
        ready=lambda: store.synced,
        not_ready="queue policy not synced yet",
        exposition=app[METRICS].exposition,
    )
    return app
