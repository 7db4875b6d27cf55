"""A JobSet with the real Kueue and the real JobSet controller (issue 19, scenario 5).

A distributed training run is often a JobSet: several Jobs that must all run together.
The user creates it unsuspended with only a queue label. Tessera's and Kueue's webhooks
both hold it (``suspend``) and Kueue admits it as one Workload; the JobSet controller
then makes its Jobs (as its own ServiceAccount, so Tessera lets them through as the
JobSet's: they were admitted with it), the Job controller their pods, and the extender
places all the pods of all the Jobs as one gang.
"""

from __future__ import annotations

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import GANG_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_jobset
from loadtest.stack.placements import gpu_conflicts, true_condition

pytestmark = pytest.mark.e2e

RACK = {labels.TOPOLOGY: "required:rack"}


def test_a_jobset_is_admitted_once_by_kueue_and_its_jobs_pods_are_placed_as_one_gang(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    # 2 Jobs x 2 pods x 4 GPUs; rack-a of the gang pool holds two such pods, rack-b four
    stored = e2e.create_stored(
        gpu_jobset("trainer", replicas=2, pods=2, gpus=4, pool=GANG_POOL, annotations=RACK)
    )

    # held for Kueue, and marked as one gang of all four pods, across both Jobs
    assert stored["spec"]["suspend"] is True
    [workers] = stored["spec"]["replicatedJobs"]
    template = workers["template"]["spec"]["template"]["metadata"]
    assert template["labels"][labels.GANG] == f"{NAMESPACE}.trainer"
    assert template["annotations"][labels.GANG_SIZE] == "4"

    workload = e2e.wait_admitted("trainer", kind="JobSet", timeout=90)
    placed = e2e.wait_bound("trainer", 4, timeout=90, label=labels.JOBSET_NAME)
    ready = e2e.api.wait(
        "Kueue to see all four pods of the JobSet ready",
        lambda: true_condition(e2e.workload("trainer", kind="JobSet"), "PodsReady"),
    )

    # one admission for the whole JobSet: its Jobs got no Workload (no quota) of their own
    workloads = e2e.api.items(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads")
    assert [w["metadata"]["name"] for w in workloads] == [workload["metadata"]["name"]]
    [pod_set] = workload["spec"]["podSets"]
    assert pod_set["count"] == 4
    # the JobSet controller made the two Jobs, and Tessera let them through as they were
    jobs = e2e.api.items(
        f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
        labelSelector=f"{labels.JOBSET_NAME}=trainer",
    )
    assert len(jobs) == 2
    for job in jobs:
        assert not job["spec"].get("suspend")
        assert job["spec"]["template"]["metadata"]["labels"][labels.GANG] == f"{NAMESPACE}.trainer"
    # all four pods in the one rack that holds them all, four GPUs each, none given twice
    assert len({p.name for p in placed}) == 4
    assert {p.name.rsplit("-", 2)[0] for p in placed} == {j["metadata"]["name"] for j in jobs}
    assert {e2e.fleet[p.node].rack for p in placed} == {"rack-b"}
    assert all(len(p.indices) == 4 for p in placed)
    assert ready["status"] == "True"
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
