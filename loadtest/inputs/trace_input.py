"""The Alibaba openb trace as the simulated cluster's input, instead of the HGX fleet.

Layer: PURE. Turns trace rows (``loadtest.inputs.traces`` reads them) into what ``scenario``
runs: Node objects (racked four to a rack, sixteen to a block, like the HGX fleet), Kueue
objects for the three teams (one ResourceFlavor per GPU model, each team's nominal
quota its share of every model, all in one cohort) and a job stream (each GPU pod of the
trace a one-pod Job of one team, in the trace's creation order). No I/O, no clock.
Must not special-case a model or a pod: whatever the trace holds goes through.

Time: the trace spans weeks. Arrivals keep their order and relative spacing, squeezed
into the run's ``duration_s``; run times keep their long-tailed shape, rescaled so that
their median is the stream's ``median_run_s`` (capped at ``max_run_s``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from cluster import labels
from loadtest.inputs.fleet import (
    BLOCK_LABEL,
    NODES_PER_RACK,
    RACK_LABEL,
    RACKS_PER_BLOCK,
    TEAMS,
    JobSpec,
    StreamSpec,
    Team,
    job_object,
)
from loadtest.inputs.traces import TraceNode, TracePod, node_object

Obj = dict[str, Any]
COHORT = "gpu-pool"
TOPOLOGY = "gpu-topology"


def trace_nodes(nodes: Sequence[TraceNode]) -> list[Obj]:
    out: list[Obj] = []
    for i, node in enumerate(nodes):
        rack = i // NODES_PER_RACK
        extra = {BLOCK_LABEL: f"block-{rack // RACKS_PER_BLOCK}", RACK_LABEL: f"rack-{rack:03d}"}
        out.append(node_object(node, extra_labels=extra))
    return out


def flavor_name(model: str) -> str:
    return "gpu-" + "".join(c if c.isalnum() else "-" for c in model.lower())


def trace_policy(
    nodes: Sequence[TraceNode],
    priority_classes: Sequence[Obj],
    *,
    model_order: Sequence[str] | None = None,
) -> list[Obj]:
    """Flavors per GPU model; per team a ClusterQueue holding its share of each model,
    its flavors in ``model_order`` (default: by name). CPU-only nodes give no flavor."""
    capacity: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            capacity[node.model] = capacity.get(node.model, 0) + node.gpus
    first = [m for m in model_order or () if m in capacity]
    models = first + sorted(set(capacity) - set(first))
    policy: list[Obj] = [_topology()]
    policy.extend(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {
                "name": flavor_name(m),
                "annotations": {labels.FLAVOR_TOPOLOGY: TOPOLOGY},
            },
            "spec": {"nodeLabels": {labels.GFD_PRODUCT: m}},
        }
        for m in models
    )
    policy.extend(priority_classes)
    for team in TEAMS:
        policy += _team_queues(team, models, capacity)
    return policy


def _topology() -> Obj:
    """The racks and blocks the nodes are given (``trace_nodes``), so that gangs may ask
    for them."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY},
        "spec": {
            "levels": [
                {"nodeLabel": BLOCK_LABEL},
                {"nodeLabel": RACK_LABEL},
                {"nodeLabel": labels.HOSTNAME},
            ]
        },
    }


def _team_queues(team: Team, models: Sequence[str], capacity: Mapping[str, int]) -> list[Obj]:
    """A team's ClusterQueue, with its share of each model, and its LocalQueue."""
    cq_name = team.namespace.removeprefix("team-")
    flavors = []
    for m in models:
        gpus = int(capacity[m] * team.weight)
        flavors.append(
            {
                "name": flavor_name(m),
                "resources": [
                    {"name": labels.GPU_RESOURCE, "nominalQuota": str(gpus)},
                    {"name": labels.GPU_MILLI_RESOURCE, "nominalQuota": str(gpus * 1000)},
                ],
            }
        )
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": cq_name},
        "spec": {
            "cohortName": COHORT,
            "queueingStrategy": "BestEffortFIFO",
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": [labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE],
                    "flavors": flavors,
                }
            ],
        },
    }
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {
            "name": team.queue,
            "namespace": team.namespace,
            "annotations": {
                "tessera.dev/default-queue": "true",
                "tessera.dev/default-priority-class": "research",
                "tessera.dev/default-time-limit": "4h",
            },
        },
        "spec": {"clusterQueue": cq_name},
    }
    return [cluster_queue, local_queue]


def trace_jobs(pods: Sequence[TracePod], spec: StreamSpec, rng: random.Random) -> list[JobSpec]:
    """``rate x duration_s`` GPU pods from a random point of the trace, as one-pod Jobs."""
    gpu_pods = sorted(
        (p for p in pods if p.num_gpu and p.creation_time is not None),
        key=lambda p: p.creation_time or 0,
    )
    if not gpu_pods:
        return []
    count = max(1, min(len(gpu_pods), int(spec.rate * spec.duration_s)))
    first = rng.randrange(0, len(gpu_pods) - count + 1)
    window = gpu_pods[first : first + count]
    t0 = window[0].creation_time or 0
    span = max(1, (window[-1].creation_time or 0) - t0)
    runs = sorted(
        max(1, (p.deletion_time or 0) - (p.creation_time or 0)) for p in window if p.deletion_time
    )
    median = runs[len(runs) // 2] if runs else 1
    jobs: list[JobSpec] = []
    for i, pod in enumerate(window):
        at = (((pod.creation_time or 0) - t0) / span) * spec.duration_s * 0.999
        lived = (pod.deletion_time or 0) - (pod.creation_time or 0) if pod.deletion_time else median
        run_s = min(spec.max_run_s, max(0.05, lived / median * spec.median_run_s))
        team = TEAMS[i % len(TEAMS)]
        product = "|".join(pod.gpu_spec) or None
        if pod.gpu_milli >= 1000:
            job = job_object(f"trace-{i:05d}", team, gpus=pod.num_gpu, product=product)
            kind = "1-gpu" if pod.num_gpu == 1 else "multi-gpu"
        else:
            job = job_object(f"trace-{i:05d}", team, milli=pod.gpu_milli, product=product)
            kind = "share"
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["resources"]["limits"].update(
            cpu=f"{pod.cpu_milli}m", memory=f"{pod.memory_mib}Mi"
        )
        jobs.append(JobSpec(at, job, run_s, kind))
    return jobs
