"""What ``sched-perf`` creates: HGX-like GPU nodes, and GPU pods of the openb trace's shapes.

Layer: PURE (trace rows and a seed in, API objects out; no I/O, no clock). Must not
decide where anything goes; every profile is given the very same objects.

Nodes: ``loadtest.stack.fleet.FakeNode`` (8 H100s in two NVLink islands ``0-3,4-7``,
GFD labels, ``nvidia.com/gpu`` and ``tessera.dev/gpu-milli`` allocatable), named
``gpu-00000``..., four to a rack and four racks to a block (``example.com/rack``,
``example.com/block``, ``kubernetes.io/hostname``: the levels the shipped extender
Deployment names).

Pods: drawn with replacement (seeded) from the GPU pods of an openb trace: a share of a
GPU (``tessera.dev/gpu-milli``) or whole GPUs (``nvidia.com/gpu``), with the row's CPU
and memory capped at the node's per-GPU part (12 cores and 192 GiB a GPU), so that an
HGX node's 96 cores never decide whether a GPU pod fits. Besides, ``gang_share`` of the
pods are members of gangs of two to four 8-GPU pods that must share a rack
(``required:rack``), labelled, annotated and given the pod affinity to their own gang
at the rack label as the webhook writes gangs into pod templates (mode A). Every profile
gets the very same pods, so kube-scheduler's ``InterPodAffinity`` keeps a gang's later
members in its first member's rack in the in-tree profiles too; only the extender
chooses a rack with room for the whole gang. Gang members are created one after the
other.

Background (``background_pods``): pods already bound when the measured ones come, spread
evenly over the nodes in a namespace of their own: the agents and sidecars of a busy
cluster. They request nothing, so every profile places the measured pods as it would
without them; what they add is objects: kube-apiserver's lists and watches, kube-scheduler's
and the extender's caches, and the extender's rebuild after a restart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels
from cluster.convert.grammar import parse_topology, parse_topology_levels
from loadtest.inputs.traces import TracePod
from loadtest.stack.fleet import FakeNode
from webhook.rules.placement import gang_affinity

Obj = dict[str, Any]

POOL: Final = "sched-perf"
NAMESPACE: Final = "sched-perf"
BACKGROUND_NAMESPACE: Final = "sched-perf-background"
NODES_PER_RACK: Final = 4
RACKS_PER_BLOCK: Final = 4
GPUS_PER_NODE: Final = 8
CPU_MILLI_PER_GPU: Final = 12_000
MEMORY_MIB_PER_GPU: Final = 192 * 1024
GANG_SIZES: Final = (2, 3, 4)
GANG_TOPOLOGY: Final = "required:rack"
LEVELS: Final = "block=example.com/block,rack=example.com/rack,hostname=kubernetes.io/hostname"
GANG_NODE_LABEL: Final = dict(parse_topology_levels(LEVELS))[parse_topology(GANG_TOPOLOGY).level]
"""The node label of ``GANG_TOPOLOGY``'s level: what the gang members' affinity keeps."""


GANG_PREFIX: Final = "gang-"


def is_gang_member(name: str) -> bool:
    """Whether the pod named ``name`` is a gang member (their names start ``gang-``)."""
    return name.startswith(GANG_PREFIX)


def hgx_nodes(count: int) -> list[FakeNode]:
    """``count`` HGX nodes, racked four to a rack, four racks to a block."""
    return [
        FakeNode(
            f"gpu-{i:05d}",
            POOL,
            rack=f"rack-{i // NODES_PER_RACK:04d}",
            block=f"block-{i // (NODES_PER_RACK * RACKS_PER_BLOCK):03d}",
        )
        for i in range(count)
    ]


@dataclass(frozen=True, slots=True)
class PodShape:
    """One pod to create: whole GPUs or one share, CPU and memory, and its gang if any."""

    name: str
    gpus: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gang: str = ""
    gang_size: int = 0

    @property
    def size(self) -> str:
        """The size class a report groups by: ``share`` or the number of GPUs."""
        return "share" if not self.gpus else str(self.gpus)

    @property
    def gpu_demand(self) -> float:
        return self.gpus if self.gpus else self.gpu_milli / 1000


def _capped(pod: TracePod, gpus: int) -> tuple[int, int]:
    units = max(gpus, 1)
    cpu = min(max(pod.cpu_milli, 100), CPU_MILLI_PER_GPU * units)
    memory = min(max(pod.memory_mib, 128), MEMORY_MIB_PER_GPU * units)
    return cpu, memory


def shapes(
    trace: Sequence[TracePod], count: int, *, gang_share: float, seed: int
) -> list[PodShape]:
    """``count`` pods: gang members (about ``gang_share`` of them, whole gangs) and draws
    from the trace's GPU pods, in a seeded random order."""
    rng = random.Random(seed)
    gpu_pods = [p for p in trace if p.num_gpu > 0]
    if not gpu_pods:
        raise ValueError("the trace holds no GPU pod")
    out: list[PodShape] = []
    gang_members = round(count * gang_share)
    gangs = 0
    while gang_members - sum(1 for s in out if s.gang) >= GANG_SIZES[0]:
        left = gang_members - sum(1 for s in out if s.gang)
        size = min(rng.choice(GANG_SIZES), left)
        if left - size == 1:  # no gang of one: one more member here, or one fewer
            size = size + 1 if size < GANG_SIZES[-1] else size - 1
        gang = f"{GANG_PREFIX}{gangs:04d}"
        gangs += 1
        cpu, memory = CPU_MILLI_PER_GPU * GPUS_PER_NODE // 2, MEMORY_MIB_PER_GPU * 4
        out += [
            PodShape(f"{gang}-{k}", GPUS_PER_NODE, 0, cpu, memory, gang=gang, gang_size=size)
            for k in range(size)
        ]
    singles = [_single(rng.choice(gpu_pods), i) for i in range(count - len(out))]
    # gangs stay whole and in member order, placed among the singles at random
    units: list[list[PodShape]] = [[s] for s in singles]
    for gang_id in dict.fromkeys(s.gang for s in out):
        units.append([s for s in out if s.gang == gang_id])
    rng.shuffle(units)
    return [s for unit in units for s in unit]


def _single(pod: TracePod, index: int) -> PodShape:
    whole = pod.num_gpu if pod.gpu_milli >= 1000 or pod.num_gpu > 1 else 0
    milli = 0 if whole else pod.gpu_milli
    cpu, memory = _capped(pod, whole)
    return PodShape(f"pod-{index:05d}", whole, milli, cpu, memory)


def pod_manifest(shape: PodShape, scheduler: str, namespace: str = NAMESPACE) -> Obj:
    """The Pod as created: GPU requests equal to limits (extended resources allow no
    other), the gang's label, annotations and pod affinity as the webhook writes them,
    and nothing that would need a kubelet."""
    gpu = (
        {labels.GPU_RESOURCE: str(shape.gpus)}
        if shape.gpus
        else {labels.GPU_MILLI_RESOURCE: str(shape.gpu_milli)}
    )
    requests = {"cpu": f"{shape.cpu_milli}m", "memory": f"{shape.memory_mib}Mi", **gpu}
    metadata: Obj = {"name": shape.name, "namespace": namespace, "labels": {"app": POOL}}
    if shape.gang:
        metadata["labels"][labels.GANG] = f"{namespace}.{shape.gang}"
        metadata["annotations"] = {
            labels.GANG_SIZE: str(shape.gang_size),
            labels.GANG_MIN: str(shape.gang_size),
            labels.TOPOLOGY: GANG_TOPOLOGY,
        }
    spec: Obj = {
        "schedulerName": scheduler,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/train:1",
                "resources": {"requests": requests, "limits": gpu},
            }
        ],
    }
    if shape.gang:
        spec["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [gang_affinity(GANG_NODE_LABEL)]
            }
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def background_pods(nodes: Sequence[FakeNode], count: int) -> list[Obj]:
    """``count`` pods bound at creation (``spec.nodeName``), round-robin over ``nodes``
    (so no node gets more than one above another), requesting nothing."""
    if count and not nodes:
        raise ValueError("background pods need nodes to be bound to")
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"bg-{i:06d}",
                "namespace": BACKGROUND_NAMESPACE,
                "labels": {"app": BACKGROUND_NAMESPACE},
            },
            "spec": {
                "nodeName": nodes[i % len(nodes)].name,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "agent", "image": "registry.example.com/agent:1"}],
            },
        }
        for i in range(count)
    ]
