"""Filters and scorers of one node for one pod, in the manner of kube-scheduler's framework.

Layer: PURE. Functions of (``PodContext``, ``NodeState``): no I/O, no clock (the request
time arrives in the context), no settings, no cache, no aiohttp. ``decide`` runs them
over the candidates of a request; ``choose_gpus`` names the GPUs bind will take.

* A filter answers ``FIT`` or ``Unfit(reason, resolvable)``. The reason is written for
  the person reading ``kubectl describe pod``; ``resolvable`` says whether evicting pods
  from the node could ever help (kube-scheduler tries preemption only where it could).
* A scorer answers a float in 0..10 (10 is best). Floats rather than the wire's
  integers: fragmentation differences between nodes are often a fraction of a GPU, and
  rounding each scorer before combining them would erase exactly those differences.
  ``decide.prioritize`` turns the combined score into the wire's integers.
* ``choose_gpus`` is the single place that picks GPUs; the GPU filter is "it found some",
  so a node that passes the filters always has an assignment at bind.

Speed: what depends only on a node and the pod's shape (the cordon, product and GPU
verdicts, the packing and island-fit part of the score, how many pods of the shape fit)
is kept in the node's ``memo`` under a key naming everything it read (``filter_key``,
``score_key``). A node object never changes and a changed node starts with an empty
memo, so a remembered answer is always the one the functions would give; what reads the
time or the gang (maintenance, gang filters, gang locality) runs every time. Three more
memos rest on the same rule, that a key holds everything its answer reads:

* ``ExtenderConfig.by_state``: the same answers by node *state* (``gpu_state``), so a
  changed node that reaches a state seen before, on it or on another node, finds them;
* ``flat_answers``: per pod shape, each node's answer by name, kept from one snapshot to
  the next by dropping the nodes the cache's ``NodeChangeLog`` names (one look-up per
  candidate, where the node memo takes three); with each node's topology domains kept
  the same way, most of a gang member's candidates are answered by name too
  (``GangShortcut``);
* a gang's room per domain (``_room_tally``): counted once per snapshot, kept in its
  ``memo``, and carried to the next by re-counting the changed nodes.

All three belong to one config: a new config (a new pod mix) starts them afresh.

The model of a node (``cluster.model``): GPUs with an index, an NVLink island, health
and free milli-GPUs. Unhealthy GPUs are never counted or chosen. A whole-GPU pod takes
GPUs nobody uses; a share takes part of one GPU.
"""

from __future__ import annotations

import bisect
import functools
import math
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from types import MappingProxyType
from typing import Final, TypeAlias, cast

from cluster.labels import GPU_RESOURCE, HOSTNAME
from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodKey,
    TopologyMode,
    product_matches,
)
from cluster.snapshot import NodeChangeLog, Snapshot, apply_allocation
from extender.config import ExtenderConfig, MixEntry, TopologyLevel

MAX_SCORE: Final = 10.0
NEUTRAL_SCORE: Final = 5.0
"""What a scorer answers when it has no opinion (a pod without GPUs): it ranks no node
above another."""

_FRAG_SCALE_MILLI: Final = 1000.0
"""How much added fragmentation halves the packing score's distance to 0 (one GPU)."""


# ---------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class Fit:
    """The node can take the pod, as far as this filter can tell."""


FIT: Final = Fit()


@dataclass(frozen=True, slots=True)
class Unfit:
    """The node cannot take the pod: why, and whether evicting pods could change that."""

    reason: str
    resolvable: bool


Verdict: TypeAlias = Fit | Unfit


# ---------------------------------------------------------------- the pod's context


_NONE: Final[Mapping[NodeName, int]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DomainRooms:
    """How many members of a gang each topology domain at one level can hold, and what
    each node counted there holds. Read-only views of the kept room count
    (``_room_tally``), not copies: a first member's request reads a few domains of
    hundreds, and a few nodes of thousands."""

    free: Mapping[str, int]
    """Members that fit on the domain's free GPUs now."""
    total: Mapping[str, int]
    """Members that would fit if no other pod held a GPU there."""
    fits_on: Mapping[NodeName, int]
    """Members each counted node holds now, draining nodes aside."""
    draining_fits: Mapping[NodeName, int]
    """The same for the draining nodes this pod may use (counted in ``free`` too)."""

    def node_fits(self, name: NodeName) -> int | None:
        """Members ``name`` holds now as counted here; None if it is not counted."""
        found = self.fits_on.get(name)
        return found if found is not None else self.draining_fits.get(name)


@dataclass(frozen=True, slots=True)
class GangView:
    """A pod's gang as the snapshot shows it, computed once per request."""

    spec: GangSpec
    members: tuple[NodeName, ...]
    """Nodes of the members placed or assumed so far (this pod excluded), one per member."""
    required: TopologyLevel | None = None
    preferred: TopologyLevel | None = None
    unknown_level: str | None = None
    """``required:<level>`` names a level the extender does not know."""
    member_domains: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per level node label (and ``""`` for the node itself): members per domain value."""
    members_located: int = 0
    """Members whose node the snapshot knows (those counted in ``member_domains``)."""
    allowed_domains: frozenset[str] | None = None
    """``required``: the domain(s) at that level holding the most placed members."""
    rooms: DomainRooms | None = None
    """No member placed yet and a level to keep to: room per domain value at that level."""
    reasons: dict[Hashable, Unfit] = field(default_factory=dict, compare=False, repr=False)
    """The gang filters' verdicts, each written once per request: ``_OUTSIDE`` for a node
    outside ``allowed_domains``, (room, resolvable) for a domain without room."""

    @property
    def refuses_nodes(self) -> bool:
        """Whether the gang filters can refuse a node: only with a ``required`` level,
        known or not. Otherwise a member's verdicts are those of a pod of its shape
        outside any gang."""
        return self.required is not None or self.unknown_level is not None

    @property
    def level(self) -> TopologyLevel | None:
        return self.required or self.preferred


@dataclass(frozen=True, slots=True)
class PodContext:
    """What every filter and scorer reads about the pod, built once per request."""

    pod: PodKey
    demand: PodDemand
    now: datetime
    config: ExtenderConfig
    gang: GangView | None = None
    fits_key: str = field(init=False, repr=False, compare=False)
    """The memo key of ``pod_fits`` for this pod, which gang filters read per node."""
    ends: datetime | None = field(init=False, repr=False, compare=False)
    """When the pod's time limit ends if it starts now (None: no limit), which the
    maintenance filter compares with every draining node's time."""
    drains: dict[datetime, Verdict] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    """The maintenance verdict by drain time, for this request: nodes of one
    maintenance window share it, reason text and all."""

    def __post_init__(self) -> None:
        d = self.demand
        key = sys.intern(f"p|{d.gpus}|{d.gpu_milli}|{self.config.islands_required}")
        object.__setattr__(self, "fits_key", key)
        limit = d.time_limit_s
        ends = None if limit is None else self.now + timedelta(seconds=limit)
        object.__setattr__(self, "ends", ends)


def build_context(
    snapshot: Snapshot, pod: PodInfo, config: ExtenderConfig, now: datetime
) -> PodContext:
    """The context of ``pod`` deciding against ``snapshot`` at time ``now``."""
    ctx = PodContext(pod=pod.key, demand=pod.demand, now=now, config=config)
    spec = pod.demand.gang
    if spec is None:
        return ctx
    gang = _gang_view(snapshot, ctx, spec)
    return PodContext(pod=pod.key, demand=pod.demand, now=now, config=config, gang=gang)


def _gang_view(snapshot: Snapshot, ctx: PodContext, spec: GangSpec) -> GangView:
    members = tuple(
        snapshot.allocations[key].node
        for key in snapshot.gangs.get(spec.id, ())
        if key != ctx.pod and key in snapshot.allocations
    )
    required = preferred = None
    unknown = None
    topology = ctx.demand.topology
    if topology is not None:
        level = ctx.config.level(topology.level)
        if topology.mode is TopologyMode.PREFERRED:
            preferred = level
        elif level is not None:
            required = level
        else:
            unknown = topology.level

    counts: dict[str, dict[str, int]] = {label: {} for label in _locality_labels(ctx.config)}
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

    Counting every node is the costly part of a gang's first member, so the count is
    kept (``_room_tally``): for the snapshot, which the member's filter, prioritize and
    bind share, and from one snapshot to the next, where only changed nodes are counted
    again. Draining nodes are kept aside: whether they may take the pod depends on the
    time.
    """
    tally = _kept_tally(snapshot, ctx, label)
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
    return DomainRooms(
        MappingProxyType(free),
        MappingProxyType(total),
        MappingProxyType(tally.fits_on),
        MappingProxyType(draining) if draining else _NONE,
    )


def _kept_tally(snapshot: Snapshot, ctx: PodContext, label: str) -> _RoomTally:
    fkey, pkey = filter_key(ctx), ctx.fits_key
    rkey = sys.intern(f"r|{fkey}|{pkey}|{label}")
    tally: _RoomTally | None = snapshot.memo.get(rkey)
    if tally is None:
        tally = _room_tally(snapshot, ctx, _RoomKeys(label, rkey, fkey, pkey))
        snapshot.memo[rkey] = tally
    return tally


def prepare_gang_shape(
    snapshot: Snapshot, demand: PodDemand, config: ExtenderConfig, now: datetime
) -> bool:
    """Make ahead what a gang's first member of ``demand``'s shape reads, and keep it as
    that member's request would: the room per domain at its level (``_rooms``), and by
    node name each node's domain there and the answer a pod of the shape outside any
    gang gets (``GangShortcut``). The first such request then finds it made, and
    redoes only the nodes changed since. Doing it for every node takes tens of
    milliseconds at 5,000 nodes for a shape no request has read yet, which a server
    does better before its first request than during one.

    False, making nothing, when ``demand`` is no gang member with a topology level the
    config knows.
    """
    topology = demand.topology
    if demand.gang is None or topology is None:
        return False
    level = config.level(topology.level)
    if level is None:
        return False
    ctx = PodContext(pod=PodKey(""), demand=demand, now=now, config=config)
    label = level.node_label
    _kept_tally(snapshot, ctx, label)
    key = filter_key(ctx)
    domains = flat_answers(snapshot, config, domain_key(label))
    lone = flat_answers(snapshot, config, key)
    if domains is not None and lone is not None:
        for name, node in snapshot.nodes.items():
            domains[name] = node.domains.get(label)
            lone[name] = kept_answer(ctx, node, key)
    return True


@dataclass(frozen=True, slots=True)
class _RoomKeys:
    label: str
    room: str
    filters: str
    fits: str


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
        """Count ``node`` in (``sign`` 1) or out (-1), with ``entry`` from ``_room_entry``."""
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


def _room_tally(snapshot: Snapshot, ctx: PodContext, keys: _RoomKeys) -> _RoomTally:
    """The room count for ``snapshot``: from the last count made under ``ctx.config``
    for these keys, with the nodes that changed since counted again (those the cache's
    change log names, or else those whose object differs: a changed node is a new
    object), or from scratch the first time."""
    nodes = snapshot.nodes
    carried = cast("_Carried | None", _table(ctx.config, ("rooms", keys.room)))
    if carried is None:
        tally = _RoomTally()
        for node in nodes.values():
            tally.count(node, _room_of(ctx, node, keys), 1)
    elif carried.nodes is nodes:
        return carried.tally
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
                tally.count(old, _room_of(ctx, old, keys), -1)
            if new is not None:
                tally.count(new, _room_of(ctx, new, keys), 1)
    fresh = _Carried(nodes, snapshot.node_log, snapshot.generation, tally)
    _keep_table(ctx.config, ("rooms", keys.room), fresh)
    return tally


def _room_of(ctx: PodContext, node: NodeState, keys: _RoomKeys) -> _Room:
    """What ``node`` adds to the room count, from its memo: (domain, fits now, fits
    empty), or None when it has no domain at the level or cordon or product rule it out."""
    entry: _Room = node.memo.get(keys.room, _UNKNOWN)
    if entry is _UNKNOWN:
        entry = _room_entry(ctx, node, keys.label, keys.filters, keys.fits)
        _remember(node, keys.room, entry)
    return entry


_Room: TypeAlias = tuple[str, int, int] | None
_UNKNOWN: Final = ("", -1, -1)


def _room_entry(ctx: PodContext, node: NodeState, label: str, fkey: str, pkey: str) -> _Room:
    value = node.domains.get(label)
    if value is None:
        return None
    # NODE_FILTERS but maintenance, which reads the time: cordon and product
    static = _static_verdicts(ctx, node, fkey)
    if static[1] is not FIT or static[2] is not FIT:
        return None
    fits, empty = _fits(ctx, node, pkey)
    return (value, fits, empty)


def _fits(ctx: PodContext, node: NodeState, key: str) -> tuple[int, int]:
    """``pod_fits`` now and empty, kept in the node's memo under ``key = ctx.fits_key``."""
    found: tuple[int, int] | None = node.memo.get(key)
    if found is None:
        shared = (key, gpu_state(node))
        found = cast("tuple[int, int] | None", ctx.config.by_state.get(shared))
        if found is None:
            demand, islands_required = ctx.demand, ctx.config.islands_required
            found = (
                pod_fits(node, demand, islands_required),
                pod_fits(node, demand, islands_required, empty=True),
            )
            _share(ctx.config, shared, found)
        _remember(node, key, found)
    return found


def _remember(node: NodeState, key: str, value: object) -> None:
    memo = node.memo
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value


_GPU_STATE: Final = attrgetter("index", "island", "healthy", "free_milli")
_STATE_KEY: Final = "state"
_BY_STATE_LIMIT: Final = 100_000
"""Entries ``ExtenderConfig.by_state`` holds before it starts over: a few per distinct
node state and pod shape, so tens of megabytes at most."""


def gpu_state(node: NodeState) -> Hashable:
    """Everything the node-only filters and ``pod_fits`` read of a node: its GPU product,
    cordon, pod limit, and each GPU's index, island, health and free milli. Nodes in one
    state get the same verdicts; the key they share them under in ``by_state``."""
    state = node.memo.get(_STATE_KEY)
    if state is None:
        gpus = tuple(map(_GPU_STATE, node.gpus))
        state = (node.product, node.unschedulable, node.max_pods, gpus)
        _remember(node, _STATE_KEY, state)
    return cast("Hashable", state)


def _score_state(node: NodeState) -> Hashable:
    """``gpu_state`` and the CPU, which packing reads as well."""
    return (gpu_state(node), node.cpu_milli > 0, node.cpu_free_milli)


@dataclass(slots=True)
class _Flat:
    log: NodeChangeLog
    generation: int
    answers: dict[NodeName, object]


def flat_answers(
    snapshot: Snapshot, config: ExtenderConfig, key: str
) -> dict[NodeName, object] | None:
    """Each node's answer under memo ``key`` (a verdict, a score, a domain), by node
    name, valid for ``snapshot``: one look-up per candidate where the node memos take
    three, which is most of a request's time with thousands of candidates.

    Kept under ``config`` from one snapshot to the next: the names the cache's change
    log gives are dropped, to be answered afresh. The caller adds what it computes of
    the node alone, never of a gang; an answer that reads the time (a draining node's)
    is kept as what does not (``Draining``), or not at all.
    ``None`` when nothing can be kept: a snapshot from outside the cache, or one older
    than the answers kept.
    """
    log = snapshot.node_log
    if log is None:
        return None
    slot = ("flat", key)
    flat = cast("_Flat | None", _table(config, slot))
    if flat is None or flat.log is not log:
        flat = _Flat(log, snapshot.generation, {})
        _keep_table(config, slot, flat)
    elif flat.generation != snapshot.generation:
        if flat.generation > snapshot.generation:
            return None
        changed = log.since(flat.generation, snapshot.generation)
        if changed is None:
            flat.answers.clear()
        else:
            pop = flat.answers.pop
            for name in changed:
                pop(name, None)
        flat.generation = snapshot.generation
    return flat.answers


_TABLES_KEPT: Final = 64
"""Per-shape tables (answers by node name, gang room counts) a config keeps, the least
recently used dropped first: each holds up to one entry per node, and a workload with
many pod shapes (a CPU request of every size) must not keep one for each."""
_TABLES: Final = "tables"


def _table(config: ExtenderConfig, slot: Hashable) -> object | None:
    tables = cast("dict[Hashable, object] | None", config.by_state.get(_TABLES))
    if tables is None:
        return None
    found = tables.pop(slot, None)
    if found is not None:
        tables[slot] = found  # the most recently used goes last
    return found


def _keep_table(config: ExtenderConfig, slot: Hashable, table: object) -> None:
    tables = cast("dict[Hashable, object] | None", config.by_state.get(_TABLES))
    if tables is None:
        tables = {}
        _share(config, _TABLES, tables)
    tables.pop(slot, None)
    if len(tables) >= _TABLES_KEPT:
        del tables[next(iter(tables))]
    tables[slot] = table


def _share(config: ExtenderConfig, key: Hashable, value: object) -> None:
    table = config.by_state
    if len(table) >= _BY_STATE_LIMIT:
        table.clear()
    table[key] = value


# ---------------------------------------------------------------- GPU arithmetic


def _islands(node: NodeState) -> tuple[dict[int, list[GpuDevice]], dict[int, int]]:
    """Whole-free GPUs per island (index order) and healthy GPUs per island."""
    free: dict[int, list[GpuDevice]] = {}
    healthy: dict[int, int] = {}
    for gpu in node.gpus:
        if gpu.healthy:
            healthy[gpu.island] = healthy.get(gpu.island, 0) + 1
            if gpu.free_milli >= MILLI_PER_GPU:
                free.setdefault(gpu.island, []).append(gpu)
    return free, healthy


def _one_island(k: int, healthy: Mapping[int, int], islands_required: bool) -> bool:
    """Whether ``k`` whole GPUs must come from one island: the rule is on, and some
    island has ``k`` healthy GPUs (a pod larger than every island must span)."""
    return islands_required and k <= max(healthy.values(), default=0)


def choose_gpus(
    node: NodeState, demand: PodDemand, config: ExtenderConfig
) -> tuple[int, ...] | None:
    """The GPU indices ``demand`` takes on ``node`` (ascending), or None if it cannot.

    Whole GPUs: from the island with the fewest free GPUs that holds them all (best
    fit keeps large islands whole); when none holds them and they need not be in one
    island, from as few islands as possible. A share: the healthy GPU with the least
    free milli that holds it, preferring GPUs in busier islands on a tie. A pod
    without GPUs takes ``()``.
    """
    if demand.gpus > 0:
        return _choose_whole(node, demand.gpus, config.islands_required)
    if demand.gpu_milli > 0:
        return _choose_share(node, demand.gpu_milli)
    return ()


def _choose_whole(node: NodeState, k: int, islands_required: bool) -> tuple[int, ...] | None:
    free, healthy = _islands(node)
    holding = [island for island, gpus in free.items() if len(gpus) >= k]
    if holding:
        best = min(holding, key=lambda island: (len(free[island]), island))
        return tuple(g.index for g in free[best][:k])
    if _one_island(k, healthy, islands_required) or sum(map(len, free.values())) < k:
        return None
    pool = sorted(free, key=lambda island: (-len(free[island]), island))
    chosen: list[int] = []
    remaining = k
    while remaining > 0:
        holding = [island for island in pool if len(free[island]) >= remaining]
        if holding:
            last = min(holding, key=lambda island: (len(free[island]), island))
            chosen.extend(g.index for g in free[last][:remaining])
            break
        largest = pool.pop(0)
        chosen.extend(g.index for g in free[largest])
        remaining -= len(free[largest])
    return tuple(sorted(chosen))


def _choose_share(node: NodeState, milli: int) -> tuple[int, ...] | None:
    whole_free: dict[int, int] = {}
    for gpu in node.gpus:
        if gpu.healthy and gpu.free_milli >= MILLI_PER_GPU:
            whole_free[gpu.island] = whole_free.get(gpu.island, 0) + 1
    best: tuple[int, int, int] | None = None
    for gpu in node.gpus:
        if gpu.healthy and gpu.free_milli >= milli:
            key = (gpu.free_milli, whole_free.get(gpu.island, 0), gpu.index)
            if best is None or key < best:
                best = key
    return None if best is None else (best[2],)


def pod_fits(
    node: NodeState, demand: PodDemand, islands_required: bool, *, empty: bool = False
) -> int:
    """How many pods like ``demand`` the node's healthy GPUs hold at once: now, or with
    ``empty`` as if no other pod held any. A pod without GPUs: the node's pod limit."""
    if demand.gpus > 0:
        k = demand.gpus
        counts: dict[int, int] = {}
        healthy: dict[int, int] = {}
        for gpu in node.gpus:
            if gpu.healthy:
                healthy[gpu.island] = healthy.get(gpu.island, 0) + 1
                if empty or gpu.free_milli >= MILLI_PER_GPU:
                    counts[gpu.island] = counts.get(gpu.island, 0) + 1
        if _one_island(k, healthy, islands_required):
            return sum(c // k for c in counts.values())
        return sum(counts.values()) // k
    if demand.gpu_milli > 0:
        m = demand.gpu_milli
        return sum(
            (MILLI_PER_GPU if empty else gpu.free_milli) // m for gpu in node.gpus if gpu.healthy
        )
    return node.max_pods


# ---------------------------------------------------------------- filters


def filter_schedulable(ctx: PodContext, node: NodeState) -> Verdict:
    """A cordoned node takes nothing new."""
    if node.unschedulable:
        return Unfit("node is cordoned (spec.unschedulable)", resolvable=False)
    return FIT


def filter_product(ctx: PodContext, node: NodeState) -> Verdict:
    """The node's GPU model is one the pod accepts (``tessera.dev/gpu-product``)."""
    accepted = ctx.demand.products
    if not accepted or not ctx.demand.uses_gpu:
        return FIT
    wanted = " or ".join(accepted)
    if not node.product:
        return Unfit(f"node has no GPU product label; pod accepts {wanted}", resolvable=False)
    if any(product_matches(a, node.product) for a in accepted):
        return FIT
    return Unfit(f"node has {node.product} GPUs; pod accepts {wanted}", resolvable=False)


def filter_maintenance(ctx: PodContext, node: NodeState) -> Verdict:
    """A node that drains at ``tessera.dev/drain-after`` takes only pods whose time
    limit (``activeDeadlineSeconds``) ends by then, counted from now."""
    drain = node.drain_after
    if drain is None:
        return FIT
    return _drain_verdict(ctx, drain)


def _drain_verdict(ctx: PodContext, drain: datetime) -> Verdict:
    verdict = ctx.drains.get(drain)
    if verdict is None:
        verdict = ctx.drains[drain] = _maintenance(ctx, drain)
    return verdict


def _maintenance(ctx: PodContext, drain: datetime) -> Verdict:
    ends = ctx.ends
    if ends is not None and ends <= drain:
        return FIT
    when = _rfc3339(drain)
    limit = ctx.demand.time_limit_s
    if ends is None or limit is None:
        return Unfit(
            f"node drains for maintenance at {when}; pod has no time limit "
            "(activeDeadlineSeconds) to end before it",
            resolvable=False,
        )
    return Unfit(
        f"node drains for maintenance at {when}; pod's time limit of "
        f"{_duration(limit)} would end at {_rfc3339(ends)}",
        resolvable=False,
    )


def filter_gpus(ctx: PodContext, node: NodeState) -> Verdict:
    """Enough free healthy GPUs, in one NVLink island when the pod fits in one; for a
    share, one healthy GPU with enough milli free."""
    demand = ctx.demand
    if not demand.uses_gpu:
        return FIT
    if not node.gpus:
        return Unfit(f"node has no GPUs ({GPU_RESOURCE} allocatable is 0)", resolvable=False)
    if demand.gpus > 0:
        return _whole_verdict(node, demand.gpus, ctx.config.islands_required)
    return _share_verdict(node, demand.gpu_milli)


def _whole_verdict(node: NodeState, k: int, islands_required: bool) -> Verdict:
    free, healthy = _islands(node)
    total_healthy = sum(healthy.values())
    if total_healthy < k:
        return Unfit(
            f"node has {_gpus(total_healthy, 'healthy ')}{_unhealthy_note(node)}, pod needs {k}",
            resolvable=False,
        )
    total_free = sum(map(len, free.values()))
    if total_free == 0:
        return Unfit(f"all {_gpus(total_healthy, 'healthy ')} are in use, pod needs {k}", True)
    if _one_island(k, healthy, islands_required):
        best = min(healthy, key=lambda island: (-len(free.get(island, ())), island))
        best_free = len(free.get(best, ()))
        if best_free >= k:
            return FIT
        reason = f"{_gpus(best_free, 'healthy ')} free in island {best}, pod needs {k}"
        if total_free >= k:
            reason += f" ({total_free} free on the node, but {k} must share one NVLink island)"
        return Unfit(reason, resolvable=True)
    if total_free >= k:
        return FIT
    return Unfit(f"{_gpus(total_free, 'healthy ')} free, pod needs {k}", resolvable=True)


def _share_verdict(node: NodeState, milli: int) -> Verdict:
    healthy = [gpu for gpu in node.gpus if gpu.healthy]
    if not healthy:
        return Unfit(f"all {_gpus(len(node.gpus))} of the node are unhealthy", resolvable=False)
    best = max(healthy, key=lambda gpu: (gpu.free_milli, -gpu.index))
    if best.free_milli >= milli:
        return FIT
    if best.free_milli == 0:
        return Unfit(
            f"all {_gpus(len(healthy), 'healthy ')} are in use, pod needs {milli} milli of one GPU",
            resolvable=True,
        )
    return Unfit(
        f"at most {best.free_milli} milli-GPU free on one healthy GPU (GPU {best.index}), "
        f"pod needs {milli} milli of one GPU",
        resolvable=True,
    )


def filter_gang_domain(ctx: PodContext, node: NodeState) -> Verdict:
    """``required:<level>``: once a member is placed or assumed, only its domain. Every
    reason it gives is unresolvable: evicting pods moves no gang member."""
    gang = ctx.gang
    if gang is None:
        return FIT
    if gang.unknown_level is not None:
        known = ", ".join(level.name for level in ctx.config.levels)
        return Unfit(
            f"gang {gang.spec.id} requires topology level {gang.unknown_level!r}, which is not "
            f"one of the extender's levels ({known})",
            resolvable=False,
        )
    level = gang.required
    if level is None:
        return FIT
    value = node.domains.get(level.node_label)
    if value is None:
        return Unfit(
            f"node has no {level.node_label} label; gang {gang.spec.id} must stay in one "
            f"{level.name}",
            resolvable=False,
        )
    allowed = gang.allowed_domains
    if allowed is None or value in allowed:
        return FIT
    return _outside(gang, level, allowed)


_OUTSIDE: Final = "outside"


def _outside(gang: GangView, level: TopologyLevel, allowed: frozenset[str]) -> Unfit:
    """The verdict on every node outside the gang's domain at ``level``: one text for
    all, so that kube-scheduler's event counts them as one reason (``4990 node(s) ...``)
    rather than listing each other domain by name."""
    verdict = gang.reasons.get(_OUTSIDE)
    if verdict is None:
        where = " or ".join(sorted(allowed))
        placed = gang.member_domains.get(level.node_label, {}).get(min(allowed), 0)
        verdict = gang.reasons[_OUTSIDE] = Unfit(
            f"gang {gang.spec.id} has {_members(placed)} in {level.name} {where}; "
            f"the node is in another {level.name}",
            resolvable=False,
        )
    return verdict


def filter_gang_room(ctx: PodContext, node: NodeState) -> Verdict:
    """``required:<level>``: the first member goes only to a domain with room for the
    gang's ``min`` members (counted as whole pods that fit, node by node)."""
    gang = ctx.gang
    if gang is None or gang.required is None or gang.rooms is None:
        return FIT
    level = gang.required
    value = node.domains.get(level.node_label)
    if value is None:
        return FIT  # filter_gang_domain reports the missing label
    free, total = domain_room(ctx, gang, value, node)
    return _room_verdict(gang, level, free, total)


def _room_verdict(gang: GangView, level: TopologyLevel, free: int, total: int) -> Verdict:
    """A first member's verdict on a node whose domain at ``level`` holds ``free``
    members now and ``total`` with every GPU free."""
    need = gang.spec.min_count
    if free >= need:
        return FIT
    # the domain unnamed, as in filter_gang_domain: one text per room size
    key = (free, total >= need)
    verdict = gang.reasons.get(key)
    if verdict is None:
        verdict = gang.reasons[key] = Unfit(
            f"the node's {level.name} has room for {_members(free)} of gang {gang.spec.id} "
            f"now, it needs {need} together",
            resolvable=key[1],
        )
    return verdict


def domain_room(ctx: PodContext, gang: GangView, value: str, node: NodeState) -> tuple[int, int]:
    """(free, total) room for members in domain ``value``, with ``node`` counted as it is
    given (it may differ from the snapshot's: victims evicted, or the request's copy)."""
    rooms = gang.rooms
    if rooms is None:
        return 0, 0
    free, total = rooms.free.get(value, 0), rooms.total.get(value, 0)
    before = rooms.node_fits(node.name)
    if before is None:
        return free, total
    now, _ = _fits(ctx, node, ctx.fits_key)
    return free - before + now, total


Filter: TypeAlias = Callable[[PodContext, NodeState], Verdict]

NODE_FILTERS: Final[tuple[Filter, ...]] = (filter_schedulable, filter_product, filter_maintenance)
"""Filters about the node as a whole, whatever its GPUs hold."""

FILTERS: Final[tuple[Filter, ...]] = (
    filter_gang_domain,
    *NODE_FILTERS,
    filter_gpus,
    filter_gang_room,
)
"""In the order their reasons win (the first unresolvable, else the first). A gang's
domain comes first: outside it nothing else about a node matters to the member, every
reason it gives is unresolvable, and so most nodes are answered by it alone once a
member is placed."""


def _first_unfit(ctx: PodContext, node: NodeState, filters: tuple[Filter, ...]) -> Unfit | None:
    for check in filters:
        verdict = check(ctx, node)
        if isinstance(verdict, Unfit):
            return verdict
    return None


def run_filters(ctx: PodContext, node: NodeState) -> Verdict:
    """Every filter; an unresolvable reason wins over a resolvable one, since it is the
    one that tells kube-scheduler not to try preemption there."""
    return run_filters_keyed(ctx, node, filter_key(ctx))


def _combine(verdicts: Iterable[Verdict]) -> Verdict:
    resolvable: Unfit | None = None
    for verdict in verdicts:
        if isinstance(verdict, Unfit):
            if not verdict.resolvable:
                return verdict
            resolvable = resolvable or verdict
    return resolvable or FIT


_MEMO_LIMIT: Final = 64
"""Entries a node keeps in its memo (pod shapes seen since it last changed) before it
starts over: bounds memory whatever the workload's variety."""

_Static: TypeAlias = tuple[Verdict, Verdict, Verdict, Verdict]
"""(the three combined, cordon, product, GPUs): the filters that read only the node and
the pod's shape."""


def filter_key(ctx: PodContext) -> str:
    """What the node-only filters (cordon, product, GPUs) read of the pod and the config:
    nodes memoize their verdicts under it. Computed once per request by callers that
    filter many nodes (``run_filters_keyed``)."""
    d = ctx.demand
    return sys.intern(f"f|{d.gpus}|{d.gpu_milli}|{d.products!r}|{ctx.config.islands_required}")


def _static_verdicts(ctx: PodContext, node: NodeState, key: str) -> _Static:
    """The node's own verdicts under ``key = filter_key(ctx)``: from its memo, else from
    a node in the same state (``by_state``), else computed; kept in its memo."""
    found: _Static | None = node.memo.get(key)
    if found is not None:
        return found
    shared = (key, gpu_state(node))
    found = cast("_Static | None", ctx.config.by_state.get(shared))
    if found is None:
        cordon, product = filter_schedulable(ctx, node), filter_product(ctx, node)
        gpus = filter_gpus(ctx, node)
        found = (_combine((cordon, product, gpus)), cordon, product, gpus)
        _share(ctx.config, shared, found)
    _remember(node, key, found)
    return found


def run_filters_keyed(ctx: PodContext, node: NodeState, key: str) -> Verdict:
    """``run_filters`` with ``key = filter_key(ctx)`` computed by the caller.

    The verdicts that depend only on the node and the pod's shape are kept in the node's
    memo (a node object never changes, so they cannot go stale); the maintenance and gang
    filters, which read the time and the gang, run every time, in ``FILTERS``' order.
    """
    if ctx.gang is None:
        found = _static_verdicts(ctx, node, key)
        if node.drain_after is None:
            return found[0]  # maintenance and both gang filters are FIT here
        return _draining(ctx, found, node.drain_after)
    domain = filter_gang_domain(ctx, node)
    if domain is not FIT:
        return domain  # first in FILTERS, and never resolvable
    found = _static_verdicts(ctx, node, key)
    combined, cordon, product, gpus = found
    maintenance = filter_maintenance(ctx, node)
    if combined is FIT and maintenance is FIT:
        return filter_gang_room(ctx, node)  # the only filter left that can refuse
    return _combine((cordon, product, maintenance, gpus, filter_gang_room(ctx, node)))


def _draining(ctx: PodContext, found: _Static, drain: datetime) -> Verdict:
    """A pod outside a gang on a node that drains at ``drain``, whose own verdicts are
    ``found``: the first unresolvable reason, else the first, without the loop."""
    maintenance = _drain_verdict(ctx, drain)
    combined, _, _, gpus = found
    if maintenance is FIT:
        return combined
    if isinstance(combined, Fit):
        return maintenance
    # both refuse: maintenance never resolves, and only cordon and product precede it
    return combined if not combined.resolvable and combined is not gpus else maintenance


@dataclass(frozen=True, slots=True)
class Draining:
    """What ``flat_answers`` keeps for a draining node, for pods outside a gang: the
    node's own verdicts, which hold as long as the node, and its drain time, which each
    request compares its pod's time limit with (``answer``)."""

    found: _Static
    drain: datetime

    def answer(self, ctx: PodContext) -> Verdict:
        return _draining(ctx, self.found, self.drain)


def kept_answer(ctx: PodContext, node: NodeState, key: str) -> Verdict | Draining:
    """What ``flat_answers`` under ``key = filter_key(ctx)`` keeps for ``node``: the
    verdict for a pod of the shape outside any gang, or for a draining node a
    ``Draining``."""
    found = _static_verdicts(ctx, node, key)
    if node.drain_after is None:
        return found[0]
    return Draining(found, node.drain_after)


@dataclass(frozen=True, slots=True)
class GangShortcut:
    """A gang member's verdict on a node by name, for most of a request's candidates,
    without reading the node: from each node's domain kept by name (``flat_answers``
    under ``domain_key``) and the answer a pod of the member's shape outside any gang
    gets there (``flat_answers`` under ``filter_key``).

    The domain filter comes first in ``FILTERS`` and never resolves: outside the gang's
    domain it decides alone. Elsewhere the member's verdict is the lone pod's (cordon,
    product and GPUs) combined with the gang's room filter, by the rule of
    ``run_filters``: that filter passes once a member is placed, and for a first member
    it reads the room of the node's domain. A draining node's verdict reads the time,
    so ``answer`` gives None for it, as for a node not seen yet: the caller judges it
    whole (``run_filters_keyed``) and tells ``learn``. With thousands of candidates,
    most of them outside the domain of a placed member, this is one or two look-ups
    per node where judging it reads the node, its domains and its memo.
    """

    ctx: PodContext
    key: str
    gang: GangView
    level: TopologyLevel
    domains: dict[NodeName, str | None]
    lone: dict[NodeName, Verdict | Draining]

    def answer(self, name: NodeName) -> Verdict | None:
        """The member's verdict on node ``name``, or None: judge the node whole."""
        value = self.domains.get(name)
        if value is None:  # not seen yet, or no label (which the domain filter reports)
            return None
        gang = self.gang
        allowed = gang.allowed_domains
        room: Verdict = FIT
        if allowed is not None:
            if value not in allowed:
                return _outside(gang, self.level, allowed)
        elif gang.rooms is not None:
            # the snapshot's own node is counted in ``rooms`` as it is: ``domain_room``'s
            # correction for a node given otherwise is nothing here
            free, total = gang.rooms.free.get(value, 0), gang.rooms.total.get(value, 0)
            room = _room_verdict(gang, self.level, free, total)
        lone = self.lone.get(name)
        if lone is None or isinstance(lone, Draining):
            return None
        return lone if room is FIT else _combine((lone, room))

    def learn(self, name: NodeName, node: NodeState) -> None:
        """Keep what ``answer`` reads of ``node``, judged whole under ``name``."""
        self.domains[name] = node.domains.get(self.level.node_label)
        self.lone[name] = kept_answer(self.ctx, node, self.key)


def domain_key(label: str) -> str:
    """The ``flat_answers`` key of each node's value of ``label``."""
    return sys.intern(f"d|{label}")


def gang_shortcut(snapshot: Snapshot, ctx: PodContext, key: str) -> GangShortcut | None:
    """The shortcut for a member of a gang with a known ``required`` level, ``key =
    filter_key(ctx)``; None for any other pod, or a snapshot that keeps nothing."""
    gang = ctx.gang
    if gang is None or gang.required is None:
        return None
    level = gang.required
    domains = flat_answers(snapshot, ctx.config, domain_key(level.node_label))
    lone = flat_answers(snapshot, ctx.config, key)
    if domains is None or lone is None:
        return None
    return GangShortcut(
        ctx,
        key,
        gang,
        level,
        cast("dict[NodeName, str | None]", domains),
        cast("dict[NodeName, Verdict | Draining]", lone),
    )


# ---------------------------------------------------------------- scorers


def fragmentation(
    node: NodeState,
    mix: tuple[MixEntry, ...],
    islands_required: bool,
    cpu_free: int | None = None,
    cpu_stranding: float = 0.0,
) -> float:
    """Free milli-GPUs of ``node`` that the expected pods could not use, averaged over the
    mix by weight: the FGD measure (Weng et al., ATC'23), with NVLink islands and CPU.

    For a share of ``m``: GPUs with less than ``m`` free are fragments. For ``k`` whole
    GPUs: partly used GPUs are fragments, and so are whole-free GPUs in islands with
    fewer than ``k`` free when ``k`` must fit in one island. A pod size the node cannot
    take at all (a product it does not accept, too few GPUs, or, when ``cpu_free`` is
    known, too little CPU) leaves every free milli a fragment; so does a pod without
    GPUs. When the CPU holds fewer pods of a size than its usable GPUs would, the GPUs
    it cannot serve (those with the least free) count ``cpu_stranding`` of their free
    milli as fragments. The pods the CPU holds are counted as a fraction (free CPU over
    the size's CPU): with 25 cores and pods of 10, two and a half GPUs are served.
    """
    frees = sorted(gpu.free_milli for gpu in node.gpus if gpu.healthy)
    total = sum(frees)
    if total == 0:
        return 0.0
    whole: dict[int, int] = {}
    healthy: dict[int, int] = {}
    for gpu in node.gpus:
        if gpu.healthy:
            healthy[gpu.island] = healthy.get(gpu.island, 0) + 1
            if gpu.free_milli >= MILLI_PER_GPU:
                whole[gpu.island] = whole.get(gpu.island, 0) + 1
    whole_total = sum(whole.values())
    largest_free = frees[-1]
    prefix = [0]
    for free in frees:
        prefix.append(prefix[-1] + free)
    usable_for: dict[int, int] = {}
    accepts: dict[tuple[str, ...], bool] = {}
    weighted = 0.0
    weights = 0.0
    for entry in mix:
        weights += entry.weight
        if not entry.uses_gpus or (cpu_free is not None and entry.cpu_milli > cpu_free):
            weighted += entry.weight * total
            continue
        if entry.products:
            ok = accepts.get(entry.products)
            if ok is None:
                ok = accepts[entry.products] = any(
                    product_matches(p, node.product) for p in entry.products
                )
            if not ok:
                weighted += entry.weight * total
                continue
        # pods of this size the CPU can still hold (only the GPU count limits without
        # CPU), as a fraction: pods of a size ask for CPU around its typical value, so
        # each core short strands part of a GPU, not a whole GPU at a floor's step
        by_cpu: float = (
            cpu_free / entry.cpu_milli
            if cpu_stranding and cpu_free is not None and entry.cpu_milli
            else len(frees)
        )
        if entry.gpus > 0:
            k = entry.gpus
            usable = usable_for.get(k)
            if usable is None:
                if _one_island(k, healthy, islands_required):
                    usable = sum(c for c in whole.values() if c >= k)
                else:
                    usable = whole_total if whole_total >= k else 0
                usable_for[k] = usable
            if not usable:
                frag: float = total
            else:
                served = min(usable, by_cpu * k)
                frag = total - usable * MILLI_PER_GPU
                frag += cpu_stranding * (usable - served) * MILLI_PER_GPU
        else:
            m = entry.gpu_milli
            if largest_free < m:
                frag = total
            else:
                first = bisect.bisect_left(frees, m)
                frag = prefix[first] + cpu_stranding * _least_free(
                    frees, prefix, first, len(frees) - first - by_cpu
                )
        weighted += entry.weight * frag
    return weighted / weights


def _least_free(frees: list[int], prefix: list[int], first: int, count: float) -> float:
    """The free milli of the ``count`` (a fraction, or none) GPUs with the least free
    from ``frees[first]`` on (``frees`` sorted, ``prefix`` its running sums)."""
    if count <= 0:
        return 0.0
    whole = int(count)
    held = float(prefix[first + whole] - prefix[first])
    if first + whole < len(frees):
        held += (count - whole) * frees[first + whole]
    return held


def score_packing(ctx: PodContext, node: NodeState) -> float:
    """10 for the placement that leaves the node least fragmented for the expected pod
    mix, 5 when it changes nothing, towards 0 as it strands more free GPU capacity."""
    return _packing(ctx, node, choose_gpus(node, ctx.demand, ctx.config))


def _packing(ctx: PodContext, node: NodeState, choice: tuple[int, ...] | None) -> float:
    if choice is None:
        return 0.0
    # CPU counts where the node reports some: what its pods leave of it
    cpu = node.cpu_free_milli if node.cpu_milli > 0 else None
    if not choice and (cpu is None or not ctx.demand.cpu_milli):
        return NEUTRAL_SCORE
    config = ctx.config
    mix, islands, stranding = config.pod_mix, config.islands_required, config.cpu_stranding
    after = node
    if choice:
        after = apply_allocation(node, Allocation(node.name, choice, ctx.demand.milli_per_gpu), 1)
    cpu_after = None if cpu is None else max(0, cpu - ctx.demand.cpu_milli)
    # the node's own fragmentation is the same for every pod shape scored on it
    before: float | None = node.memo.get(config.fragmentation_key)
    if before is None:
        before = fragmentation(node, mix, islands, cpu, stranding)
        _remember(node, config.fragmentation_key, before)
    delta = fragmentation(after, mix, islands, cpu_after, stranding) - before
    # a logistic curve: monotonic everywhere, so no two deltas collapse at a clamp
    exponent = max(-50.0, min(50.0, delta / _FRAG_SCALE_MILLI))
    return MAX_SCORE / (1.0 + math.exp(exponent))


def score_island_fit(ctx: PodContext, node: NodeState) -> float:
    """Best fit inside the node: 10 when the pod fills exactly what is free in the
    islands it uses (or the free part of its shared GPU); less the more it leaves."""
    return _island_fit(ctx, node, choose_gpus(node, ctx.demand, ctx.config))


def _island_fit(ctx: PodContext, node: NodeState, choice: tuple[int, ...] | None) -> float:
    if choice is None:
        return 0.0
    if not choice:
        return NEUTRAL_SCORE
    demand = ctx.demand
    by_index = {gpu.index: gpu for gpu in node.gpus}
    if demand.is_share:
        return MAX_SCORE * demand.gpu_milli / max(demand.gpu_milli, by_index[choice[0]].free_milli)
    free, healthy = _islands(node)
    used = {by_index[i].island for i in choice}
    left_open = sum(len(free.get(island, ())) for island in used)
    score = MAX_SCORE * demand.gpus / max(demand.gpus, left_open)
    if len(used) > 1 and _one_island(demand.gpus, healthy, True):
        # only when islands are a preference: it fits one island but spans several
        score /= len(used)
    return score


def score_gang_locality(ctx: PodContext, node: NodeState) -> float:
    """Members of a gang close together.

    With members placed: the share of them in this node's domain, at the
    ``preferred:<level>`` when there is one (three quarters of the score), and averaged
    over every level down to the node itself. For the first member: room for the gang's
    ``min`` members in this node's domain at its level (or on the node, without one).
    Not a gang: 0 everywhere, so it ranks no node above another.
    """
    gang = ctx.gang
    if gang is None:
        return 0.0
    if gang.members_located:
        affinity = _affinity(gang, node)
        if gang.preferred is not None:
            near = _share_in(gang, gang.preferred.node_label, node)
            return MAX_SCORE * (0.75 * near + 0.25 * affinity)
        return MAX_SCORE * affinity
    need = max(1, gang.spec.min_count)
    level = gang.level
    if level is not None and gang.rooms is not None:
        value = node.domains.get(level.node_label)
        if value is None:
            return 0.0
        free, _ = domain_room(ctx, gang, value, node)
        return MAX_SCORE * min(1.0, free / need)
    fits, _ = _fits(ctx, node, ctx.fits_key)
    return MAX_SCORE * min(1.0, fits / need)


def _share_in(gang: GangView, label: str, node: NodeState) -> float:
    value = node.name if label == "" else node.domains.get(label)
    if value is None or not gang.members_located:
        return 0.0
    return gang.member_domains.get(label, {}).get(value, 0) / gang.members_located


def _affinity(gang: GangView, node: NodeState) -> float:
    # the hostname level and the node itself are one level: count it once
    labels = [label for label in gang.member_domains if label != HOSTNAME]
    return sum(_share_in(gang, label, node) for label in labels) / len(labels)


Scorer: TypeAlias = Callable[[PodContext, NodeState], float]

SCORERS: Final[Mapping[str, Scorer]] = MappingProxyType(
    {
        "packing": score_packing,
        "island_fit": score_island_fit,
        "gang_locality": score_gang_locality,
    }
)
"""Each scorer by the name of its weight in ``ScoringWeights``."""


def score_node(ctx: PodContext, node: NodeState) -> float:
    """The weighted mean of the scorers that judge the pod (``applied_weight``), 0..10;
    0 where the pod has no GPUs to take.

    Meant for nodes that passed the filters; the GPUs are chosen once and every scorer
    judges that same choice, the one bind will make.
    """
    return score_node_keyed(ctx, node, score_key(ctx))


def score_key(ctx: PodContext) -> str:
    """What the node-only scorers (packing, island fit) read of the pod and the config:
    nodes memoize their part of the score under it."""
    d = ctx.demand
    return sys.intern(f"s|{d.gpus}|{d.gpu_milli}|{d.cpu_milli}|{ctx.config.scoring_key}")


def static_score(ctx: PodContext, node: NodeState, key: str) -> float | None:
    """Packing and island fit, weighted and summed (None: no GPUs can be chosen)."""
    memo = node.memo
    if key in memo:
        known: float | None = memo[key]
        return known
    shared = (key, _score_state(node))
    table = ctx.config.by_state
    if shared in table:
        total = cast("float | None", table[shared])
    else:
        choice = choose_gpus(node, ctx.demand, ctx.config)
        total = None
        if choice is not None:
            weights = ctx.config.weights
            total = 0.0
            if weights.packing:
                total += weights.packing * _packing(ctx, node, choice)
            if weights.island_fit:
                total += weights.island_fit * _island_fit(ctx, node, choice)
        _share(ctx.config, shared, total)
    _remember(node, key, total)
    return total


def score_node_keyed(ctx: PodContext, node: NodeState, key: str) -> float:
    """``score_node`` with ``key = score_key(ctx)`` computed by the caller; the node keeps
    its packing and island-fit part in its memo, gang locality is scored every time."""
    total = static_score(ctx, node, key)
    if total is None:
        return 0.0
    weights = ctx.config.weights
    if weights.gang_locality and ctx.gang is not None:
        total += weights.gang_locality * score_gang_locality(ctx, node)
    scale = applied_weight(ctx)
    return clamp_score(total / scale) if scale else 0.0


def applied_weight(ctx: PodContext) -> float:
    """The weights of the scorers that judge this pod: gang locality only judges gang
    members. A weighted mean over these alone keeps the full 0..10 for every pod (a
    scorer that answers 0 everywhere would squeeze the others into a part of it)."""
    weights = ctx.config.weights
    return weights.total if ctx.gang is not None else weights.packing + weights.island_fit


def clamp_score(score: float) -> float:
    """Within 0..10 whatever happened upstream (NaN counts as 0)."""
    if not score >= 0.0:
        return 0.0
    return min(MAX_SCORE, score)


# ---------------------------------------------------------------- words


def _gpus(count: int, kind: str = "") -> str:
    return f"{count} {kind}GPU{'' if count == 1 else 's'}"


def _members(count: int) -> str:
    return f"{count} member{'' if count == 1 else 's'}"


def _unhealthy_note(node: NodeState) -> str:
    bad = [str(gpu.index) for gpu in node.gpus if not gpu.healthy]
    if not bad:
        return ""
    return f" (GPU {','.join(bad)} unhealthy)"


# Kept: a maintenance reason is written on every request that names a draining node
# (once per drain time: it reads the time, so no memo outlives the request), and
# strftime was most of a plain pod's filter there.
@functools.lru_cache(maxsize=1024)
def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=256)
def _duration(seconds: int) -> str:
    """``4h``, ``1h30m``, ``90s``: as a person would write the time limit."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"
