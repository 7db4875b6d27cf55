"""The cluster as Tessera sees it: nodes made of GPUs, pods made of demands.

Layer: PURE. Frozen slotted dataclasses and tiny total functions over them. Must not
import I/O, asyncio, pydantic or the cache; must not read the clock (times arrive as
values). Everything here is built by ``cluster.convert`` from raw Kubernetes JSON, or
by the cache from these same records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Final, NewType

NodeName = NewType("NodeName", str)
PodKey = NewType("PodKey", str)
"""``<namespace>/<name>``: how the cache, the binder and the extender name one pod."""
GangId = NewType("GangId", str)
"""``<namespace>.<job name>``: the value of the ``tessera.dev/gang`` label."""

MILLI_PER_GPU = 1000
"""A whole GPU is 1000 milli-GPUs; a share is 1 to 999 of them."""


def pod_key(namespace: str, name: str) -> PodKey:
    return PodKey(f"{namespace}/{name}")


def product_matches(accepted: str, product: str) -> bool:
    """``H100`` accepts ``NVIDIA-H100-80GB-HBM3``: its ``-`` parts appear as consecutive
    parts of the GPU Feature Discovery product, in any case (``H10``, ``A100`` do not)."""
    want = accepted.strip().lower().split("-")
    have = product.strip().lower().split("-")
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def level_short_name(node_label: str) -> str:
    """The name a topology level also answers to: its node label's name part, the text
    after the last ``/`` (``rack`` for ``example.com/rack``). The webhook and the
    extender both read ``tessera.dev/topology: required:<level>`` with this rule."""
    return node_label.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU of a node: its index, its NVLink island, and how much of it is free."""

    index: int
    island: int
    healthy: bool = True
    free_milli: int = MILLI_PER_GPU

    @property
    def whole_free(self) -> bool:
        """Free for a whole-GPU pod: healthy and not shared with anyone."""
        return self.healthy and self.free_milli == MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One ``matchExpressions`` (or ``matchFields``) item of a pod's required node
    affinity; a ``nodeSelector`` entry is ``key In (value)``."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    field: bool = False
    """A ``matchFields`` item: ``key`` names a field of the Node (``metadata.name``)."""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty: every effect


@dataclass(frozen=True, slots=True)
class NodeSelection:
    """Which nodes a pod may go to by their labels and taints, as kube-scheduler's
    in-tree filters judge it: ``spec.nodeSelector`` (all of ``required``), the required
    node affinity (one of ``terms``, when there are any) and ``spec.tolerations``.
    kube-scheduler only hands the extender nodes that pass these; the extender reads them
    to count where a gang's *other* members could go."""

    required: tuple[NodeRequirement, ...] = ()
    terms: tuple[tuple[NodeRequirement, ...], ...] | None = None
    """None: no required node affinity; else a node must match one term."""
    tolerations: tuple[Toleration, ...] = ()
    prefers: bool = False
    """The pod also states a preference that only kube-scheduler's own scoring weighs: a
    preferred node affinity, a preferred pod affinity or anti-affinity, or a topology
    spread that allows skew (``ScheduleAnyway``). The choice among the nodes it fits is
    then left to kube-scheduler (``ExtenderConfig.choose_in_filter``)."""


UNCONSTRAINED: Final = NodeSelection()
"""A pod with no node selector, no required node affinity and no toleration."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node and its GPUs; ``free_milli`` of each GPU reflects every known allocation.

    ``domains`` maps a topology level's node label to this node's value at that level
    (``{"example.com/rack": "r12"}``); a level the node has no label for is absent.
    ``problems`` lists malformed annotations found at conversion: they were ignored,
    and are reported once where the node is first seen.
    """

    name: NodeName
    gpus: tuple[GpuDevice, ...] = ()
    product: str = ""
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    """Allocatable CPU, as the Node object reports it."""
    cpu_requested_milli: int = 0
    """CPU requested by the pods bound (or assumed) to the node, GPU pods or not."""
    memory_bytes: int = 0
    max_pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    domains: Mapping[str, str] = field(default_factory=dict)
    drain_after: datetime | None = None
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def cpu_free_milli(self) -> int:
        """CPU the node can still give to a pod (never negative)."""
        return max(0, self.cpu_milli - self.cpu_requested_milli)

    @property
    def healthy_gpus(self) -> tuple[GpuDevice, ...]:
        return tuple(g for g in self.gpus if g.healthy)

    @property
    def free_milli(self) -> int:
        """Free milli-GPUs summed over healthy GPUs."""
        return sum(g.free_milli for g in self.gpus if g.healthy)

    @property
    def whole_free(self) -> int:
        """Healthy GPUs that nobody uses, whole or in part."""
        return sum(1 for g in self.gpus if g.whole_free)

    def islands(self) -> dict[int, tuple[GpuDevice, ...]]:
        """GPUs grouped by NVLink island, islands in ascending order."""
        grouped: dict[int, list[GpuDevice]] = {}
        for gpu in self.gpus:
            grouped.setdefault(gpu.island, []).append(gpu)
        return {island: tuple(grouped[island]) for island in sorted(grouped)}


class TopologyMode(Enum):
    REQUIRED = "required"
    PREFERRED = "preferred"


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """``tessera.dev/topology``: keep a gang inside one domain of ``level``."""

    mode: TopologyMode
    level: str

    def __str__(self) -> str:
        return f"{self.mode.value}:{self.level}"


@dataclass(frozen=True, slots=True)
class GangSpec:
    """A gang: ``size`` members in total, of which ``min_count`` must run together."""

    id: GangId
    size: int
    min_count: int


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What one pod needs from a node.

    Either ``gpus`` whole GPUs, or one share of ``gpu_milli`` (1-999) of a single GPU,
    never both; a pod with neither uses no GPU. ``products`` empty means any product.
    """

    gpus: int = 0
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_bytes: int = 0
    gang: GangSpec | None = None
    topology: TopologyConstraint | None = None
    time_limit_s: int | None = None
    products: tuple[str, ...] = ()
    selection: NodeSelection | None = None
    """Where the pod may go by node labels and taints; None: not known (read only for
    pods that wait to be placed)."""

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_milli > 0

    @property
    def is_share(self) -> bool:
        return self.gpus == 0 and self.gpu_milli > 0

    @property
    def total_milli(self) -> int:
        """GPU capacity the pod takes, in milli-GPUs."""
        return self.gpus * MILLI_PER_GPU if self.gpus else self.gpu_milli

    @property
    def milli_per_gpu(self) -> int:
        """What the pod takes of each GPU it is given."""
        return MILLI_PER_GPU if self.gpus else self.gpu_milli


class PodPhase(Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @property
    def terminal(self) -> bool:
        """A terminal pod holds no resources any more."""
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One pod as the cache keeps it: identity, demand and where it is bound.

    ``gpu_indices`` are the GPUs named by ``tessera.dev/gpu-indices``; empty for a pod
    that is not bound yet, or one bound without the annotation (the cache then picks
    GPUs for it so that accounting stays whole). ``refusal`` says why no node can take
    the pod whatever it has free: a GPU request that is no count of GPUs (negative, not
    a number, fractional, more than a node can have), which must not be read as none.

    Times, for reservations (``extender.reservations``): ``started_at`` is when a bound
    pod started (``status.startTime``), from which its time limit runs; ``created_at``
    and ``priority`` are read only for gang members waiting to be placed, which gangs are
    served in order of (the oldest gang first, the higher priority first).
    """

    key: PodKey
    uid: str
    demand: PodDemand
    node: NodeName | None = None
    gpu_indices: tuple[int, ...] = ()
    phase: PodPhase = PodPhase.PENDING
    scheduler_name: str = ""
    deleting: bool = False
    problems: tuple[str, ...] = ()
    refusal: str = ""
    started_at: datetime | None = None
    """``status.startTime`` of a bound pod; None before the kubelet starts it."""
    created_at: datetime | None = None
    """``metadata.creationTimestamp``, kept for a gang member waiting to be placed."""
    priority: int = 0
    """``spec.priority`` (admission resolves the priority class into it), kept for a gang
    member waiting to be placed."""
    version: str = field(default="", compare=False)
    """``metadata.resourceVersion`` of a pod not bound yet ("" once bound, or without
    one): which content of the object this record was read from. Not part of what the
    pod is (two reads of one pod compare equal); the extender reads it to take a pod
    kube-scheduler sends from the cache, when the watch read that same version."""

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def holds_resources(self) -> bool:
        """Bound and not finished: its GPUs count as used."""
        return self.node is not None and not self.phase.terminal


@dataclass(frozen=True, slots=True)
class Allocation:
    """The GPUs one pod holds on one node, and how much of each (1000 = whole)."""

    node: NodeName
    indices: tuple[int, ...]
    milli_per_gpu: int

    def __str__(self) -> str:
        return ",".join(str(i) for i in self.indices)


@dataclass(frozen=True, slots=True)
class Promise:
    """A node promised from ``start`` on: to maintenance (``gang`` None) or to ``gang``'s
    reservation. ``start`` None: from a time not known yet, so nothing else may start
    there. The rule it keeps is ``extender.promises``'; the cache only holds the
    reservations' promises for the snapshots (``Snapshot.promises``)."""

    start: datetime | None
    gang: GangId | None = None
