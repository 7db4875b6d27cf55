"""Gangs with the real Kueue: waitForPodsReady, and both topology modes (issue 19,
scenarios 4 and 6).

Kueue runs with ``waitForPodsReady`` (60 s, ``loadtest/stack/kueue.py``): a workload
whose pods are not all ready in time is evicted and requeued. The suite's kubelet makes a
bound pod ready at once, so a gang is ready exactly when all its members were placed.

* Mode A (flavors naming their Topology in ``tessera.dev/topology-name``): Kueue admits by
  quota, and the extender keeps the gang in one rack.
* Mode B (flavor e2e-h100-tas with ``spec.topologyName``): Kueue's topology-aware
  scheduling assigns each pod a host before kube-scheduler sees it, and the extender picks
  the GPUs inside each host.
"""

from __future__ import annotations

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import GANG_POOL, TAS_POOL
from loadtest.stack.jobs import gpu_job
from loadtest.stack.kueue import WAIT_FOR_PODS_READY_S
from loadtest.stack.placements import Placement, gpu_conflicts, parse_indices, true_condition

pytestmark = pytest.mark.e2e

RACK = {labels.TOPOLOGY: "required:rack"}


def in_one_island(e2e: E2ECluster, placed: list[Placement]) -> bool:
    def islands(node: str) -> list[set[int]]:
        return [set(parse_indices(part)) for part in e2e.fleet[node].islands.split(",")]

    return all(any(set(p.indices) <= island for island in islands(p.node)) for p in placed)


def test_mode_a_a_gang_is_ready_in_one_rack_placed_by_the_extender(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    stored = e2e.create_stored(
        gpu_job("gang-mode-a", pods=4, gpus=4, pool=GANG_POOL, annotations=RACK)
    )

    e2e.wait_admitted("gang-mode-a")
    placed = e2e.wait_bound("gang-mode-a", 4)
    ready = e2e.api.wait(
        "Kueue to see all four pods ready",
        lambda: true_condition(e2e.workload("gang-mode-a"), "PodsReady"),
    )

    # Tessera told its extender (not Kueue) to keep the gang in a rack
    template = stored["spec"]["template"]["metadata"]["annotations"]
    assert template[labels.TOPOLOGY] == "required:rack"
    assert labels.KUEUE_REQUIRED_TOPOLOGY not in template
    # rack-a has room for two of the four, rack-b for all four
    assert {e2e.fleet[p.node].rack for p in placed} == {"rack-b"}
    assert in_one_island(e2e, placed)
    assert ready["status"] == "True"
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []


def test_a_gang_that_cannot_be_placed_holds_no_gpu_and_kueue_requeues_it(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    # 4 x 8 GPUs in one rack of the gang pool: no rack has four free nodes
    e2e.create_stored(gpu_job("gang-too-wide", pods=4, gpus=8, pool=GANG_POOL, annotations=RACK))
    e2e.wait_admitted("gang-too-wide")

    evicted = e2e.api.wait(
        "Kueue to evict the gang whose pods never became ready",
        lambda: true_condition(e2e.workload("gang-too-wide"), "Evicted"),
        timeout=WAIT_FOR_PODS_READY_S + 60,
        describe=lambda: e2e.describe_pods("gang-too-wide"),
    )
    requeued = e2e.api.wait(
        "Kueue to count the requeue",
        lambda: (e2e.workload("gang-too-wide") or {}).get("status", {}).get("requeueState"),
    )

    assert evicted["reason"] == "PodsReadyTimeout", evicted
    assert requeued.get("count", 0) >= 1
    # all or nothing: the extender bound no member, so the gang never held a GPU
    assert [p for p in e2e.all_placements() if p.name.startswith("gang-too-wide")] == []


def test_mode_b_kueue_assigns_the_hosts_and_the_extender_the_gpus(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    stored = e2e.create_stored(
        gpu_job("gang-mode-b", pods=4, gpus=4, queue="tas", annotations=RACK)
    )

    workload = e2e.wait_admitted("gang-mode-b")
    placed = e2e.wait_bound("gang-mode-b", 4)

    # Tessera handed the level to Kueue, and did not ask its extender to enforce it too
    template = stored["spec"]["template"]["metadata"]["annotations"]
    assert template[labels.KUEUE_REQUIRED_TOPOLOGY] == "example.com/rack"
    assert labels.TOPOLOGY not in template
    [assignment] = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"][labels.GPU_RESOURCE] == "e2e-h100-tas"
    assert assignment.get("topologyAssignment"), assignment
    # Kueue chose the hosts (rack-t1 holds two of the four, rack-t2 all four) ...
    pods = {p["metadata"]["name"]: p for p in e2e.pods("gang-mode-b")}
    for p in placed:
        assert pods[p.name]["spec"]["nodeSelector"][labels.HOSTNAME] == p.node
        assert e2e.fleet[p.node].pool == TAS_POOL
    assert {e2e.fleet[p.node].rack for p in placed} == {"rack-t2"}
    # ... and the extender the GPUs: four per pod, each in one NVLink island
    assert all(len(p.indices) == 4 for p in placed)
    assert in_one_island(e2e, placed)
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
