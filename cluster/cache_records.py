"""The records the cache keeps behind its snapshots: one slot per node name, the gang
index, the product totals, and the assumptions made by bind.

Layer: STATE (the cache's side of it). Plain mutable records that only the cache
(``cluster.cache``, their one writer) holds and changes; readers see snapshots, never
these. Must not do I/O, log, read the clock or use asyncio, and must not account GPUs
(``cluster.accounting`` does that) or decide what a watch event means (the cache does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cluster.model import MILLI_PER_GPU, Allocation, GangId, NodeName, NodeState, PodInfo, PodKey
from cluster.sharded import CowMap, ShardedMap
from cluster.snapshot import indices_match


@dataclass(frozen=True, slots=True)
class ProductCounters:
    """GPU capacity of one product (``nvidia.com/gpu.product``) across the known nodes."""

    nodes: int = 0
    gpus: int = 0
    healthy_gpus: int = 0
    allocated_milli: int = 0
    whole_free_gpus: int = 0


@dataclass(frozen=True, slots=True)
class Assumption:
    """A placement that bind assumed, until the watch confirms it or ``deadline``
    (monotonic seconds) passes."""

    pod: PodInfo
    allocation: Allocation
    deadline: float


@dataclass(slots=True)
class NodeSlot:
    """All the cache keeps under one node name. A slot outlives its node: pods bound to
    a deleted node keep their allocations, so a node that comes back is accounted as
    before; an empty slot is dropped."""

    base: NodeState | None = None
    """The node as the watch reports it (``None``: not reported, or deleted)."""
    pods: dict[PodKey, tuple[Allocation | None, int]] = field(default_factory=dict)
    """GPU pods placed here: the exact allocation (``None`` where the cache picks the
    GPUs) and the CPU the pod asks, so accounting the node sums these instead of looking
    each pod up again."""
    cpu_only: int = 0
    """CPU asked by the pods without GPUs placed here."""
    problems: tuple[str, ...] = ()
    """Accounting problems found the last time the node was accounted."""

    @property
    def unused(self) -> bool:
        return self.base is None and not self.pods and not self.cpu_only and not self.problems


class GangIndex:
    """Gang → members holding an allocation, and the sorted tuples snapshots show. Only
    the gangs touched since the last ``flush`` are re-sorted."""

    __slots__ = ("_dirty", "_frozen", "_members")

    def __init__(self) -> None:
        self._members: dict[GangId, set[PodKey]] = {}
        self._frozen: CowMap[GangId, tuple[PodKey, ...]] = CowMap()
        self._dirty: set[GangId] = set()

    def move(self, key: PodKey, leave: GangId | None, join: GangId | None) -> None:
        if leave is not None:
            members = self._members.get(leave)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._members[leave]
                self._dirty.add(leave)
        if join is not None:
            self._members.setdefault(join, set()).add(key)
            self._dirty.add(join)

    def flush(self) -> None:
        for gang in self._dirty:
            members = self._members.get(gang)
            if members:
                sorted_members = tuple(sorted(members))
                if self._frozen.get(gang) != sorted_members:
                    self._frozen.set(gang, sorted_members)
            else:
                self._frozen.pop(gang)
        self._dirty.clear()

    def freeze(self) -> ShardedMap[GangId, tuple[PodKey, ...]]:
        return self._frozen.freeze()


class ProductTotals:
    """Running ``ProductCounters`` per GPU product: a node's contribution is taken out
    before it changes and put back after, so counters never walk the fleet."""

    __slots__ = ("_totals",)

    def __init__(self) -> None:
        self._totals: dict[str, list[int]] = {}

    def add(self, node: NodeState, sign: int) -> None:
        totals = self._totals.setdefault(node.product, [0] * 5)
        for i, part in enumerate(_contribution(node)):
            totals[i] += sign * part

    def counters(self) -> Mapping[str, ProductCounters]:
        return MappingProxyType(
            {
                product: ProductCounters(*totals)
                for product, totals in sorted(self._totals.items())
                if totals[0]
            }
        )


def _contribution(node: NodeState) -> tuple[int, int, int, int, int]:
    """What one node adds to its product's ``ProductCounters``, field by field."""
    healthy = allocated = whole_free = 0
    for gpu in node.gpus:
        healthy += gpu.healthy
        allocated += MILLI_PER_GPU - gpu.free_milli
        whole_free += gpu.whole_free
    return (1, len(node.gpus), healthy, allocated, whole_free)


def placement(
    watch: PodInfo | None, assumption: Assumption | None
) -> tuple[NodeName, Allocation | None] | None:
    """Where a pod's GPUs are, from its inputs: the node, and the exact allocation or
    None when the cache must pick GPUs for it (bound without usable indices)."""
    if watch is not None and watch.node is not None:
        if indices_match(watch.gpu_indices, watch.demand):
            return watch.node, Allocation(watch.node, watch.gpu_indices, watch.demand.milli_per_gpu)
        return watch.node, None
    if assumption is not None:
        return assumption.allocation.node, assumption.allocation
    return None


def gang_of(pod: PodInfo | None) -> GangId | None:
    if pod is None or pod.demand.gang is None:
        return None
    return pod.demand.gang.id
