"""The pods holding GPUs on each node and when their time limits end: what a plan of
reservations counts each node's outlook from (``extender.outlooks``); and the gang
members among all pods, which a plan finds the waiting gangs among.

Layer: PURE (``holdings``, a function of a snapshot and ``now``) and a memo that one
caller keeps between its plans (``HoldingsMemo``, in memory only, held to the PURE
contract): no I/O, no clock, no settings, no aiohttp, no cache. Must not decide
anything: it only says what holds GPUs where, and until when.

``holdings`` walks every allocation of the snapshot: about a second of CPU at 150,000
pods. ``HoldingsMemo`` gives the same answer from one plan to the next at the cost of
what changed: a snapshot's pod and allocation maps share with the previous snapshot's
every shard no write touched (``cluster.sharded``), so a shard whose two dicts are the
ones seen last time holds the same pods, on the same nodes, with the same limits. A pod
bound but not started has its limit run from ``now``, so its holding is made again at
each plan. Each node's tuple is the one handed out last time when equal to it, which
the outlook memo (kept while a node's holdings are the same object) relies on.
``GangPodsMemo`` keeps the gang members of each shard of the pods the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from cluster.model import Allocation, GangId, GangSpec, NodeName, PodInfo, PodKey
from cluster.sharded import SHARDS, ShardedMap
from cluster.snapshot import Snapshot
from extender.outlooks import Holding


def holdings(snapshot: Snapshot, now: datetime) -> dict[NodeName, tuple[Holding, ...]]:
    """The pods holding GPUs on each node and when their time limits end: from the pod's
    start (``started_at``; a pod bound but not started yet starts now) plus its time
    limit; a pod the snapshot does not describe has none. Per node in the order of
    ``snapshot.allocations``."""
    found: dict[NodeName, list[Holding]] = {}
    for key, allocation in snapshot.allocations.items():
        row = _row(allocation, snapshot.pods.get(key))
        found.setdefault(allocation.node, []).append(_holding(row, now))
    return {name: tuple(held) for name, held in found.items()}


@dataclass(frozen=True, slots=True)
class _Row:
    """One allocation as a holding: ``held`` when it does not depend on ``now``, else
    the pod's time limit, which runs from ``now`` (bound, not started)."""

    allocation: Allocation
    held: Holding | None
    limit_s: int
    cpu_milli: int


def _row(allocation: Allocation, pod: PodInfo | None) -> _Row:
    if pod is None:
        return _Row(allocation, Holding(allocation, None, 0), 0, 0)
    demand = pod.demand
    cpu, limit = demand.cpu_milli or 0, demand.time_limit_s
    if limit is None:
        return _Row(allocation, Holding(allocation, None, cpu), 0, cpu)
    if pod.started_at is None:
        return _Row(allocation, None, limit, cpu)
    ends = pod.started_at + timedelta(seconds=limit)
    return _Row(allocation, Holding(allocation, ends, cpu), 0, cpu)


def _holding(row: _Row, now: datetime) -> Holding:
    if row.held is not None:
        return row.held
    return Holding(row.allocation, now + timedelta(seconds=row.limit_s), row.cpu_milli)


@dataclass(frozen=True, slots=True)
class _Shard:
    """The rows of one shard, made from these two dicts (compared by identity)."""

    pods: Mapping[PodKey, PodInfo]
    allocations: Mapping[PodKey, Allocation]
    rows: tuple[_Row, ...]


class HoldingsMemo:
    """``holdings`` of one caller's snapshots, one after another, made again only for
    the nodes with a pod in a shard of the pod maps that changed, or a pod not started
    (see the module docstring). Not shared between threads: one plan at a time."""

    __slots__ = ("_by_node", "_last", "_pending", "_shards")

    def __init__(self) -> None:
        self._last: dict[NodeName, tuple[Holding, ...]] = {}
        self._shards: list[_Shard | None] = []
        self._by_node: dict[NodeName, dict[int, tuple[_Row, ...]]] = {}
        """Per node, its rows in each shard that has some."""
        self._pending: set[NodeName] = set()
        """Nodes with a row whose limit runs from ``now``."""
        self._reset()

    def _reset(self) -> None:
        self._shards = [None] * SHARDS
        self._by_node = {}
        self._pending = set()

    def holdings(self, snapshot: Snapshot, now: datetime) -> dict[NodeName, tuple[Holding, ...]]:
        """What ``holdings(snapshot, now)`` says, the tuple of a node equal to last
        time's being last time's."""
        pods, allocations = snapshot.pods, snapshot.allocations
        if not (isinstance(pods, ShardedMap) and isinstance(allocations, ShardedMap)):
            self._reset()  # a snapshot made by hand: nothing to carry
            return self._stable(holdings(snapshot, now))
        changed = self._carry(pods, allocations)
        last = self._last
        out = dict(last)
        for name in changed | self._pending:
            held = self._node(name, now)
            before = last.get(name)
            if not held:
                out.pop(name, None)
            else:
                out[name] = before if before is not None and before == held else held
        self._last = out
        return out

    def _stable(
        self, found: dict[NodeName, tuple[Holding, ...]]
    ) -> dict[NodeName, tuple[Holding, ...]]:
        last = self._last
        for name, held in found.items():
            before = last.get(name)
            if before is not None and before == held:
                found[name] = before
        self._last = found
        return found

    def _carry(
        self, pods: ShardedMap[PodKey, PodInfo], allocations: ShardedMap[PodKey, Allocation]
    ) -> set[NodeName]:
        """Bring the rows up to these maps; the nodes whose rows changed."""
        kept, by_node = self._shards, self._by_node
        changed: set[NodeName] = set()
        for at, (pod_shard, shard) in enumerate(
            zip(pods.every_shard(), allocations.every_shard(), strict=True)
        ):
            entry = kept[at]
            if entry is None:
                if not shard:
                    continue
            elif entry.pods is pod_shard and entry.allocations is shard:
                continue
            else:
                for row in entry.rows:
                    name = row.allocation.node
                    by_node[name].pop(at, None)
                    changed.add(name)
            rows = tuple(_row(a, pod_shard.get(key)) for key, a in shard.items())
            kept[at] = _Shard(pod_shard, shard, rows) if rows else None
            grouped: dict[NodeName, list[_Row]] = {}
            for row in rows:
                grouped.setdefault(row.allocation.node, []).append(row)
            for name, listed in grouped.items():
                by_node.setdefault(name, {})[at] = tuple(listed)
                changed.add(name)
        return changed

    def _node(self, name: NodeName, now: datetime) -> tuple[Holding, ...]:
        """The holdings of ``name``, in the order of the allocations (shard by shard)."""
        parts = self._by_node.get(name)
        if not parts:
            self._by_node.pop(name, None)
            self._pending.discard(name)
            return ()
        rows = [row for at in sorted(parts) for row in parts[at]]
        if any(row.held is None for row in rows):
            self._pending.add(name)
        else:
            self._pending.discard(name)
        return tuple(_holding(row, now) for row in rows)


# ---------------------------------------------------------------- gang members


@dataclass(frozen=True, slots=True)
class _Gangs:
    """The gang members of one shard of the pods (this dict, compared by identity): each
    gang's spec as its first member there says, and the members not bound."""

    pods: Mapping[PodKey, PodInfo]
    specs: tuple[tuple[GangId, GangSpec], ...]
    unbound: tuple[tuple[PodKey, PodInfo], ...]


def _gangs(shard: Mapping[PodKey, PodInfo]) -> _Gangs:
    specs: dict[GangId, GangSpec] = {}
    unbound: list[tuple[PodKey, PodInfo]] = []
    for key, pod in shard.items():
        spec = pod.demand.gang
        if spec is not None:
            specs.setdefault(spec.id, spec)
            if pod.node is None:
                unbound.append((key, pod))
    return _Gangs(shard, tuple(specs.items()), tuple(unbound))


class GangPodsMemo:
    """The gang members among a caller's snapshots' pods, one snapshot after another,
    looked for again only in the shards of the pods that changed. Not shared between
    threads: one plan at a time."""

    __slots__ = ("_shards",)

    def __init__(self) -> None:
        self._shards: list[_Gangs | None] = []

    def members(
        self, pods: Mapping[PodKey, PodInfo]
    ) -> tuple[dict[GangId, GangSpec], list[tuple[PodKey, PodInfo]]]:
        """Each gang with a pod in ``pods`` and its spec (its first member's, in the
        order of ``pods``), and the members not bound, in that order."""
        if not isinstance(pods, ShardedMap):  # a snapshot made by hand: nothing to carry
            self._shards = []
            whole = _gangs(pods)
            return dict(whole.specs), list(whole.unbound)
        kept = self._shards
        shards: list[_Gangs | None] = []
        specs: dict[GangId, GangSpec] = {}
        unbound: list[tuple[PodKey, PodInfo]] = []
        for at, shard in enumerate(pods.every_shard()):
            entry = kept[at] if at < len(kept) else None
            if entry is None or entry.pods is not shard:
                entry = _gangs(shard) if shard else None
            shards.append(entry)
            if entry is not None:
                for gang, spec in entry.specs:
                    specs.setdefault(gang, spec)
                unbound.extend(entry.unbound)
        self._shards = shards
        return specs, unbound
