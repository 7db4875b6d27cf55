"""The reservation study's simulated cluster: the openb nodes, their free GPUs, CPU and
memory, the pods running on them, and where a pod or a gang fits.

Layer: PURE (mutable state of one run, no I/O, no clock: times are seconds of the run).
Must not decide what a policy decides (whether a node is promised to someone is the
caller's ``allowed``). Its nodes are also shown to ``extender.reservations`` as the
extender sees them (``view``): ``NodeState`` values (one NVLink island: the trace has
no topology) and the pods holding their GPUs until their time limits end.

Placement of a single pod is a simple best fit, the same for every policy (the
extender's own scoring would cost a full pass over 1,213 nodes per pod, where this study
places some 100,000 pods a run): whole GPUs go to the node (of a model the pod accepts,
with its CPU and memory) with the fewest whole free GPUs that holds them, the
lowest-index free GPUs there; a share goes to the partly used GPU with the least free
that holds it (lowest index first), else to a whole free GPU on the node with the
fewest. Both keep empty nodes empty for as long as they can, which is what gangs need.
A gang's members go to the rack with the fewest nodes able to hold a member that still
holds them all (each member takes a whole empty 8-GPU node).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from cluster.labels import GFD_PRODUCT, HOSTNAME
from cluster.model import Allocation, GpuDevice, NodeName, NodeState
from extender.outlooks import Holding
from loadtest.inputs.asks import PodAsk
from loadtest.inputs.fleet import RACK_LABEL
from loadtest.inputs.traces import TraceNode
from loadtest.reservations.workload import GANG_GPUS, GANG_MEMBER, MILLI, Job

EPOCH: Final = datetime(2026, 1, 1, tzinfo=UTC)
"""Second 0 of a run, as the extender's code reads times."""


def moment(at: float) -> datetime:
    """Second ``at`` of a run as a time."""
    return EPOCH + timedelta(seconds=at)


def seconds(when: datetime) -> float:
    """A time as the run's second."""
    return (when - EPOCH).total_seconds()


Allowed = Callable[[int], bool]


@dataclass(frozen=True, slots=True)
class Run:
    """One pod of a job on node ``node``: its GPUs, and when its time limit ends."""

    job: Job
    node: int
    indices: tuple[int, ...]
    limit_ends: float


class SimCluster:
    """Free GPUs, CPU and memory per node, with the indexes best fit searches."""

    @classmethod
    def like(cls, other: SimCluster) -> SimCluster:
        """An empty cluster of ``other``'s nodes and racks."""
        return cls(other.source, [other.rack_names[r] for r in other.rack_of])

    def __init__(self, nodes: Sequence[TraceNode], racks: Sequence[str]) -> None:
        self.source = tuple(nodes)
        self.names = [NodeName(n.name) for n in nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.models = [n.model for n in nodes]
        self.sizes = [n.gpus for n in nodes]
        self.cpu_cap = [n.cpu_milli for n in nodes]
        self.mem_cap = [n.memory_mib for n in nodes]
        self.free = [[MILLI] * n.gpus for n in nodes]
        self.free_total = [MILLI * n.gpus for n in nodes]
        self.whole = list(self.sizes)
        self.cpu = list(self.cpu_cap)
        self.mem = list(self.mem_cap)
        self.runs: list[dict[int, Run]] = [{} for _ in nodes]
        self.allocated_milli = 0
        self.capacity_milli = MILLI * sum(self.sizes)
        self.version = [0] * len(nodes)
        self.dirty = set(range(len(nodes)))
        """Nodes changed since ``take_dirty`` last said which."""
        self._groups(nodes)
        self._racks(racks)
        self._views: dict[int, tuple[int, NodeState, tuple[Holding, ...]]] = {}
        self._ever: dict[PodAsk, bool] = {}
        self._held: dict[int, Holding] = {}
        self._gpus: dict[tuple[int, int], GpuDevice] = {}

    # ------------------------------------------------------------ setup

    def _groups(self, nodes: Sequence[TraceNode]) -> None:
        """Nodes by (model, GPU count), each with its indexes: nodes by whole free GPUs,
        and nodes by the free milli of their partly used GPUs."""
        keys: dict[tuple[str, int], int] = {}
        self.group_of = [keys.setdefault((n.model, n.gpus), len(keys)) for n in nodes]
        self.group_keys = list(keys)
        self.by_whole: list[list[dict[int, None]]] = [
            [{} for _ in range(size + 1)] for _, size in self.group_keys
        ]
        self.partial: list[dict[int, dict[int, int]]] = [{} for _ in self.group_keys]
        self.partial_values: list[list[int]] = [[] for _ in self.group_keys]
        self._spec_groups: dict[tuple[str, ...], tuple[int, ...]] = {}
        for n in range(len(nodes)):
            self._index(n)

    def _racks(self, racks: Sequence[str]) -> None:
        names: dict[str, int] = {}
        self.rack_of = [names.setdefault(r, len(names)) for r in racks]
        self.rack_names = list(names)
        self.rack_nodes: list[list[int]] = [[] for _ in names]
        for n, r in enumerate(self.rack_of):
            self.rack_nodes[r].append(n)
        self.slot = [self._holds_member(n) for n in range(len(racks))]
        self.rack_slots = [sum(self.slot[n] for n in nodes) for nodes in self.rack_nodes]
        self.gang_racks = [r for r, nodes in enumerate(self.rack_nodes) if self._gang_rack(nodes)]

    def _gang_rack(self, nodes: Sequence[int]) -> bool:
        return any(self.sizes[n] == GANG_GPUS for n in nodes)

    # ------------------------------------------------------------ indexes

    def _index(self, n: int, sign: int = 1) -> None:
        g = self.group_of[n]
        if sign > 0:
            self.by_whole[g][self.whole[n]][n] = None
        else:
            del self.by_whole[g][self.whole[n]][n]
        partial, values = self.partial[g], self.partial_values[g]
        for f in self.free[n]:
            if 0 < f < MILLI:
                holders = partial.get(f)
                if holders is None:
                    holders = partial[f] = {}
                    bisect.insort(values, f)
                count = holders.get(n, 0) + sign
                if count:
                    holders[n] = count
                else:
                    del holders[n]
                    if not holders:
                        del partial[f]
                        values.pop(bisect.bisect_left(values, f))

    def _holds_member(self, n: int) -> bool:
        return (
            self.sizes[n] == GANG_GPUS
            and self.whole[n] == GANG_GPUS
            and self.cpu[n] >= GANG_MEMBER.cpu_milli
            and self.mem[n] >= GANG_MEMBER.memory_mib
        )

    def _changed(self, n: int) -> None:
        self.version[n] += 1
        self.dirty.add(n)
        now = self._holds_member(n)
        if now != self.slot[n]:
            self.slot[n] = now
            self.rack_slots[self.rack_of[n]] += 1 if now else -1

    # ------------------------------------------------------------ taking and giving back

    def take(self, n: int, ask: PodAsk, indices: Sequence[int], run: Run) -> None:
        self._index(n, -1)
        frees = self.free[n]
        for i in indices:
            if frees[i] < ask.gpu_milli:
                raise AssertionError(f"GPU {i} of {self.names[n]} cannot hold {ask}")
            if frees[i] == MILLI:
                self.whole[n] -= 1
            frees[i] -= ask.gpu_milli
        self.cpu[n] -= ask.cpu_milli
        self.mem[n] -= ask.memory_mib
        self.runs[n][id(run)] = run
        self.allocated_milli += len(indices) * ask.gpu_milli
        self.free_total[n] -= len(indices) * ask.gpu_milli
        self._index(n)
        self._changed(n)

    def release(self, run: Run) -> None:
        n, ask = run.node, run.job.ask
        self._index(n, -1)
        frees = self.free[n]
        for i in run.indices:
            frees[i] += ask.gpu_milli
            if frees[i] == MILLI:
                self.whole[n] += 1
        self.cpu[n] += ask.cpu_milli
        self.mem[n] += ask.memory_mib
        del self.runs[n][id(run)]
        self._held.pop(id(run), None)
        self.allocated_milli -= len(run.indices) * ask.gpu_milli
        self.free_total[n] += len(run.indices) * ask.gpu_milli
        self._index(n)
        self._changed(n)

    # ------------------------------------------------------------ where a pod fits

    def room(self, n: int, ask: PodAsk) -> bool:
        """CPU and memory for ``ask`` on ``n`` (GPUs are the indexes' business)."""
        return self.cpu[n] >= ask.cpu_milli and self.mem[n] >= ask.memory_mib

    def fits(self, n: int, ask: PodAsk) -> bool:
        """Whether ``ask`` fits on node ``n`` now."""
        if not self.room(n, ask) or (ask.gpu_spec and self.models[n] not in ask.gpu_spec):
            return False
        if ask.whole:
            return self.whole[n] >= ask.num_gpu
        return any(f >= ask.gpu_milli for f in self.free[n])

    def ever_fits(self, ask: PodAsk) -> bool:
        """Whether some node could hold ``ask`` if it were empty."""
        found = self._ever.get(ask)
        if found is None:
            found = self._ever[ask] = any(
                self.cpu_cap[n] >= ask.cpu_milli
                and self.mem_cap[n] >= ask.memory_mib
                and self.sizes[n] >= ask.num_gpu
                and (not ask.gpu_spec or self.models[n] in ask.gpu_spec)
                for n in range(len(self.names))
            )
        return found

    def _groups_for(self, spec: tuple[str, ...]) -> tuple[int, ...]:
        found = self._spec_groups.get(spec)
        if found is None:
            found = self._spec_groups[spec] = tuple(
                g for g, (model, _) in enumerate(self.group_keys) if not spec or model in spec
            )
        return found

    def best_single(
        self, ask: PodAsk, allowed: Allowed | None
    ) -> tuple[int, tuple[int, ...]] | None:
        """Node and GPUs for one pod by best fit (see the module docstring), on nodes
        ``allowed`` lets it use; None when none holds it."""
        groups = self._groups_for(ask.gpu_spec)
        if not ask.whole:
            found = self._best_share(groups, ask, allowed)
            if found is not None:
                return found
        return self._best_whole(groups, ask, ask.num_gpu if ask.whole else 1, allowed)

    def _best_whole(
        self, groups: Sequence[int], ask: PodAsk, k: int, allowed: Allowed | None
    ) -> tuple[int, tuple[int, ...]] | None:
        largest = max((self.group_keys[g][1] for g in groups), default=0)
        for w in range(k, largest + 1):
            for g in groups:
                buckets = self.by_whole[g]
                if w >= len(buckets):
                    continue
                for n in buckets[w]:
                    if self.room(n, ask) and (allowed is None or allowed(n)):
                        frees = self.free[n]
                        return n, tuple([i for i, f in enumerate(frees) if f == MILLI][:k])
        return None

    def _best_share(
        self, groups: Sequence[int], ask: PodAsk, allowed: Allowed | None
    ) -> tuple[int, tuple[int, ...]] | None:
        m = ask.gpu_milli
        for f, g in self._partial_from(groups, m):
            for n in self.partial[g][f]:
                if self.room(n, ask) and (allowed is None or allowed(n)):
                    return n, (self.free[n].index(f),)
        return None

    def _partial_from(self, groups: Sequence[int], m: int) -> Iterator[tuple[int, int]]:
        """(free milli, group) of partly used GPUs with at least ``m`` free, least first."""
        runs = []
        for g in groups:
            values = self.partial_values[g]
            start = bisect.bisect_left(values, m)
            if start < len(values):
                runs.append([(f, g) for f in values[start:]])
        return heapq.merge(*runs)

    # ------------------------------------------------------------ gangs

    def member_nodes(self, rack: int, allowed: Allowed | None) -> list[int]:
        return [
            n for n in self.rack_nodes[rack] if self.slot[n] and (allowed is None or allowed(n))
        ]

    def best_rack(
        self,
        members: int,
        allowed: Allowed | None,
        watched: Collection[int],
        prefer: int | None = None,
    ) -> list[int] | None:
        """Nodes for ``members`` gang members in one rack: ``prefer`` when it has room,
        else the rack with the fewest member slots that holds them. ``allowed`` is asked
        only about the nodes of the racks in ``watched`` (where it may say no)."""
        if prefer is not None:
            nodes = self.member_nodes(prefer, allowed)
            if len(nodes) >= members:
                return nodes[:members]
        best: tuple[int, int] | None = None
        for r in self.gang_racks:
            slots = self.rack_slots[r]
            if slots < members:
                continue
            if r in watched:
                slots = len(self.member_nodes(r, allowed))
                if slots < members:
                    continue
            if best is None or slots < best[0]:
                best = (slots, r)
        if best is None:
            return None
        return self.member_nodes(best[1], allowed if best[1] in watched else None)[:members]

    # ------------------------------------------------------------ as the extender sees it

    def view(self, n: int) -> tuple[NodeState, tuple[Holding, ...]]:
        """Node ``n`` as a ``NodeState`` and the pods holding its GPUs, with the times
        their limits end: made again only after the node changed."""
        kept = self._views.get(n)
        if kept is not None and kept[0] == self.version[n]:
            return kept[1], kept[2]
        name = self.names[n]
        rack = self.rack_names[self.rack_of[n]]
        state = NodeState(
            name=name,
            gpus=tuple(self._gpu(i, f) for i, f in enumerate(self.free[n])),
            product=self.models[n],
            cpu_milli=self.cpu_cap[n],
            cpu_requested_milli=self.cpu_cap[n] - self.cpu[n],
            labels={HOSTNAME: name, GFD_PRODUCT: self.models[n], RACK_LABEL: rack},
            domains={HOSTNAME: name, RACK_LABEL: rack},
        )
        held = tuple(self._holding(run) for run in self.runs[n].values())
        self._views[n] = (self.version[n], state, held)
        return state, held

    def _gpu(self, index: int, free: int) -> GpuDevice:
        found = self._gpus.get((index, free))
        if found is None:
            found = self._gpus[index, free] = GpuDevice(index, 0, True, free)
        return found

    def _holding(self, run: Run) -> Holding:
        found = self._held.get(id(run))
        if found is None:
            allocation = Allocation(self.names[run.node], run.indices, run.job.ask.gpu_milli)
            found = Holding(allocation, moment(run.limit_ends), run.job.ask.cpu_milli)
            self._held[id(run)] = found
        return found

    def take_dirty(self) -> set[int]:
        found, self.dirty = self.dirty, set()
        return found

    def free_milli(self, nodes: Iterable[int]) -> int:
        """Free GPU capacity of ``nodes``, in milli-GPUs."""
        return sum(map(self.free_total.__getitem__, nodes))


class NodeViews(Mapping[NodeName, NodeState]):
    """Nodes ``names`` of ``sim`` as the extender sees them, each made when it is read
    (and again only after it changed): a plan reads the nodes of the domains it counts
    again, not every node that changed."""

    __slots__ = ("_names", "_sim")

    def __init__(self, sim: SimCluster, names: Iterable[NodeName]) -> None:
        self._sim = sim
        self._names = dict.fromkeys(names)

    def __getitem__(self, name: NodeName) -> NodeState:
        if name not in self._names:
            raise KeyError(name)
        return self._sim.view(self._sim.index[name])[0]

    def __iter__(self) -> Iterator[NodeName]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class HoldingViews(Mapping[NodeName, tuple[Holding, ...]]):
    """The pods holding GPUs on the nodes of a ``NodeViews``, the same way."""

    __slots__ = ("_nodes", "_sim")

    def __init__(self, sim: SimCluster, nodes: NodeViews) -> None:
        self._sim = sim
        self._nodes = nodes

    def __getitem__(self, name: NodeName) -> tuple[Holding, ...]:
        if name not in self._nodes:
            raise KeyError(name)
        return self._sim.view(self._sim.index[name])[1]

    def __iter__(self) -> Iterator[NodeName]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)
