"""Scenarios 3 and 4: the real Kueue admits the jobs, the real job controller makes the
pods, the real kube-scheduler places them through the extender, and the placements are
read back from the API.

Each scenario pins its jobs to its own pool of fake nodes (``loadtest/stack/fleet.py``)
with a plain ``nodeSelector``, so the scenarios do not share GPUs and can run in any order.
After each one, every GPU pod in the cluster is checked against the GPU accounting rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import GANG_POOL, HEALTH_POOL, MAINTENANCE_POOL, RACK, SHARE_POOL
from loadtest.stack.jobs import gpu_job
from loadtest.stack.placements import Placement, gpu_conflicts, parse_indices
from webhook.rules.placement import gang_affinity

pytestmark = pytest.mark.e2e

HOUR = 3600


def islands_of(e2e: E2ECluster, node: str) -> list[set[int]]:
    return [set(parse_indices(part)) for part in e2e.fleet[node].islands.split(",")]


def assert_accounting_holds(e2e: E2ECluster) -> None:
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []


def assert_never_bound(e2e: E2ECluster, job: str) -> None:
    assert [p.node for p in e2e.placements(job)] == [""]


def test_a_rack_gang_lands_in_one_rack_each_pod_in_one_nvlink_island(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling

    rack = {labels.TOPOLOGY: "required:rack"}
    stored = e2e.create_stored(
        gpu_job("llm-pretrain", pods=4, gpus=4, pool=GANG_POOL, annotations=rack)
    )
    placed = e2e.wait_bound("llm-pretrain", 4)

    racks = {e2e.fleet[p.node].rack for p in placed}
    # rack-a has room for two of the four workers, rack-b for all four
    assert racks == {"rack-b"}, e2e.describe_pods("llm-pretrain")
    for p in placed:
        assert len(p.indices) == 4
        assert any(set(p.indices) <= island for island in islands_of(e2e, p.node)), p
    assert_accounting_holds(e2e)

    # The webhook told each member to stay in its gang's rack, naming no gang; kube-apiserver
    # took the template's term and, creating each pod, added the gang id from its label.
    template = stored["spec"]["template"]
    gang = template["metadata"]["labels"][labels.GANG]
    assert template["spec"]["affinity"]["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [gang_affinity(RACK)]
    }
    merged = {**gang_affinity(RACK), "labelSelector": {"matchExpressions": [
        {"key": labels.GANG, "operator": "In", "values": [gang]}]}}  # fmt: skip
    for pod in e2e.pods("llm-pretrain"):
        assert pod["spec"]["affinity"]["podAffinity"] == {
            "requiredDuringSchedulingIgnoredDuringExecution": [merged]
        }


def _one_share(e2e: E2ECluster, name: str, milli: int) -> Placement:
    e2e.create_stored(gpu_job(name, gpu_milli=milli, pool=SHARE_POOL))
    [placed] = e2e.wait_bound(name, 1)
    return placed


def test_gpu_shares_are_packed_onto_a_gpu_already_shared(scheduling: E2ECluster) -> None:
    e2e = scheduling

    first = _one_share(e2e, "notebook-half", 500)
    second = _one_share(e2e, "notebook-quarter", 250)
    third = _one_share(e2e, "notebook-last-quarter", 250)

    # 16 idle GPUs on two nodes, yet each share goes where a share already is
    assert len(first.indices) == 1
    assert (second.node, second.indices) == (first.node, first.indices)
    assert (third.node, third.indices) == (first.node, first.indices)
    assert_accounting_holds(e2e)


def _indices(placed: Sequence[Placement]) -> set[int]:
    return {i for p in placed for i in p.indices}


def test_an_unhealthy_gpu_is_never_assigned(scheduling: E2ECluster) -> None:
    e2e = scheduling  # health-1: islands 0-3 and 4-7, GPU 5 broken

    e2e.create_stored(gpu_job("sick-four", gpus=4, pool=HEALTH_POOL))
    four = e2e.wait_bound("sick-four", 1)
    e2e.create_stored(gpu_job("sick-singles", pods=3, gpus=1, pool=HEALTH_POOL))
    singles = e2e.wait_bound("sick-singles", 3)
    e2e.create_stored(gpu_job("sick-one-too-many", gpus=1, pool=HEALTH_POOL))
    failure = e2e.wait_scheduling_failure("sick-one-too-many")

    # island 4-7 has only three healthy GPUs, so four GPUs in one island means 0-3
    assert _indices(four) == {0, 1, 2, 3}
    assert _indices(singles) == {4, 6, 7}
    # seven healthy GPUs, seven taken: the eighth pod waits, and `kubectl describe` says why
    assert "all 7 healthy GPUs are in use" in failure
    assert_never_bound(e2e, "sick-one-too-many")
    assert_accounting_holds(e2e)


def test_a_job_that_would_outlast_a_maintenance_window_does_not_start_there(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling  # maint-drain drains 30 minutes after the suite started; maint-steady never

    e2e.create_stored(gpu_job("eval-short", gpus=1, node="maint-drain", time_limit=600))
    [short] = e2e.wait_bound("eval-short", 1)
    e2e.create_stored(gpu_job("train-long-pinned", gpus=1, node="maint-drain", time_limit=4 * HOUR))
    failure = e2e.wait_scheduling_failure("train-long-pinned")
    e2e.create_stored(gpu_job("train-long", gpus=1, pool=MAINTENANCE_POOL, time_limit=4 * HOUR))
    [long] = e2e.wait_bound("train-long", 1)

    # ten minutes end before the maintenance: allowed on the draining node
    assert short.node == "maint-drain"
    # four hours do not: refused there (as `kubectl describe` shows), and placed on the
    # pool's other node instead
    assert "drains for maintenance" in failure
    assert "time limit of 4h" in failure
    assert_never_bound(e2e, "train-long-pinned")
    assert long.node == "maint-steady"
    assert_accounting_holds(e2e)
