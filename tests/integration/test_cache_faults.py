"""Faults between kube-apiserver and the caches the two servers decide from (issue 20).

Every informer-fed cache (the extender's nodes and pods, the webhook's Kueue policy and
the uids of Jobs) meets four faults from a fake kube-apiserver over real sockets: its
watch cut mid-stream, a 410 Gone on its watch, a slow relist, and kube-apiserver
unreachable for a while (connections refused) and then back. Objects change on the
server while each lasts. What a cluster admin would notice is checked: the cache ends
equal to the server, changes made while its watch was down included; readiness tells
the truth meanwhile (the extender's /readyz turns 503 naming the watch once kube-apiserver
has not been heard on it for --max-cache-age, and 200 once it has been heard again; the
webhook's says 503 until its policy is first complete, then serves its last complete
policy); and the time the cache took to converge once kube-apiserver answered again is
printed (``converged:`` lines, seen with ``pytest -s``) and held to a generous bound.

The extender's clock is injected, so its staleness comes from moving the clock, never
from waiting. The informers back off in real time (0.5 s, doubling), and that is what the
convergence times measure. Draining on SIGTERM is the serving layer's, tested with the
webhook in ``test_webhook_server.py`` (``test_sigterm_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web

from cluster.clock import ManualClock, SystemClock
from cluster.feed import NODES_PATH, PODS_PATH
from cluster.files import load_objects
from cluster.labels import GPU_INDICES, GPU_RESOURCE
from extender.app import CACHE, SOURCE
from extender.settings import ExtenderSettings
from tests.builders import node_json, pod_json
from tests.certfiles import Material, make_material
from tests.fakeapi import FakeApiServer, Recorded, write_kubeconfig
from tests.integration import test_extender_server as extender_tests
from tests.integration import test_webhook_owners as owner_tests
from tests.integration.test_extender_server import LEVELS, NOW, bind_args, serving
from tests.integration.test_webhook_owners import JOBS, NS, job, webhook_on
from tests.integration.test_webhook_policy_watch import POLICY, path_of
from webhook.app import OWNERS, STORE
from webhook.owners import OwnerKey, OwnerKind

LIMIT_S = 300.0
"""The extender's --max-cache-age. The fake API server ends a watch after its
timeoutSeconds of real time, which is hearing from it: at this limit that is 100 s at
least, far beyond any of these tests, so only the injected clock makes a watch stale."""
CONVERGE_BOUND_S = 10.0
"""Generous: once kube-apiserver answers again, an informer tries within its current
backoff delay, a second or two after the two failed attempts (0.5 s, then 1 s) these
tests wait for, and a list of a few objects takes milliseconds."""
WAIT_S = 15.0
LOCAL_QUEUES = path_of({"kind": "LocalQueue"})

Obj = dict[str, Any]
View = Mapping[str, object]
ListHook = Callable[[Recorded], Awaitable[None]]


# ---------------------------------------------------------------- the servers under test


@dataclass
class Under:
    """One server under test, the fake kube-apiserver it watches, and its clock."""

    kind: Literal["extender", "webhook"]
    api: FakeApiServer
    app: web.Application
    session: aiohttp.ClientSession
    url: str
    clock: ManualClock
    watches: int
    """How many watches it keeps open."""

    async def readyz(self) -> tuple[int, str]:
        async with self.session.get(self.url + "/readyz") as response:
            return response.status, await response.text()

    async def post(self, path: str, body: bytes) -> Obj:
        async with self.session.post(self.url + path, data=body) as response:
            assert response.status == 200
            answer: Obj = await response.json(content_type=None)
            return answer


@contextlib.asynccontextmanager
async def extender_on(api: FakeApiServer, folder: Path) -> AsyncIterator[Under]:
    settings = ExtenderSettings(
        kubeconfig=write_kubeconfig(folder, api, "extender"),
        topology_levels=LEVELS,
        max_cache_age_s=LIMIT_S,
    )
    clock = ManualClock(NOW)
    async with serving(settings, clock=clock) as ext:
        # Its watches: nodes and pods (its cache), and ResourceFlavors (metrics' labels only)
        yield Under("extender", api, ext.app, ext.session, ext.url, clock, watches=3)


@contextlib.asynccontextmanager
async def webhook_under(
    api: FakeApiServer, material: Material, folder: Path
) -> AsyncIterator[Under]:
    async with webhook_on(api, material, folder) as webhook:
        # The webhook's readiness reads no clock; this one only keeps the faults uniform.
        # Its watches: the five Kueue resources, ResourceQuotas and Jobs (the fake serves no
        # JobSet API).
        clock = ManualClock(NOW)
        yield Under("webhook", api, webhook.app, webhook.session, webhook.url, clock, watches=7)


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            # The caches have no change signal (readers take what is there): poll.
            while not await check():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"never happened: {what}")


# ---------------------------------------------------------------- the caches


@dataclass(frozen=True)
class Cache:
    """One informer-fed cache: what its server starts with, a change that adds, modifies
    and deletes one object each, and the view of it a user would notice, as the server
    holds it and as the cache does."""

    name: str
    server: Literal["extender", "webhook"]
    collections: tuple[str, ...]
    seed: Callable[[FakeApiServer], None]
    change: Callable[[FakeApiServer], None]
    on_server: Callable[[FakeApiServer], View]
    in_cache: Callable[[web.Application], View]
    unready_until_listed: str | None
    """What /readyz says while the cache's first list is under way (None: ready)."""

    @property
    def resources(self) -> frozenset[str]:
        """The informers' resource names, as their log lines give them."""
        return frozenset(path.rsplit("/", 1)[-1] for path in self.collections)

    def converged(self, under: Under) -> bool:
        return self.in_cache(under.app) == self.on_server(under.api)


def seed_extender(api: FakeApiServer) -> None:
    for name in ("gpu-a", "gpu-b"):
        api.put(NODES_PATH, node_json(name))
    api.put(PODS_PATH, pod_json("train-0", gpus=2, node="gpu-a", gpu_indices="0,1"))
    api.put(PODS_PATH, pod_json("train-1", gpus=2))
    api.put(PODS_PATH, pod_json("train-2", gpus=2))


def change_nodes(api: FakeApiServer) -> None:
    api.put(NODES_PATH, node_json("gpu-c"))
    api.put(NODES_PATH, node_json("gpu-a", gpus=4))
    api.delete(NODES_PATH, "gpu-b")


def nodes_on_server(api: FakeApiServer) -> View:
    return {
        name: int(node["status"]["allocatable"][GPU_RESOURCE])
        for name, node in api.objects(NODES_PATH).items()
    }


def nodes_in_cache(app: web.Application) -> View:
    return {name: len(node.gpus) for name, node in app[CACHE].snapshot().nodes.items()}


def change_pods(api: FakeApiServer) -> None:
    api.put(PODS_PATH, pod_json("train-9", gpus=2))
    api.put(PODS_PATH, pod_json("train-1", gpus=2, node="gpu-b", gpu_indices="2,3"))
    api.delete(PODS_PATH, "team-nlp/train-2")


def pods_on_server(api: FakeApiServer) -> View:
    view: dict[str, object] = {}
    for key, pod in api.objects(PODS_PATH).items():
        indices = (pod["metadata"].get("annotations") or {}).get(GPU_INDICES, "")
        view[key] = (
            pod["spec"].get("nodeName") or None,
            tuple(int(i) for i in indices.split(",") if i),
        )
    return view


def pods_in_cache(app: web.Application) -> View:
    return {key: (pod.node, pod.gpu_indices) for key, pod in app[CACHE].snapshot().pods.items()}


def seed_webhook(api: FakeApiServer) -> None:
    for obj in load_objects(POLICY):
        api.put(path_of(obj), obj)
    for name in ("finetune", "pretrain"):
        api.put(JOBS, job(name))


def local_queue(name: str, cluster_queue: str) -> Obj:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"clusterQueue": cluster_queue},
    }


def change_policy(api: FakeApiServer) -> None:
    api.put(LOCAL_QUEUES, local_queue("late-queue", "research"))
    api.put(LOCAL_QUEUES, local_queue("default", "sandbox"))
    api.delete(LOCAL_QUEUES, f"{NS}/team-nlp-queue")


def policy_on_server(api: FakeApiServer) -> View:
    return {key: lq["spec"]["clusterQueue"] for key, lq in api.objects(LOCAL_QUEUES).items()}


def policy_in_cache(app: web.Application) -> View:
    policy = app[STORE].current()
    if policy is None:
        return {}
    return {f"{ns}/{name}": lq.cluster_queue for (ns, name), lq in policy.local_queues.items()}


JOB_NAMES = ("finetune", "pretrain", "late")


def change_jobs(api: FakeApiServer) -> None:
    api.put(JOBS, job("late"))
    # made again under the same name: a new uid, which the pods it makes will name
    api.delete(JOBS, f"{NS}/pretrain")
    api.put(JOBS, job("pretrain"))
    api.delete(JOBS, f"{NS}/finetune")


def jobs_on_server(api: FakeApiServer) -> View:
    jobs = api.objects(JOBS)
    return {
        name: jobs[f"{NS}/{name}"]["metadata"]["uid"] if f"{NS}/{name}" in jobs else None
        for name in JOB_NAMES
    }


def jobs_in_cache(app: web.Application) -> View:
    view = app[OWNERS].view()
    return {name: view.uid(OwnerKey(OwnerKind.JOB, NS, name)) for name in JOB_NAMES}


CACHES = [
    Cache("nodes", "extender", (NODES_PATH,), seed_extender, change_nodes,
          nodes_on_server, nodes_in_cache, "cluster cache not synced yet"),
    Cache("pods", "extender", (PODS_PATH,), seed_extender, change_pods,
          pods_on_server, pods_in_cache, "cluster cache not synced yet"),
    Cache("Kueue policy", "webhook",
          (*(path_of({"kind": k}) for k in owner_tests.KUEUE), path_of({"kind": "ResourceQuota"})),
          seed_webhook, change_policy, policy_on_server, policy_in_cache,
          "queue policy not synced yet"),
    # Ready without it: an owner the watch has not seen is looked up with one GET.
    Cache("owner uids", "webhook", (JOBS,), seed_webhook, change_jobs,
          jobs_on_server, jobs_in_cache, None),
]  # fmt: skip


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


@contextlib.asynccontextmanager
async def started(
    cache: Cache, folder: Path, material: Material, hold: ListHook | None = None
) -> AsyncIterator[Under]:
    """The cache's server on a fake kube-apiserver seeded for it (its lists passed
    through ``hold`` first, when given)."""
    token = extender_tests.TOKEN if cache.server == "extender" else owner_tests.TOKEN
    async with FakeApiServer(token=token) as api:
        cache.seed(api)
        api.before_list = hold
        if cache.server == "extender":
            server = extender_on(api, folder)
        else:
            server = webhook_under(api, material, folder)
        async with server as under:
            yield under


# ---------------------------------------------------------------- the faults


class ListGate:
    """Holds the lists of some collections until opened: a slow list, however long the
    test's clock says it took."""

    def __init__(self, collections: tuple[str, ...]) -> None:
        self.collections = collections
        self.held = asyncio.Event()
        self.open = asyncio.Event()

    async def __call__(self, request: Recorded) -> None:
        if request.path in self.collections:
            self.held.set()
            await self.open.wait()


async def assert_ready(under: Under) -> None:
    assert await under.readyz() == (200, "ok")


async def heard_on_the_other_watches(under: Under, cache: Cache) -> None:
    """After the clock jumped: a bookmark on every open watch, so that only the cache's
    own watch, which is not open, stays unheard."""
    under.api.send_bookmark()
    if under.kind != "extender":
        return  # the webhook keeps no ages
    informers = under.app[SOURCE].informers

    async def heard() -> bool:
        return all(i.age_s() == 0 for i in informers if i.resource not in cache.resources)

    await eventually(heard, "the bookmark heard on the other watches")


def assert_stale(reason: str, resources: frozenset[str]) -> None:
    """The extender's 503: exactly the watches of ``resources`` named as unheard."""
    for resource in ("nodes", "pods"):
        named = f"the {resource} watch last heard from kube-apiserver 301 s ago" in reason
        assert named == (resource in resources), reason
    assert f"--max-cache-age {LIMIT_S:g}" in reason


@dataclass(frozen=True)
class Fault:
    """Brings the fault on, changes the cache's objects on the server while it lasts,
    checks what readiness says meanwhile, and returns once kube-apiserver answers again."""

    act: Callable[[Under, Cache, list[logging.LogRecord]], Awaitable[None]]
    relists: bool
    """Whether the cache has to list again (or can resume its watch)."""


async def cut_mid_stream(under: Under, cache: Cache, logged: list[logging.LogRecord]) -> None:
    """The watch's connection breaks after the first of the changes."""
    for collection in cache.collections:
        under.api.drop_watches(after_events=1, collection=collection)
    cache.change(under.api)
    # a moment without the watch is well within --max-cache-age
    await assert_ready(under)


async def gone(under: Under, cache: Cache, logged: list[logging.LogRecord]) -> None:
    """The watch falls behind a compaction: a 410 Gone, after changes it never carried."""
    with under.api.withheld():
        cache.change(under.api)
    under.api.compact()
    for collection in cache.collections:
        under.api.expire_watches(collection)
    await assert_ready(under)


async def slow_relist(under: Under, cache: Cache, logged: list[logging.LogRecord]) -> None:
    """The relist after a 410 takes longer than --max-cache-age to arrive."""
    before = cache.in_cache(under.app)
    gate = ListGate(cache.collections)
    under.api.before_list = gate
    try:
        await gone(under, cache, logged)
        await gate.held.wait()
        under.clock.advance(LIMIT_S + 1)
        await heard_on_the_other_watches(under, cache)
        status, reason = await under.readyz()
        if under.kind == "extender":
            assert status == 503, reason
            assert_stale(reason, cache.resources)
        else:
            # no limit on the policy's age: the last complete one is served meanwhile
            assert (status, reason) == (200, "ok")
        assert cache.in_cache(under.app) == before, "the old state, whole, until the list is in"
    finally:
        gate.open.set()


async def unreachable(under: Under, cache: Cache, logged: list[logging.LogRecord]) -> None:
    """kube-apiserver goes away: the open watches break and every connection is refused,
    for two attempts of each of the cache's informers; then it comes back, its watch
    cache begun afresh (a 410 for a watch from before)."""
    since = len(logged)
    await under.api.go_down()
    cache.change(under.api)  # through another kube-apiserver, into the same etcd

    async def refused_twice() -> bool:
        failed = [
            r.tessera_fields["resource"]  # type: ignore[attr-defined]
            for r in logged[since:]
            if r.levelno == logging.WARNING and r.name == "cluster.informer"
        ]
        return all(failed.count(resource) >= 2 for resource in cache.resources)

    await eventually(refused_twice, "two failed attempts of each of the cache's informers")
    under.clock.advance(LIMIT_S + 1)
    status, reason = await under.readyz()
    if under.kind == "extender":
        assert status == 503, reason
        assert_stale(reason, frozenset({"nodes", "pods"}))
        # and nothing is decided from the old view
        answer = await under.post("/bind", bind_args(pod_json("train-1", gpus=2), "gpu-a"))
        assert "stale" in answer["Error"]
        assert under.app[CACHE].snapshot().assumed == frozenset()
    else:
        assert (status, reason) == (200, "ok")
    await under.api.come_back()


FAULTS = {
    "watch cut mid-stream": Fault(cut_mid_stream, relists=False),
    "410 Gone on the watch": Fault(gone, relists=True),
    "slow relist": Fault(slow_relist, relists=True),
    "kube-apiserver unreachable": Fault(unreachable, relists=True),
}


def requests_to(api: FakeApiServer, kind: str, cache: Cache) -> int:
    return sum(1 for r in api.requests_of(kind) if r.path in cache.collections)


async def converged_and_ready(under: Under, cache: Cache) -> float:
    """Seconds until the cache equals the server and the server is ready."""
    clock = SystemClock()
    began = clock.monotonic()

    async def done() -> bool:
        return cache.converged(under) and (await under.readyz())[0] == 200

    await eventually(done, f"the {cache.name} cache equal to the server, and ready")
    return clock.monotonic() - began


@pytest.mark.parametrize("fault", FAULTS, ids=str)
@pytest.mark.parametrize("cache", CACHES, ids=lambda c: c.name)
async def test_a_cache_converges_after_a_fault_and_readiness_tells_the_truth_meanwhile(
    cache: Cache,
    fault: str,
    tmp_path: Path,
    material: Material,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cluster.informer")
    async with started(cache, tmp_path, material) as under:

        async def settled() -> bool:
            return (
                under.api.watchers == under.watches
                and cache.converged(under)
                and (await under.readyz())[0] == 200
            )

        await eventually(settled, "listed, every watch open, and ready")
        before = cache.on_server(under.api)
        lists = requests_to(under.api, "list", cache)
        watches = requests_to(under.api, "watch", cache)

        await FAULTS[fault].act(under, cache, caplog.records)
        took = await converged_and_ready(under, cache)

        assert cache.on_server(under.api) != before, "the fault came with changes"
        relisted = requests_to(under.api, "list", cache) > lists
        assert relisted == FAULTS[fault].relists
        assert requests_to(under.api, "watch", cache) > watches
    print(
        f"converged: {cache.server} {cache.name} after {fault}: {took:.3f} s "
        "after kube-apiserver answered again"
    )
    assert took < CONVERGE_BOUND_S


@pytest.mark.parametrize("cache", CACHES, ids=lambda c: c.name)
async def test_readiness_waits_for_a_slow_first_list(
    cache: Cache, tmp_path: Path, material: Material
) -> None:
    gate = ListGate(cache.collections)
    async with started(cache, tmp_path, material, hold=gate) as under:
        try:
            await gate.held.wait()
            # the list takes longer than --max-cache-age; the other watches are heard
            others = under.watches - len(cache.collections)

            async def others_open() -> bool:
                return under.api.watchers == others

            await eventually(others_open, "the other watches open")
            under.clock.advance(LIMIT_S + 1)
            await heard_on_the_other_watches(under, cache)
            status, reason = await under.readyz()
        finally:
            gate.open.set()
        took = await converged_and_ready(under, cache)
    if cache.unready_until_listed is None:
        assert (status, reason) == (200, "ok")
    else:
        assert (status, reason) == (503, cache.unready_until_listed)
    print(f"converged: {cache.server} {cache.name} after a slow first list: {took:.3f} s")
    assert took < CONVERGE_BOUND_S
