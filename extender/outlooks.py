"""When nodes, and domains of nodes, can hold members of one shape, as the pods on them
end by their time limits: what ``extender.reservations`` estimates its starts from.

Layer: PURE. Functions of nodes, the pods holding their GPUs and ``now``: no I/O, no
clock, no settings, no aiohttp, no cache. Must not choose a domain or a reservation
(``extender.reservations`` does) nor place anything.

* A node's *outlook* for one member shape (``node_outlook``): how many members it
  holds now and from which time on it holds more, as the pods on it end by their time
  limits (``started_at`` + ``activeDeadlineSeconds``). A pod without a time limit never
  ends as far as the outlook knows: the members it blocks count only as ``blocked``. A
  pod past its limit is taken to end a grace after now: it pushes the estimate.
* A domain's *totals* (``domain_totals``): how many members its nodes hold together
  over time.
* ``OutlookMemo`` keeps both between plans, and each member shape's domains.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import is_
from typing import Final, Protocol

from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    Promise,
    product_matches,
)
from extender.config import MixEntry
from extender.gpus import fragmentation, gpus_fit, pod_fits
from extender.selection import selection_refusal

ANYWHERE: Final = ""
"""The one domain of a member shape without a topology level: every node that may hold it."""
_FOREVER: Final = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Holding:
    """A pod holding GPUs (and CPU) on a node until ``ends`` (None: no time limit)."""

    allocation: Allocation
    ends: datetime | None
    cpu_milli: int = 0


@dataclass(frozen=True, slots=True)
class Outlook:
    """How many members of one shape a node holds: ``now``, from each step's time on
    (rising), and ``blocked`` once pods without a time limit are gone too."""

    name: NodeName
    now: int
    steps: tuple[tuple[datetime, int], ...] = ()
    blocked: int = 0


# ---------------------------------------------------------------- one node


def node_outlook(
    node: NodeState,
    held: Sequence[Holding],
    member: PodDemand,
    now: datetime,
    *,
    grace: timedelta,
    islands_required: bool,
) -> Outlook:
    """How many ``member`` pods ``node`` holds now and as its pods end by their time
    limits (``held``); one past its limit ends ``grace`` after now. CPU counts as well
    as GPUs when the node says how much it has. Valid at ``now``: a caller that keeps
    an outlook recomputes it once a pod's end has passed."""
    known = sorted(
        (_clamp(h.ends, now, grace), i) for i, h in enumerate(held) if h.ends is not None
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


def _clamp(ends: datetime, now: datetime, grace: timedelta) -> datetime:
    """A pod past its time limit still holds its GPUs: it ends ``grace`` after now."""
    return ends if ends >= now else now + grace


class _Freeing:
    """A node's GPUs and CPU as its pods give them back, one pod at a time: free milli
    per GPU in a list, made into GPUs only when members are counted (an outlook
    releases every pod of the node, and counts after few of them: ``could_hold``)."""

    __slots__ = (
        "cpu_free",
        "free",
        "gpus",
        "islands_required",
        "member",
        "where",
        "whole_free",
    )

    def __init__(self, node: NodeState, member: PodDemand, islands_required: bool) -> None:
        self.gpus = node.gpus
        self.free = [gpu.free_milli for gpu in node.gpus]
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
        free, gpus = self.free, self.gpus
        for at in places:
            was = free[at]
            free[at] = now = min(MILLI_PER_GPU, was + back)
            if now == MILLI_PER_GPU and was < MILLI_PER_GPU and gpus[at].healthy:
                self.whole_free += 1
        if self.cpu_free is not None:
            self.cpu_free += holding.cpu_milli

    def members(self) -> int:
        member = self.member
        gpus = [
            g if g.free_milli == f else GpuDevice(g.index, g.island, g.healthy, f)
            for g, f in zip(self.gpus, self.free, strict=True)
        ]
        fits = gpus_fit(gpus, member, self.islands_required)
        if member.cpu_milli > 0 and self.cpu_free is not None:
            fits = min(fits, self.cpu_free // member.cpu_milli)
        return fits


# ---------------------------------------------------------------- one domain


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


# ---------------------------------------------------------------- kept between plans


class Cluster(Protocol):
    """What the memo counts from: nodes, the pods holding GPUs on each, the grace of an
    overrun and whether whole-GPU pods keep to one NVLink island."""

    @property
    def nodes(self) -> Mapping[NodeName, NodeState]: ...

    @property
    def holdings(self) -> Mapping[NodeName, Sequence[Holding]]: ...

    @property
    def grace(self) -> timedelta: ...

    @property
    def islands_required(self) -> bool: ...


class OutlookMemo:
    """What one caller's plans share (a plan without one makes its own): each node's
    outlook by member shape while the node object and its holdings object are the same
    ones and no pod there has passed its end; the domains of a shape at a level, and the
    maintenance windows, for one ``nodes`` mapping object. A caller that changes a
    node's labels, products, health or drain time in place must ``clear`` it.

    A caller that says which nodes it changed (``told``, then ``changed`` before each
    plan) spares every plan comparing each node of each domain with what its counts
    were made of: only the domains of the nodes it names are counted again."""

    __slots__ = (
        "_domains",
        "_drains",
        "_fragments",
        "_outlooks",
        "_told",
        "_totals",
        "_within",
    )

    def __init__(self, *, told: bool = False) -> None:
        self._told = told
        self._within: dict[NodeName, list[tuple[object, ...]]] = {}
        self._outlooks: dict[tuple[NodeName, int, int, int, bool], _KeptOutlook] = {}
        self._totals: dict[tuple[object, ...], _KeptTotals] = {}
        self._domains: dict[tuple[object, ...], tuple[object, dict[str, tuple[NodeName, ...]]]] = {}
        self._drains: tuple[object, dict[NodeName, Promise]] | None = None
        self._fragments: dict[NodeName, tuple[NodeState, object, bool, float]] = {}

    def clear(self) -> None:
        self._fragments.clear()
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
        grace: timedelta,
        islands_required: bool,
    ) -> Outlook:
        key = (node.name, member.gpus, member.gpu_milli, member.cpu_milli, islands_required)
        kept = self._outlooks.get(key)
        if kept is not None and kept.node is node and kept.held is held and now <= kept.until:
            return kept.outlook
        outlook = node_outlook(
            node, held, member, now, grace=grace, islands_required=islands_required
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
        now: datetime,
        cluster: Cluster,
    ) -> DomainTotals:
        """The ``DomainTotals`` of ``names`` for ``member``, kept while each node and its
        holdings are the same objects and no pod there has passed its end."""
        islands = cluster.islands_required
        key = (
            domain,
            member.gpus,
            member.gpu_milli,
            member.cpu_milli,
            member.products,
            member.selection,
            islands,
        )
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
            self.outlook(node, h, member, now, grace=cluster.grace, islands_required=islands)
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
        islands_required: bool,
    ) -> dict[str, tuple[NodeName, ...]]:
        """The nodes that may ever hold a ``member`` (schedulable, an accepted product,
        enough healthy GPUs), by their domain at ``level`` (``ANYWHERE`` without one)."""
        key = (
            level,
            member.gpus,
            member.gpu_milli,
            member.products,
            member.selection,
            islands_required,
        )
        kept = self._domains.get(key)
        if kept is not None and kept[0] is nodes:
            return kept[1]
        groups: dict[str, list[NodeName]] = {}
        for name, node in nodes.items():
            value = ANYWHERE if level is None else node.domains.get(level)
            if value is not None and _may_hold(node, member, islands_required):
                groups.setdefault(value, []).append(name)
        found = {value: tuple(names) for value, names in groups.items()}
        self._domains[key] = (nodes, found)
        return found

    def fragmentation(
        self, node: NodeState, mix: tuple[MixEntry, ...], islands_required: bool
    ) -> float:
        """``gpus.fragmentation`` of ``node`` for ``mix``, kept while the node object and
        the mix object are the same ones (a tie between domains that fit now, which most
        do when a gang waits for nothing, weighs every node of each)."""
        kept = self._fragments.get(node.name)
        if kept is not None and kept[0] is node and kept[1] is mix and kept[2] is islands_required:
            return kept[3]
        found = fragmentation(node, mix, islands_required)
        self._fragments[node.name] = (node, mix, islands_required, found)
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
    if member.selection is not None and selection_refusal(member.selection, node) is not None:
        return False
    return pod_fits(node, member, islands_required, empty=True) > 0
