"""``tessera nodes``: where GPUs are free, held, unhealthy or draining, counted the way the
extender counts them.

Layer: PURE. From a ``Snapshot`` (the extender's own cache, fed the same nodes and pods),
the Kueue ResourceFlavors and the topology levels, to frozen records: no I/O, no clock
(``now`` is a value), no settings. Must not count GPUs any other way than the cache and
``extender.capacity`` do (the extender's capacity metrics count with it too): a GPU is
*free* when it is healthy and no pod holds any of it (``GpuDevice.whole_free``),
*allocated* when some pod holds some of it, *unhealthy* when
``tessera.dev/unhealthy-gpus`` names it. An unhealthy GPU a pod still holds is both
allocated and unhealthy, so the three may add up to more than the total.

"Gang" columns answer: how many pods of ``gang_gpus`` whole GPUs could start now, with
``pod_fits`` (NVLink islands as the extender requires them). A cordoned node, and a node
with a ``tessera.dev/drain-after`` time, counts for none: a drain window admits only
pods whose time limit ends before it, and a gang pod's limit is not known here. The
largest gang per topology level is the best domain of that level; over the whole cluster
it is every node's count summed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from cluster.convert.grammar import format_rfc3339
from cluster.labels import HOSTNAME
from cluster.model import MILLI_PER_GPU, NodeName, NodeState, level_short_name
from cluster.snapshot import Snapshot
from extender.capacity import node_figures
from webhook.queues import Flavor, Policy

Level = tuple[str, str]
"""(level name, node label), widest first: ``("rack", "example.com/rack")``."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node's GPUs. ``domains`` holds (level name, value) for every level but the
    node's own (hostname), widest first; ``flavors`` the ResourceFlavors whose
    ``nodeLabels`` the node carries, most specific first."""

    name: str
    product: str
    flavors: tuple[str, ...]
    domains: tuple[tuple[str, str], ...]
    gpus_total: int
    gpus_allocated: int
    gpus_free: int
    gpus_unhealthy: int
    milli_used: int
    islands_total: int
    islands_free: int
    gang_pods: int
    drain_after: datetime | None
    cordoned: bool

    @property
    def draining(self) -> bool:
        return self.drain_after is not None

    @property
    def flavor(self) -> str:
        return ",".join(self.flavors)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "gpus_total": self.gpus_total,
            "gpus_allocated": self.gpus_allocated,
            "gpus_free": self.gpus_free,
            "gpus_unhealthy": self.gpus_unhealthy,
            "gpu_milli_used": self.milli_used,
            "product": self.product,
            "flavors": list(self.flavors),
            "domains": dict(self.domains),
            "islands_total": self.islands_total,
            "islands_free": self.islands_free,
            "gang_pods_now": self.gang_pods,
            "drain_after": _stamp(self.drain_after),
            "cordoned": self.cordoned,
        }


@dataclass(frozen=True, slots=True)
class GroupRow:
    """The nodes of one product, flavor and domain at each level above the node."""

    product: str
    flavor: str
    domains: tuple[tuple[str, str], ...]
    nodes: int
    gpus_total: int
    gpus_allocated: int
    gpus_free: int
    gpus_unhealthy: int
    islands_free: int
    largest_gang: int
    draining: int

    def to_json(self) -> dict[str, object]:
        return {
            "product": self.product,
            "flavor": self.flavor,
            "domains": dict(self.domains),
            "nodes": self.nodes,
            "gpus_total": self.gpus_total,
            "gpus_allocated": self.gpus_allocated,
            "gpus_free": self.gpus_free,
            "gpus_unhealthy": self.gpus_unhealthy,
            "islands_free": self.islands_free,
            "largest_gang": self.largest_gang,
            "nodes_draining": self.draining,
        }


@dataclass(frozen=True, slots=True)
class Drain:
    """A node with a maintenance window: when it starts and how far off that is."""

    node: str
    at: datetime
    in_s: float
    gpus_allocated: int


@dataclass(frozen=True, slots=True)
class NodesReport:
    levels: tuple[str, ...]
    gang_gpus: int
    nodes: tuple[NodeRow, ...]
    groups: tuple[GroupRow, ...]
    largest_gang: tuple[tuple[str, int], ...]
    """(level name or ``cluster``, the most ``gang_gpus`` pods one domain of it could start)."""
    drains: tuple[Drain, ...]

    def totals(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "gpus_total": sum(n.gpus_total for n in self.nodes),
            "gpus_allocated": sum(n.gpus_allocated for n in self.nodes),
            "gpus_free": sum(n.gpus_free for n in self.nodes),
            "gpus_unhealthy": sum(n.gpus_unhealthy for n in self.nodes),
            "islands_free": sum(n.islands_free for n in self.nodes),
            "nodes_draining": sum(n.draining for n in self.nodes),
        }

    def to_json(self) -> dict[str, object]:
        return {
            "nodes": [n.to_json() for n in self.nodes],
            "groups": [g.to_json() for g in self.groups],
            "totals": self.totals(),
            "gang_gpus": self.gang_gpus,
            "largest_gang": dict(self.largest_gang),
            "levels": list(self.levels),
            "draining": [
                {
                    "node": d.node,
                    "drain_after": _stamp(d.at),
                    "in_s": d.in_s,
                    "gpus_allocated": d.gpus_allocated,
                }
                for d in self.drains
            ],
        }


def _stamp(when: datetime | None) -> str | None:
    """A time as the annotation holds it (``2026-12-01T02:00:00Z``), for JSON."""
    return None if when is None else format_rfc3339(when)


def flavors_of(node: NodeState, flavors: Iterable[Flavor]) -> tuple[str, ...]:
    """The flavors whose every ``nodeLabel`` the node carries, the most labels first (then
    by name). A flavor without node labels fits any node and says nothing: left out."""
    matching = [
        f
        for f in flavors
        if f.node_labels and all(node.labels.get(k) == v for k, v in f.node_labels.items())
    ]
    matching.sort(key=lambda f: (-len(f.node_labels), f.name))
    return tuple(f.name for f in matching)


def node_row(
    node: NodeState,
    flavors: Iterable[Flavor],
    levels: Sequence[Level],
    *,
    gang_gpus: int,
    islands_required: bool,
) -> NodeRow:
    figures = node_figures(node, gang_gpus=gang_gpus, islands_required=islands_required)
    return NodeRow(
        name=node.name,
        product=node.product,
        flavors=flavors_of(node, flavors),
        domains=tuple((name, node.labels[label]) for name, label in levels if label in node.labels),
        gpus_total=figures.gpus_total,
        gpus_allocated=figures.gpus_allocated,
        gpus_free=figures.gpus_free,
        gpus_unhealthy=figures.gpus_unhealthy,
        milli_used=figures.milli_used,
        islands_total=figures.islands_total,
        islands_free=figures.islands_free,
        gang_pods=figures.gang_pods,
        drain_after=node.drain_after,
        cordoned=node.unschedulable,
    )


def nodes_report(
    snapshot: Snapshot,
    flavors: Mapping[str, Flavor],
    levels: Sequence[Level],
    now: datetime,
    *,
    gang_gpus: int = 8,
    islands_required: bool = True,
) -> NodesReport:
    """Every GPU node (nodes without GPUs are left out), the groups, gangs and drains.

    ``levels`` are the topology levels widest first; the hostname level, if listed, is the
    node itself and groups nothing.
    """
    if gang_gpus < 1:
        raise ValueError(f"a gang pod takes at least one GPU, not {gang_gpus}")
    above = tuple(level for level in levels if level[1] != HOSTNAME)
    rows = tuple(
        node_row(
            node,
            flavors.values(),
            above,
            gang_gpus=gang_gpus,
            islands_required=islands_required,
        )
        for node in sorted(snapshot.nodes.values(), key=lambda n: n.name)
        if node.gpus
    )
    return NodesReport(
        levels=tuple(name for name, _ in above),
        gang_gpus=gang_gpus,
        nodes=rows,
        groups=_groups(rows),
        largest_gang=_largest_gangs(rows, [name for name, _ in above]),
        drains=tuple(
            sorted(
                (
                    Drain(
                        r.name,
                        r.drain_after,
                        (r.drain_after - now).total_seconds(),
                        r.gpus_allocated,
                    )
                    for r in rows
                    if r.drain_after is not None
                ),
                key=lambda d: (d.at, d.node),
            )
        ),
    )


def _groups(rows: Sequence[NodeRow]) -> tuple[GroupRow, ...]:
    grouped: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[NodeRow]] = {}
    for row in rows:
        grouped.setdefault((row.product, row.flavor, row.domains), []).append(row)
    return tuple(
        GroupRow(
            product=product,
            flavor=flavor,
            domains=domains,
            nodes=len(members),
            gpus_total=sum(m.gpus_total for m in members),
            gpus_allocated=sum(m.gpus_allocated for m in members),
            gpus_free=sum(m.gpus_free for m in members),
            gpus_unhealthy=sum(m.gpus_unhealthy for m in members),
            islands_free=sum(m.islands_free for m in members),
            largest_gang=sum(m.gang_pods for m in members),
            draining=sum(m.draining for m in members),
        )
        for (product, flavor, domains), members in sorted(grouped.items())
    )


def _largest_gangs(rows: Sequence[NodeRow], levels: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """Per level, the domain whose nodes could start the most gang pods together; then
    the hostname level (the best single node) and the whole cluster."""
    found: list[tuple[str, int]] = []
    for level in levels:
        per_domain: dict[str, int] = {}
        for row in rows:
            value = dict(row.domains).get(level)
            if value is not None:
                per_domain[value] = per_domain.get(value, 0) + row.gang_pods
        found.append((level, max(per_domain.values(), default=0)))
    found.append(("hostname", max((r.gang_pods for r in rows), default=0)))
    found.append(("cluster", sum(r.gang_pods for r in rows)))
    return tuple(found)


# ---------------------------------------------------------------- one node, GPU by GPU


@dataclass(frozen=True, slots=True)
class GpuRow:
    index: int
    island: int
    healthy: bool
    pods: tuple[str, ...]
    milli_used: int

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "island": self.island,
            "healthy": self.healthy,
            "pods": list(self.pods),
            "milli_used": self.milli_used,
        }


def node_gpus(snapshot: Snapshot, name: str) -> tuple[GpuRow, ...] | None:
    """The node's GPUs with the pods that hold each (``namespace/name``); None: no such
    node. Held GPUs come from the snapshot's allocations: exactly what the extender sees."""
    node = snapshot.nodes.get(NodeName(name))
    if node is None:
        return None
    holders: dict[int, list[str]] = {}
    for key, allocation in snapshot.allocations.items():
        if allocation.node == node.name:
            for index in allocation.indices:
                holders.setdefault(index, []).append(key)
    return tuple(
        GpuRow(
            index=gpu.index,
            island=gpu.island,
            healthy=gpu.healthy,
            pods=tuple(sorted(holders.get(gpu.index, ()))),
            milli_used=MILLI_PER_GPU - gpu.free_milli,
        )
        for gpu in node.gpus
    )


# ---------------------------------------------------------------- topology levels


def policy_levels(policy: Policy) -> tuple[Level, ...]:
    """The levels of the Kueue Topology objects, widest first, each once (Topologies in
    name order), named by their short names; the hostname level when there is none."""
    seen: dict[str, None] = {}
    for name in sorted(policy.topologies):
        for label in policy.topologies[name].levels:
            seen.setdefault(label, None)
    if not seen:
        return (("hostname", HOSTNAME),)
    return tuple((level_short_name(label), label) for label in seen)
