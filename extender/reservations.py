"""Reservations: a gang that cannot start now is promised the domain whose pods end
soonest by their time limits; other pods may start there meanwhile only if they end in
time (backfill).

Layer: PURE. Functions of nodes, the pods holding their GPUs, gangs and ``now``: no
I/O, no clock, no settings, no aiohttp, no cache; the bound on reservations and the
grace for an overrun arrive as ``ReservationRules``. Must not place pods or choose GPUs
(the filters and ``extender.gpus`` do), and must not keep reservations anywhere (a caller
holds the last ``Plan`` and hands its reservations back): the live extender through
``extender.holds`` (what is held from one plan to the next) and ``extender.reserving``
(when it plans, where holds are recorded), the load test's reservation study
directly (``loadtest.reservations``).

How a plan is made (``plan_reservations``), gang by gang in order (the higher priority
first, then the oldest), at most ``max_reservations`` of them:

* Each node's *outlook* (``extender.outlooks``): how many of the gang's members it
  holds now and from which time on it holds more, as the pods on it end by their time
  limits. A pod without a time limit never ends as far as it knows; a pod past its
  limit is taken to end ``overrun_grace`` after now: it pushes the estimate, it never
  breaks a reservation.
* A domain's *estimate* (``estimate_domain``): the first time its nodes hold the gang's
  members together, and the nodes that do. A node promised to someone else
  (maintenance, or an earlier gang's reservation: ``extender.promises``) counts only
  while the gang, starting then, would end by that promise.
* The gang's domain: the earliest estimate, chosen again at every plan, so that a
  reservation follows the domain that frees soonest as pods end before their limits.
  (Keeping the first choice made the largest gangs of the load test's reservation
  study wait longer than with no reservation at all: time limits overstate how long
  pods run, and pods backfilled up to a start that was too late keep the rack busy
  until then.) Ties keep the domain the gang holds, then go to the domain whose free
  GPUs are least fragmented (``gpus.fragmentation``); domains whose start is unknown
  (waiting on pods without a time limit) come last. An estimate of ``now`` means the
  gang fits now: it is placed, not reserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from cluster.model import (
    GangId,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodKey,
    Promise,
    TopologyMode,
)
from cluster.snapshot import Snapshot
from extender.config import ExtenderConfig
from extender.outlooks import ANYWHERE, Holding, Outlook, OutlookMemo
from extender.promises import latest_start

_FOREVER: Final = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ReservationRules:
    max_reservations: int = 8
    """Gangs that hold a reservation at once; the others wait without one."""
    overrun_grace: timedelta = timedelta(seconds=60)
    """A pod still running past its time limit is taken to end this long after now."""

    def __post_init__(self) -> None:
        if self.max_reservations < 0 or self.overrun_grace <= timedelta(0):
            raise ValueError(f"reservations: a bound >= 0 and a grace > 0, not {self!r}")


@dataclass(frozen=True, slots=True)
class GangDemand:
    """A gang waiting to start: ``members`` pods of ``member`` together, in one domain
    of the level labelled ``level`` (None: anywhere)."""

    gang: GangId
    member: PodDemand
    members: int
    level: str | None
    since: datetime
    """When it started waiting: the oldest gang is served first."""
    priority: int = 0

    @property
    def order(self) -> tuple[int, datetime, str]:
        return (-self.priority, self.since, self.gang)


@dataclass(frozen=True, slots=True)
class Estimate:
    """When ``nodes`` of ``domain`` hold the gang together: ``start`` (None: unknown,
    they wait on pods without a time limit)."""

    domain: str
    start: datetime | None
    nodes: tuple[NodeName, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """``nodes`` of ``domain`` promised to ``gang`` from ``start`` (None: unknown)."""

    gang: GangId
    domain: str
    nodes: tuple[NodeName, ...]
    start: datetime | None

    @property
    def promise(self) -> Promise:
        return Promise(self.start, self.gang)


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``plan_reservations`` decided for the waiting gangs, in their order."""

    reservations: tuple[Reservation, ...] = ()
    fits_now: tuple[tuple[GangId, Estimate], ...] = ()
    """Gangs with a domain that holds them now (and which): to place, not reserve."""
    unplaceable: tuple[GangId, ...] = ()
    """Gangs no domain can ever hold (too few nodes that may take a member)."""
    unreserved: tuple[GangId, ...] = ()
    """Gangs past the bound on reservations: they wait without one."""

    def promises(self) -> dict[NodeName, Promise]:
        """Per reserved node, its reservation's promise."""
        return {name: r.promise for r in self.reservations for name in r.nodes}


# ---------------------------------------------------------------- from a snapshot


def gang_demands(
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    *,
    unbound: Iterable[tuple[PodKey, PodInfo]] | None = None,
) -> tuple[GangDemand, ...]:
    """Gangs whose members wait and none of which is placed, in their order: a gang
    waits since its oldest member was created, at its highest member's priority. A
    ``required`` level the config does not know leaves the gang out (no domain can be
    named); ``preferred`` is no constraint for a reservation. ``unbound``: the gang
    members of ``snapshot.pods`` not bound, in its order, when the caller knows them
    (``holdings.GangPodsMemo``); else every pod is looked at."""
    waiting: dict[GangId, list[PodKey]] = {}
    for key, pod in snapshot.pods.items() if unbound is None else unbound:
        gang = pod.demand.gang
        if gang is not None and pod.node is None and not snapshot.gangs.get(gang.id):
            waiting.setdefault(gang.id, []).append(key)
    demands = []
    for gang_id, keys in waiting.items():
        pods = [snapshot.pods[key] for key in keys]
        first = pods[0].demand
        assert first.gang is not None
        level: str | None = None
        topology = first.topology
        if topology is not None and topology.mode is TopologyMode.REQUIRED:
            found = config.level(topology.level)
            if found is None:
                continue
            level = found.node_label
        since = min((p.created_at for p in pods if p.created_at is not None), default=now)
        priority = max(p.priority for p in pods)
        demands.append(GangDemand(gang_id, first, first.gang.min_count, level, since, priority))
    return tuple(sorted(demands, key=lambda d: d.order))


def node_promises(node: NodeState, reservations: Iterable[Reservation]) -> tuple[Promise, ...]:
    """Everything ``node`` is promised to, earliest first: its maintenance window
    (``tessera.dev/drain-after``) and the reservations that hold it."""
    found = [r.promise for r in reservations if node.name in r.nodes]
    if node.drain_after is not None:
        found.append(Promise(node.drain_after))
    return tuple(sorted(found, key=_promise_order))


def _promise_order(promise: Promise) -> tuple[bool, datetime]:
    """Earliest first, a promise from an unknown time before all: nothing may go there."""
    return (promise.start is not None, promise.start or _FOREVER)


# ---------------------------------------------------------------- one domain


def estimate_domain(
    domain: str,
    outlooks: Sequence[Outlook],
    members: int,
    *,
    limit_s: int | None,
    promised: Mapping[NodeName, Promise],
    now: datetime,
) -> Estimate | None:
    """The first time at or after ``now`` that the nodes of ``outlooks`` hold
    ``members`` together, and the fewest nodes that do (those with room earliest, then
    the most room, then by name); start None when only pods without a time limit stand
    in the way; None when even that is not enough. A node ``promised`` to someone else
    counts only up to the latest start from which a gang with time limit ``limit_s``
    still ends by the promise (``promises.latest_start``)."""
    usable: list[Outlook] = []
    cutoffs: list[tuple[datetime, NodeName]] = []
    for outlook in outlooks:
        promise = promised.get(outlook.name)
        if promise is not None:
            last = latest_start(limit_s, promise.start)
            if last is None or last < now:
                continue
            cutoffs.append((last, outlook.name))
        usable.append(outlook)
    found = _sweep(usable, sorted(cutoffs), members, now)
    if found is not None:
        return Estimate(domain, found[0], found[1])
    promised_here = {name for _, name in cutoffs}
    blocked = [o for o in usable if o.name not in promised_here and o.blocked > 0]
    if sum(o.blocked for o in blocked) < members:
        return None
    blocked.sort(key=lambda o: (-o.now, -o.blocked, o.name))
    return Estimate(domain, None, _enough([(o.name, o.blocked) for o in blocked], members))


def _sweep(
    usable: Sequence[Outlook],
    cutoffs: Sequence[tuple[datetime, NodeName]],
    members: int,
    now: datetime,
) -> tuple[datetime, tuple[NodeName, ...]] | None:
    """Walk the steps of ``usable`` in time order, dropping each node once past its
    cutoff, until they hold ``members``: (when, which nodes)."""
    holds = {o.name: o.now for o in usable}
    since = dict.fromkeys(holds, now)
    total = sum(holds.values())
    steps = sorted((t, o.name, m) for o in usable for t, m in o.steps)
    at = cut = 0
    when = now
    while True:
        while cut < len(cutoffs) and cutoffs[cut][0] < when:
            total -= holds.pop(cutoffs[cut][1], 0)
            cut += 1
        while at < len(steps) and steps[at][0] <= when:
            _, name, count = steps[at]
            if name in holds:
                total += count - holds[name]
                holds[name], since[name] = count, when
            at += 1
        if total >= members:
            room = sorted(
                (n for n, m in holds.items() if m), key=lambda n: (since[n], -holds[n], n)
            )
            return when, _enough([(n, holds[n]) for n in room], members)
        if at >= len(steps):
            return None
        when = steps[at][0]


def _enough(ranked: Sequence[tuple[NodeName, int]], members: int) -> tuple[NodeName, ...]:
    """The first of ``ranked`` (node, members it holds) that hold ``members`` together."""
    chosen: list[NodeName] = []
    total = 0
    for name, count in ranked:
        if total >= members:
            break
        chosen.append(name)
        total += count
    return tuple(chosen)


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The cluster as a plan reads it: nodes, the pods holding GPUs on each, the config."""

    nodes: Mapping[NodeName, NodeState]
    holdings: Mapping[NodeName, Sequence[Holding]]
    config: ExtenderConfig
    rules: ReservationRules = field(default_factory=ReservationRules)
    memo: OutlookMemo = field(default_factory=OutlookMemo, compare=False)

    @property
    def grace(self) -> timedelta:
        return self.rules.overrun_grace

    @property
    def islands_required(self) -> bool:
        return self.config.islands_required


def plan_reservations(
    gangs: Sequence[GangDemand],
    cluster: PlanInput,
    held: Mapping[GangId, Reservation],
    now: datetime,
) -> Plan:
    """Reservations for the waiting ``gangs`` (see the module docstring): the gangs in
    their order, each given the domain of the earliest estimate (on a tie, the one it
    ``held``), until ``max_reservations`` are made; what the earlier gangs were given
    (and maintenance windows) is promised away from the later ones."""
    promised = dict(cluster.memo.drains(cluster.nodes))
    ranked: dict[tuple[object, ...], list[tuple[_Order, str]]] = {}
    """Per gang shape, every domain by its start with no promise counted: made once a
    plan, the same for every gang of that shape."""
    made: list[Reservation] = []
    fits: list[tuple[GangId, Estimate]] = []
    never: list[GangId] = []
    over: list[GangId] = []
    for gang in sorted(gangs, key=lambda g: g.order):
        if len(made) >= cluster.rules.max_reservations:
            over.append(gang.gang)
            continue
        estimate = _gang_estimate(
            gang, cluster, held.get(gang.gang), promised=promised, now=now, ranked=ranked
        )
        if estimate is None:
            never.append(gang.gang)
            continue
        if estimate.start == now:
            fits.append((gang.gang, estimate))
            promise = Promise(now, gang.gang)  # it is placed there now: nobody else counts on it
        else:
            made.append(Reservation(gang.gang, estimate.domain, estimate.nodes, estimate.start))
            promise = made[-1].promise
        for name in estimate.nodes:
            earlier = promised.get(name)
            if earlier is None or _promise_order(promise) < _promise_order(earlier):
                promised[name] = promise
    return Plan(tuple(made), tuple(fits), tuple(never), tuple(over))


_Order = tuple[bool, datetime]


def _gang_estimate(
    gang: GangDemand,
    cluster: PlanInput,
    old: Reservation | None,
    *,
    promised: Mapping[NodeName, Promise],
    now: datetime,
    ranked: dict[tuple[object, ...], list[tuple[_Order, str]]],
) -> Estimate | None:
    """The estimate of the domain the gang is given. Domains are taken by their start
    with no promise counted (``_ranked``), which is when they hold the gang unless a
    node of theirs is promised away; those are estimated in full, which can only be
    later. Once the next domain's start is later than the best found, none after it
    can win: the earliest are ``_pick``ed among, and only the chosen one's nodes found."""
    groups = cluster.memo.domains(cluster.nodes, gang.member, gang.level, cluster.islands_required)
    touched = _promised_domains(gang.level, promised, cluster.nodes)
    full: dict[str, Estimate] = {}
    found: list[tuple[_Order, str]] = []
    best: _Order | None = None
    for bound, domain in _ranked(gang, cluster, groups, now, ranked):
        if best is not None and bound > best:
            break
        order = bound
        if domain in touched:
            estimate = _estimate(gang, domain, groups[domain], cluster, promised=promised, now=now)
            if estimate is None:
                continue
            full[domain] = estimate
            order = _start_order(estimate.start)
        found.append((order, domain))
        if best is None or order < best:
            best = order
    if best is None:
        return None
    tied = [domain for order, domain in found if order == best]
    chosen = _pick(tied, cluster, groups, keep=None if old is None else old.domain)
    kept = full.get(chosen)
    if kept is None:
        kept = _estimate(gang, chosen, groups[chosen], cluster, promised=promised, now=now)
    return kept


def _ranked(
    gang: GangDemand,
    cluster: PlanInput,
    groups: Mapping[str, Sequence[NodeName]],
    now: datetime,
    ranked: dict[tuple[object, ...], list[tuple[_Order, str]]],
) -> list[tuple[_Order, str]]:
    """Every domain that can ever hold the gang, by when it does with no promise counted
    (``DomainTotals``, kept by the memo), soonest first."""
    member = gang.member
    key = (
        gang.level,
        member.gpus,
        member.gpu_milli,
        member.cpu_milli,
        member.products,
        member.selection,
        gang.members,
    )
    found = ranked.get(key)
    if found is None:
        found = []
        for domain, names in groups.items():
            totals = cluster.memo.totals(domain, names, member, now, cluster)
            if totals.holds(gang.members):
                found.append((_start_order(totals.start(gang.members, now)), domain))
        found.sort()
        ranked[key] = found
    return found


def _promised_domains(
    level: str | None, promised: Mapping[NodeName, Promise], nodes: Mapping[NodeName, NodeState]
) -> set[str]:
    """The domains at ``level`` with a node promised away."""
    if level is None:
        return {ANYWHERE} if promised else set()
    found = set()
    for name in promised:
        node = nodes.get(name)
        if node is not None and (value := node.domains.get(level)) is not None:
            found.add(value)
    return found


def _estimate(
    gang: GangDemand,
    domain: str,
    names: Sequence[NodeName],
    cluster: PlanInput,
    *,
    promised: Mapping[NodeName, Promise],
    now: datetime,
) -> Estimate | None:
    islands = cluster.config.islands_required
    outlooks = [
        cluster.memo.outlook(
            cluster.nodes[name],
            cluster.holdings.get(name, ()),
            gang.member,
            now,
            grace=cluster.grace,
            islands_required=islands,
        )
        for name in names
        if name in cluster.nodes
    ]
    return estimate_domain(
        domain,
        outlooks,
        gang.members,
        limit_s=gang.member.time_limit_s,
        promised=promised,
        now=now,
    )


def _pick(
    tied: Sequence[str],
    cluster: PlanInput,
    groups: Mapping[str, Sequence[NodeName]],
    *,
    keep: str | None,
) -> str:
    """Among domains of equal start: ``keep`` (the one the gang holds), else the one
    whose free GPUs are least fragmented for the pod mix, then by name."""
    if len(tied) == 1:
        return tied[0]
    if keep is not None and keep in tied:
        return keep
    mix, islands, memo = cluster.config.pod_mix, cluster.islands_required, cluster.memo

    def fragmented(domain: str) -> tuple[float, str]:
        nodes = (cluster.nodes[n] for n in groups[domain])
        return sum(memo.fragmentation(n, mix, islands) for n in nodes), domain

    return min(tied, key=fragmented)


def _start_order(start: datetime | None) -> tuple[bool, datetime]:
    """Sooner first; a start not known after every known one."""
    return (start is None, start or _FOREVER)
