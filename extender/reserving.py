"""Reservations in the live extender: when they are planned, and where they are kept.

Layer: I/O. The shell around ``extender.holds`` (which decides): it takes one snapshot
and the time, plans on them (a PURE function of both, so nothing it reads changes
meanwhile), puts the reservations' promises in the cache (``ClusterCache.promise``: the
filters read them from the next snapshot on), then records what changed on the API
server. Must not decide anything itself, and must not plan inside a request or on the
event loop: a request only asks for a plan (``wanted``), and the plan runs in a worker
thread (``plan``).

When: a gang member that no candidate fits asks for a plan; while any reservation is
held, a plan runs every ``interval_s`` too (to follow the estimates, and to release a
gang that started, or whose pods are gone past the grace); never more often than that.
With ``max_reservations`` 0 nothing is planned at all. Only a replica kube-scheduler
asks plans and writes (``Reserver.active``): with two scheduler replicas, the standby's
extender rebuilds the reservations but leaves their Leases to the leader's.

Where a reservation is kept (``HoldStore``): a ``coordination.k8s.io`` Lease per
reservation in the extender's own namespace (``LeaseHolds``), not an annotation on the
gang's pods, because

* writing the pods would need ``patch`` on every pod of the cluster, which the extender
  does not hold by design (whoever may patch any pod may change any pod's image: see
  ``extender.binder``); a Lease needs a Role in one namespace, its own;
* a Lease is one object per gang however many members it has, written when the
  reservation changes (and its ``renewTime`` while the gang waits), not one per member;
* its fields say what they mean here: the gang is the holder, ``acquireTime`` when the
  gang first waited (its place in the order survives a restart or a failover), and
  ``renewTime`` when its pods were last seen (so that a gang requeued just before a
  restart keeps its grace, and one gone for long is released).

The price: a Lease outlives its gang, so the extender deletes it when it releases the
reservation (and a restarted one releases what it rebuilt once the grace has passed).
On start the extender lists the Leases (``restore``) before its first plan. In
standalone mode (a cluster file) the records stay in memory (``MemoryHolds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Final, Protocol

from cluster import labels, logs
from cluster.cache import ClusterCache
from cluster.clock import Clock
from cluster.convert.grammar import AnnotationError
from cluster.kube import ApiError, KubeClient, KubeError
from cluster.model import GangId, NodeName, PodInfo
from cluster.snapshot import Snapshot
from extender.holds import (
    Hold,
    HoldRules,
    Holds,
    PlanMemo,
    changed,
    hold_of,
    lease_name,
    lease_of,
    next_holds,
)
from extender.learning import LiveConfig
from extender.metrics import ExtenderMetrics
from extender.promises import binding

log = logging.getLogger(__name__)

_HOUR_S: Final = 3600.0
ACTIVE_PLANS: Final = 3
"""A replica asked no ``/filter`` for this many plan intervals is taken for a standby."""


class HoldStore(Protocol):
    """Where reservations are recorded, to be rebuilt by a restarted extender."""

    async def load(self) -> dict[GangId, Hold]: ...

    async def record(self, gang: GangId, hold: Hold | None) -> None:
        """Record ``gang``'s hold, or its release (None)."""
        ...


class MemoryHolds:
    """Records in memory: standalone mode, and tests."""

    def __init__(self) -> None:
        self.kept: dict[GangId, Hold] = {}

    async def load(self) -> dict[GangId, Hold]:
        return dict(self.kept)

    async def record(self, gang: GangId, hold: Hold | None) -> None:
        if hold is None:
            self.kept.pop(gang, None)
        else:
            self.kept[gang] = hold


class LeaseHolds:
    """One Lease per reservation in ``namespace`` (see the module docstring)."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    async def load(self) -> dict[GangId, Hold]:
        items, _ = await self._client.list(
            self._path, {"labelSelector": f"{labels.RESERVATION}=true"}
        )
        found: dict[GangId, Hold] = {}
        for item in items:
            try:
                hold = hold_of(item)
            except AnnotationError as exc:
                log.warning("reservation lease ignored", extra=logs.fields(reason=str(exc)))
                continue
            found[hold.gang] = hold
        return found

    async def record(self, gang: GangId, hold: Hold | None) -> None:
        path = f"{self._path}/{lease_name(gang)}"
        try:
            if hold is None:
                await self._client.delete_json(path)
            else:
                await self._client.patch_json(path, lease_of(hold, self._namespace))
        except ApiError as exc:
            if exc.status != 404:
                raise
            if hold is not None:  # not there yet: made
                await self._client.post_json(self._path, lease_of(hold, self._namespace))


class Reserver:
    """The reservations this extender holds, planned and recorded (see the module's
    docstring). One writer of ``ClusterCache.promise``."""

    def __init__(
        self,
        cache: ClusterCache,
        live: LiveConfig,
        rules: HoldRules,
        *,
        clock: Clock,
        metrics: ExtenderMetrics,
        interval_s: float,
        store: HoldStore | None = None,
    ) -> None:
        self.cache = cache
        self.live = live
        self.rules = rules
        self.clock = clock
        self.metrics = metrics
        self.interval_s = interval_s
        self.store: HoldStore = store if store is not None else MemoryHolds()
        self.held: dict[GangId, Hold] = {}
        self._recorded: dict[GangId, Hold] = {}
        self._wanted = asyncio.Event()
        self._planned_at: datetime | None = None
        self._asked_at: float | None = None
        self._memo: PlanMemo | None = None

    @property
    def enabled(self) -> bool:
        return self.rules.plan.max_reservations > 0

    def wanted(self, pod: PodInfo, fits: int) -> None:
        """A ``/filter`` answered ``fits`` candidates for ``pod``: this replica is the one
        kube-scheduler asks (see ``active``), and a gang member that no candidate fits
        asks for a plan."""
        self._asked_at = self.clock.monotonic()
        if not fits and pod.demand.gang is not None and self.enabled:
            self._wanted.set()

    @property
    def active(self) -> bool:
        """Whether kube-scheduler asked this replica a ``/filter`` within the last
        ``ACTIVE_PLANS`` intervals. Only the leader's kube-scheduler calls its extender,
        so a standby never is: it keeps the reservations it rebuilt (for when it leads)
        but neither plans nor writes a Lease, which the leader's extender owns. A leader
        with no request for that long plans again at its next one, from the Leases as
        they are then (another replica may have led meanwhile): a reservation only
        matters to the requests that read it."""
        asked = self._asked_at
        return asked is not None and self.clock.monotonic() - asked <= (
            ACTIVE_PLANS * self.interval_s
        )

    async def plan(self) -> Holds:
        """Plan on the current snapshot, in a worker thread, then put the promises in the
        cache. A plan reads every pod holding GPUs and every domain that may hold a waiting
        gang: the first plan is seconds of CPU at 5,000 nodes and 150,000 pods
        (``loadtest.bench.reservations_plan``), which on the event loop would hold every
        ``/filter`` and ``/bind`` that long. ``next_holds`` is PURE over one immutable
        snapshot and the plans' memo, which only the one plan running reads, so the
        thread shares nothing that changes; the promises are put on the loop, as one step.
        The memo makes a plan cost what changed since the last one (a new config starts
        a new memo)."""
        now = self.clock.now()
        snapshot = self.cache.snapshot()
        held = dict(self.held)
        config = self.live.current
        memo = self._memo
        if memo is None or memo.config is not config:
            memo = self._memo = PlanMemo(config)
        holds = await asyncio.to_thread(
            partial(next_holds, snapshot, config, self.rules, held, now, memo=memo)
        )
        idle = 0.0
        if self._planned_at is not None:
            hours = (now - self._planned_at).total_seconds() / _HOUR_S
            idle = hours * idle_gpus(snapshot, self.held.values())
        self._planned_at = now
        self.held = dict(holds.held)
        promises = holds.promises()
        self.cache.promise(promises)
        self.metrics.reserving(len(self.held), len(promises), idle)
        return holds

    async def record(self) -> None:
        """Write what changed since the last records (a failed write is tried again
        after the next plan)."""
        refresh = max(self.rules.requeue_grace / 2, timedelta(seconds=self.interval_s))
        for gang in list(changed(self._recorded, self.held, refresh)):
            hold = self.held.get(gang)
            try:
                await self.store.record(gang, hold)
            except KubeError as exc:
                log.warning(
                    "reservation not recorded", extra=logs.fields(gang=gang, error=str(exc))
                )
                continue
            if hold is None:
                self._recorded.pop(gang, None)
            else:
                self._recorded[gang] = hold

    async def restore(self) -> None:
        """What the records say is held, in the cache before the first plan."""
        try:
            found = await self.store.load()
        except KubeError as exc:
            log.warning("reservations not rebuilt", extra=logs.fields(error=str(exc)))
            return
        self.held = dict(found)
        self._recorded = dict(found)
        self.cache.promise(Holds(found).promises())
        if found:
            log.info("reservations rebuilt", extra=logs.fields(gangs=sorted(found)))

    async def run(self, synced: Callable[[], Awaitable[None]]) -> None:
        """Once ``synced()`` returns (the cache is complete): rebuild, then plan when
        asked, and every ``interval_s`` while any reservation is held."""
        await synced()
        await self.restore()
        current = True
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), self.interval_s if self.held else None)
            self._wanted.clear()
            if not self.active:  # a standby, or a leader nobody asked for a while
                current = False
                continue
            if not current:
                await self.restore()
                current = True
            await self.plan()
            await self.record()
            await asyncio.sleep(self.interval_s)


def idle_gpus(snapshot: Snapshot, holds: Iterable[Hold]) -> int:
    """Healthy GPUs wholly free on the nodes ``holds`` reserve."""
    names = {name for hold in holds for name in hold.reservation.nodes}
    nodes = snapshot.nodes
    return sum(
        sum(1 for gpu in node.gpus if gpu.whole_free)
        for name in names
        if (node := nodes.get(name)) is not None
    )


def backfilled(snapshot: Snapshot, pod: PodInfo, node: str) -> bool:
    """Whether binding ``pod`` on ``node`` backfills a reservation of another gang."""
    held = snapshot.promises.get(NodeName(node))
    if not held:
        return False
    gang = pod.demand.gang
    return any(p.gang is not None for p in binding(held, None if gang is None else gang.id))
