"""The load test's kube-scheduler, minus the wire: in-tree fit and score combination.

Layer: PURE. What kube-scheduler decides before and after it calls the extender:
which nodes pass its in-tree filters (NodeResourcesFit on CPU, memory and the
``nvidia.com/gpu`` count; NodeAffinity with the node selector and required affinity;
TaintToleration for NoSchedule taints), the in-tree score (NodeResourcesFit's default
LeastAllocated, 0-100), and how extender scores join it: kube-scheduler multiplies an
extender's 0-10 score by ``MaxNodeScore / MaxExtenderPriority`` (100 / 10) and by the
extender's ``weight``, adds it to the plugins' sum, and takes the highest total
(``selectHost`` picks among ties at random; here the seeded caller's ``tie_break``).
It also stops looking once it has found enough feasible nodes (``feasible_nodes``: the
adaptive ``percentageOfNodesToScore``, from a start index that moves on every cycle),
so at scale the extender is asked about a few hundred nodes, not the whole fleet.
No I/O, no clock, no async. Must not call the extender (``cluster_sim`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import labels
from cluster.quantity import to_milli, to_units
from loadtest.sim.objects import PodNeeds, matches_terms

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5


@dataclass(slots=True)
class NodeRoom:
    """kube-scheduler's cache entry for one node: allocatable and what bound pods use."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]
    """(key, value, effect) of NoSchedule / NoExecute taints."""
    cpu_milli: int
    memory: int
    gpus: int
    used_cpu: int = 0
    used_memory: int = 0
    used_gpus: int = 0
    pods: set[str] = field(default_factory=set)

    def add(self, key: str, needs: PodNeeds) -> None:
        self.pods.add(key)
        self.used_cpu += needs.cpu_milli
        self.used_memory += needs.memory
        self.used_gpus += needs.gpus

    def remove(self, key: str, needs: PodNeeds) -> None:
        if key not in self.pods:
            return
        self.pods.discard(key)
        self.used_cpu -= needs.cpu_milli
        self.used_memory -= needs.memory
        self.used_gpus -= needs.gpus


def node_room(node: Mapping[str, Any]) -> NodeRoom:
    alloc = node.get("status", {}).get("allocatable", {})
    taints = tuple(
        (t.get("key", ""), t.get("value", ""), t.get("effect", ""))
        for t in node.get("spec", {}).get("taints") or ()
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    return NodeRoom(
        node["metadata"]["name"],
        dict(node["metadata"].get("labels") or {}),
        taints,
        to_milli(str(alloc.get("cpu", "0"))),
        to_units(str(alloc.get("memory", "0"))),
        int(str(alloc.get(labels.GPU_RESOURCE, "0"))),
    )


def _tolerated(taint: tuple[str, str, str], needs: PodNeeds) -> bool:
    key, value, _ = taint
    for t_key, operator, t_value in needs.tolerations:
        if operator == "Exists" and (not t_key or t_key == key):
            return True
        if t_key == key and t_value == value:
            return True
    return False


def fits(node: NodeRoom, needs: PodNeeds) -> bool:
    """Whether the in-tree filters pass ``node`` for a pod with ``needs``."""
    if any(node.labels.get(k) != v for k, v in needs.node_selector.items()):
        return False
    if not matches_terms(node.labels, needs.affinity_terms):
        return False
    if any(not _tolerated(taint, needs) for taint in node.taints):
        return False
    return (
        node.used_cpu + needs.cpu_milli <= node.cpu_milli
        and node.used_memory + needs.memory <= node.memory
        and node.used_gpus + needs.gpus <= node.gpus
    )


def least_allocated(node: NodeRoom, needs: PodNeeds) -> int:
    """NodeResourcesFit's default score: the mean free share of CPU and memory after the
    pod, 0-100 (kube-scheduler weighs cpu and memory equally by default)."""

    def free(used: int, asked: int, total: int) -> float:
        return 0.0 if total <= 0 else max(0.0, (total - used - asked) / total)

    cpu = free(node.used_cpu, needs.cpu_milli, node.cpu_milli)
    memory = free(node.used_memory, needs.memory, node.memory)
    return int(MAX_NODE_SCORE * (cpu + memory) / 2)


def combine_scores(
    names: Sequence[str],
    in_tree: Mapping[str, int],
    extender_scores: Mapping[str, int],
    weight: int,
) -> dict[str, int]:
    """kube-scheduler's total per node: in-tree score + extender score x (100/10) x weight.

    A node the extender did not score gets 0 from it (kube-scheduler starts every node
    at 0 and adds what each extender returns).
    """
    scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
    return {
        name: in_tree.get(name, 0) + extender_scores.get(name, 0) * scale * weight for name in names
    }


def select_host(totals: Mapping[str, int], tie_break: Callable[[int], int]) -> str | None:
    """The highest total; ``tie_break(n)`` picks one of ``n`` tied nodes (0-based)."""
    if not totals:
        return None
    best = max(totals.values())
    tied = [name for name, total in totals.items() if total == best]
    return tied[tie_break(len(tied))] if len(tied) > 1 else tied[0]


def nodes_to_find(all_nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (``numFeasibleNodesToFind``): every node below 100; else ``percentage`` of them
    (0, the default, is adaptive: 50 % less 1 % per 125 nodes, at least 5 %), at least
    100. 500 of 5,000 nodes, 500 of 10,000."""
    if all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return all_nodes
    if percentage == 0:
        percentage = max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND, 50 - all_nodes // 125)
    return max(MIN_FEASIBLE_NODES_TO_FIND, all_nodes * percentage // 100)


def feasible_nodes(
    rooms: Sequence[NodeRoom], needs: PodNeeds, start: int, limit: int
) -> tuple[list[str], int]:
    """The nodes that pass the in-tree filters, looked at from ``start`` round the list
    until ``limit`` are found; also how many were looked at (kube-scheduler moves its
    next start index on by that many)."""
    found: list[str] = []
    count = len(rooms)
    looked = 0
    while looked < count and len(found) < limit:
        room = rooms[(start + looked) % count]
        looked += 1
        if fits(room, needs):
            found.append(room.name)
    return found, looked
