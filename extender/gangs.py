"""A pod's gang as one snapshot shows it: its members, its domain, room per domain.

Layer: PURE. Functions of a snapshot, a pod and the decision cache: no I/O, no clock
(``now`` is a value), no settings, no aiohttp. Builds each request's ``PodContext``
(``build_context``); must not judge a node itself (the gang filters in
``extender.filters`` and gang locality in ``extender.scores`` do, from the
``GangView`` made here).

A gang's first member with a topology level reads how many members each domain at that
level can hold (``DomainRooms``): whole pods per node, counted over every node, which
is the costly part of its request. The count is carried in the decision cache from one
snapshot to the next, where only the nodes changed since are counted again
(``_room_tally``), and can be made before any request asks (``prepare_gang_shape``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Final, TypeAlias, cast

from cluster.model import GangSpec, NodeName, NodeState, PodDemand, PodInfo, PodKey, TopologyMode
from cluster.snapshot import NodeChangeLog, Snapshot
from extender.config import ExtenderConfig
from extender.context import FIT, DomainRooms, GangView, PodContext
from extender.filters import (
    ROOM_FILTERS,
    NodeFacts,
    filter_maintenance,
    filter_reserved,
    member_fits,
    node_facts,
    passes,
)
from extender.memo import MISSING, DecisionCache, FactsKey, NodeMemo, RoomKey

_NONE: Final[Mapping[NodeName, int]] = MappingProxyType({})


def build_context(
    snapshot: Snapshot,
    pod: PodInfo,
    config: ExtenderConfig,
    now: datetime,
    memo: DecisionCache | None = None,
) -> PodContext:
    """The context of ``pod`` deciding against ``snapshot`` at time ``now``, with the
    decision cache ``memo`` of ``config`` (None: a fresh one, which keeps nothing)."""
    memo = DecisionCache(config) if memo is None else memo
    spec = pod.demand.gang
    gang = None
    if spec is not None:
        gang = _gang_view(snapshot, pod, spec, config=config, now=now, memo=memo)
    return PodContext(
        pod=pod.key,
        demand=pod.demand,
        now=now,
        config=config,
        gang=gang,
        promises=snapshot.promises,
        memo=memo,
    )


def _gang_view(
    snapshot: Snapshot,
    pod: PodInfo,
    spec: GangSpec,
    *,
    config: ExtenderConfig,
    now: datetime,
    memo: DecisionCache,
) -> GangView:
    members = tuple(
        snapshot.allocations[key].node
        for key in snapshot.gangs.get(spec.id, ())
        if key != pod.key and key in snapshot.allocations
    )
    required = preferred = None
    unknown = None
    topology = pod.demand.topology
    if topology is not None:
        level = config.level(topology.level)
        if topology.mode is TopologyMode.PREFERRED:
            preferred = level
        elif level is not None:
            required = level
        else:
            unknown = topology.level

    counts: dict[str, dict[str, int]] = {label: {} for label in _locality_labels(config)}
    located = 0
    for name in members:
        node = snapshot.nodes.get(name)
        if node is None:
            continue
        located += 1
        for label, per_domain in counts.items():
            value = name if label == "" else node.domains.get(label)
            if value is not None:
                per_domain[value] = per_domain.get(value, 0) + 1

    focus = required or preferred
    allowed = None
    rooms = None
    if focus is not None:
        placed = counts.get(focus.node_label, {})
        if placed:
            top = max(placed.values())
            allowed = frozenset(v for v, n in placed.items() if n == top) if required else None
        else:
            # the room is counted with the pod's context, before its gang is known
            ctx = PodContext(
                pod=pod.key,
                demand=pod.demand,
                now=now,
                config=config,
                promises=snapshot.promises,
                memo=memo,
            )
            rooms = _rooms(snapshot, ctx, focus.node_label)
    return GangView(
        spec=spec,
        members=members,
        required=required,
        preferred=preferred,
        unknown_level=unknown,
        member_domains=MappingProxyType({k: MappingProxyType(v) for k, v in counts.items()}),
        members_located=located,
        allowed_domains=allowed,
        rooms=rooms,
    )


def _locality_labels(config: ExtenderConfig) -> tuple[str, ...]:
    """Labels members are counted by: every level's, and ``""`` for the node itself."""
    return (*(level.node_label for level in config.levels), "")


def _rooms(snapshot: Snapshot, ctx: PodContext, label: str) -> DomainRooms:
    """Room for members of the gang per domain at ``label``, over every known node that
    could take one of them at all. Whole pods per node, not GPU sums: eight GPUs free as
    two per node hold no member of four GPUs.

    The count is kept (``_room_tally``) for the snapshot, which the member's filter,
    prioritize and bind share, and from one snapshot to the next. Draining nodes are
    kept aside: whether they may take the pod depends on the time.
    """
    key = RoomKey(ctx.shape, label, ctx.demand.selection)
    tally = _room_tally(snapshot, ctx, key)
    free, total = tally.free, tally.total
    draining: dict[NodeName, int] = {}
    for node, (value, fits, empty) in tally.draining.values():
        if filter_maintenance(ctx, node) is not FIT:
            continue
        if not draining:
            free, total = dict(free), dict(total)
        draining[node.name] = fits
        free[value] = free.get(value, 0) + fits
        total[value] = total.get(value, 0) + empty
    withheld = _withheld(snapshot, ctx, key, tally, draining) if ctx.promises else {}
    if withheld:
        free, total = dict(free), dict(total)
        for value, fits, empty in withheld.values():
            free[value] -= fits
            total[value] -= empty
    return DomainRooms(
        MappingProxyType(free),
        MappingProxyType(total),
        MappingProxyType(tally.fits_on),
        MappingProxyType(draining) if draining else _NONE,
        frozenset(withheld),
    )


def _withheld(
    snapshot: Snapshot,
    ctx: PodContext,
    key: RoomKey,
    tally: _RoomTally,
    draining: Mapping[NodeName, int],
) -> dict[NodeName, tuple[str, int, int]]:
    """The counted nodes a reservation of another gang holds that the pod may not use
    (``filter_reserved``), and what each added to the count: a gang does not count on
    GPUs kept free for another."""
    found: dict[NodeName, tuple[str, int, int]] = {}
    for name in ctx.promises:
        node = snapshot.nodes.get(name)
        if node is None or (name not in tally.fits_on and name not in draining):
            continue
        if filter_reserved(ctx, node) is FIT:
            continue
        entry = _room_of(ctx, node, key.label, ctx.memo.per_node(key))
        if entry is not None:
            found[name] = entry
    return found


def prepare_gang_shape(
    snapshot: Snapshot, demand: PodDemand, memo: DecisionCache, now: datetime
) -> bool:
    """Make ahead what a gang's first member of ``demand``'s shape reads, and keep it
    in ``memo`` as that member's request would: the room per domain at its level
    (``_rooms``), and on the way each node's verdicts for the shape, and for a required
    level each node's facts by name (``kept_facts``). The first such request then finds
    it made, and redoes only the nodes changed since. Doing it for every node takes
    tens of milliseconds at 5,000 nodes for a shape no request has read yet, which a
    server does better before its first request than during one.

    False, making nothing, when ``demand`` is no gang member with a topology level the
    config knows.
    """
    topology = demand.topology
    if demand.gang is None or topology is None:
        return False
    level = memo.config.level(topology.level)
    if level is None:
        return False
    ctx = PodContext(pod=PodKey(""), demand=demand, now=now, config=memo.config, memo=memo)
    _room_tally(snapshot, ctx, RoomKey(ctx.shape, level.node_label, ctx.demand.selection))
    if topology.mode is TopologyMode.REQUIRED:
        # of the gang, a node's facts read only the level: any member's view will do
        gang = GangView(spec=demand.gang, members=(), required=level)
        member = PodContext(
            pod=PodKey(""), demand=demand, now=now, config=memo.config, gang=gang, memo=memo
        )
        facts = kept_facts(snapshot, member)
        if facts is not None:
            for name, node in snapshot.nodes.items():
                if name not in facts:
                    facts[name] = node_facts(member, node)
    return True


def kept_facts(snapshot: Snapshot, ctx: PodContext) -> dict[NodeName, NodeFacts] | None:
    """Each node's ``NodeFacts`` for a member of a gang that requires a known level, kept
    by name in the decision cache for ``snapshot`` (``memo.FactsKey``: what they read of
    the pod); None for any other pod, or when nothing can be kept there
    (``DecisionCache.by_name``)."""
    gang = ctx.gang
    if gang is None or gang.required is None:
        return None
    key = FactsKey(ctx.shape, gang.required.node_label)
    return cast("dict[NodeName, NodeFacts] | None", ctx.memo.by_name(snapshot, key))


_Room: TypeAlias = tuple[str, int, int] | None
"""What a node adds to a room count: (domain, fits now, fits empty), or None."""


@dataclass(slots=True)
class _RoomTally:
    """Room per domain value over the nodes counted so far (draining nodes aside). Never
    changed once in a memo: a newer count starts from a copy."""

    free: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    nodes_in: dict[str, int] = field(default_factory=dict)
    fits_on: dict[NodeName, int] = field(default_factory=dict)
    """Members each node holds now."""
    draining: dict[NodeName, tuple[NodeState, tuple[str, int, int]]] = field(default_factory=dict)

    def copy(self) -> _RoomTally:
        return _RoomTally(
            dict(self.free),
            dict(self.total),
            dict(self.nodes_in),
            dict(self.fits_on),
            dict(self.draining),
        )

    def count(self, node: NodeState, entry: _Room, sign: int) -> None:
        """Count ``node`` in (``sign`` 1) or out (-1), with ``entry`` from ``_room_of``."""
        if entry is None:
            return
        if node.drain_after is not None:
            if sign > 0:
                self.draining[node.name] = (node, entry)
            else:
                self.draining.pop(node.name, None)
            return
        value, fits, empty = entry
        if sign > 0:
            self.fits_on[node.name] = fits
        else:
            self.fits_on.pop(node.name, None)
        left = self.nodes_in.get(value, 0) + sign
        if left <= 0:
            for counts in (self.free, self.total, self.nodes_in):
                counts.pop(value, None)
            return
        self.nodes_in[value] = left
        self.free[value] = self.free.get(value, 0) + sign * fits
        self.total[value] = self.total.get(value, 0) + sign * empty


@dataclass(frozen=True, slots=True)
class _Carried:
    """A room count, and the snapshot it was made for."""

    nodes: Mapping[NodeName, NodeState]
    log: NodeChangeLog | None
    generation: int
    tally: _RoomTally


def _room_tally(snapshot: Snapshot, ctx: PodContext, key: RoomKey) -> _RoomTally:
    """The room count for ``snapshot``: from the last count made under ``ctx.config``
    for these keys, with the nodes that changed since counted again (those the cache's
    change log names, or else those whose object differs: a changed node is a new
    object), or from scratch the first time."""
    nodes = snapshot.nodes
    carried = cast("_Carried | None", ctx.memo.carried(key))
    if carried is not None and carried.nodes is nodes:
        return carried.tally
    entries = ctx.memo.per_node(key)
    if carried is None:
        tally = _RoomTally()
        for node in nodes.values():
            tally.count(node, _room_of(ctx, node, key.label, entries), 1)
    else:
        seen = carried.nodes
        logged = None
        log = carried.log
        if (
            log is not None
            and log is snapshot.node_log
            and carried.generation <= snapshot.generation
        ):
            logged = log.since(carried.generation, snapshot.generation)
        if logged is not None:
            changed = list(dict.fromkeys(logged))
        else:
            changed = [name for name, node in nodes.items() if seen.get(name) is not node]
            added = sum(1 for name in changed if name not in seen)
            if len(seen) + added != len(nodes):
                changed.extend(seen.keys() - nodes.keys())
        tally = carried.tally.copy()
        for name in changed:
            old, new = seen.get(name), nodes.get(name)
            if old is new:
                continue
            if old is not None:
                tally.count(old, _room_of(ctx, old, key.label, entries), -1)
            if new is not None:
                tally.count(new, _room_of(ctx, new, key.label, entries), 1)
    fresh = _Carried(nodes, snapshot.node_log, snapshot.generation, tally)
    ctx.memo.carry(key, fresh)
    return tally


def _room_of(ctx: PodContext, node: NodeState, label: str, entries: NodeMemo) -> _Room:
    """What ``node`` adds to the room count at ``label``: (domain, fits now, fits
    empty), or None when it has no domain there or fails a ``ROOM_FILTERS`` filter.
    Kept by node object in ``entries``."""
    entry = entries.get(node)
    if entry is MISSING:
        value = node.domains.get(label)
        if value is None or not passes(ctx, node, ROOM_FILTERS):
            entry = None
        else:
            fits, empty = member_fits(ctx, node)
            entry = (value, fits, empty)
        entries.put(node, entry)
    return cast("_Room", entry)
