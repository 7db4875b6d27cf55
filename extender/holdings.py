"""The pods holding GPUs on each node and when their time limits end: what a plan of
reservations counts each node's outlook from (``extender.outlooks``).

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from cluster.model import Allocation, NodeName, PodInfo, PodKey
from cluster.sharded import ShardedMap
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
    the shards of the pod maps that changed (see the module docstring). Not shared
    between threads: one plan at a time."""

    __slots__ = ("_last", "_shards")

    def __init__(self) -> None:
        self._shards: list[_Shard | None] = []
        self._last: dict[NodeName, tuple[Holding, ...]] = {}

    def holdings(self, snapshot: Snapshot, now: datetime) -> dict[NodeName, tuple[Holding, ...]]:
        """What ``holdings(snapshot, now)`` says, the tuple of a node equal to last
        time's being last time's."""
        pods, allocations = snapshot.pods, snapshot.allocations
        if isinstance(pods, ShardedMap) and isinstance(allocations, ShardedMap):
            found = self._from_shards(pods, allocations, now)
        else:  # a snapshot made by hand: nothing to carry
            self._shards = []
            found = {name: list(held) for name, held in holdings(snapshot, now).items()}
        last = self._last
        out: dict[NodeName, tuple[Holding, ...]] = {}
        for name, listed in found.items():
            held = tuple(listed)
            before = last.get(name)
            out[name] = before if before is not None and before == held else held
        self._last = out
        return out

    def _from_shards(
        self,
        pods: ShardedMap[PodKey, PodInfo],
        allocations: ShardedMap[PodKey, Allocation],
        now: datetime,
    ) -> dict[NodeName, list[Holding]]:
        kept = self._shards
        shards: list[_Shard | None] = []
        found: dict[NodeName, list[Holding]] = {}
        for at, (pod_shard, shard) in enumerate(
            zip(pods.every_shard(), allocations.every_shard(), strict=True)
        ):
            if not shard:
                shards.append(None)
                continue
            entry = kept[at] if at < len(kept) else None
            if entry is None or entry.pods is not pod_shard or entry.allocations is not shard:
                rows = tuple(_row(a, pod_shard.get(key)) for key, a in shard.items())
                entry = _Shard(pod_shard, shard, rows)
            shards.append(entry)
            for row in entry.rows:
                held = row.held
                if held is None:
                    held = _holding(row, now)
                found.setdefault(row.allocation.node, []).append(held)
        self._shards = shards
        return found
