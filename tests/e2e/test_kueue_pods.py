"""A plain Pod through Kueue's pod integration, with the real Kueue (issue 19, scenario 5).

A notebook is one Pod, not a Job: what holds it for Kueue is a scheduling gate, not
``suspend``. Kueue's pod webhook and Tessera's both want the same gate
(``kueue.x-k8s.io/admission``); whichever comes second finds it and adds nothing. Kueue
makes a Workload for the Pod, admits it, and lifts the gate (a pod UPDATE that Tessera's
webhook lets through); kube-scheduler then places it through the extender.

The other half of scenario 5, a JobSet run by the real JobSet controller, is
test_kueue_jobsets.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import jsonio, labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.jobs import IMAGE, NAMESPACE, QUEUE
from loadtest.stack.placements import Placement, gpu_conflicts

pytestmark = pytest.mark.e2e


def notebook(name: str, gpu_milli: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {labels.QUEUE_NAME: QUEUE}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "lab",
                    "image": IMAGE,
                    "resources": {
                        "requests": {"cpu": "1", "memory": "4Gi"},
                        "limits": {labels.GPU_MILLI_RESOURCE: gpu_milli},
                    },
                }
            ],
        },
    }


def test_a_plain_pod_is_gated_admitted_by_kueue_and_placed_by_the_extender(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    done = e2e.kubectl(
        "create", "-f", "-", "-o", "json", stdin=jsonio.dumps(notebook("lab-1", 500)).decode()
    )
    stored = jsonio.loads(done.stdout)

    # held for Kueue by its admission gate (once, though both webhooks want it); Kueue may
    # add gates of its own, and lifts them all at admission
    gates = [g["name"] for g in stored["spec"].get("schedulingGates") or []]
    assert gates.count(labels.KUEUE_ADMISSION_GATE) == 1
    assert stored["spec"]["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
    assert stored["metadata"]["labels"][labels.PRIORITY_CLASS] == "e2e-research"

    workload = e2e.wait_admitted("lab-1", kind="Pod")
    assert workload["spec"]["priority"] == 100

    def placed() -> Placement | None:
        pod = e2e.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/lab-1")
        found = Placement.of(pod)
        return found if found.node and found.indices else None

    bound = e2e.api.wait("the notebook to be bound with its GPU recorded", placed)
    pod = e2e.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/lab-1")

    assert not pod["spec"].get("schedulingGates")
    assert len(bound.indices) == 1
    assert bound.gpu_milli == 500
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
