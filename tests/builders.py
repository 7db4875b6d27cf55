"""Small builders of Kubernetes objects as the API sends them (raw JSON dicts).

Shapes follow the recorded captures (``tests.shared.CAPTURES``, kube-apiserver 1.36): a
node with GPU Feature Discovery labels and ``nvidia.com/gpu`` in capacity and
allocatable; a pod whose containers carry GPU requests equal to limits, as the API
requires for extended resources; and the Kueue objects (``kueue.x-k8s.io/v1beta2``) a
queue policy is read from. Every argument is optional, so a test names only what it is
about. Each call returns fresh dicts that the caller may change.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from cluster import labels as keys

H100: str = "NVIDIA-H100-80GB-HBM3"
H100_MEMORY_MIB: int = 81559
RACK_LABEL: str = "cloud.example.com/topology-rack"
BLOCK_LABEL: str = "cloud.example.com/topology-block"


def node_json(
    name: str = "gpu-a",
    *,
    gpus: int | str | None = 8,
    product: str | None = H100,
    gpu_memory_mib: int | None = H100_MEMORY_MIB,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    rack: str | None = None,
    block: str | None = None,
    islands: str | None = None,
    unhealthy: str | None = None,
    drain_after: str | None = None,
    unschedulable: bool = False,
    taints: Iterable[Mapping[str, str]] = (),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node; ``gpus=None`` leaves ``nvidia.com/gpu`` out of its status."""
    node_labels = {keys.HOSTNAME: name}
    if gpus is not None:
        node_labels["nvidia.com/gpu.present"] = "true"
    if product is not None:
        node_labels[keys.GFD_PRODUCT] = product
    if gpu_memory_mib is not None:
        node_labels[keys.GFD_MEMORY] = str(gpu_memory_mib)
    if rack is not None:
        node_labels[RACK_LABEL] = rack
    if block is not None:
        node_labels[BLOCK_LABEL] = block
    node_labels.update(labels or {})

    node_annotations = {"node.alpha.kubernetes.io/ttl": "0"}
    for key, value in (
        (keys.NVLINK_ISLANDS, islands),
        (keys.UNHEALTHY_GPUS, unhealthy),
        (keys.DRAIN_AFTER, drain_after),
    ):
        if value is not None:
            node_annotations[key] = value
    node_annotations.update(annotations or {})

    resources: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus is not None:
        resources[keys.GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"node/{name}")),
            "resourceVersion": "275",
            "creationTimestamp": "2026-11-29T18:27:49Z",
            "labels": node_labels,
            "annotations": node_annotations,
        },
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-11-29T18:27:49Z",
                    "lastTransitionTime": "2026-11-29T18:27:49Z",
                    "reason": "KubeletReady",
                    "message": "API-only node",
                }
            ],
        },
    }


def container(
    name: str = "main",
    *,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    restart_policy: str | None = None,
    image: str = "registry.example/train:1.0",
) -> dict[str, Any]:
    """A container; ``restart_policy="Always"`` on an init container makes a sidecar."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    built: dict[str, Any] = {
        "name": name,
        "image": image,
        "resources": resources,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if restart_policy is not None:
        built["restartPolicy"] = restart_policy
    return built


def gpu_container(
    name: str = "main",
    *,
    gpus: int = 0,
    gpu_milli: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """A container asking for GPUs (requests = limits) and optionally CPU and memory."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if gpus:
        requests[keys.GPU_RESOURCE] = limits[keys.GPU_RESOURCE] = str(gpus)
    if gpu_milli:
        requests[keys.GPU_MILLI_RESOURCE] = limits[keys.GPU_MILLI_RESOURCE] = str(gpu_milli)
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
    return container(name, requests=requests, limits=limits)


def pod_json(
    name: str = "train-0",
    namespace: str = "team-nlp",
    *,
    gpus: int = 0,
    gpu_milli: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    containers: Iterable[Mapping[str, Any]] | None = None,
    init_containers: Iterable[Mapping[str, Any]] = (),
    overhead: Mapping[str, str] | None = None,
    gang: str | None = None,
    gang_size: int | str | None = None,
    gang_min: int | str | None = None,
    topology: str | None = None,
    products: str | None = None,
    active_deadline_s: int | None = None,
    node: str | None = None,
    gpu_indices: str | None = None,
    phase: str | None = "Pending",
    scheduler_name: str = keys.DEFAULT_SCHEDULER_NAME,
    deleting: bool = False,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod. Without ``containers``, one container asks for ``gpus``/``gpu_milli``/…

    Every pod has resourceVersion 296: one extender reads a pod it has decoded before by
    UID and resourceVersion, so a test that sends it two different pods of one name and
    namespace gives the second another resourceVersion.
    """
    pod_labels = {"batch.kubernetes.io/job-name": name.rsplit("-", 1)[0]}
    if gang is not None:
        pod_labels[keys.GANG] = gang
    pod_labels.update(labels or {})

    pod_annotations: dict[str, str] = {}
    for key, value in (
        (keys.GANG_SIZE, gang_size),
        (keys.GANG_MIN, gang_min),
        (keys.TOPOLOGY, topology),
        (keys.GPU_PRODUCT, products),
        (keys.GPU_INDICES, gpu_indices),
    ):
        if value is not None:
            pod_annotations[key] = str(value)
    pod_annotations.update(annotations or {})

    if containers is None:
        containers = [gpu_container(gpus=gpus, gpu_milli=gpu_milli, cpu=cpu, memory=memory)]
    spec: dict[str, Any] = {
        "containers": [dict(c) for c in containers],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": scheduler_name,
        "tolerations": [
            {
                "key": keys.TAINT_NOT_READY,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if init_containers:
        spec["initContainers"] = [dict(c) for c in init_containers]
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    if active_deadline_s is not None:
        spec["activeDeadlineSeconds"] = active_deadline_s
    if node is not None:
        spec["nodeName"] = node

    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{namespace}/{name}")),
        "resourceVersion": "296",
        "creationTimestamp": "2026-11-29T18:28:01Z",
        "labels": pod_labels,
    }
    if pod_annotations:
        metadata["annotations"] = pod_annotations
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T18:30:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    status: dict[str, Any] = {"qosClass": "BestEffort"}
    if phase is not None:
        status["phase"] = phase
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "spec": spec, "status": status}


# ---------------------------------------------------------------- Kueue objects

KUEUE = "kueue.x-k8s.io/v1beta2"


def flavor_obj(
    name: str,
    node_labels: dict[str, str] | None = None,
    *,
    taints: list[dict[str, str]] | None = None,
    topology: str | None = None,
    tessera_topology: str | None = None,
) -> dict[str, Any]:
    """``topology``: Kueue's ``spec.topologyName`` (Kueue places by it, mode B);
    ``tessera_topology``: Tessera's annotation (Tessera places by it, mode A)."""
    spec: dict[str, Any] = {}
    if node_labels is not None:
        spec["nodeLabels"] = node_labels
    if taints:
        spec["nodeTaints"] = taints
    if topology:
        spec["topologyName"] = topology
    metadata: dict[str, Any] = {"name": name}
    if tessera_topology:
        metadata["annotations"] = {keys.FLAVOR_TOPOLOGY: tessera_topology}
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": metadata, "spec": spec}


Quota = tuple[Any, ...]
"""(nominal,) or (nominal, borrowingLimit) or (nominal, borrowingLimit, lendingLimit)."""


def cq_obj(
    name: str,
    flavors: dict[str, dict[str, Quota]],
    *,
    cohort: str | None = None,
    annotations: dict[str, str] | None = None,
    v1beta1: bool = False,
) -> dict[str, Any]:
    """One resource group covering every resource the flavors name."""
    covered: list[str] = []
    rows = []
    for flavor, resources in flavors.items():
        out = []
        for resource, quota in resources.items():
            if resource not in covered:
                covered.append(resource)
            row: dict[str, Any] = {"name": resource, "nominalQuota": quota[0]}
            if len(quota) > 1 and quota[1] is not None:
                row["borrowingLimit"] = quota[1]
            if len(quota) > 2 and quota[2] is not None:
                row["lendingLimit"] = quota[2]
            out.append(row)
        rows.append({"name": flavor, "resources": out})
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": covered, "flavors": rows}]}
    if cohort is not None:
        spec["cohort" if v1beta1 else "cohortName"] = cohort
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1" if v1beta1 else KUEUE,
        "kind": "ClusterQueue",
        "metadata": metadata,
        "spec": spec,
    }


def lq_obj(
    namespace: str, name: str, cluster_queue: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": namespace, "name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": KUEUE,
        "kind": "LocalQueue",
        "metadata": metadata,
        "spec": {"clusterQueue": cluster_queue},
    }


def topology_obj(name: str, levels: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }


def wpc_obj(name: str, value: Any) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def workload_obj(
    name: str,
    namespace: str = "team-nlp",
    *,
    queue: str = "training",
    gpus: int = 8,
    count: int = 1,
    created: str = "2026-01-01T00:00:00Z",
    admitted_at: str | None = None,
    cluster_queue: str = "training",
    flavor: str = "h100",
    finished: bool = False,
) -> dict[str, Any]:
    """A Kueue Workload of ``count`` pods of ``gpus`` GPUs each; ``admitted_at``: its
    quota was reserved then in ``cluster_queue`` on ``flavor``."""
    template = {
        "metadata": {},
        "spec": {"containers": [gpu_container(gpus=gpus)], "restartPolicy": "Never"},
    }
    status: dict[str, Any] = {"conditions": []}
    if admitted_at is not None:
        for kind in ("QuotaReserved", "Admitted"):
            status["conditions"].append(
                {"type": kind, "status": "True", "lastTransitionTime": admitted_at}
            )
        status["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": count,
                    "flavors": {keys.GPU_RESOURCE: flavor},
                    "resourceUsage": {keys.GPU_RESOURCE: str(gpus * count)},
                }
            ],
        }
    if finished:
        status["conditions"].append(
            {"type": "Finished", "status": "True", "lastTransitionTime": created}
        )
    return {
        "apiVersion": KUEUE,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {
            "queueName": queue,
            "podSets": [{"name": "main", "count": count, "template": template}],
        },
        "status": status,
    }
