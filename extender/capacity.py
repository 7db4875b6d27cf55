"""GPUs counted for capacity planning, node by node: what ``/metrics`` sums per product,
flavor and topology domain.

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

from collections.abc import Mapping
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
