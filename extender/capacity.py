"""GPUs counted for capacity planning: per node, then per product and flavor, and the
largest gang that could start now at each topology level.

Layer: PURE. Functions of ``NodeState`` records and plain values: no I/O, no clock, no
cache, no settings. The extender's metrics (``extender.metrics``) and the console
(``console.nodes``) count with these, so ``tessera nodes`` and ``/metrics`` agree.

What the words mean (the same as in the filters): a GPU is *free* when it is healthy
and no pod holds any of it (``whole_free``), *allocated* when some pod holds some of it,
*unhealthy* when ``tessera.dev/unhealthy-gpus`` names it; an unhealthy GPU a pod still
holds is both allocated and unhealthy. A node is *draining* when it has a
``tessera.dev/drain-after`` time. *Gang pods* are the pods of ``gang_gpus`` whole GPUs
the node could start now (``gpus.pod_fits``, NVLink islands as the filter requires
them); a cordoned or draining node starts none, since a drain window admits only pods
whose time limit ends before it and a gang's limit is not known here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster.model import MILLI_PER_GPU, NodeState, PodDemand
from extender.config import ExtenderConfig
from extender.gpus import fragmentation, pod_fits

GANG_GPUS = 8
"""The gang pod the largest-gang figures count: one whole HGX node's worth of GPUs."""


@dataclass(frozen=True, slots=True)
class NodeFigures:
    gpus_total: int
    gpus_allocated: int
    gpus_free: int
    gpus_unhealthy: int
    milli_used: int
    islands_total: int
    islands_free: int
    gang_pods: int
    draining: bool
    cordoned: bool


def node_figures(
    node: NodeState, *, gang_gpus: int = GANG_GPUS, islands_required: bool = True
) -> NodeFigures:
    islands = node.islands()
    blocked = node.unschedulable or node.drain_after is not None
    gang = 0 if blocked else pod_fits(node, PodDemand(gpus=gang_gpus), islands_required)
    return NodeFigures(
        gpus_total=node.gpu_count,
        gpus_allocated=sum(1 for g in node.gpus if g.free_milli < MILLI_PER_GPU),
        gpus_free=node.whole_free,
        gpus_unhealthy=sum(1 for g in node.gpus if not g.healthy),
        milli_used=sum(MILLI_PER_GPU - g.free_milli for g in node.gpus),
        islands_total=len(islands),
        islands_free=sum(1 for gpus in islands.values() if all(g.whole_free for g in gpus)),
        gang_pods=gang,
        draining=node.drain_after is not None,
        cordoned=node.unschedulable,
    )


def fragmented_gpus(node: NodeState, config: ExtenderConfig) -> float:
    """GPUs' worth of the node's free capacity that the pod mix in use could not use
    (FGD's expected fragmentation, ``gpus.fragmentation``, in GPUs)."""
    cpu = node.cpu_free_milli if node.cpu_milli > 0 else None
    milli = fragmentation(node, config.pod_mix, config.islands_required, cpu, config.cpu_stranding)
    return milli / MILLI_PER_GPU


def flavor_of(node: NodeState, flavors: Mapping[str, Mapping[str, str]]) -> str:
    """The Kueue ResourceFlavor whose ``nodeLabels`` the node carries, the one with the
    most labels (then by name) when several do; ``""`` when none does. A flavor without
    node labels fits any node and says nothing: never chosen."""
    best: tuple[int, str] | None = None
    for name, wanted in flavors.items():
        if wanted and all(node.labels.get(k) == v for k, v in wanted.items()):
            key = (-len(wanted), name)
            if best is None or key < best:
                best = key
    return "" if best is None else best[1]


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """The GPUs of the nodes of one product and flavor."""

    nodes: int = 0
    gpus_total: int = 0
    gpus_allocated: int = 0
    gpus_free: int = 0
    gpus_unhealthy: int = 0
    gpus_draining: int = 0
    """GPUs on nodes that have a drain time."""
    fragmented: float = 0.0

    def plus(self, figures: NodeFigures, fragmented: float) -> GroupFigures:
        return GroupFigures(
            nodes=self.nodes + 1,
            gpus_total=self.gpus_total + figures.gpus_total,
            gpus_allocated=self.gpus_allocated + figures.gpus_allocated,
            gpus_free=self.gpus_free + figures.gpus_free,
            gpus_unhealthy=self.gpus_unhealthy + figures.gpus_unhealthy,
            gpus_draining=self.gpus_draining + (figures.gpus_total if figures.draining else 0),
            fragmented=self.fragmented + fragmented,
        )


def largest_gangs(
    nodes: Iterable[tuple[str, Mapping[str, str], int]], levels: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """(product, level) → the most gang pods one domain of that level could start now,
    from (product, node labels, gang pods) per node; ``levels`` are (name, node label)
    widest first. ``hostname`` is the best single node and ``cluster`` all nodes of the
    product together, whatever the levels."""
    per_domain: dict[tuple[str, str], dict[str, int]] = {}
    best: dict[tuple[str, str], int] = {}
    for product, node_labels, pods in nodes:
        for name, label in levels:
            value = node_labels.get(label)
            if value is not None and name != "hostname":
                domains = per_domain.setdefault((product, name), {})
                domains[value] = domains.get(value, 0) + pods
        best[(product, "hostname")] = max(best.get((product, "hostname"), 0), pods)
        best[(product, "cluster")] = best.get((product, "cluster"), 0) + pods
    for key, domains in per_domain.items():
        best[key] = max(domains.values(), default=0)
    return best
