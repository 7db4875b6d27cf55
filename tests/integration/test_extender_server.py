"""The extender as kube-scheduler meets it: HTTP(S) on a real socket.

What a cluster admin or kube-scheduler would notice: the captured exchanges get the
captured answers; 200 binds racing for three nodes never hand a GPU out twice, even when
the watch breaks in the middle; a pod just bound is counted by the very next /filter;
bad bodies get a 400 with a reason and logical problems an ``Error``; the server is not
ready before it has listed the cluster; metrics are there; only kube-scheduler's
certificate gets in with mutual TLS; and ``python -m extender`` refuses to start on bad
certificates or an exposed plain-HTTP address, with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import logging
import os
import re
import ssl
import subprocess
import sys
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from cluster import jsonio, logs
from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.pods import pod_from_json
from cluster.feed import NODES_PATH, PODS_PATH
from cluster.labels import GPU_INDICES
from cluster.model import Allocation, NodeName, PodKey
from extender import wire
from extender.app import CACHE, create_app
from extender.binder import Binder, MemoryBinder
from extender.flavors import FLAVORS_PATH
from extender.settings import ExtenderSettings, parse_levels
from loadtest.ports import free_port
from server.serving import DEBUG_ROUTES, EXPOSITION, GUARD, metrics_app, running
from server.tls import CertReloader, client_context
from tests.binders import FailingBinder, GatedBinder
from tests.builders import RACK_LABEL, node_json, pod_json
from tests.certfiles import MTLS_CLIENTS, Material, make_material
from tests.fakeapi import FakeApiServer, Fault, write_kubeconfig
from tests.processes import server_main, wait_ready

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT.parent / "shared" / "captures"
NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
LEVELS_TEXT = f"rack={RACK_LABEL},hostname=kubernetes.io/hostname"
LEVELS = parse_levels(LEVELS_TEXT)
TOKEN = "extender-test-token"
WAIT_S = 15.0


# ---------------------------------------------------------------- builders


def captured(name: str) -> Any:
    path = CAPTURES / name
    if not path.is_file():
        pytest.skip(f"captures not found at {CAPTURES} (the shared folder beside the repo)")
    return jsonio.loads(path.read_bytes())


def capture_cluster(folder: Path) -> Path:
    """The cluster the captures were recorded on, as ``kubectl get nodes,pods -A -o
    json`` lists it: node gpu-a exactly as captures/022 shows it, gpu-b its twin, and
    the three pending pods exactly as kube-scheduler sent them."""
    gpu_a: dict[str, Any] = {"kind": "Node", "apiVersion": "v1"}
    gpu_a.update(captured("022-ext-full-filter-request.json")["body"]["Nodes"]["items"][0])
    gpu_b = copy.deepcopy(gpu_a)
    gpu_b["metadata"]["name"] = gpu_b["metadata"]["labels"]["kubernetes.io/hostname"] = "gpu-b"
    gpu_b["metadata"]["uid"] = "e27135de-4f3a-5422-9266-9471417e5573"
    pods = []
    for name in ("008-ext-cache-filter", "013-ext-cache-filter", "022-ext-full-filter"):
        pod: dict[str, Any] = {"kind": "Pod", "apiVersion": "v1"}
        pod.update(captured(f"{name}-request.json")["body"]["Pod"])
        pods.append(pod)
    path = folder / "cluster.json"
    listing = {"apiVersion": "v1", "kind": "List", "items": [gpu_a, gpu_b, *pods]}
    path.write_bytes(jsonio.dumps(listing))
    return path


def cluster_file(folder: Path, objects: Iterable[Mapping[str, Any]]) -> Path:
    path = folder / "cluster.json"
    path.write_bytes(jsonio.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    return path


def filter_args(pod: Mapping[str, Any], names: Iterable[str]) -> bytes:
    return wire.encode_extender_args(pod, node_names=list(names))


def bind_args(pod: Mapping[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    return wire.encode_binding_args(meta["namespace"], meta["name"], meta["uid"], node)


def key_of(pod: Mapping[str, Any]) -> PodKey:
    return PodKey(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")


# ---------------------------------------------------------------- the server under test


@dataclass
class Extender:
    url: str
    session: aiohttp.ClientSession
    app: web.Application
    metrics_url: str = ""

    @property
    def cache(self) -> ClusterCache:
        return self.app[CACHE]

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {"Content-Type": "application/json", **(headers or {})}
        async with self.session.post(self.url + path, data=body, headers=sent) as response:
            return response.status, jsonio.loads(await response.read())

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.text()

    async def metrics(self) -> str:
        """The metrics page, from the listener of its own (never the serving port)."""
        async with self.session.get(self.metrics_url + "/metrics", ssl=False) as response:
            assert response.status == 200
            return await response.text()

    async def replay(self, capture: str) -> tuple[int, Any]:
        """A captured request as kube-scheduler sent it: path, body and its headers."""
        request = captured(f"{capture}-request.json")
        kept = ("User-Agent", "Content-Type", "Accept-Encoding")
        headers = {k: v for k, v in request["headers"].items() if k in kept}
        return await self.post(request["path"], jsonio.dumps(request["body"]), headers)

    async def ready(self) -> None:
        async with asyncio.timeout(WAIT_S):
            # readiness is only visible over HTTP, as a kubelet probe sees it
            while (await self.get("/readyz"))[0] != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def serving(
    settings: ExtenderSettings,
    *,
    server_tls: ssl.SSLContext | None = None,
    client_tls: ssl.SSLContext | None = None,
    cache: ClusterCache | None = None,
    binder: Binder | None = None,
    clock: ManualClock | None = None,
) -> AsyncIterator[Extender]:
    clock = clock or ManualClock(NOW)
    app = create_app(settings, cache=cache, binder=binder, clock=clock)
    metrics = metrics_app(app[EXPOSITION], clock, app.get(DEBUG_ROUTES))
    async with (
        running(app, "127.0.0.1", 0, server_tls, shutdown_grace_s=1.0) as port,
        running(metrics, "127.0.0.1", 0) as metrics_port,
    ):
        url = f"https://localhost:{port}" if server_tls else f"http://127.0.0.1:{port}"
        connector = aiohttp.TCPConnector(limit=20, ssl=client_tls or True)
        async with aiohttp.ClientSession(connector=connector) as session:
            yield Extender(url, session, app, f"http://127.0.0.1:{metrics_port}")


def file_extender(
    tmp_path: Path, objects: Iterable[Mapping[str, Any]], **overrides: Any
) -> tuple[ExtenderSettings, ManualClock, ClusterCache]:
    settings = ExtenderSettings(
        cluster_file=cluster_file(tmp_path, objects), topology_levels=LEVELS, **overrides
    )
    clock = ManualClock(NOW)
    return settings, clock, ClusterCache(clock, settings.assume_ttl_s)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        yield server


@contextlib.asynccontextmanager
async def api_extender(
    api: FakeApiServer, folder: Path, *, max_cache_age_s: float = 30.0, **kwargs: Any
) -> AsyncIterator[Extender]:
    settings = ExtenderSettings(
        kubeconfig=write_kubeconfig(folder, api, "extender"),
        topology_levels=LEVELS,
        max_cache_age_s=max_cache_age_s,
    )
    async with serving(settings, **kwargs) as ext:
        await ext.ready()
        yield ext


async def eventually(check: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            # The cache has no change signal by design (readers take snapshots): poll.
            while not check():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"never happened: {what}")


# ---------------------------------------------------------------- the captured exchanges


async def test_captured_exchanges_replayed_over_http_get_the_captured_answers(
    tmp_path: Path,
) -> None:
    settings = ExtenderSettings(cluster_file=capture_cluster(tmp_path), topology_levels=LEVELS)
    clock = ManualClock(NOW)
    cache = ClusterCache(clock)
    gate = GatedBinder(MemoryBinder(cache))
    async with serving(settings, cache=cache, binder=gate, clock=clock) as ext:
        assert await ext.replay("008-ext-cache-filter") == (
            200,
            captured("009-ext-cache-filter-response.json"),
        )
        status, scores = await ext.replay("010-ext-cache-prioritize")
        assert status == 200
        assert_captured_priority_shape(scores, "011-ext-cache-prioritize-response.json")

        # captures/013: the second pod's /filter arrives before the first /bind is answered
        first_bind = asyncio.create_task(ext.replay("012-ext-cache-bind"))
        async with asyncio.timeout(WAIT_S):
            await gate.entered.wait()
        assert await ext.replay("013-ext-cache-filter") == (
            200,
            captured("014-ext-cache-filter-response.json"),
        )
        status, scores = await ext.replay("015-ext-cache-prioritize")
        assert status == 200
        assert_captured_priority_shape(scores, "016-ext-cache-prioritize-response.json")
        gate.release.set()
        assert await first_bind == (200, captured("017-ext-cache-bind-response.json"))
        assert await ext.replay("018-ext-cache-bind") == (
            200,
            captured("019-ext-cache-bind-response.json"),
        )

        # the full-Node profile (nodeCacheCapable: false); NodeNames is null on the wire
        status, body = await ext.replay("022-ext-full-filter")
        assert body.pop("NodeNames") is None
        assert (status, body) == (200, captured("023-ext-full-filter-response.json"))
        assert await ext.replay("024-ext-full-bind") == (
            200,
            captured("025-ext-full-bind-response.json"),
        )

    pods = cache.snapshot().pods
    placed = {key: (pods[key].node, pods[key].gpu_indices) for key in pods}
    assert placed == {
        "team-nlp/finetune-cslh4-lmxmr": ("gpu-b", (0, 1, 2, 3)),
        "team-nlp/finetune-cslh4-sdskf": ("gpu-b", (4, 5, 6, 7)),
        "team-nlp/notebook": ("gpu-a", (0,)),
    }
    assert cache.snapshot().assumed == frozenset()


def assert_captured_priority_shape(ours: list[dict[str, Any]], capture: str) -> None:
    """Same hosts in the same order, same keys; the scores are ours, not the recorder's."""
    theirs = captured(capture)
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs]
    assert [e["Host"] for e in ours] == [e["Host"] for e in theirs]
    assert all(isinstance(e["Score"], int) and 0 <= e["Score"] <= 10 for e in ours)


async def test_a_pod_known_only_from_its_filter_request_can_be_bound(tmp_path: Path) -> None:
    """kube-scheduler may bind a pod before the extender's watch (or file) shows it."""
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a", rack="r1")])
    newcomer = pod_json("newcomer-0", gpus=2)
    async with serving(settings, cache=cache, clock=clock) as ext:
        assert (await ext.post("/filter", filter_args(newcomer, ["gpu-a"])))[1]["NodeNames"] == [
            "gpu-a"
        ]
        assert await ext.post("/bind", bind_args(newcomer, "gpu-a")) == (200, {"Error": ""})
    bound = cache.snapshot().pods[key_of(newcomer)]
    assert (bound.node, len(bound.gpu_indices)) == ("gpu-a", 2)


async def test_choosing_in_filter_names_one_node_and_packs_the_next_pod_beside_the_last(
    tmp_path: Path,
) -> None:
    nodes = [node_json("gpu-a", rack="r1"), node_json("gpu-b", rack="r1")]
    settings, clock, cache = file_extender(tmp_path, nodes, choose_in_filter=True)
    first, second = pod_json("half-0", gpus=4), pod_json("half-1", gpus=4)
    async with serving(settings, cache=cache, clock=clock) as ext:
        # two empty nodes, equal: the first named
        status, answer = await ext.post("/filter", filter_args(first, ["gpu-b", "gpu-a"]))
        assert (status, answer["NodeNames"], answer["FailedNodes"]) == (200, ["gpu-b"], {})
        assert await ext.post("/bind", bind_args(first, "gpu-b")) == (200, {"Error": ""})
        # gpu-b now has 4 GPUs left: the next 4-GPU pod fills it, though named last
        status, answer = await ext.post("/filter", filter_args(second, ["gpu-a", "gpu-b"]))
        assert (status, answer["NodeNames"]) == (200, ["gpu-b"])
        # a pod that prefers something only kube-scheduler scores is left its choice
        prefers = pod_json("spread-0", gpus=1)
        prefers["spec"]["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "ScheduleAnyway"}
        ]  # fmt: skip
        status, answer = await ext.post("/filter", filter_args(prefers, ["gpu-a", "gpu-b"]))
        assert (status, answer["NodeNames"]) == (200, ["gpu-a", "gpu-b"])


# ---------------------------------------------------------------- bind and the cache


async def test_filter_right_after_bind_counts_the_pod_before_the_watch_shows_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a", rack="r1"))
    first = api.put(PODS_PATH, pod_json("big-0", gpus=8))
    second = api.put(PODS_PATH, pod_json("big-1", gpus=8))
    async with api_extender(api, tmp_path) as ext:
        with api.withheld():  # the watch lags: nothing reaches the extender's cache
            assert await ext.post("/bind", bind_args(first, "gpu-a")) == (200, {"Error": ""})
            assert api.objects(PODS_PATH)["team-nlp/big-0"]["spec"]["nodeName"] == "gpu-a"
            status, result = await ext.post("/filter", filter_args(second, ["gpu-a"]))
        assert status == 200
        assert result["NodeNames"] == []
        assert "in use" in result["FailedNodes"]["gpu-a"]
        assert ext.cache.snapshot().assumed == {key_of(first)}


@pytest.mark.parametrize(
    ("uncertain", "freed_at_once"),
    [
        pytest.param(False, True, id="refused-bind-forgets-at-once"),
        pytest.param(True, False, id="maybe-bound-stays-until-the-ttl"),
    ],
)
async def test_a_failed_bind_gives_its_gpus_back(
    tmp_path: Path, uncertain: bool, freed_at_once: bool
) -> None:
    settings, clock, cache = file_extender(
        tmp_path, [node_json("gpu-a", rack="r1")], assume_ttl_s=30, expire_interval_s=0.01
    )
    first, second = pod_json("big-0", gpus=8), pod_json("big-1", gpus=8)
    binder = FailingBinder(uncertain)
    async with serving(settings, cache=cache, binder=binder, clock=clock) as ext:
        await ext.post("/filter", filter_args(first, ["gpu-a"]))
        status, answer = await ext.post("/bind", bind_args(first, "gpu-a"))
        assert status == 200
        assert "injected" in answer["Error"]

        async def fits() -> bool:
            result = (await ext.post("/filter", filter_args(second, ["gpu-a"])))[1]
            return bool(result["NodeNames"] == ["gpu-a"])

        assert await fits() is freed_at_once
        clock.advance(31)
        async with asyncio.timeout(WAIT_S):
            while not await fits():  # noqa: ASYNC110 - the expiry shows only in answers
                await asyncio.sleep(0.02)


async def test_a_bind_repeated_while_under_way_waits_for_the_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-scheduler repeats a bind after its httpTimeout; the pod is bound once."""
    caplog.set_level(logging.INFO, logger="extender.binding")
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a"), node_json("gpu-b")])
    pod = pod_json("slow-0", gpus=4)
    gate = GatedBinder(MemoryBinder(cache))
    async with serving(settings, cache=cache, binder=gate, clock=clock) as ext:
        await ext.post("/filter", filter_args(pod, ["gpu-a", "gpu-b"]))
        first = asyncio.create_task(ext.post("/bind", bind_args(pod, "gpu-a")))
        async with asyncio.timeout(WAIT_S):
            await gate.entered.wait()
        again = asyncio.create_task(ext.post("/bind", bind_args(pod, "gpu-a")))
        await eventually(
            lambda: any(r.message == "bind repeated while under way" for r in caplog.records),
            "the repeated bind reached the server",
        )
        elsewhere = await ext.post("/bind", bind_args(pod, "gpu-b"))
        assert "already being bound to node gpu-a" in elsewhere[1]["Error"]
        gate.release.set()
        assert await first == await again == (200, {"Error": ""})
    assert len(gate.calls) == 1


# ---------------------------------------------------------------- kube-scheduler's httpTimeout


async def send_slowly(ext: Extender, path: str, body: bytes, meanwhile: Callable[[], None]) -> Any:
    """POST ``body`` in two parts; ``meanwhile`` runs once the request is under way."""
    port = int(ext.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body[:10])
    await eventually(lambda: ext.app[GUARD].in_flight == 1, "the request is under way")
    meanwhile()
    writer.write(body[10:])
    status_line = await reader.readline()
    headers = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
    length = int(headers.split("content-length:")[1].split("\r\n")[0])
    answer = jsonio.loads(await reader.readexactly(length))
    writer.close()
    return int(status_line.split()[1]), answer


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
async def test_a_verb_too_late_for_kube_scheduler_is_answered_504_undecided(
    tmp_path: Path, verb: str
) -> None:
    pod = pod_json("train-0", gpus=8)
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a"), pod])
    gate = GatedBinder(MemoryBinder(cache))
    body = bind_args(pod, "gpu-a") if verb == "bind" else filter_args(pod, ["gpu-a"])
    async with serving(settings, cache=cache, binder=gate, clock=clock) as ext:
        # kube-scheduler waits httpTimeout (5 s) from when it sent the request
        status, answer = await send_slowly(ext, f"/{verb}", body, lambda: clock.advance(5.0))
        text = await ext.metrics()
    assert status == 504
    assert answer["reason"] == "Timeout"
    assert f'tessera_extender_decisions_total{{result="shed",verb="{verb}"}} 1.0' in text
    assert 'tessera_extender_shed_requests_total{reason="deadline"} 1.0' in text
    # a bind refused whole: nothing planned, assumed or posted
    assert gate.calls == []
    assert cache.counters().assumed == 0
    assert cache.snapshot().nodes[NodeName("gpu-a")].whole_free == 8


async def test_a_bind_under_way_when_its_deadline_passes_is_carried_out_whole(
    tmp_path: Path,
) -> None:
    pod = pod_json("train-0", gpus=8)
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a"), pod])
    gate = GatedBinder(MemoryBinder(cache))
    async with serving(settings, cache=cache, binder=gate, clock=clock) as ext:
        binding = asyncio.create_task(ext.post("/bind", bind_args(pod, "gpu-a")))
        async with asyncio.timeout(WAIT_S):
            await gate.entered.wait()
        clock.advance(60)  # long past kube-scheduler's patience: the bind is half done
        gate.release.set()
        assert await binding == (200, {"Error": ""})
    assert [p.pod.key for p in gate.calls] == [key_of(pod)]


# ---------------------------------------------------------------- racing binds


def gpu_use(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """Milli-GPUs per (node, GPU index), from bound pods and their gpu-indices."""
    use: dict[tuple[str, int], int] = defaultdict(int)
    for obj in pods:
        pod = pod_from_json(obj)
        if pod.node is None:
            continue
        assert pod.gpu_indices, f"{pod.key} is bound without {GPU_INDICES}"
        for index in pod.gpu_indices:
            use[(pod.node, index)] += pod.demand.milli_per_gpu
    return use


SHAPES: tuple[tuple[int, int], ...] = ((1, 0), (2, 0), (4, 0), (0, 300), (0, 500))
"""(whole GPUs, milli of one GPU) of the racing pods, in turn."""


@pytest.mark.parametrize("drops_after", [(), (40, 120)], ids=["steady-watch", "watch-drops"])
async def test_200_concurrent_binds_never_give_a_gpu_twice(
    api: FakeApiServer, tmp_path: Path, drops_after: tuple[int, ...]
) -> None:
    names = ["gpu-0", "gpu-1", "gpu-2"]
    for name in names:
        api.put(NODES_PATH, node_json(name, rack="r1", islands="0-3,4-7"))
    pods = []
    for i in range(200):
        gpus, milli = SHAPES[i % len(SHAPES)]
        pods.append(api.put(PODS_PATH, pod_json(f"race-{i}", gpus=gpus, gpu_milli=milli)))
    answered = 0

    async with api_extender(api, tmp_path) as ext:

        async def schedule(i: int, pod: dict[str, Any]) -> tuple[PodKey, str, str]:
            """What kube-scheduler does for one pod: filter, pick a node, bind."""
            nonlocal answered
            result = (await ext.post("/filter", filter_args(pod, names)))[1]
            fits = result["NodeNames"]
            # a loser's filter may find nothing left: it binds anyway, to race
            node = fits[i % len(fits)] if fits else names[i % len(names)]
            status, answer = await ext.post("/bind", bind_args(pod, node))
            assert status == 200
            answered += 1
            if answered in drops_after:
                api.drop_watches()
            return key_of(pod), node, answer["Error"]

        results = await asyncio.gather(*(schedule(i, pod) for i, pod in enumerate(pods)))

        stored = api.objects(PODS_PATH)
        assert max(gpu_use(stored.values()).values()) <= 1000
        winners = {key: node for key, node, error in results if not error}
        losers = [(key, error) for key, _, error in results if error]
        assert winners
        assert losers
        assert all("cannot bind" in error for _, error in losers)
        for key, node in winners.items():
            assert stored[key]["spec"]["nodeName"] == node
        for key, _ in losers:
            assert "nodeName" not in stored[key]["spec"]
            assert GPU_INDICES not in stored[key]["metadata"].get("annotations", {})
        # losers were refused from the cache, before any API call
        bindings = [r for r in api.requests_of("post") if r.path.endswith("/binding")]
        assert len(bindings) == len(winners)

        # once the watch has caught up, the cache holds exactly what the API holds
        await eventually(lambda: not ext.cache.snapshot().assumed, "every bind confirmed")
        snapshot = ext.cache.snapshot()
        truth = {}
        for key in winners:
            pod = pod_from_json(stored[key])
            assert pod.node is not None
            truth[key] = Allocation(pod.node, pod.gpu_indices, pod.demand.milli_per_gpu)
        assert {key: snapshot.allocations[key] for key in truth} == truth
        assert set(snapshot.allocations) == set(truth)
        assert snapshot.assumed == frozenset()


async def test_a_bind_is_one_binding_carrying_the_gpus_and_the_pod_is_never_patched(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    async with api_extender(api, tmp_path) as ext:
        assert await ext.post("/bind", bind_args(pod, "gpu-a")) == (200, {"Error": ""})
        # the watch shows the pod bound with its GPUs: the assumption is confirmed by it
        await eventually(lambda: not ext.cache.snapshot().assumed, "the watch confirms the bind")
        assert ext.cache.snapshot().allocations[key_of(pod)].indices == (0, 1)
    writes = [r for r in api.requests if r.kind not in ("list", "watch")]
    assert [(r.kind, r.path) for r in writes] == [
        ("post", "/api/v1/namespaces/team-nlp/pods/train-0/binding")
    ]
    (post,) = writes
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    uid = pod["metadata"]["uid"]
    # DefaultBinder's Binding, with the GPU indices for kube-apiserver to copy onto the pod
    assert post.json() == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "train-0",
            "namespace": "team-nlp",
            "uid": uid,
            "annotations": {GPU_INDICES: "0,1"},
        },
        "target": {"kind": "Node", "name": "gpu-a"},
    }
    stored = api.objects(PODS_PATH)["team-nlp/train-0"]
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert stored["metadata"]["annotations"][GPU_INDICES] == "0,1"


async def test_a_refused_binding_is_an_error_and_frees_the_gpus(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=8))
    async with api_extender(api, tmp_path) as ext:
        api.faults.append(Fault("post", 403, "Forbidden", "binding is forbidden"))
        status, answer = await ext.post("/bind", bind_args(pod, "gpu-a"))
        assert status == 200
        assert "forbidden" in answer["Error"]
        assert ext.cache.snapshot().assumed == frozenset()
        result = (await ext.post("/filter", filter_args(pod, ["gpu-a"])))[1]
        assert result["NodeNames"] == ["gpu-a"]
    assert GPU_INDICES not in api.objects(PODS_PATH)["team-nlp/train-0"]["metadata"].get(
        "annotations", {}
    )


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b'{"Pod": {', "not valid JSON", id="truncated"),
        pytest.param(b"", "not valid JSON", id="empty"),
        pytest.param(b'[{"Pod": {}}]', "JSON array", id="array"),
        pytest.param(b'"filter"', "JSON string", id="string"),
    ],
)
async def test_a_body_that_is_no_extender_request_gets_400_with_a_reason(
    tmp_path: Path, path: str, body: bytes, reason: str
) -> None:
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a")])
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, answer = await ext.post(path, body)
        assert status == 400
        assert reason in answer["Error"]
        assert (await ext.get("/healthz"))[0] == 200


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
async def test_a_body_that_does_not_inflate_gets_400_not_500(
    tmp_path: Path, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by tests/fuzz: aiohttp inflates a gzip body as the handler reads it, and
    raised out of the handler when it could not (kube-scheduler sends plain JSON)."""
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a")])
    async with serving(settings, cache=cache, clock=clock) as ext:
        headers = {"Content-Encoding": "gzip"}
        status, answer = await ext.post(path, zlib.compress(b"{}"), headers)
        assert status == 400
        assert "cannot be read as gzip" in answer["Error"]
        assert (await ext.get("/healthz"))[0] == 200
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_body_whose_deflate_stream_ends_unfinished_is_answered(tmp_path: Path) -> None:
    """Found by tests/fuzz, once in a few hundred inputs over TLS: aiohttp fails to
    inflate only at the body's end, and the handler, already waiting, was never told, so
    the request held a slot of --max-in-flight for good. Every byte came, so the guard's
    body deadline does not apply; the handler's read has the same deadline of its own."""
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a")])
    settings = settings.model_copy(update={"body_timeout_s": 0.5})
    async with serving(settings, cache=cache, clock=clock) as ext:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(ext.url.rsplit(":")[-1]))
        body = zlib.compress(b'{"Pod": {}}')[:3]  # a zlib header, and no end
        writer.write(
            b"POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Encoding: deflate\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        await writer.drain()
        # the handler starts on the headers; the body comes in a later read
        await asyncio.sleep(0.1)
        writer.write(body)
        await writer.drain()
        try:
            async with asyncio.timeout(5):
                answer = await reader.read()  # the server closes the connection after it
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 400")
        assert b"request body not read to its end within 0.5 s" in answer


async def test_full_nodes_nested_deeper_than_the_answer_can_repeat_get_400(
    tmp_path: Path,
) -> None:
    """Found by tests/fuzz: the answer to a /filter with full Nodes repeats the fitting
    items as received, and orjson writes at most 254 levels of nesting though it reads
    1024; such a node was a 500."""
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a")])
    node = node_json("gpu-a")
    node["status"]["nested"] = "nested-here"
    body = wire.encode_extender_args(pod_json("train-0", gpus=1), nodes=[node])
    body = body.replace(jsonio.dumps("nested-here"), b"[" * 300 + b"]" * 300)
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, answer = await ext.post("/filter", body)
        assert status == 400
        assert "nested more than 254 levels" in answer["Error"]
        assert (await ext.get("/healthz"))[0] == 200


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        pytest.param(
            "/bind",
            wire.encode_binding_args("team-nlp", "ghost-0", "0000", "gpu-a"),
            "not in the extender's cache",
            id="bind-unknown-pod",
        ),
        pytest.param(
            "/bind",
            bind_args(pod_json("train-0", gpus=1), "gpu-z"),
            "node gpu-z is not in the extender's cache",
            id="bind-unknown-node",
        ),
        pytest.param(
            "/filter",
            wire.encode_extender_args(pod_json("train-0", gpus=1)),
            "names no nodes",
            id="filter-without-candidates",
        ),
    ],
)
async def test_a_logical_problem_is_200_with_error(
    tmp_path: Path, path: str, body: bytes, expected: str
) -> None:
    settings, clock, cache = file_extender(
        tmp_path, [node_json("gpu-a"), pod_json("train-0", gpus=1)]
    )
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, answer = await ext.post(path, body)
    assert status == 200
    assert expected in answer["Error"]


async def test_an_unknown_candidate_is_unresolvable(tmp_path: Path) -> None:
    settings, clock, cache = file_extender(tmp_path, [node_json("gpu-a")])
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, result = await ext.post(
            "/filter", filter_args(pod_json("train-0", gpus=1), ["gpu-a", "gpu-z"])
        )
    assert status == 200
    assert result["NodeNames"] == ["gpu-a"]
    assert "not in the extender's cache" in result["FailedAndUnresolvableNodes"]["gpu-z"]


# ---------------------------------------------------------------- readiness and metrics


async def test_not_ready_until_nodes_and_pods_are_listed(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=1))
    listing = asyncio.Event()

    async def hold(_: object) -> None:
        await listing.wait()

    api.before_list = hold
    settings = ExtenderSettings(kubeconfig=write_kubeconfig(tmp_path, api, "extender"))
    async with serving(settings) as ext:
        assert (await ext.get("/readyz"))[0] == 503
        status, answer = await ext.post("/filter", filter_args(pod, ["gpu-a"]))
        assert status == 503
        assert "not synced" in answer["Error"]
        kept = gc.get_freeze_count()
        listing.set()
        await ext.ready()
        status, result = await ext.post("/filter", filter_args(pod, ["gpu-a"]))
        assert (status, result["NodeNames"]) == (200, ["gpu-a"])
        # what was listed is kept out of the collector's full passes
        assert gc.get_freeze_count() > kept


# The fake API server ends its watches after their timeoutSeconds of real time, which
# proves it is there: a limit of 300 s makes that 100 s at least, far beyond the test.
QUIET_LIMIT_S = 300.0


async def test_a_stale_cache_is_not_ready_and_is_neither_filtered_nor_bound_from(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    clock = ManualClock(NOW)
    async with api_extender(api, tmp_path, max_cache_age_s=QUIET_LIMIT_S, clock=clock) as ext:
        assert await ext.get("/readyz") == (200, "ok")
        # kube-apiserver says nothing on either watch for longer than the limit
        clock.advance(QUIET_LIMIT_S + 1)
        status, reason = await ext.get("/readyz")
        assert status == 503
        for resource in ("nodes", "pods"):
            assert f"the {resource} watch last heard from kube-apiserver 301 s ago" in reason
        assert "--max-cache-age 300" in reason

        status, answer = await ext.post("/filter", filter_args(pod, ["gpu-a"]))
        assert status == 200, "an Error kube-scheduler retries the pod after"
        assert "stale" in answer["Error"]
        assert "the nodes watch last heard from kube-apiserver 301 s ago" in answer["Error"]
        status, answer = await ext.post("/bind", bind_args(pod, "gpu-a"))
        assert status == 200
        assert "stale" in answer["Error"]
        assert ext.cache.snapshot().assumed == frozenset()
        assert api.requests_of("post") == [], "nothing was bound"
        # no opinion from a stale cache: kube-scheduler scores without the extender, and
        # preemption is retried rather than evict victims chosen on an old view
        for verb in ("/prioritize", "/preempt"):
            status, answer = await ext.post(verb, filter_args(pod, ["gpu-a"]))
            assert status == 503
            assert "stale" in answer["Error"]
        metrics = await ext.metrics()
        assert 'tessera_extender_cache_age_seconds{resource="nodes"} 301.0' in metrics
        assert 'tessera_extender_cache_age_seconds{resource="pods"} 301.0' in metrics
        assert 'tessera_extender_decisions_total{result="stale",verb="bind"} 1.0' in metrics

        # the server speaks again (a bookmark on each watch): ready, and binds resume
        api.send_bookmark()
        await ext.ready()
        assert await ext.post("/bind", bind_args(pod, "gpu-a")) == (200, {"Error": ""})
    assert api.objects(PODS_PATH)["team-nlp/train-0"]["spec"]["nodeName"] == "gpu-a"


@pytest.mark.parametrize("verb", ["filter", "bind"])
async def test_a_verb_too_late_is_answered_504_before_a_stale_cache_refuses_it(
    api: FakeApiServer, tmp_path: Path, verb: str
) -> None:
    """kube-scheduler has given up on a request past its httpTimeout: it gets the 504 of
    a shed request whatever the cache, and only one still on time hears that the cache
    is stale."""
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    body = bind_args(pod, "gpu-a") if verb == "bind" else filter_args(pod, ["gpu-a"])
    clock = ManualClock(NOW)
    async with api_extender(api, tmp_path, max_cache_age_s=QUIET_LIMIT_S, clock=clock) as ext:
        clock.advance(QUIET_LIMIT_S + 1)
        late = await send_slowly(ext, f"/{verb}", body, lambda: clock.advance(5.0))
        on_time = await ext.post(f"/{verb}", body)
        text = await ext.metrics()
    assert late[0] == 504
    assert late[1]["reason"] == "Timeout"
    assert on_time[0] == 200
    assert "stale" in on_time[1]["Error"]
    assert f'tessera_extender_decisions_total{{result="shed",verb="{verb}"}} 1.0' in text
    assert f'tessera_extender_decisions_total{{result="stale",verb="{verb}"}} 1.0' in text
    assert api.requests_of("post") == [], "nothing was bound"


async def test_without_a_cache_age_limit_an_old_cache_is_served(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    pod = api.put(PODS_PATH, pod_json("train-0", gpus=2))
    clock = ManualClock(NOW)
    async with api_extender(api, tmp_path, max_cache_age_s=0, clock=clock) as ext:
        clock.advance(3600)
        assert await ext.get("/readyz") == (200, "ok")
        status, result = await ext.post("/filter", filter_args(pod, ["gpu-a"]))
        assert (status, result["NodeNames"]) == (200, ["gpu-a"])
        metrics = await ext.metrics()
    assert 'tessera_extender_cache_age_seconds{resource="pods"} 3600.0' in metrics


async def test_the_watches_ask_for_bookmarks_and_end_within_the_cache_age_limit(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    async with api_extender(api, tmp_path, max_cache_age_s=30) as ext:
        await eventually(lambda: len(api.requests_of("watch")) == 3, "the three watches open")
        assert await ext.get("/readyz") == (200, "ok")
    assert {w.path for w in api.requests_of("watch")} == {NODES_PATH, PODS_PATH, FLAVORS_PATH}
    for watch in api.requests_of("watch"):
        assert watch.query["allowWatchBookmarks"] == "true"
        assert 10 <= int(watch.query["timeoutSeconds"]) < 20


async def test_metrics_report_verbs_reasons_assumptions_and_gpus(tmp_path: Path) -> None:
    first, second = pod_json("big-0", gpus=8), pod_json("share-0", gpu_milli=250)
    settings, clock, cache = file_extender(
        tmp_path, [node_json("gpu-a", islands="0-3,4-7"), node_json("gpu-b"), first, second]
    )
    gate = GatedBinder(MemoryBinder(cache))
    async with serving(settings, cache=cache, binder=gate, clock=clock) as ext:
        await ext.post("/filter", filter_args(first, ["gpu-a", "gpu-b"]))
        await ext.post("/prioritize", filter_args(first, ["gpu-a", "gpu-b"]))
        binding = asyncio.create_task(ext.post("/bind", bind_args(first, "gpu-b")))
        async with asyncio.timeout(WAIT_S):
            await gate.entered.wait()
        await ext.post("/filter", filter_args(first, ["gpu-a", "gpu-b"]))
        await ext.post("/filter", b"garbage")
        while_binding = await ext.metrics()
        gate.release.set()
        await binding
        await ext.post("/bind", bind_args(second, "gpu-a"))
        text = await ext.metrics()

    assert "tessera_extender_assumed_pods 1.0" in while_binding
    assert "tessera_extender_assumed_pods 0.0" in text
    for verb in ("filter", "prioritize", "bind"):
        assert f'tessera_extender_request_seconds_bucket{{le="0.001",verb="{verb}"}}' in text
        assert f'tessera_extender_decision_seconds_count{{verb="{verb}"}}' in text
    assert 'tessera_extender_decisions_total{result="ok",verb="filter"} 2.0' in text
    assert 'tessera_extender_decisions_total{result="bad_request",verb="filter"} 1.0' in text
    assert 'tessera_extender_decisions_total{result="ok",verb="bind"} 2.0' in text
    assert 'tessera_extender_filter_nodes_total{result="fit"} 3.0' in text
    assert 'tessera_extender_filter_nodes_total{result="failed"} 1.0' in text
    assert 'tessera_extender_filter_reasons_total{reason="gpus_in_use"} 1.0' in text
    assert 'tessera_extender_assumptions_total{outcome="confirmed"} 2.0' in text
    h100 = 'product="NVIDIA-H100-80GB-HBM3"'
    assert f'tessera_extender_gpus{{{h100},state="total"}} 16.0' in text
    assert f'tessera_extender_gpus{{{h100},state="allocated"}} 8.25' in text
    assert f'tessera_extender_gpus{{{h100},state="free"}} 7.75' in text
    assert f'tessera_extender_gpus{{{h100},state="whole_free"}} 7.0' in text
    assert f"tessera_extender_gpu_fragmentation_ratio{{{h100}}} {0.75 / 7.75}" in text
    assert "tessera_extender_bind_api_seconds_count 2.0" in text


async def test_a_filtered_pod_s_reasons_read_back_from_the_metrics_listener(
    tmp_path: Path,
) -> None:
    """What ``tessera why`` reads: the last /filter of a pod, grouped, on the metrics
    listener only; the capacity figures beside it, as Prometheus parses them."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    }
    big, busy = pod_json("big-0", gpus=8), pod_json("busy", gpus=4, node="gpu-b")
    busy["metadata"]["annotations"] = {GPU_INDICES: "0,1,2,3"}
    objects = [
        node_json("gpu-a", unhealthy="5"),
        node_json("gpu-b", rack="r1"),
        node_json("gpu-c", drain_after="2026-11-29T20:00:00Z"),
        busy,
        big,
        flavor,
    ]
    settings, clock, cache = file_extender(tmp_path, objects)
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, body = await ext.post("/filter", filter_args(big, ["gpu-a", "gpu-b", "gpu-c"]))
        assert (status, body["NodeNames"]) == (200, [])
        clock.advance(5)
        await ext.post("/filter", filter_args(big, ["gpu-a", "gpu-b", "gpu-c"]))
        page = ext.metrics_url + "/debug/reasons?pod=team-nlp/big-0,team-nlp/nobody"
        async with ext.session.get(page) as response:
            assert response.status == 200
            shown = jsonio.loads(await response.read())
        assert (await ext.get("/debug/reasons?pod=team-nlp/big-0"))[0] == 404
        async with ext.session.get(ext.metrics_url + "/debug/reasons") as response:
            assert response.status == 400
        async with ext.session.get(ext.metrics_url + "/debug/reasons?pod=../etc") as response:
            assert response.status == 400
        text = await ext.metrics()

    record, missing = shown["pods"]
    assert missing == {"pod": "team-nlp/nobody", "found": False}
    assert (record["pod"], record["filters"], record["candidates"], record["fit"]) == (
        "team-nlp/big-0",
        2,
        3,
        0,
    )
    assert (record["first_filtered"], record["last_filtered"]) == (
        "2026-11-29T18:28:00Z",
        "2026-11-29T18:28:05Z",
    )
    reasons = {
        r["category"]: (r["nodes"], r["resolvable"], r["examples"]) for r in record["reasons"]
    }
    assert reasons == {
        "too_few_gpus": (1, False, ["gpu-a"]),
        "island": (1, True, ["gpu-b"]),
        "maintenance": (1, False, ["gpu-c"]),
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    h100 = (("flavor", "h100"), ("product", "NVIDIA-H100-80GB-HBM3"))
    assert samples[("tessera_extender_capacity_gpus", (*h100, ("state", "free")))] == 19
    assert samples[("tessera_extender_capacity_gpus", (*h100, ("state", "draining")))] == 8
    cluster_gang = (("level", "cluster"), ("product", "NVIDIA-H100-80GB-HBM3"))
    assert samples[("tessera_extender_largest_gang_pods", cluster_gang)] == 0


# ---------------------------------------------------------------- the learned pod mix


def mostly_single_gpu_cluster() -> list[dict[str, Any]]:
    """Two free 8-GPU nodes that differ only in CPU (48 and 128 cores) and a third one
    running two 1-GPU 12-core pods; eight more of those and two 2-GPU 24-core pods wait."""
    typical: dict[str, Any] = {"gpus": 1, "cpu": "12"}
    return [
        node_json("gpu-a", cpu="48"),
        node_json("gpu-b", cpu="128"),
        node_json("gpu-c", cpu="64"),
        pod_json("run-0", node="gpu-c", gpu_indices="0", phase="Running", **typical),
        pod_json("run-1", node="gpu-c", gpu_indices="1", phase="Running", **typical),
        *(pod_json(f"wait-{i}", **typical) for i in range(8)),
        *(pod_json(f"pair-{i}", gpus=2, cpu="24") for i in range(2)),
    ]


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


async def scraped(ext: Extender, name: str, value: float) -> str:
    """The first /metrics page where gauge ``name`` shows ``value``."""
    async with asyncio.timeout(WAIT_S):
        while True:
            text = await ext.metrics()
            if gauge(text, name) == value:
                return text
            # the mix is only visible as Prometheus scrapes it: poll
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("mix", ["learned", "default"])
async def test_a_server_packs_for_the_pod_mix_its_cluster_runs(tmp_path: Path, mix: str) -> None:
    settings, clock, cache = file_extender(tmp_path, mostly_single_gpu_cluster(), pod_mix=mix)
    # a CPU-heavy pod: 24 cores on gpu-a leave 24 for the seven GPUs still free there,
    # enough for two of the cluster's 12-core pods; on gpu-b all seven stay usable
    heavy = pod_json("heavy-0", gpus=1, cpu="24")
    async with serving(settings, cache=cache, clock=clock) as ext:
        text = await ext.metrics()
        status, answer = await ext.post("/prioritize", filter_args(heavy, ["gpu-a", "gpu-b"]))

    assert status == 200
    scores = {entry["Host"]: entry["Score"] for entry in answer}
    if mix == "learned":
        # learned before the first request: 1 GPU x 12 cores and 2 GPUs x 24 cores
        assert gauge(text, "tessera_extender_pod_mix_sizes") == 2
        assert gauge(text, "tessera_extender_pod_mix_pods") == 12
        assert scores["gpu-b"] > scores["gpu-a"]
    else:
        # the built-in mix asks for no CPU: both nodes look the same
        assert gauge(text, "tessera_extender_pod_mix_sizes") == 6
        assert gauge(text, "tessera_extender_pod_mix_pods") == 0
        assert scores["gpu-b"] == scores["gpu-a"]


def gang_cluster() -> list[dict[str, Any]]:
    """Racks r1 (a1, a2) and r2 (b1, b2) of 8-GPU nodes, and in r1 a gang of two 4-GPU
    members: r1 has room for two more such members, r2 for four."""
    running = [
        pod_json(
            f"old-{i}",
            gpus=4,
            gang="team-nlp.old",
            gang_size=2,
            topology="required:rack",
            node=node,
            gpu_indices="0,1,2,3",
            phase="Running",
        )
        for i, node in enumerate(["a1", "a2"])
    ]
    racks = {"a1": "r1", "a2": "r1", "b1": "r2", "b2": "r2"}
    return [*(node_json(name, rack=rack) for name, rack in racks.items()), *running]


@pytest.mark.parametrize("mix", ["learned", "default"])
async def test_a_server_prepares_its_gang_shapes_before_their_first_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mix: str
) -> None:
    caplog.set_level(logging.INFO, logger="extender.learning")
    settings, clock, cache = file_extender(tmp_path, gang_cluster(), pod_mix=mix)
    # a new gang of the running one's shape, of three members: only r2 holds them
    first = pod_json("new-0", gpus=4, gang="team-nlp.new", gang_size=3, topology="required:rack")
    async with serving(settings, cache=cache, clock=clock) as ext:
        prepared = [r for r in caplog.records if r.message == "gang shapes prepared"]
        status, result = await ext.post("/filter", filter_args(first, ["a1", "a2", "b1", "b2"]))
    # as an operator reads it with --log-json
    assert [jsonio.loads(logs.JsonFormatter().format(r))["shapes"] for r in prepared] == [1]
    assert status == 200
    assert result["NodeNames"] == ["b1", "b2"]
    assert set(result["FailedNodes"]) == {"a1", "a2"}
    assert "rack has room for 2 members" in result["FailedNodes"]["a1"]


async def test_the_mix_is_learned_again_as_the_workload_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="extender.learning")
    settings, clock, cache = file_extender(
        tmp_path, mostly_single_gpu_cluster(), pod_mix_interval_s=0.05
    )
    async with serving(settings, cache=cache, clock=clock) as ext:
        assert gauge(await ext.metrics(), "tessera_extender_pod_mix_sizes") == 2
        # what the watch would add: a wave of 8-GPU jobs
        for i in range(12):
            cache.upsert_pod(pod_from_json(pod_json(f"big-{i}", gpus=8, cpu="96")))
        text = await scraped(ext, "tessera_extender_pod_mix_pods", 24)
    assert gauge(text, "tessera_extender_pod_mix_sizes") == 3
    assert gauge(text, "tessera_extender_pod_mix_changes_total") == 2
    # as an operator reads them with --log-json
    lines = [jsonio.loads(logs.JsonFormatter().format(r)) for r in caplog.records]
    learned = [
        (line["level"], line["sizes"], line["pods"])
        for line in lines
        if line["event"] == "pod mix learned"
    ]
    assert learned == [("info", 2, 12), ("info", 3, 24)]


async def test_a_watching_server_learns_its_mix_once_the_informers_have_listed(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put(NODES_PATH, node_json("gpu-a"))
    for i in range(3):
        api.put(PODS_PATH, pod_json(f"train-{i}", gpus=4, cpu="32"))
    settings = ExtenderSettings(
        kubeconfig=write_kubeconfig(tmp_path, api, "extender"), pod_mix_interval_s=3600
    )
    async with serving(settings) as ext:
        await ext.ready()
        # long before the first interval ends
        text = await scraped(ext, "tessera_extender_pod_mix_pods", 3)
    assert gauge(text, "tessera_extender_pod_mix_sizes") == 1


async def test_a_watching_server_prepares_its_gang_shapes_once_the_informers_have_listed(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="extender.learning")
    for item in gang_cluster():
        api.put(NODES_PATH if item["kind"] == "Node" else PODS_PATH, item)
    settings = ExtenderSettings(
        kubeconfig=write_kubeconfig(tmp_path, api, "extender"),
        topology_levels=LEVELS,
        pod_mix="default",
    )
    async with serving(settings) as ext:
        await ext.ready()
        await eventually(
            lambda: any(r.message == "gang shapes prepared" for r in caplog.records),
            "the gang shapes were prepared",
        )


# ---------------------------------------------------------------- mutual TLS


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return make_material(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Material:
    """Certificates from another CA, with the very same names."""
    return make_material(tmp_path_factory.mktemp("other-ca"))


def mtls_settings(material: Material, cluster: Path) -> ExtenderSettings:
    return ExtenderSettings(
        tls_cert=material["extender.crt"],
        tls_key=material["extender.key"],
        client_ca=material["ca-bundle.crt"],
        cluster_file=cluster,
        topology_levels=LEVELS,
    )


@pytest.mark.parametrize(("client", "accepted"), MTLS_CLIENTS)
async def test_mutual_tls_lets_only_kube_scheduler_in(
    material: Material,
    stranger: Material,
    tmp_path: Path,
    client: Callable[[Material, Material], ssl.SSLContext],
    accepted: bool,
) -> None:
    settings = mtls_settings(material, capture_cluster(tmp_path))
    served = CertReloader(
        material["extender.crt"], material["extender.key"], client_ca=material["ca-bundle.crt"]
    )
    async with serving(
        settings, server_tls=served.context, client_tls=client(material, stranger)
    ) as ext:
        if accepted:
            assert await ext.replay("008-ext-cache-filter") == (
                200,
                captured("009-ext-cache-filter-response.json"),
            )
        else:
            with pytest.raises(aiohttp.ClientError):
                await ext.replay("008-ext-cache-filter")


# ---------------------------------------------------------------- python -m extender


def main_env(**extra: str) -> dict[str, str]:
    """This process's environment without extender settings or an in-cluster API
    address, plus ``extra``."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TESSERA_EXTENDER_", "KUBERNETES_SERVICE_"))
    }
    return {**clean, **extra}


def run_main(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extender", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=main_env(**(env or {})),
    )


def test_main_refuses_a_mismatched_key_with_one_line_naming_the_file(
    material: Material, tmp_path: Path
) -> None:
    result = run_main(
        "--tls-cert",
        str(material["extender.crt"]),
        "--tls-key",
        str(material["webhook.key"]),
        "--cluster-file",
        str(cluster_file(tmp_path, [node_json("gpu-a")])),
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert str(material["webhook.key"]) in result.stderr


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(("--host", "0.0.0.0"), {}, id="flag"),
        pytest.param((), {"TESSERA_EXTENDER_HOST": "10.1.2.3"}, id="environment"),
    ],
)
def test_main_refuses_plain_http_on_a_non_loopback_address(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    cluster = str(cluster_file(tmp_path, [node_json("gpu-a")]))
    result = run_main(*args, "--cluster-file", cluster, env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "refusing plain HTTP" in result.stderr


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(("--cluster-file", "{tmp}/nope.yaml"), "{tmp}/nope.yaml", id="cluster-file"),
        pytest.param(("--kubeconfig", "{tmp}/nope"), "{tmp}/nope", id="kubeconfig"),
        pytest.param((), "KUBERNETES_SERVICE_HOST", id="in-cluster-outside-a-cluster"),
    ],
)
def test_main_without_a_usable_cluster_source_says_which(
    tmp_path: Path, source: tuple[str, ...], expected: str
) -> None:
    args = [arg.format(tmp=tmp_path) for arg in source]
    result = run_main("--port", str(free_port()), *args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m extender: ")
    assert expected.format(tmp=tmp_path) in last


async def test_main_serves_a_cluster_file_over_mutual_tls_and_stops_on_sigterm(
    material: Material, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    context = client_context(
        material["ca.crt"], material["kube-scheduler.crt"], material["kube-scheduler.key"]
    )
    async with server_main(
        "extender",
        "--port",
        str(port),
        "--tls-cert",
        str(material["extender.crt"]),
        "--tls-key",
        str(material["extender.key"]),
        "--client-ca",
        str(material["ca-bundle.crt"]),
        "--cluster-file",
        str(capture_cluster(tmp_path)),
        env=main_env(
            TESSERA_EXTENDER_TOPOLOGY_LEVELS=LEVELS_TEXT,
            TESSERA_EXTENDER_METRICS_PORT=str(metrics_port),
            # a bind that lands is logged at DEBUG only (a line per pod costs CPU)
            TESSERA_EXTENDER_LOG_LEVEL="DEBUG",
        ),
    ) as server:
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_ready(session, f"https://localhost:{port}/readyz")
            ext = Extender(
                f"https://localhost:{port}",
                session,
                web.Application(),
                f"http://127.0.0.1:{metrics_port}",
            )
            assert await ext.replay("008-ext-cache-filter") == (
                200,
                captured("009-ext-cache-filter-response.json"),
            )
            assert await ext.replay("012-ext-cache-bind") == (
                200,
                captured("017-ext-cache-bind-response.json"),
            )
            assert (await ext.get("/metrics"))[0] == 404
            metrics = await ext.metrics()
        assert await server.stop() == 0
    # the full collection made before serving, whose survivors are kept out of later ones
    full = re.search(r'tessera_extender_gc_pause_seconds_count{generation="2"} (\S+)', metrics)
    assert full is not None
    assert float(full.group(1)) >= 1
    logged = server.logged
    assert "serving" in logged
    assert "bound pod=team-nlp/finetune-cslh4-lmxmr node=gpu-b gpus=0,1,2,3" in logged
