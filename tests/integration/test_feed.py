"""The cache fed by real informers from a fake kube-apiserver on a real socket.

What a user of the extender would notice: GPUs held by bound pods are not free, GPUs of
finished or deleted pods come back, a pod that uses no GPU costs nothing, and a dropped
watch loses nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cluster import jsonio
from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.feed import NODES_PATH, PODS_PATH, CacheFeed, run_all
from cluster.informer import Backoff
from cluster.kube import KubeClient, KubeConfig
from cluster.model import NodeName, PodKey
from cluster.snapshot import Snapshot
from tests.builders import RACK_LABEL, node_json, pod_json
from tests.fakeapi import FakeApiServer


def free_by_gpu(snapshot: Snapshot, node: str) -> list[int]:
    return [gpu.free_milli for gpu in snapshot.nodes[NodeName(node)].gpus]


async def eventually(cache: ClusterCache, check: Callable[[Snapshot], bool]) -> Snapshot:
    async with asyncio.timeout(5):
        # The cache has no change signal by design (readers take snapshots), so poll.
        while not check(cache.snapshot()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return cache.snapshot()


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def fed(api: FakeApiServer) -> AsyncIterator[ClusterCache]:
    cache = ClusterCache(ManualClock())
    feed = CacheFeed(cache, levels=(RACK_LABEL,))
    async with KubeClient(KubeConfig.explicit(api.url)) as client:
        informers = feed.informers(client, backoff=Backoff(initial_s=0.01, cap_s=0.05))
        task = asyncio.create_task(run_all(informers))
        try:
            async with asyncio.timeout(5):
                for informer in informers:
                    await informer.wait_synced()
            yield cache
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.fixture
def seeded(api: FakeApiServer) -> FakeApiServer:
    api.put(NODES_PATH, node_json("gpu-a", rack="r1", islands="0-3,4-7"))
    api.put(NODES_PATH, node_json("gpu-b", rack="r2"))
    api.put(PODS_PATH, pod_json("train-0", gpus=4, node="gpu-a", gpu_indices="4,5,6,7"))
    api.put(PODS_PATH, pod_json("share-0", gpu_milli=300, node="gpu-b", gpu_indices="2"))
    api.put(PODS_PATH, pod_json("pending-0", gpus=2))
    api.put(PODS_PATH, pod_json("cpu-only", cpu="2"))
    return api


async def test_initial_list_rebuilds_every_allocation(
    seeded: FakeApiServer, fed: ClusterCache
) -> None:
    snapshot = fed.snapshot()
    assert free_by_gpu(snapshot, "gpu-a") == [1000] * 4 + [0] * 4
    assert free_by_gpu(snapshot, "gpu-b") == [1000, 1000, 700] + [1000] * 5
    assert snapshot.nodes[NodeName("gpu-a")].domains == {RACK_LABEL: "r1"}
    assert PodKey("team-nlp/pending-0") in snapshot.pods
    assert PodKey("team-nlp/cpu-only") not in snapshot.pods


async def test_watch_events_move_gpus(seeded: FakeApiServer, fed: ClusterCache) -> None:
    seeded.put(PODS_PATH, pod_json("pending-0", gpus=2, node="gpu-b", gpu_indices="0,1"))
    snapshot = await eventually(fed, lambda s: free_by_gpu(s, "gpu-b")[0] == 0)
    assert free_by_gpu(snapshot, "gpu-b") == [0, 0, 700] + [1000] * 5

    # A finished pod stops matching the live-pods selector: the watch says DELETED.
    seeded.put(
        PODS_PATH,
        pod_json("train-0", gpus=4, node="gpu-a", gpu_indices="4,5,6,7", phase="Succeeded"),
    )
    await eventually(fed, lambda s: free_by_gpu(s, "gpu-a") == [1000] * 8)

    seeded.delete(PODS_PATH, "team-nlp/share-0")
    await eventually(fed, lambda s: free_by_gpu(s, "gpu-b") == [0, 0] + [1000] * 6)

    seeded.delete(NODES_PATH, "gpu-a")
    await eventually(fed, lambda s: NodeName("gpu-a") not in s.nodes)


async def test_a_dropped_watch_loses_nothing(seeded: FakeApiServer, fed: ClusterCache) -> None:
    seeded.drop_watches()
    for i in range(3):
        seeded.put(PODS_PATH, pod_json(f"late-{i}", gpus=1, node="gpu-b", gpu_indices=str(3 + i)))
    snapshot = await eventually(fed, lambda s: free_by_gpu(s, "gpu-b")[3:6] == [0, 0, 0])
    assert free_by_gpu(snapshot, "gpu-b") == [1000, 1000, 700, 0, 0, 0, 1000, 1000]


async def test_standalone_file_gives_the_same_cache(seeded: FakeApiServer, tmp_path: Path) -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": list(seeded.objects(NODES_PATH).values())
        + list(seeded.objects(PODS_PATH).values()),
    }
    path = tmp_path / "cluster.json"
    path.write_bytes(jsonio.dumps(listing))
    cache = ClusterCache(ManualClock())
    assert CacheFeed(cache, levels=(RACK_LABEL,)).load_file(path) == (2, 4)
    assert free_by_gpu(cache.snapshot(), "gpu-a") == [1000] * 4 + [0] * 4
    assert free_by_gpu(cache.snapshot(), "gpu-b") == [1000, 1000, 700] + [1000] * 5
