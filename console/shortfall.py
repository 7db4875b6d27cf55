"""Whether pods that must start together fit the free GPUs of a pool of nodes now, and
if not, how many more nodes it takes: "needs 2 more nodes of NVIDIA-H100-80GB-HBM3 in
one rack".

Layer: PURE. Functions of ``NodeState`` records and plain values: no I/O, no clock, no
settings. Must not place pods any other way than the extender does: a pod's GPUs are
chosen by ``extender.gpus.choose_gpus`` and counted by ``pod_fits`` (NVLink islands as
the filter requires them), and a cordoned or draining node starts nothing (as
``extender.capacity`` counts gang pods: a drain window admits only pods whose time
limit ends before it, which is not known here).

A *new node* is one like the pool's largest: as many pods of the shape as the pool's
best node would hold empty, of that node's GPU product. Nodes needed is what is
missing over what one new node holds, rounded up; for pods that must share a topology
domain, the domain that holds the most of them now is the one grown. An ask fits or
not as a whole (a gang starts all together or not at all): one that does not fit takes
nothing from the pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from cluster.model import GpuDevice, NodeName, NodeSelection, NodeState, PodDemand, pod_key
from extender.config import ExtenderConfig
from extender.context import Fit, PodContext
from extender.filters import filter_node_selection
from extender.gpus import choose_gpus, pod_fits
from extender.memo import DecisionCache

Nodes = Mapping[NodeName, NodeState]
_PLAIN = ExtenderConfig()


@dataclass(frozen=True, slots=True)
class Ask:
    """``count`` pods of ``gpus`` whole GPUs each that start together, all in one domain
    of the node label ``level`` when it is set (``level_name`` for messages: ``rack``)."""

    count: int
    gpus: int
    level: str | None = None
    level_name: str = ""
    selection: NodeSelection | None = None
    """Where the pods may go by node labels and taints (None: anywhere in the pool)."""

    @property
    def total(self) -> int:
        return self.count * self.gpus


@dataclass(frozen=True, slots=True)
class Missing:
    """What an ask lacks in a pool."""

    ask: Ask
    pods_fit: int
    """The most of its pods the pool (its best domain, for a ``level``) holds now."""
    per_node: int
    """Pods of the shape one new node holds (0: no node of the pool holds even one)."""
    product: str
    domain: str | None
    """The domain grown, for an ask with a level that some domain of the pool has."""
    gpus_free: int
    """Free GPUs in the whole pool (healthy, held by no pod, node open)."""

    @property
    def pods_missing(self) -> int:
        return self.ask.count - self.pods_fit

    @property
    def nodes(self) -> int | None:
        """More nodes like the pool's largest it takes; None: none would do."""
        if self.per_node <= 0:
            return None
        return math.ceil(self.pods_missing / self.per_node)

    @property
    def fragmented(self) -> bool:
        """Enough GPUs are free in the pool, but not in the shape (or domain) asked."""
        return self.gpus_free >= self.ask.total

    def text(self) -> str:
        """``needs 2 more nodes of NVIDIA-H100-80GB-HBM3 in one rack``."""
        nodes = self.nodes
        if nodes is None:
            return f"no node of the pool holds a pod of {self.ask.gpus} GPUs, even empty"
        where = f" in one {self.ask.level_name or self.ask.level}" if self.ask.level else ""
        plural = "node" if nodes == 1 else "nodes"
        return f"needs {nodes} more {plural} of {self.product or 'its GPU product'}{where}"

    def to_json(self) -> dict[str, object]:
        return {
            "pods": self.ask.count,
            "gpus_per_pod": self.ask.gpus,
            "level": self.ask.level_name or self.ask.level,
            "pods_fit_now": self.pods_fit,
            "nodes_needed": self.nodes,
            "product": self.product or None,
            "domain": self.domain,
            "gpus_free": self.gpus_free,
            "fragmented": self.fragmented,
            "summary": self.text(),
        }


@dataclass(frozen=True, slots=True)
class Placement:
    """The pool after the asks took their GPUs (``nodes``), or unchanged with what the
    first ask that did not fit lacks (``missing``)."""

    nodes: Nodes
    missing: Missing | None

    @property
    def fits(self) -> bool:
        return self.missing is None


def open_fits(node: NodeState, gpus: int, islands_required: bool) -> int:
    """Pods of ``gpus`` whole GPUs the node could start now: none on a cordoned or
    draining node."""
    if node.unschedulable or node.drain_after is not None or gpus <= 0:
        return 0
    return pod_fits(node, PodDemand(gpus=gpus), islands_required)


def place(nodes: Nodes, asks: Sequence[Ask], *, islands_required: bool = True) -> Placement:
    """Place the asks in turn on ``nodes``, each in the domain (or over the pool) that
    holds it with the least room to spare, each node filled in the same spirit (the
    nodes that hold the fewest first)."""
    config = ExtenderConfig(islands_required=islands_required)
    work = dict(nodes)
    for ask in asks:
        if ask.count <= 0 or ask.gpus <= 0:
            continue
        domains = _domains(work, ask, islands_required)
        holding = [d for d in domains if d[1] >= ask.count]
        if not holding:
            best = max(domains, key=lambda d: (d[1], d[0]), default=None)
            return Placement(nodes, _missing(nodes, ask, best, islands_required))
        _, _, members = min(holding, key=lambda d: (d[1], d[0]))
        left = ask.count
        for fit, name in sorted(members):
            taken = min(fit, left)
            work[name] = _take(work[name], ask.gpus, taken, config)
            left -= taken
            if not left:
                break
    return Placement(work, None)


def _domains(
    nodes: Nodes, ask: Ask, islands_required: bool
) -> list[tuple[str, int, list[tuple[int, NodeName]]]]:
    """(domain, pods it holds now, (pods, node) of its nodes that hold some); one domain
    ``""`` of the whole pool for an ask without a level."""
    found: dict[str, list[tuple[int, NodeName]]] = {}
    for name, node in nodes.items():
        value = "" if ask.level is None else node.labels.get(ask.level)
        if value is None or not allowed(node, ask):
            continue
        fit = open_fits(node, ask.gpus, islands_required)
        found.setdefault(value, [])
        if fit:
            found[value].append((fit, name))
    return [(value, sum(f for f, _ in members), members) for value, members in found.items()]


def allowed(node: NodeState, ask: Ask) -> bool:
    """The pods' node selector, required node affinity and tolerations let them onto the
    node, as the extender's own check of them judges it (it reads no time: any will do)."""
    if ask.selection is None:
        return True
    context = PodContext(
        pod_key("", ""),
        PodDemand(gpus=ask.gpus, selection=ask.selection),
        datetime.min.replace(tzinfo=UTC),
        _PLAIN,
        memo=DecisionCache(_PLAIN, keep=False),
    )
    return isinstance(filter_node_selection(context, node), Fit)


def _take(node: NodeState, gpus: int, pods: int, config: ExtenderConfig) -> NodeState:
    held: set[int] = set()
    for _ in range(pods):
        chosen = choose_gpus(node, PodDemand(gpus=gpus), config)
        if chosen is None:  # pragma: no cover - pod_fits counted this many
            break
        held.update(chosen)
        node = replace(node, gpus=tuple(_held(g) if g.index in held else g for g in node.gpus))
    return node


def _held(gpu: GpuDevice) -> GpuDevice:
    return replace(gpu, free_milli=0)


def _missing(
    nodes: Nodes,
    ask: Ask,
    best: tuple[str, int, list[tuple[int, NodeName]]] | None,
    islands_required: bool,
) -> Missing:
    demand = PodDemand(gpus=ask.gpus)
    per_node, product = max(
        (
            (pod_fits(n, demand, islands_required, empty=True), n.product)
            for n in nodes.values()
            if allowed(n, ask)
        ),
        default=(0, ""),
    )
    return Missing(
        ask=ask,
        pods_fit=best[1] if best is not None else 0,
        per_node=per_node,
        product=product,
        domain=best[0] if best is not None and ask.level is not None else None,
        gpus_free=sum(
            n.whole_free for n in nodes.values() if not n.unschedulable and n.drain_after is None
        ),
    )
