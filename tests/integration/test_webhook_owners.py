"""The webhook knows which Jobs and JobSets exist, from a real watch on a fake
kube-apiserver, and lets through unjudged only the pods and Jobs their controllers made.

Issue 20: a forged ownerReference skipped every rule. A pod the Job controller made
names its Job by uid; the webhook checks that uid against a watch cache of Jobs (and
JobSets, when their API is served) and, when the watch has not caught up with a Job
created a moment ago, with one GET. Everything here runs over real sockets: the fake
API server's watches and GETs, and the webhook over TLS with certificates from certs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cluster import jsonio, labels
from cluster.clock import ManualClock
from cluster.files import load_objects
from cluster.informer import Backoff
from cluster.kube import METADATA_LIST_ACCEPT, METADATA_WATCH_ACCEPT, KubeClient, KubeConfig
from server.tls import CertReloader, client_context
from tests.certfiles import Material, make_material
from tests.fakeapi import FakeApiServer, write_kubeconfig
from tests.integration.test_webhook_policy_watch import path_of
from webhook.app import OWNERS, STORE, create_app
from webhook.owners import JOB_CONTROLLER_USERNAMES, OwnerKey, OwnerKind
from webhook.settings import WebhookSettings
from webhook.source import OwnerSource, OwnerStore, watch_owners

POLICY = Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml"
TOKEN = "webhook-token"
JOBS = "/apis/batch/v1/jobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/jobsets"
JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
KUEUE = {
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}
NS = "team-nlp"
JOB_CONTROLLER = JOB_CONTROLLER_USERNAMES[0]
FAST = Backoff(initial_s=0.01, cap_s=0.05)
WAIT_S = 5.0

Obj = dict[str, Any]


def job(name: str, namespace: str = NS) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img"}]}}},
    }


def jobset(name: str) -> Obj:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicatedJobs": []},
    }


class JobSetApi:
    """Discovery of the JobSet group version, as kube-apiserver serves it once the CRD
    is installed, and 404 before (the fake serves collections, not discovery)."""

    def __init__(self, api: FakeApiServer, *, installed: bool) -> None:
        self.installed = installed
        api.app.router.add_get(JOBSET_API, self._discovery)

    async def _discovery(self, _: web.Request) -> web.Response:
        if not self.installed:
            raise web.HTTPNotFound
        body = {
            "kind": "APIResourceList",
            "groupVersion": "jobset.x-k8s.io/v1alpha2",
            "resources": [{"name": "jobsets", "namespaced": True, "kind": "JobSet"}],
        }
        return web.Response(body=jsonio.dumps(body), content_type="application/json")


async def eventually(check: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            while not check():  # noqa: ASYNC110 - the store has no change signal: poll
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"never happened: {what}")


class Sleeps:
    """The owner watch's waits between looks for the JobSet API: each one recorded, and
    held until the test lets it end (no timer races the test)."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.release = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.release.wait()
        self.release.clear()


@contextlib.asynccontextmanager
async def watching(api: FakeApiServer, sleeps: Sleeps | None = None) -> AsyncIterator[OwnerStore]:
    store = OwnerStore()
    async with KubeClient(KubeConfig.explicit(api.url, token=TOKEN)) as client:
        task = asyncio.create_task(
            watch_owners(store, client, sleep=sleeps or Sleeps(), backoff=FAST)
        )
        try:
            yield store
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------- the watch cache


async def test_the_uids_of_jobs_and_jobsets_are_watched_as_metadata_only() -> None:
    api = FakeApiServer(token=TOKEN)
    JobSetApi(api, installed=True)
    async with api:
        finetune = api.put(JOBS, job("finetune"))
        pretrain = api.put(JOBSETS, jobset("pretrain"))
        async with watching(api) as store:
            view = store.view()
            job_key = OwnerKey(OwnerKind.JOB, NS, "finetune")
            jobset_key = OwnerKey(OwnerKind.JOBSET, NS, "pretrain")
            await eventually(lambda: view.uid(jobset_key) is not None, "the JobSet listed")
            assert view.uid(job_key) == finetune["metadata"]["uid"]
            assert view.uid(jobset_key) == pretrain["metadata"]["uid"]

            late = api.put(JOBS, job("late"))
            late_key = OwnerKey(OwnerKind.JOB, NS, "late")
            await eventually(lambda: view.uid(late_key) == late["metadata"]["uid"], "ADDED seen")
            api.delete(JOBS, f"{NS}/finetune")
            await eventually(lambda: view.uid(job_key) is None, "DELETED seen")

    owner_requests = [r for r in api.requests if r.path in (JOBS, JOBSETS)]
    assert {r.kind for r in owner_requests} == {"list", "watch"}
    for request in owner_requests:
        wanted = METADATA_LIST_ACCEPT if request.kind == "list" else METADATA_WATCH_ACCEPT
        assert request.headers["Accept"] == wanted


async def test_without_the_jobset_api_jobs_are_watched_and_jobsets_looked_for_now_and_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleeps = Sleeps()
    async with FakeApiServer(token=TOKEN) as api:
        api.put(JOBS, job("finetune"))
        with caplog.at_level(logging.INFO, logger="webhook.source"):
            async with watching(api, sleeps) as store:
                key = OwnerKey(OwnerKind.JOB, NS, "finetune")
                await eventually(lambda: store.view().uid(key) is not None, "Jobs listed")
                await eventually(lambda: len(sleeps.asked) == 1, "a wait for the JobSet API")
                sleeps.release.set()
                await eventually(lambda: len(sleeps.asked) == 2, "a second look, then a wait")

    assert sleeps.asked == [300.0, 300.0]
    assert not [r for r in api.requests if r.path == JOBSETS]
    said = [r for r in caplog.records if "JobSet API not served" in r.getMessage()]
    assert len(said) == 1


async def test_a_jobset_api_installed_later_is_watched_from_then_on() -> None:
    sleeps = Sleeps()
    api = FakeApiServer(token=TOKEN)
    jobset_api = JobSetApi(api, installed=False)
    async with api, watching(api, sleeps) as store:
        await eventually(lambda: len(sleeps.asked) == 1, "a wait for the JobSet API")
        jobset_api.installed = True  # the CRD is installed
        pretrain = api.put(JOBSETS, jobset("pretrain"))
        sleeps.release.set()
        key = OwnerKey(OwnerKind.JOBSET, NS, "pretrain")
        await eventually(
            lambda: store.view().uid(key) == pretrain["metadata"]["uid"], "JobSets watched"
        )


async def test_confirm_asks_the_api_for_one_owner() -> None:
    async with FakeApiServer(token=TOKEN) as api:
        made = api.put(JOBS, job("finetune"))
        source = OwnerSource()
        assert await source.confirm(OwnerKey(OwnerKind.JOB, NS, "finetune")) is None  # no API
        async with KubeClient(KubeConfig.explicit(api.url, token=TOKEN)) as client:
            source.client = client
            found = OwnerKey(OwnerKind.JOB, NS, "finetune")
            gone = OwnerKey(OwnerKind.JOBSET, NS, "pretrain")  # JobSet API not even served
            view = await source.confirm(found)
            assert view is not None
            assert view.uid(found) == made["metadata"]["uid"]
            view = await source.confirm(gone)
            assert view is not None
            assert (gone in view.fetched, view.uid(gone)) == (True, None)
        assert [r.path for r in api.requests if r.kind == "get"] == [
            f"/apis/batch/v1/namespaces/{NS}/jobs/finetune",
            f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/pretrain",
        ]


# ---------------------------------------------------------------- the webhook, end to end


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


def pod_review(owner: str, uid: str, sender: str) -> bytes:
    """A 64-GPU pod naming Job ``owner`` (uid ``uid``) as its controller."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{owner}-",
            "namespace": NS,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": owner,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {"name": "c", "image": "img", "resources": {"limits": {labels.GPU_RESOURCE: "64"}}}
            ]
        },
    }
    return jsonio.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"review-{owner}-{sender}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": NS,
                "operation": "CREATE",
                "userInfo": {"username": sender},
                "object": pod,
            },
        }
    )


class Webhook:
    def __init__(self, url: str, session: aiohttp.ClientSession, app: web.Application) -> None:
        self.url, self.session, self.app = url, session, app

    async def review(self, body: bytes, waits: str = "10s") -> Obj:
        """The review's answer; ``waits`` is its ``?timeout=``, as kube-apiserver writes it."""
        url = f"{self.url}/mutate?timeout={waits}"
        async with self.session.post(url, data=body) as response:
            assert response.status == 200
            answer: Obj = jsonio.loads(await response.read())["response"]
            return answer


@contextlib.asynccontextmanager
async def webhook_on(
    api: FakeApiServer,
    material: Material,
    folder: Path,
    *,
    owners: OwnerSource | None = None,
    **overrides: Any,
) -> AsyncIterator[Webhook]:
    settings = WebhookSettings(kubeconfig=write_kubeconfig(folder, api, "webhook"), **overrides)
    app = create_app(settings, owners=owners, clock=ManualClock())
    runner = web.AppRunner(app)
    await runner.setup()
    reloader = CertReloader(material["webhook.crt"], material["webhook.key"])
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    url = f"https://localhost:{runner.addresses[0][1]}"
    connector = aiohttp.TCPConnector(ssl=client_context(material["ca.crt"]))
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            yield Webhook(url, session, app)
    finally:
        await runner.cleanup()


async def test_the_webhook_skips_only_pods_of_jobs_that_exist_with_their_uid(
    material: Material, tmp_path: Path
) -> None:
    async with FakeApiServer(token=TOKEN) as api:
        for obj in load_objects(POLICY):
            api.put(path_of(obj), obj)
        listed = api.put(JOBS, job("finetune"))["metadata"]["uid"]
        async with webhook_on(api, material, tmp_path) as webhook:
            owners = webhook.app[OWNERS]
            key = OwnerKey(OwnerKind.JOB, NS, "finetune")
            # the watch open, not only the list in: a watch opened later would replay the
            # Job withheld below, and the GET this test expects for it would not be made
            await watched(webhook, api)
            await eventually(lambda: owners.view().uid(key) == listed, "the Job listed")
            gets_before = len(api.requests_of("get"))

            genuine = await webhook.review(pod_review("finetune", listed, JOB_CONTROLLER))
            forged_uid = await webhook.review(pod_review("finetune", "0", JOB_CONTROLLER))
            forged_sender = await webhook.review(pod_review("finetune", listed, "alice"))
            # the watch cache has not seen this Job yet: one GET finds it
            with api.withheld():
                fresh = api.put(JOBS, job("fresh"))["metadata"]["uid"]
                just_made = await webhook.review(pod_review("fresh", fresh, JOB_CONTROLLER))
            made_up = await webhook.review(pod_review("made-up", "1", JOB_CONTROLLER))

    assert (genuine["allowed"], "patch" in genuine) == (True, False)
    assert (just_made["allowed"], "patch" in just_made) == (True, False)
    for judged in (forged_uid, forged_sender, made_up):
        assert judged["allowed"] is False
        assert "asks for 64 GPUs" in judged["status"]["message"]
    gets = [r.path for r in api.requests_of("get")[gets_before:]]
    # a GET only where the cache lacked the owner: not for the uid it knows, nor when the
    # sender alone already decides
    assert gets == [
        f"/apis/batch/v1/namespaces/{NS}/jobs/finetune",
        f"/apis/batch/v1/namespaces/{NS}/jobs/fresh",
        f"/apis/batch/v1/namespaces/{NS}/jobs/made-up",
    ]


def serve_policy(api: FakeApiServer) -> None:
    for obj in load_objects(POLICY):
        api.put(path_of(obj), obj)


async def watched(webhook: Webhook, api: FakeApiServer) -> None:
    """Until the queue policy is listed and the Jobs are watched: a Job put after this,
    while the API withholds its events, is one the webhook has not seen."""
    await eventually(lambda: webhook.app[STORE].synced, "the queue policy listed")
    # the fake registers a watch as it records its request, with no await between
    await eventually(
        lambda: any(r.kind == "watch" and r.path == JOBS for r in api.requests), "Jobs watched"
    )


# Far beyond the review's 1 s, far short of the lookup's own 60 s limit.
ANSWER_BOUND_S = 15.0


async def test_a_slow_owner_lookup_is_cut_short_by_the_reviews_deadline(
    material: Material, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver stops waiting at the review's ``?timeout=``: an API slow to answer
    the GET must not hold the answer past it. The lookup gets the review's time left
    (less the margin), not its own limit, and the pod is then judged as its own."""
    never = asyncio.Event()

    async def hold(_: object) -> None:
        await never.wait()

    async with FakeApiServer(token=TOKEN) as api:
        serve_policy(api)
        api.before_get = hold
        lookup = OwnerSource(timeout_s=60.0)
        try:
            async with webhook_on(api, material, tmp_path, owners=lookup) as webhook:
                await watched(webhook, api)
                with api.withheld(), caplog.at_level(logging.WARNING, logger="webhook.source"):
                    fresh = api.put(JOBS, job("fresh"))["metadata"]["uid"]
                    async with asyncio.timeout(ANSWER_BOUND_S):
                        answer = await webhook.review(
                            pod_review("fresh", fresh, JOB_CONTROLLER), waits="1s"
                        )
        finally:
            never.set()  # the held GET ends, so the fake API closes at once

    assert answer["allowed"] is False
    assert "asks for 64 GPUs" in answer["status"]["message"]
    gets = [r.path for r in api.requests_of("get")]
    assert gets == [f"/apis/batch/v1/namespaces/{NS}/jobs/fresh"]
    said = [r for r in caplog.records if "owner lookup failed" in r.getMessage()]
    assert len(said) == 1


async def test_a_review_with_no_time_left_judges_an_unseen_owner_without_a_lookup(
    material: Material, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A review whose time left is all margin is still answered, but a GET would push
    the answer past the deadline: the pod is judged as its own at once, as when a
    lookup fails. (The webhook's clock stands still: exactly the margin is left.)"""
    async with FakeApiServer(token=TOKEN) as api:
        serve_policy(api)
        async with webhook_on(api, material, tmp_path, deadline_margin_s=1.0) as webhook:
            await watched(webhook, api)
            with api.withheld(), caplog.at_level(logging.WARNING, logger="webhook.source"):
                fresh = api.put(JOBS, job("fresh"))["metadata"]["uid"]
                answer = await webhook.review(
                    pod_review("fresh", fresh, JOB_CONTROLLER), waits="1s"
                )

    assert answer["allowed"] is False
    assert "asks for 64 GPUs" in answer["status"]["message"]
    assert api.requests_of("get") == [], "no lookup"
    said = [r for r in caplog.records if "no time left to look up" in r.getMessage()]
    assert len(said) == 1
