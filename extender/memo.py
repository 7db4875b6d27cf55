"""The decision cache: what the extender's decisions keep from one request to the next.

Layer: STATE, in memory only (held to the PURE modules' contract: no I/O, no clock, no
asyncio, no settings). One ``DecisionCache`` per config generation, passed beside the
snapshot to every decision, as kube-scheduler passes its cache and ``CycleState`` to
its plugins. Must not decide anything: it stores and hands back what the filters and
scorers computed, under keys they give.

The invalidation rule, for every answer kept here:

    An answer is kept under a key that names everything it reads. Of the pod, the key
    is a frozen value naming the fields read (``ShapeKey``, ``FitShape``, ``ScoreShape``,
    ``RoomKey``, ``FactsKey``). Of the config, nothing: a cache belongs to one config
    (``config``) and a new config (a new pod mix) gets a new, empty cache. Of the node,
    one of three:

    * the node object (``per_node``): ``NodeState`` is frozen, so a changed node is a
      new object, and an entry answers only for the very object it was made for;
    * the node's state (``by_state``, or ``state_table`` for a whole request's look-ups
      at once, with ``gpu_state`` or a superset of it): every field the answer reads,
      named by a number (``state_id``), so a node that reaches a state seen before, on
      it or on another node, finds the answer;
    * the node's name, for a cache's snapshots (``by_name``): the names the cache's
      ``NodeChangeLog`` gives are dropped as the snapshots move on, so an entry always
      describes the node of that name in the snapshot asked about.

    An answer that reads the time or the request's gang is never kept here.

A filter that reads a new field of the node or the pod adds it to its key (and to
``gpu_state`` when its answers are kept by state, to ``filters.NodeFacts`` when they
are kept by name); nothing else keeps verdicts stale. Every table is bounded, whatever
the workload's variety of pod shapes and nodes. Besides answers, a cache keeps each pod
shape's keys (``ShapeTables``), under the demand's fields they name.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Final, TypeVar, cast

from cluster.model import NodeName, NodeSelection, NodeState, PodDemand
from cluster.snapshot import NodeChangeLog, Snapshot
from extender.config import ExtenderConfig

T = TypeVar("T")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""What a look-up gives for no entry (``None`` is an answer: no GPUs can be chosen)."""


# ---------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True)
class ShapeKey:
    """What the node-only filters (cordon, product, GPUs) read of the pod."""

    gpus: int
    gpu_milli: int
    products: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FitShape:
    """What ``pod_fits`` reads of the pod: how many pods of it a node holds."""

    gpus: int
    gpu_milli: int


@dataclass(frozen=True, slots=True)
class ScoreShape:
    """What the node-only scorers (packing, island fit) read of the pod."""

    gpus: int
    gpu_milli: int
    cpu_milli: int


@dataclass(frozen=True, slots=True)
class RoomKey:
    """A gang's room count per domain at a node label, for members of ``shape`` that may
    go where ``selection`` lets them (``filter_node_selection``)."""

    shape: ShapeKey
    label: str
    selection: NodeSelection | None = None


@dataclass(frozen=True, slots=True)
class FactsKey:
    """What ``filters.NodeFacts`` read of the pod: the node-only filters' part
    (``shape``) and the node label of the level its gang requires (``""``: none)."""

    shape: ShapeKey
    label: str


_GPU_STATE: Final = attrgetter("index", "island", "healthy", "free_milli")


# ---------------------------------------------------------------- tables


class NodeMemo:
    """The answers under one key, by node object (the first way of the rule)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[NodeName, tuple[NodeState, object]] = {}

    def get(self, node: NodeState) -> object:
        """The answer kept for this very ``node`` object, else ``MISSING``."""
        entry = self._entries.get(node.name)
        if entry is not None and entry[0] is node:
            return entry[1]
        return MISSING

    def put(self, node: NodeState, value: object) -> None:
        entries = self._entries
        if len(entries) >= _NODES_KEPT:
            entries.clear()
        entries[node.name] = (node, value)

    def __len__(self) -> int:
        return len(self._entries)


class _Forgetful(NodeMemo):
    """A ``NodeMemo`` that keeps nothing (``DecisionCache(keep=False)``)."""

    __slots__ = ()

    def put(self, node: NodeState, value: object) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ShapeTables:
    """The keys of what the filters and scorers read of a pod of one shape, and the
    tables kept under them by node object: made once per shape
    (``DecisionCache.shape_tables``), so that a request neither builds nor hashes a
    key to find them."""

    shape: ShapeKey
    fit_shape: FitShape
    score_shape: ScoreShape
    verdicts: NodeMemo
    fits: NodeMemo
    scores: NodeMemo


@dataclass(slots=True)
class _ByName:
    log: NodeChangeLog
    generation: int
    answers: dict[NodeName, object]


_NODES_KEPT: Final = 100_000
"""Nodes a ``NodeMemo`` keeps before it starts over: one entry per node name, so this
only bounds a cluster whose node names keep changing."""
_TABLES_KEPT: Final = 64
"""Per-key tables (by node, by name, room counts) a cache keeps of each kind, the
least recently used dropped first: each holds up to one entry per node, and a workload
with many pod shapes (a CPU request of every size) must not keep one for each."""
_BY_STATE_KEPT: Final = 100_000
"""Entries ``by_state`` holds before it starts over: a few per distinct node state and
pod shape, so tens of megabytes at most."""


class DecisionCache:
    """Everything decisions under ``config`` keep between requests (see the module's
    docstring for the rule every entry follows)."""

    __slots__ = (
        "_by_name",
        "_by_state",
        "_carried",
        "_next_id",
        "_per_node",
        "_shapes",
        "_state_ids",
        "_state_tables",
        "config",
        "fragmentation",
        "keep",
        "states",
    )

    def __init__(self, config: ExtenderConfig, *, keep: bool = True) -> None:
        """``keep=False``: a cache that keeps no answer, for a caller that never shows
        a node object twice and keeps its own answers (the placement study makes a
        fresh ``NodeState`` per decision): kept, they would never be read again, only
        walked by the garbage collector."""
        self.config: Final = config
        self.keep: Final = keep
        self.states = NodeMemo() if keep else _Forgetful()
        """Each node's ``gpu_state``."""
        self.fragmentation = NodeMemo() if keep else _Forgetful()
        """Each node's own fragmentation, the same for every pod scored on it."""
        self._per_node: dict[Hashable, NodeMemo] = {}
        self._by_state: dict[tuple[Hashable, Hashable], object] = {}
        self._by_name: dict[Hashable, _ByName] = {}
        self._carried: dict[Hashable, object] = {}
        self._shapes: dict[Hashable, ShapeTables] = {}
        self._state_ids: dict[Hashable, int] = {}
        self._next_id = 0
        self._state_tables: dict[Hashable, dict[Hashable, object]] = {}

    def per_node(self, key: Hashable) -> NodeMemo:
        """The answers under ``key`` by node object; a request fetches it once."""
        return _lru(self._per_node, key, NodeMemo if self.keep else _Forgetful)

    def shape_tables(self, demand: PodDemand) -> ShapeTables:
        """The keys of ``demand``'s shape and the tables under them (``per_node``), kept
        by the fields of the demand they name."""
        fields = (demand.gpus, demand.gpu_milli, demand.products, demand.cpu_milli)
        found = self._shapes.get(fields)
        if found is None:
            if len(self._shapes) >= _TABLES_KEPT:
                self._shapes.clear()  # a workload of many shapes: made again as needed
            gpus, milli, products, cpu = fields
            shape = ShapeKey(gpus, milli, products)
            fit_shape = FitShape(gpus, milli)
            score_shape = ScoreShape(gpus, milli, cpu)
            found = ShapeTables(
                shape,
                fit_shape,
                score_shape,
                self.per_node(shape),
                self.per_node(fit_shape),
                self.per_node(score_shape),
            )
            self._shapes[fields] = found
        return found

    def by_state(self, key: Hashable, state: Hashable) -> object:
        """The answer under ``key`` for a node in ``state``, else ``MISSING``."""
        return self._by_state.get((key, state), MISSING)

    def state_table(self, key: Hashable) -> dict[Hashable, object]:
        """The answers under ``key`` by node state, as one table (``by_state``'s, for a
        caller that looks up a whole request's states in one ``map``, where
        ``by_state`` builds a key per look-up). The caller adds what it computes."""
        if not self.keep:
            return {}
        table = _lru(self._state_tables, key, dict)
        if len(table) >= _BY_STATE_KEPT:
            table.clear()
        return table

    def keep_by_state(self, key: Hashable, state: Hashable, value: object) -> None:
        if not self.keep:
            return
        table = self._by_state
        if len(table) >= _BY_STATE_KEPT:
            table.clear()
        table[(key, state)] = value

    def by_name(self, snapshot: Snapshot, key: Hashable) -> dict[NodeName, object] | None:
        """The answers under ``key`` by node name, valid for ``snapshot``: one look-up
        per candidate, where reading the node takes three, which is most of a request's
        time with thousands of candidates. The caller adds what it computes; only what
        reads the node and the pod's shape, never the time or a gang.

        ``None`` when nothing can be kept: a snapshot from outside the cache (nodes
        given in a request), or one older than the answers kept, or a cache that keeps
        nothing.
        """
        log = snapshot.node_log
        if log is None or not self.keep:
            return None
        kept = self._by_name.get(key)
        if kept is None or kept.log is not log:
            kept = _ByName(log, snapshot.generation, {})
            _keep(self._by_name, key, kept)
        else:
            _keep(self._by_name, key, kept)  # the most recently used goes last
            if kept.generation != snapshot.generation:
                if kept.generation > snapshot.generation:
                    return None
                changed = log.since(kept.generation, snapshot.generation)
                if changed is None:
                    kept.answers.clear()
                else:
                    pop = kept.answers.pop
                    for name in changed:
                        pop(name, None)
                kept.generation = snapshot.generation
        return kept.answers

    def by_state_of(
        self,
        snapshot: Snapshot,
        names: Sequence[NodeName],
        states: tuple[str, Callable[[DecisionCache, NodeState], int]],
        *,
        key: Hashable,
        answer: Callable[[NodeState], T],
        steady: Callable[[NodeState], bool] | None = None,
    ) -> list[T | None] | None:
        """``answer`` for each named node, kept by node state: each name's state
        (``states``: its ``by_name`` key and how to work it out) is kept by name for
        every pod shape, and the answers under ``key`` by state (``state_table``), so a
        request is two look-ups per name, each done for all the names in one pass
        (``map``) rather than a Python step each. Only a node changed since, or a state
        new to ``key``, is worked out; a node that is not ``steady`` is answered afresh.
        None for a node the snapshot lacks (an answer is never None); ``None`` for all
        when nothing can be kept by name (a snapshot from outside the cache)."""
        kind, state_of = states
        by_name = self.by_name(snapshot, kind)
        if by_name is None:
            return None
        table = cast("dict[Hashable, T]", self.state_table(key))
        ids = list(map(by_name.get, names))
        found: list[T | None] = list(map(table.get, ids))
        if None not in found:
            return found
        nodes = snapshot.nodes
        for i, kept in enumerate(found):
            if kept is not None:
                continue
            name = names[i]
            node = nodes.get(name)
            if node is None:
                continue
            if steady is not None and not steady(node):
                found[i] = answer(node)
                continue
            state = ids[i]
            if state is None:
                state = by_name[name] = state_of(self, node)
            value = table.get(state)
            if value is None:
                value = table[state] = answer(node)
            found[i] = value
        return found

    def state_id(self, state: Hashable) -> int:
        """The number that names ``state`` in this cache's keys: equal states get one
        number, and a number never names another state. A number rather than the state
        itself because a key is hashed at every look-up and a tuple's hash is not kept:
        a node's state is some forty values, its number one."""
        ids = self._state_ids
        found = ids.get(state)
        if found is None:
            if len(ids) >= _BY_STATE_KEPT:
                # numbers go on from where they were, so no kept answer is misread
                self._next_id += len(ids)
                ids.clear()
            found = ids[state] = self._next_id + len(ids)
        return found

    def carried(self, key: Hashable) -> object | None:
        """What a reader carries under ``key`` from one snapshot to the next (a gang's
        room count), which it brings up to date itself by the node change log."""
        found = self._carried.get(key)
        if found is not None:
            _keep(self._carried, key, found)
        return found

    def carry(self, key: Hashable, value: object) -> None:
        if self.keep:
            _keep(self._carried, key, value)

    def sizes(self) -> Mapping[str, int]:
        """Entries of each kind of table, for tests and a curious operator."""
        return {
            "per_node": len(self._per_node),
            "by_state": len(self._by_state) + sum(map(len, self._state_tables.values())),
            "by_name": len(self._by_name),
            "carried": len(self._carried),
            "shapes": len(self._shapes),
        }


def gpu_state(memo: DecisionCache, node: NodeState) -> int:
    """Everything the node-only filters and ``pod_fits`` read of a node: its GPU product,
    cordon, pod limit, and each GPU's index, island, health and free milli. Nodes in one
    state get the same verdicts: the state ``by_state`` keeps them under, named by a
    number (``DecisionCache.state_id``)."""
    states = memo.states
    state = states.get(node)
    if state is MISSING:
        gpus = tuple(map(_GPU_STATE, node.gpus))
        state = memo.state_id((node.product, node.unschedulable, node.max_pods, gpus))
        states.put(node, state)
    return state  # type: ignore[return-value]


def score_state(memo: DecisionCache, node: NodeState) -> int:
    """``gpu_state`` and the CPU, which packing reads as well (named by a number too)."""
    return memo.state_id((gpu_state(memo, node), node.cpu_milli > 0, node.cpu_free_milli))


def _lru(tables: dict[Hashable, T], key: Hashable, make: type[T]) -> T:
    found = tables.get(key)
    if found is None:
        found = make()
    _keep(tables, key, found)
    return found


def _keep(tables: dict[Hashable, T], key: Hashable, value: T) -> None:
    """``value`` under ``key``, as the most recently used; the least recently used goes
    when there are more than ``_TABLES_KEPT``."""
    tables.pop(key, None)
    if len(tables) >= _TABLES_KEPT:
        del tables[next(iter(tables))]
    tables[key] = value
