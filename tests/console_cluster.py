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
    pods = [
        pod_json(
            "train-0", gpus=8, node="gpu-r1-0", gpu_indices="0,1,2,3,4,5,6,7", phase="Running"
        ),
        pod_json("small-0", gpus=4, node="gpu-r1-1", gpu_indices="0,1,2,3", phase="Running"),
        pod_json("tune-0", "team-cv", gpus=2, node="gpu-r3-0", gpu_indices="4,5", phase="Running"),
        pod_json(
            "notebook-0",
            "team-cv",
            gpu_milli=500,
            node="gpu-r3-0",
            gpu_indices="6",
            phase="Running",
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


def write_cluster_file(path: Path) -> Path:
    """The example cluster as one ``kind: List`` JSON file, as ``kubectl get -o json``
    writes one."""
    path.write_bytes(
        jsonio.dumps_pretty({"apiVersion": "v1", "kind": "List", "items": example_objects()})
    )
    return path
