"""The loop Tessera exists for, with the real Kueue: Kueue admits by quota, kube-scheduler
places through the extender (issue 19's scenarios 1, 2 and 7).

No scenario here unsuspends, admits or preempts anything: Kueue does. The suite plays only
the kubelets (``loadtest/stack/kubelet.py``): bound pods start and become ready, and a
scenario may end them. Jobs go in with ``kubectl create`` as a user's would, without
``suspend``.

Who does what at creation (Kueue's webhooks are called first: kube-apiserver orders
mutating webhook configurations by name, ``kueue-…`` before ``tessera-webhook``): Kueue's
suspends a Job that has a queue label; Tessera's finds it suspended and writes no
``suspend`` of its own, and adds what Kueue has no field for (priority class from the queue,
the flavors' affinity and tolerations, gang and topology metadata, a time limit, the
scheduler name). Tessera's suspend rule still writes when Kueue's did not act: on a queue
label that Tessera itself defaulted, or where Kueue's webhook is not installed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import CAPACITY
from loadtest.stack.jobs import NAMESPACE, QUEUE, gpu_job
from loadtest.stack.placements import Placement, gpu_conflicts

pytestmark = pytest.mark.e2e

TRAINING_CQ = "e2e-training"
TESSERA_FLAVORS = {"e2e-h100-reserved": "reserved", "e2e-h100-spot": "spot"}
"""The flavors queue ``training`` may use, and the capacity label of their nodes."""


def gpu_flavor(workload: dict[str, Any]) -> str:
    [assignment] = workload["status"]["admission"]["podSetAssignments"]
    flavor: str = assignment["flavors"][labels.GPU_RESOURCE]
    return flavor


def test_a_job_created_unsuspended_is_admitted_by_kueue_and_placed_by_the_extender(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    job = gpu_job("kueue-finetune", pods=2, gpus=4)
    assert "suspend" not in job["spec"]

    stored = e2e.create_stored(job)

    # held for Kueue, and mutated by Tessera
    assert stored["spec"]["suspend"] is True
    assert stored["metadata"]["labels"][labels.PRIORITY_CLASS] == "e2e-research"
    template = stored["spec"]["template"]
    assert template["spec"]["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
    assert template["metadata"]["labels"][labels.GANG] == f"{NAMESPACE}.kueue-finetune"

    workload = e2e.wait_admitted("kueue-finetune")
    # Kueue ordered the workload by the priority class Tessera injected
    assert workload["spec"]["priorityClassRef"]["name"] == "e2e-research"
    assert workload["spec"]["priority"] == 100
    # ... and admitted it to one of the flavors Tessera's affinity allows
    flavor = gpu_flavor(workload)
    assert flavor in TESSERA_FLAVORS

    placed = e2e.wait_bound("kueue-finetune", 2)
    admitted = e2e.get_json("job", "kueue-finetune", "-n", NAMESPACE)
    assert admitted["spec"]["suspend"] is False
    # Kueue wrote its flavor's node labels; the pods sit on that flavor's nodes
    selector = admitted["spec"]["template"]["spec"].get("nodeSelector") or {}
    assert selector.get(CAPACITY) == TESSERA_FLAVORS[flavor]
    for p in placed:
        assert e2e.fleet[p.node].extra_labels.get(CAPACITY, "reserved") == TESSERA_FLAVORS[flavor]
        assert len(p.indices) == 4
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []


def test_kueues_webhook_holds_a_queued_job_that_tessera_leaves_alone(e2e: E2ECluster) -> None:
    # A CPU-only job: Tessera's webhook lets it through unchanged, Kueue's suspends it.
    # Without Kueue's webhook it would start running before Kueue's controller stopped it.
    job = gpu_job("kueue-cpu-only", pods=1)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {}

    stored = e2e.create_stored(job)

    assert stored["spec"]["suspend"] is True
    assert labels.PRIORITY_CLASS not in stored["metadata"].get("labels", {})
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "default-scheduler"


def pending_reason(e2e: E2ECluster, job: str) -> str | None:
    workload = e2e.workload(job)
    if workload is None or workload.get("status", {}).get("admission"):
        return None
    for condition in workload.get("status", {}).get("conditions") or []:
        if condition["type"] == "QuotaReserved" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return None


def test_a_job_over_the_free_quota_waits_and_runs_when_the_first_finishes(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    # 32 reserved GPUs nominal + 8 borrowable, 8 spot: the first takes the 32, the second
    # (16) fits in neither what is left of reserved nor spot
    e2e.create_stored(gpu_job("quota-first", pods=4, gpus=8))
    e2e.wait_admitted("quota-first")
    first = e2e.wait_bound("quota-first", 4)
    e2e.create_stored(gpu_job("quota-second", pods=2, gpus=8))

    reason = e2e.api.wait(
        "Kueue to say why quota-second waits", lambda: pending_reason(e2e, "quota-second")
    )
    # Kueue's own words; Tessera admitted it at creation because it can run one day
    assert "insufficient unused quota" in reason, reason
    assert all(not p.node for p in e2e.placements("quota-second"))

    e2e.finish("quota-first")
    workload = e2e.wait_admitted("quota-second")
    second = e2e.wait_bound("quota-second", 2)

    assert gpu_flavor(workload) == "e2e-h100-reserved"
    assert len({p.node for p in first}) == 4
    assert all(len(p.indices) == 8 for p in second)
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []


GPU_RESOURCES = (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE)


def _usage(cq: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(flavor, GPU resource) → quantity in use, from the ClusterQueue's status."""
    out: dict[tuple[str, str], int] = {}
    for flavor in cq.get("status", {}).get("flavorsUsage") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] in GPU_RESOURCES:
                out[(flavor["name"], resource["name"])] = int(resource.get("total", "0"))
    return out


def _held_by_queue(e2e: E2ECluster, placements: list[Placement]) -> dict[str, tuple[int, int]]:
    """LocalQueue → (whole GPUs, GPU milli) that the extender recorded at bind for the
    pods of that queue's jobs."""
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    queue_of = {
        job["metadata"]["name"]: (job["metadata"].get("labels") or {}).get(labels.QUEUE_NAME)
        for job in e2e.api.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs")
    }
    pods = {p["metadata"]["name"]: p for p in e2e.api.items(f"/api/v1/namespaces/{NAMESPACE}/pods")}
    for p in placements:
        if not p.node or p.namespace != NAMESPACE:
            continue
        job = (pods[p.name]["metadata"].get("labels") or {}).get(labels.JOB_NAME, "")
        queue = queue_of.get(job)
        if queue is None:
            continue
        held[queue][0] += len(p.indices) if p.gpus else 0
        held[queue][1] += p.gpu_milli
    return {queue: (gpus, milli) for queue, (gpus, milli) in held.items()}


def test_at_quiescence_kueues_usage_equals_the_gpus_the_extender_allocated(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    e2e.create_stored(gpu_job("tally-gang", pods=3, gpus=4))
    e2e.create_stored(gpu_job("tally-single", gpus=1))
    e2e.create_stored(gpu_job("tally-share", gpu_milli=250))
    for job, pods in (("tally-gang", 3), ("tally-single", 1), ("tally-share", 1)):
        e2e.wait_admitted(job)
        e2e.wait_bound(job, pods)

    def counts_all_three() -> tuple[int, int] | None:
        usage = _usage(e2e.cluster_queue(TRAINING_CQ))
        gpus = sum(v for (_, resource), v in usage.items() if resource == labels.GPU_RESOURCE)
        milli = sum(v for (_, r), v in usage.items() if r == labels.GPU_MILLI_RESOURCE)
        return (gpus, milli) if (gpus, milli) == (13, 250) else None

    # Kueue writes a ClusterQueue's usage on its own reconcile, after the Workloads are
    # admitted and not necessarily in one write: wait for all three jobs, then compare.
    usage = e2e.api.wait("Kueue to count all three jobs in its usage", counts_all_three)
    assert _held_by_queue(e2e, e2e.all_placements()) == {QUEUE: usage}
