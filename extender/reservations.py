"""Reservations: a gang that cannot start now is promised the domain whose pods end
soonest by their time limits; other pods may start there meanwhile only if they end in
time (backfill).

Layer: PURE. Functions of nodes, the pods holding their GPUs, gangs and ``now``: no
I/O, no clock, no settings, no aiohttp, no cache; the bound on reservations and the
grace for an overrun arrive as ``ReservationRules``. Must not place pods or choose GPUs
(the filters and ``extender.gpus`` do), must not keep reservations anywhere (a caller
holds the last ``Plan`` and hands its reservations back), and is not yet called by the
extender's filter pipeline: the load test's reservation study runs it
(``loadtest.reservations``).

How a plan is made (``plan_reservations``), gang by gang in order (the higher priority
first, then the oldest), at most ``max_reservations`` of them:

* Each node's *outlook* for one member shape (``node_outlook``): how many members it
  holds now and from which time on it holds more, as the pods on it end by their time
  limits (``started_at`` + ``activeDeadlineSeconds``). A pod without a time limit never
  ends as far as the outlook knows: the members it blocks count only as ``blocked``. A
  pod past its limit is taken to end ``overrun_grace`` after now: it pushes the
  estimate, it never breaks a reservation.
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

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import is_
from typing import Final

from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GangId,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodKey,
    TopologyMode,
    product_matches,
)
from cluster.snapshot import Snapshot
from extender.config import ExtenderConfig
from extender.context import FIT, Verdict
from extender.gpus import fragmentation, gpus_fit, pod_fits
from extender.promises import Promise, latest_start, promise_verdict

ANYWHERE: Final = ""
"""The one domain of a gang without a topology level: every node that may hold it."""
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
class Holding:
    """A pod holding GPUs (and CPU) on a node until ``ends`` (None: no time limit)."""

    allocation: Allocation
    ends: datetime | None
    cpu_milli: int = 0


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
class Outlook:
    """How many members of one shape a node holds: ``now``, from each step's time on
    (rising), and ``blocked`` once pods without a time limit are gone too."""

    name: NodeName
    now: int
    steps: tuple[tuple[datetime, int], ...] = ()
    blocked: int = 0


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


def holdings(snapshot: Snapshot, now: datetime) -> dict[NodeName, tuple[Holding, ...]]:
    """The pods holding GPUs on each node and when their time limits end: from the pod's
    start (``started_at``; a pod bound but not started yet starts now) plus its time
    limit; a pod the snapshot does not describe has none."""
    found: dict[NodeName, list[Holding]] = {}
    for key, allocation in snapshot.allocations.items():
        pod = snapshot.pods.get(key)
        ends = cpu = None
        if pod is not None:
            limit = pod.demand.time_limit_s
            if limit is not None:
                ends = (pod.started_at or now) + timedelta(seconds=limit)
            cpu = pod.demand.cpu_milli
        found.setdefault(allocation.node, []).append(Holding(allocation, ends, cpu or 0))
    return {name: tuple(held) for name, held in found.items()}


def gang_demands(
    snapshot: Snapshot, config: ExtenderConfig, now: datetime
) -> tuple[GangDemand, ...]:
    """Gangs whose members wait and none of which is placed, in their order: a gang
    waits since its oldest member was created, at its highest member's priority. A
    ``required`` level the config does not know leaves the gang out (no domain can be
    named); ``preferred`` is no constraint for a reservation."""
    waiting: dict[GangId, list[PodKey]] = {}
    for key, pod in snapshot.pods.items():
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


def backfill_verdict(
    node: str,
    promises: Sequence[Promise],
    *,
    pod_gang: GangId | None,
    ends: datetime | None,
    limit_s: int | None,
    now: datetime,
) -> Verdict:
    """Whether a pod whose time limit ends at ``ends`` may start on ``node`` under its
    ``promises`` (``node_promises``): it must end by every one of them, but its own
    gang's reservation, which is for it."""
    for promise in promises:
        if promise.gang is not None and promise.gang == pod_gang:
            continue
        verdict = promise_verdict(promise, node, ends, limit_s, now)
        if verdict is not FIT:
            return verdict
    return FIT


# ---------------------------------------------------------------- one node


def node_outlook(
    node: NodeState,
    held: Sequence[Holding],
    member: PodDemand,
    now: datetime,
    *,
    rules: ReservationRules,
    islands_required: bool,
) -> Outlook:
    """How many ``member`` pods ``node`` holds now and as its pods end (see the module
    docstring). CPU counts as well as GPUs when the node says how much it has. Valid at
    ``now``: a caller that keeps an outlook recomputes it once a pod's end has passed."""
    known = sorted(
        (_clamp(h.ends, now, rules), i) for i, h in enumerate(held) if h.ends is not None
    )
    state = _Freeing(node, member, islands_required)
    last = state.members()
    steps: list[tuple[datetime, int]] = [(now, last)]
    for ends, i in known:
        state.release(held[i])
        if not state.could_hold(last + 1):
            continue  # (most steps: GPUs freed that no member can use yet)
        members = state.members()
        if members > last:
            if steps[-1][0] == ends:
                steps.pop()  # pods ending at one time free their GPUs together
            steps.append((ends, members))
            last = members
    for holding in held:
        if holding.ends is None:
            state.release(holding)
    return Outlook(node.name, steps[0][1], tuple(steps[1:]), state.members())


def _clamp(ends: datetime, now: datetime, rules: ReservationRules) -> datetime:
    """A pod past its time limit still holds its GPUs: it ends a grace after now."""
    return ends if ends >= now else now + rules.overrun_grace


class _Freeing:
    """A node's GPUs and CPU as its pods give them back, one pod at a time: GPUs as a
    list, not a ``NodeState`` per step (an outlook releases every pod of the node)."""

    __slots__ = ("cpu_free", "gpus", "islands_required", "member", "where", "whole_free")

    def __init__(self, node: NodeState, member: PodDemand, islands_required: bool) -> None:
        self.gpus = list(node.gpus)
        self.where = {gpu.index: at for at, gpu in enumerate(node.gpus)}
        self.cpu_free = node.cpu_free_milli if node.cpu_milli > 0 else None
        self.member = member
        self.islands_required = islands_required
        self.whole_free = sum(1 for gpu in node.gpus if gpu.whole_free)

    def could_hold(self, members: int) -> bool:
        """False when the node surely cannot hold ``members`` yet (too few whole free
        GPUs, or too little CPU); True when it may (``members`` says for sure)."""
        member = self.member
        if member.gpus > 0 and self.whole_free < members * member.gpus:
            return False
        return not (
            member.cpu_milli > 0
            and self.cpu_free is not None
            and self.cpu_free < members * member.cpu_milli
        )

    def release(self, holding: Holding) -> None:
        places: list[int] = []
        for index in holding.allocation.indices:
            at = self.where.get(index)
            if at is None:
                return  # GPUs the node does not have: nothing there to give back
            places.append(at)
        back = holding.allocation.milli_per_gpu
        for at in places:
            gpu = self.gpus[at]
            free = min(MILLI_PER_GPU, gpu.free_milli + back)
            self.gpus[at] = freed = GpuDevice(gpu.index, gpu.island, gpu.healthy, free)
            self.whole_free += freed.whole_free and not gpu.whole_free
        if self.cpu_free is not None:
            self.cpu_free += holding.cpu_milli

    def members(self) -> int:
        member = self.member
        fits = gpus_fit(self.gpus, member, self.islands_required)
        if member.cpu_milli > 0 and self.cpu_free is not None:
            fits = min(fits, self.cpu_free // member.cpu_milli)
        return fits


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


@dataclass(frozen=True, slots=True)
class DomainTotals:
    """How many members a domain's nodes hold together: ``totals[i]`` from
    ``times[i]`` on (rising; ``times[0]`` is when it was counted), ``blocked`` once
    pods without a time limit are gone too. No promise is counted: what
    ``estimate_domain`` says of a domain none of whose nodes is promised away."""

    times: tuple[datetime, ...]
    totals: tuple[int, ...]
    blocked: int

    def holds(self, members: int) -> bool:
        """Whether the domain ever holds ``members``, if only once pods without a limit end."""
        return self.totals[-1] >= members or self.blocked >= members

    def start(self, members: int, now: datetime) -> datetime | None:
        """When the domain holds ``members`` (``holds``): a time at or after ``now``, or
        None when only pods without a time limit stand in the way."""
        at = bisect_left(self.totals, members)
        return max(self.times[at], now) if at < len(self.totals) else None


def domain_totals(outlooks: Sequence[Outlook], now: datetime) -> DomainTotals:
    """The ``DomainTotals`` of nodes with these ``outlooks``."""
    base = blocked = 0
    rises: list[tuple[datetime, int]] = []
    for outlook in outlooks:
        base += outlook.now
        blocked += outlook.blocked
        last = outlook.now
        for when, members in outlook.steps:
            rises.append((when, members - last))
            last = members
    rises.sort()
    times, totals = [now], [base]
    for when, rise in rises:
        if when <= times[-1]:
            totals[-1] += rise
        else:
            times.append(when)
            totals.append(totals[-1] + rise)
    return DomainTotals(tuple(times), tuple(totals), blocked)


# ---------------------------------------------------------------- the plan


class OutlookMemo:
    """What one caller's plans share (a plan without one makes its own): each node's
    outlook by member shape while the node object and its holdings object are the same
    ones and no pod there has passed its end; the domains of a shape at a level, and the
    maintenance windows, for one ``nodes`` mapping object. A caller that changes a
    node's labels, products, health or drain time in place must ``clear`` it.

    A caller that says which nodes it changed (``told``, then ``changed`` before each
    plan) spares every plan comparing each node of each domain with what its counts
    were made of: only the domains of the nodes it names are counted again."""

    __slots__ = ("_domains", "_drains", "_outlooks", "_told", "_totals", "_within")

    def __init__(self, *, told: bool = False) -> None:
        self._told = told
        self._within: dict[NodeName, list[tuple[str, int, int, int, bool]]] = {}
        self._outlooks: dict[tuple[NodeName, int, int, int, bool], _KeptOutlook] = {}
        self._totals: dict[tuple[str, int, int, int, bool], _KeptTotals] = {}
        self._domains: dict[tuple[object, ...], tuple[object, dict[str, tuple[NodeName, ...]]]] = {}
        self._drains: tuple[object, dict[NodeName, Promise]] | None = None

    def clear(self) -> None:
        self._outlooks.clear()
        self._totals.clear()
        self._within.clear()
        self._domains.clear()
        self._drains = None

    def outlook(
        self,
        node: NodeState,
        held: Sequence[Holding],
        member: PodDemand,
        now: datetime,
        *,
        rules: ReservationRules,
        islands_required: bool,
    ) -> Outlook:
        key = (node.name, member.gpus, member.gpu_milli, member.cpu_milli, islands_required)
        kept = self._outlooks.get(key)
        if kept is not None and kept.node is node and kept.held is held and now <= kept.until:
            return kept.outlook
        outlook = node_outlook(
            node, held, member, now, rules=rules, islands_required=islands_required
        )
        until = min((h.ends for h in held if h.ends is not None), default=_FOREVER)
        self._outlooks[key] = _KeptOutlook(node, held, until, outlook)
        return outlook

    def changed(self, names: Iterable[NodeName]) -> None:
        """These nodes (or the pods on them) changed: the counts of their domains go."""
        for name in names:
            for key in self._within.pop(name, ()):
                self._totals.pop(key, None)

    def totals(
        self,
        domain: str,
        names: Sequence[NodeName],
        member: PodDemand,
        cluster: PlanInput,
        now: datetime,
    ) -> DomainTotals:
        """The ``DomainTotals`` of ``names`` for ``member``, kept while each node and its
        holdings are the same objects and no pod there has passed its end."""
        islands = cluster.config.islands_required
        key = (domain, member.gpus, member.gpu_milli, member.cpu_milli, islands)
        kept = self._totals.get(key)
        if self._told and kept is not None and now <= kept.until:
            return kept.totals
        nodes, holdings = cluster.nodes, cluster.holdings
        states = tuple(nodes[n] for n in names)
        held = tuple(holdings.get(n, ()) for n in names)
        if (
            kept is not None
            and now <= kept.until
            and len(kept.states) == len(states)
            and all(map(is_, kept.states, states))
            and all(map(is_, kept.held, held))
        ):
            return kept.totals
        outlooks = [
            self.outlook(node, h, member, now, rules=cluster.rules, islands_required=islands)
            for node, h in zip(states, held, strict=True)
        ]
        found = domain_totals(outlooks, now)
        until = min((self._until(n, member, islands) for n in names), default=_FOREVER)
        self._totals[key] = _KeptTotals(states, held, until, found)
        if self._told:
            for name in names:
                self._within.setdefault(name, []).append(key)
        return found

    def _until(self, name: NodeName, member: PodDemand, islands: bool) -> datetime:
        kept = self._outlooks.get((name, member.gpus, member.gpu_milli, member.cpu_milli, islands))
        return _FOREVER if kept is None else kept.until

    def domains(
        self,
        nodes: Mapping[NodeName, NodeState],
        member: PodDemand,
        level: str | None,
        config: ExtenderConfig,
    ) -> dict[str, tuple[NodeName, ...]]:
        """The nodes that may ever hold a ``member`` (schedulable, an accepted product,
        enough healthy GPUs), by their domain at ``level`` (``ANYWHERE`` without one)."""
        key = (level, member.gpus, member.gpu_milli, member.products, config.islands_required)
        kept = self._domains.get(key)
        if kept is not None and kept[0] is nodes:
            return kept[1]
        groups: dict[str, list[NodeName]] = {}
        for name, node in nodes.items():
            value = ANYWHERE if level is None else node.domains.get(level)
            if value is not None and _may_hold(node, member, config.islands_required):
                groups.setdefault(value, []).append(name)
        found = {value: tuple(names) for value, names in groups.items()}
        self._domains[key] = (nodes, found)
        return found

    def drains(self, nodes: Mapping[NodeName, NodeState]) -> dict[NodeName, Promise]:
        """The maintenance windows of ``nodes``, as promises."""
        if self._drains is None or self._drains[0] is not nodes:
            found = {n: Promise(s.drain_after) for n, s in nodes.items() if s.drain_after}
            self._drains = (nodes, found)
        return self._drains[1]


@dataclass(frozen=True, slots=True)
class _KeptTotals:
    states: tuple[NodeState, ...]
    held: tuple[Sequence[Holding], ...]
    until: datetime
    totals: DomainTotals


@dataclass(frozen=True, slots=True)
class _KeptOutlook:
    node: NodeState
    held: Sequence[Holding]
    until: datetime
    outlook: Outlook


def _may_hold(node: NodeState, member: PodDemand, islands_required: bool) -> bool:
    if node.unschedulable:
        return False
    if member.products and not any(product_matches(p, node.product) for p in member.products):
        return False
    return pod_fits(node, member, islands_required, empty=True) > 0


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The cluster as a plan reads it: nodes, the pods holding GPUs on each, the config."""

    nodes: Mapping[NodeName, NodeState]
    holdings: Mapping[NodeName, Sequence[Holding]]
    config: ExtenderConfig
    rules: ReservationRules = field(default_factory=ReservationRules)
    memo: OutlookMemo = field(default_factory=OutlookMemo, compare=False)


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
    groups = cluster.memo.domains(cluster.nodes, gang.member, gang.level, cluster.config)
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
        gang.members,
    )
    found = ranked.get(key)
    if found is None:
        found = []
        for domain, names in groups.items():
            totals = cluster.memo.totals(domain, names, member, cluster, now)
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
            rules=cluster.rules,
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
    config = cluster.config

    def fragmented(domain: str) -> tuple[float, str]:
        nodes = (cluster.nodes[n] for n in groups[domain])
        lost = sum(fragmentation(n, config.pod_mix, config.islands_required) for n in nodes)
        return lost, domain

    return min(tied, key=fragmented)


def _start_order(start: datetime | None) -> tuple[bool, datetime]:
    """Sooner first; a start not known after every known one."""
    return (start is None, start or _FOREVER)
