"""One consistent, immutable view of the cluster, and the GPU arithmetic over it.

Layer: PURE. No async, no I/O, no clock, no settings, no aiohttp or kubernetes_asyncio,
and no import of the cache that produces snapshots. A ``Snapshot`` is what every reader
decides against: take one, decide, and never ``await`` in between. Nothing in a snapshot
changes after it is handed out; the cache builds the next one by sharing what did not
change (whole ``NodeState`` objects, whole shards of the pod maps). ``NodeChangeLog``
says which nodes changed between two generations, for readers that carry what they
derived from one snapshot to the next.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GangId,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodKey,
    Promise,
)
from cluster.sharded import ShardedMap


def _no_nodes() -> Mapping[NodeName, NodeState]:
    return MappingProxyType({})


def _no_promises() -> Mapping[NodeName, tuple[Promise, ...]]:
    return MappingProxyType({})


class NodeChangeLog:
    """Which nodes changed at which generation, for the last changes the cache made.

    Written only by the cache (``record``, as a node's state is replaced), read through
    the snapshots: a reader that derived something per node at one generation brings it
    up to a later one by redoing just the nodes ``since`` names, instead of looking at
    every node. Bounded: it forgets the oldest changes, and then says so (``None``).
    """

    __slots__ = ("_floor", "_generations", "_limit", "_names")

    def __init__(self, limit: int = 8192) -> None:
        self._generations: list[int] = []
        self._names: list[NodeName] = []
        self._floor = 0
        """Every change made after this generation is still in the log."""
        self._limit = limit

    def record(self, generation: int, name: NodeName) -> None:
        """``name`` changed in ``generation`` (never lower than one recorded before)."""
        self._generations.append(generation)
        self._names.append(name)
        if len(self._names) > 2 * self._limit:
            cut = len(self._names) - self._limit
            floor = self._generations[cut - 1]
            while cut < len(self._generations) and self._generations[cut] == floor:
                cut += 1  # a generation is kept whole or not at all
            del self._generations[:cut], self._names[:cut]
            self._floor = floor

    def since(self, generation: int, upto: int) -> list[NodeName] | None:
        """Nodes changed after ``generation`` up to ``upto`` (repeats possible), or
        ``None`` when the log no longer reaches back to ``generation``."""
        if generation < self._floor:
            return None
        low = bisect_right(self._generations, generation)
        high = bisect_right(self._generations, upto, lo=low)
        return self._names[low:high]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster at one generation.

    * ``nodes``: every known node; each GPU's ``free_milli`` already reflects all bound
      and assumed allocations (clamped at 0 if the watch reported an over-commitment).
    * ``pods``: GPU pods the cache knows, bound or pending (terminal pods are gone).
    * ``allocations``: GPUs held by bound and assumed pods. An allocation may name a node
      that is not in ``nodes`` (deleted, or not seen yet): it is kept for when it returns.
    * ``gangs``: per gang, the members that hold an allocation, sorted by key.
    * ``assumed``: pods whose allocation comes from ``assume`` and not yet from the watch.
    * ``promises``: per node held by a gang's reservation, its promises (the
      reservations' planner writes them through ``ClusterCache.promise``); a node's
      maintenance window is the node's own ``drain_after``.
    """

    generation: int = 0
    nodes: Mapping[NodeName, NodeState] = field(default_factory=_no_nodes)
    pods: Mapping[PodKey, PodInfo] = field(default_factory=ShardedMap.empty)
    allocations: Mapping[PodKey, Allocation] = field(default_factory=ShardedMap.empty)
    gangs: Mapping[GangId, tuple[PodKey, ...]] = field(default_factory=ShardedMap.empty)
    assumed: frozenset[PodKey] = frozenset()
    promises: Mapping[NodeName, tuple[Promise, ...]] = field(default_factory=_no_promises)
    node_log: NodeChangeLog | None = field(default=None, repr=False, compare=False)
    """The cache's record of node changes by generation; ``None`` for a snapshot that
    is not one of a cache's (nodes given in a request), which readers must not carry
    anything into or out of."""

    def gang_nodes(self, gang: GangId) -> tuple[NodeName, ...]:
        """Nodes holding the gang's placed or assumed members, one entry per member."""
        return tuple(self.allocations[key].node for key in self.gangs.get(gang, ()))


def gpus_needed(demand: PodDemand) -> int:
    """How many GPU indices a pod's allocation names: ``gpus``, or 1 for a share."""
    if demand.gpus:
        return demand.gpus
    return 1 if demand.gpu_milli else 0


def indices_match(indices: tuple[int, ...], demand: PodDemand) -> bool:
    """Whether ``indices`` can be the allocation of ``demand``: right count, distinct."""
    needed = gpus_needed(demand)
    if needed == 0 or len(indices) != needed:
        return False
    if needed == 1:
        return indices[0] >= 0
    return min(indices) >= 0 and len(set(indices)) == needed


def apply_allocation(node: NodeState, allocation: Allocation, sign: int) -> NodeState:
    """``node`` with ``allocation`` taken (``sign=1``) or given back (``sign=-1``).

    Free milli stays within 0..1000: taking from a full GPU clamps at 0 and returning to
    an empty one clamps at 1000, so callers simulating a placement (or the eviction of
    victims) never see an impossible GPU. Unknown GPU indices or a different node are a
    caller's mistake and raise ``ValueError``.
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be 1 or -1, got {sign}")
    if allocation.node != node.name:
        raise ValueError(f"allocation is for node {allocation.node}, not {node.name}")
    wanted = set(allocation.indices)
    delta = -sign * allocation.milli_per_gpu
    gpus: list[GpuDevice] = []
    for gpu in node.gpus:
        if gpu.index in wanted:
            wanted.discard(gpu.index)
            free = min(MILLI_PER_GPU, max(0, gpu.free_milli + delta))
            gpus.append(GpuDevice(gpu.index, gpu.island, gpu.healthy, free))
        else:
            gpus.append(gpu)
    if wanted:
        missing = ",".join(str(i) for i in sorted(wanted))
        raise ValueError(f"node {node.name} has no GPU {missing}")
    return replace(node, gpus=tuple(gpus))


def pick_gpus(node: NodeState, demand: PodDemand) -> tuple[int, ...] | None:
    """A simple deterministic choice of GPUs for ``demand`` on ``node``, or None.

    Whole GPUs: the lowest-index whole-free healthy GPUs, from one NVLink island when
    some island has enough of them (the first such island). A share: the healthy GPU
    with the least free milli that still holds it, lowest index on ties. A demand with
    no GPU gets ``()``. This accounts pods bound without ``tessera.dev/gpu-indices``;
    placement quality is the extender's business, not this function's.
    """
    if demand.gpus > 0:
        free = sorted((g for g in node.gpus if g.whole_free), key=lambda g: g.index)
        if len(free) < demand.gpus:
            return None
        by_island: dict[int, list[int]] = {}
        for gpu in free:
            by_island.setdefault(gpu.island, []).append(gpu.index)
        for island in sorted(by_island):
            if len(by_island[island]) >= demand.gpus:
                return tuple(by_island[island][: demand.gpus])
        return tuple(g.index for g in free[: demand.gpus])
    if demand.gpu_milli > 0:
        best: GpuDevice | None = None
        for gpu in node.gpus:
            if not gpu.healthy or gpu.free_milli < demand.gpu_milli:
                continue
            if best is None or (gpu.free_milli, gpu.index) < (best.free_milli, best.index):
                best = gpu
        return None if best is None else (best.index,)
    return ()
