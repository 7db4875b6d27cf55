"""The webhook's queue policy kept current by real informers on Kueue's API paths.

A cluster admin who adds a LocalQueue or changes a quota expects the next review to see
it, with no restart: this drives a fake kube-apiserver over a real socket and checks
the policy the webhook would decide with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.clock import ManualClock
from cluster.files import load_objects
from cluster.informer import Backoff
from cluster.kube import KubeClient, KubeConfig
from tests.fakeapi import FakeApiServer
from webhook.queues import Policy
from webhook.source import KUEUE_RESOURCES, PolicyStore, policy_informers

POLICY = Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml"
PLURAL = {
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}


def path_of(obj: dict[str, Any]) -> str:
    if obj["kind"] == "ResourceQuota":
        return "/api/v1/resourcequotas"
    return f"/apis/kueue.x-k8s.io/v1beta2/{PLURAL[obj['kind']]}"


async def eventually(store: PolicyStore, check: Callable[[Policy], bool]) -> Policy:
    async with asyncio.timeout(5):
        while True:
            policy = store.current()
            if policy is not None and check(policy):
                return policy
            await asyncio.sleep(0.01)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        for obj in load_objects(POLICY):
            server.put(path_of(obj), obj)
        yield server


@pytest.fixture
async def store(api: FakeApiServer) -> AsyncIterator[PolicyStore]:
    store = PolicyStore(ManualClock())
    async with KubeClient(KubeConfig.explicit(api.url)) as client:
        informers = policy_informers(store, client, backoff=Backoff(initial_s=0.01, cap_s=0.05))
        tasks = [asyncio.create_task(informer.run()) for informer in informers]
        try:
            yield store
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_policy_appears_once_every_kueue_resource_is_listed(
    store: PolicyStore,
) -> None:
    policy = await eventually(store, lambda p: True)
    assert store.synced
    assert len(KUEUE_RESOURCES) == 5
    assert policy.local_queue("team-nlp", "team-nlp-queue") is not None
    assert policy.cluster_queue("research") is not None
    assert [q.hard for q in policy.quotas_in("team-quota")] == [16, 50]


async def test_a_new_local_queue_and_a_new_quota_are_seen_without_restart(
    api: FakeApiServer, store: PolicyStore
) -> None:
    await eventually(store, lambda p: True)
    api.put(
        path_of({"kind": "LocalQueue"}),
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"namespace": "team-nlp", "name": "late-queue"},
            "spec": {"clusterQueue": "research"},
        },
    )
    policy = await eventually(store, lambda p: p.local_queue("team-nlp", "late-queue") is not None)
    assert "late-queue" in policy.queues_in("team-nlp")

    api.delete(path_of({"kind": "LocalQueue"}), "team-nlp/late-queue")
    await eventually(store, lambda p: p.local_queue("team-nlp", "late-queue") is None)

    queues = path_of({"kind": "ClusterQueue"})
    research = api.objects(queues)["research"]
    for group in research["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                if flavor["name"] == "h100-reserved" and resource["name"] == "nvidia.com/gpu":
                    resource["nominalQuota"] = 40
    api.put(queues, research)
    policy = await eventually(
        store, lambda p: p.limit("research", "h100-reserved", "nvidia.com/gpu").nominal == 40_000
    )
    assert policy.limit("research", "h100-reserved", "nvidia.com/gpu").total > 40_000


async def test_a_namespace_quota_changed_is_seen_without_restart(
    api: FakeApiServer, store: PolicyStore
) -> None:
    await eventually(store, lambda p: True)
    quotas = "/api/v1/resourcequotas"
    quota = api.objects(quotas)["team-quota/gpus"]
    quota["spec"]["hard"]["requests.nvidia.com/gpu"] = "4"
    api.put(quotas, quota)
    await eventually(store, lambda p: p.quotas_in("team-quota")[0].hard == 4)
    api.delete(quotas, "team-quota/gpus")
    await eventually(store, lambda p: p.quotas_in("team-quota") == ())
