"""The small GPU cluster the console's tests and the README's examples read.

Layer: test support. Built from ``tests.builders``: two blocks of H100 racks (reserved
and spot flavors), one node draining, one with unhealthy GPUs, pods holding GPUs, the
Kueue queues of a two-team cohort and their Workloads. ``NOW`` is the time the tests'
clock shows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster import jsonio
from tests.builders import (
    BLOCK_LABEL,
    RACK_LABEL,
    cq_obj,
    flavor_obj,
    lq_obj,
    node_json,
    pod_json,
    topology_obj,
    workload_obj,
)

NOW = datetime(2026, 1, 1, 6, 0, tzinfo=UTC)
CAPACITY = "example.com/capacity"


def example_objects() -> list[dict[str, Any]]:
    nodes = []
    for block, rack, count, capacity in (
        ("b1", "r1", 3, "reserved"),
        ("b1", "r2", 2, "reserved"),
        ("b2", "r3", 2, "spot"),
    ):
        for i in range(count):
            name = f"gpu-{rack}-{i}"
            nodes.append(
                node_json(
                    name,
                    rack=rack,
                    block=block,
                    islands="0-3,4-7",
                    labels={CAPACITY: capacity},
                    drain_after="2026-01-01T08:00:00Z" if name == "gpu-r2-1" else None,
                    unhealthy="5" if name == "gpu-r1-2" else None,
                )
            )
    # Running pods with the time limits the webhook writes (their jobs end at 08:00,
    # 07:00 and 06:30), but the notebook, which has none.
    pods = [
        _started(
            pod_json(
                "train-0",
                gpus=8,
                node="gpu-r1-0",
                gpu_indices="0,1,2,3,4,5,6,7",
                phase="Running",
                active_deadline_s=4 * 3600,
            ),
            "2026-01-01T04:00:00Z",
        ),
        _started(
            pod_json(
                "small-0",
                gpus=4,
                node="gpu-r1-1",
                gpu_indices="0,1,2,3",
                phase="Running",
                active_deadline_s=2 * 3600,
            ),
            "2026-01-01T05:00:00Z",
        ),
        _started(
            pod_json(
                "tune-0",
                "team-cv",
                gpus=2,
                node="gpu-r3-0",
                gpu_indices="4,5",
                phase="Running",
                active_deadline_s=3600,
            ),
            "2026-01-01T05:30:00Z",
        ),
        _started(
            pod_json(
                "notebook-0",
                "team-cv",
                gpu_milli=500,
                node="gpu-r3-0",
                gpu_indices="6",
                phase="Running",
            ),
            "2026-01-01T02:00:00Z",
        ),
        pod_json("waiting-0", gpus=8),
    ]
    kueue = [
        topology_obj("default", [BLOCK_LABEL, RACK_LABEL, "kubernetes.io/hostname"]),
        flavor_obj(
            "h100-reserved",
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", CAPACITY: "reserved"},
        ),
        flavor_obj(
            "h100-spot", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", CAPACITY: "spot"}
        ),
        cq_obj("nlp", {"h100-reserved": {"nvidia.com/gpu": (24,)}}, cohort="research"),
        cq_obj(
            "cv",
            {"h100-reserved": {"nvidia.com/gpu": (16,)}, "h100-spot": {"nvidia.com/gpu": (16,)}},
            cohort="research",
        ),
        lq_obj("team-nlp", "training", "nlp"),
        lq_obj("team-cv", "training", "cv"),
    ]
    workloads = [
        workload_obj(
            "job-train",
            gpus=8,
            count=4,
            created="2026-01-01T01:00:00Z",
            admitted_at="2026-01-01T01:10:00Z",
            cluster_queue="nlp",
            flavor="h100-reserved",
        ),
        workload_obj("job-big", gpus=8, count=2, created="2026-01-01T03:00:00Z"),
        workload_obj("job-next", gpus=8, created="2026-01-01T05:30:00Z"),
        workload_obj("job-done", gpus=8, created="2026-01-01T00:00:00Z", finished=True),
        workload_obj(
            "job-tune",
            "team-cv",
            gpus=2,
            created="2026-01-01T04:00:00Z",
            admitted_at="2026-01-01T04:00:30Z",
            cluster_queue="cv",
            flavor="h100-spot",
        ),
    ]
    return [*nodes, *pods, *kueue, *workloads]


def _started(pod: dict[str, Any], at: str) -> dict[str, Any]:
    pod["status"]["startTime"] = at
    return pod


def write_cluster_file(path: Path) -> Path:
    """The example cluster as one ``kind: List`` JSON file, as ``kubectl get -o json``
    writes one."""
    path.write_bytes(
        jsonio.dumps_pretty({"apiVersion": "v1", "kind": "List", "items": example_objects()})
    )
    return path


LLM_UID = "6f1b3c1e-0a6c-4d0e-9d57-1a7f0c3e5b21"
WAIT_UID = "0c2f5d7a-3b8e-4f61-8e0b-5d4c3a2b1f10"


def _job(name: str, uid: str, *, gpus: int, pods: int, suspend: bool) -> dict[str, Any]:
    """A Job as the webhook left it: queue and priority labels, gang keys on the
    template, the scheduler profile, a time limit."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "team-nlp",
            "uid": uid,
            "labels": {
                "kueue.x-k8s.io/queue-name": "training",
                "kueue.x-k8s.io/priority-class": "batch",
            },
            "creationTimestamp": "2026-01-01T05:00:00Z",
        },
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "suspend": suspend,
            "activeDeadlineSeconds": 7200,
            "template": {
                "metadata": {
                    "labels": {"tessera.dev/gang": f"team-nlp.{name}"},
                    "annotations": {
                        "tessera.dev/gang-size": str(pods),
                        "tessera.dev/gang-min": str(pods),
                        "tessera.dev/topology": "required:topology-rack",
                    },
                },
                "spec": {
                    "schedulerName": "tessera-gpu",
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "img:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def why_objects() -> list[dict[str, Any]]:
    """Two Jobs of team-nlp for ``tessera why``: ``llm`` (three 8-GPU pods that must
    share a rack, which no rack has room for) is admitted and its pods wait for the
    scheduler; ``wait`` is still suspended, its Workload without quota."""
    llm = _job("llm", LLM_UID, gpus=8, pods=3, suspend=False)
    wait = _job("wait", WAIT_UID, gpus=8, pods=4, suspend=True)
    pods = []
    for i in range(3):
        pod = pod_json(
            f"llm-{i}",
            gpus=8,
            gang="team-nlp.llm",
            gang_size=3,
            gang_min=3,
            topology="required:topology-rack",
            labels={"batch.kubernetes.io/job-name": "llm"},
        )
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "llm",
                "uid": LLM_UID,
                "controller": True,
            }
        ]
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/7 nodes are available: 3 the node's topology-rack has room for 0 "
                "members of gang team-nlp.llm now, it needs 3 together.",
                "lastTransitionTime": "2026-01-01T05:50:00Z",
            }
        ]
        pods.append(pod)
    admitted = workload_obj(
        "job-llm-5c2d1",
        gpus=8,
        count=3,
        created="2026-01-01T05:00:00Z",
        admitted_at="2026-01-01T05:40:00Z",
        cluster_queue="nlp",
        flavor="h100-reserved",
    )
    pending = workload_obj("job-wait-9a7e3", gpus=8, count=4, created="2026-01-01T04:00:00Z")
    pending["status"]["conditions"] = [
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient unused quota "
            "for nvidia.com/gpu in flavor h100-reserved, 16 more needed",
            "lastTransitionTime": "2026-01-01T04:00:05Z",
        }
    ]
    for workload, name, uid in ((admitted, "llm", LLM_UID), (pending, "wait", WAIT_UID)):
        workload["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": True}
        ]
    events = [
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "wait.1", "namespace": "team-nlp"},
            "involvedObject": {
                "kind": "Job",
                "name": "wait",
                "namespace": "team-nlp",
                "uid": WAIT_UID,
            },
            "type": "Normal",
            "reason": "Suspended",
            "message": "Job suspended",
            "count": 1,
            "lastTimestamp": "2026-01-01T04:00:01Z",
        },
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "llm-0.1", "namespace": "team-nlp"},
            "involvedObject": {
                "kind": "Pod",
                "name": "llm-0",
                "namespace": "team-nlp",
                "uid": pods[0]["metadata"]["uid"],
            },
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": pods[0]["status"]["conditions"][0]["message"],
            "count": 4,
            "lastTimestamp": "2026-01-01T05:58:00Z",
        },
    ]
    return [llm, wait, *pods, admitted, pending, *events]
