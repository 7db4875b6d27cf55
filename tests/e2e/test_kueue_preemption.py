"""Borrowing in a cohort and reclaim by priority, with the real Kueue (issue 19, scenario 3).

Queue ``training`` (ClusterQueue e2e-training, default priority e2e-research, 100) may
borrow 8 reserved H100s from e2e-lender; queue ``lender`` (e2e-lender, default priority
e2e-urgent, 1000) takes them back from lower priorities. Both jobs are pinned to the
reclaim pool, whose 40 GPUs are exactly what the borrower holds, so the reclaimer can run
only on GPUs the borrower gave back. Kueue is the only one that preempts: the priorities
it uses are the WorkloadPriorityClasses Tessera's webhook injected, and kube-scheduler,
which sees every GPU pod at one priority, never evicts anything.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import RECLAIM_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_job
from loadtest.stack.placements import gpu_conflicts, true_condition

pytestmark = pytest.mark.e2e

BORROWER, RECLAIMER = "borrow-40", "reclaim-16"


def _reporter(event: dict[str, Any]) -> str:
    return str(event.get("source", {}).get("component") or event.get("reportingComponent") or "")


def scheduler_preemptions(e2e: E2ECluster) -> list[str]:
    """Every sign that kube-scheduler preempted a pod of the namespace: a ``Preempted``
    event from a scheduler, or a ``DisruptionTarget`` condition it set."""
    seen = [
        f"{e['involvedObject'].get('name')}: {e.get('message')}"
        for e in e2e.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if e.get("reason") == "Preempted"
        and "scheduler"
        in (e.get("source", {}).get("component") or e.get("reportingComponent") or "")
    ]
    for pod in e2e.api.items(f"/api/v1/namespaces/{NAMESPACE}/pods"):
        for c in pod.get("status", {}).get("conditions") or []:
            if c["type"] == "DisruptionTarget" and c.get("reason") == "PreemptionByScheduler":
                seen.append(f"{pod['metadata']['name']}: {c.get('message')}")
    return seen


def test_the_lender_reclaims_by_priority_and_its_pods_land_on_the_gpus_given_back(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling

    borrower = e2e.create_stored(gpu_job(BORROWER, pods=5, gpus=8, pool=RECLAIM_POOL))
    admitted = e2e.wait_admitted(BORROWER)
    first = e2e.wait_bound(BORROWER, 5)
    # 40 GPUs: 32 of its own and 8 borrowed from e2e-lender
    assert borrower["metadata"]["labels"][labels.PRIORITY_CLASS] == "e2e-research"
    assert admitted["spec"]["priority"] == 100
    held = {(p.node, i) for p in first for i in p.indices}
    assert len(held) == 40

    reclaimer = e2e.create_stored(
        gpu_job(RECLAIMER, pods=2, gpus=8, queue="lender", pool=RECLAIM_POOL)
    )
    assert reclaimer["metadata"]["labels"][labels.PRIORITY_CLASS] == "e2e-urgent"

    # Kueue preempts the borrower: evicted, its Job suspended, its pods deleted
    evicted = e2e.api.wait(
        f"Kueue to evict {BORROWER}",
        lambda: true_condition(e2e.workload(BORROWER), "Evicted"),
        describe=lambda: repr((e2e.workload(BORROWER) or {}).get("status")),
    )
    assert evicted["status"] == "True"
    assert evicted["reason"] == "Preempted"
    preempted = true_condition(e2e.workload(BORROWER), "Preempted")
    assert preempted is not None
    assert preempted["reason"] == "InCohortReclamation"

    workload = e2e.wait_admitted(RECLAIMER)
    second = e2e.wait_bound(RECLAIMER, 2)

    assert workload["spec"]["priority"] == 1000
    # the extender gave the reclaimer GPUs the borrower held: there are no others in the pool
    assert {(p.node, i) for p in second for i in p.indices} <= held
    # the borrower waits for quota again (32 of its own cannot hold 40) and holds nothing
    assert not (e2e.workload(BORROWER) or {}).get("status", {}).get("admission")
    assert all(not p.node for p in e2e.placements(BORROWER))
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
    # the two layers never fought: only Kueue preempted
    assert scheduler_preemptions(e2e) == []
