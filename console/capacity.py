"""``tessera capacity``: does a team need more quota or more hardware?

Layer: PURE. From the queue policy (Kueue's ClusterQueues and ResourceFlavors), the live
Workloads, the pods of admitted ones and the extender's own view of the nodes (a
``Snapshot``) to a frozen report: no I/O, no clock (``now`` is a value). Must not place
a pod any other way than ``console.shortfall`` (the extender's GPU choice) does.

How the work waiting is judged, in the order Kueue would take it (pods of admitted
workloads first, oldest admission first; then pending workloads, oldest first; priority
is not read):

* the pods of an admitted workload that no node holds yet wait for *nodes* — or for
  *fragmentation* when the flavor has enough free GPUs, but not in the shape asked;
* a pending workload is tried on its ClusterQueue's GPU flavors in order. In the first
  where both its quota room and the free GPUs hold it, it waits only for its *turn*
  (Kueue admits it at its next pass, unless an admission check holds it); it takes that
  room and those GPUs from the work after it. Else, where the free GPUs would hold it
  but the quota would not, it waits for *quota* (more quota starts it: the GPUs are taken
  as if it had it); else it waits for *nodes* (or *fragmentation*) — with quota too
  short or not, nodes are what would start it.

*Quota room* of a queue in a flavor: its idle nominal (``nominalQuota`` less what its
admitted workloads reserved) plus what it may borrow: what the rest of its cohort has
idle and may lend (each one's ``lendingLimit`` if set), less what the cohort already
borrows, capped by its ``borrowingLimit``. Only whole GPUs (``nvidia.com/gpu``) are
judged: a workload's CPU or memory quota, GPU shares, Kueue's fair sharing, preemption
and hierarchical Cohort objects are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels
from cluster.convert.demand import read_demand
from cluster.convert.selection import node_selection
from cluster.model import NodeSelection, PodDemand, TopologyMode, level_short_name
from console.nodes import Level
from console.queues import Workload
from console.reading import field_map
from console.shortfall import Ask, Missing, Nodes
from webhook.queues import Flavor, Policy

GPU: Final = labels.GPU_RESOURCE
MILLI: Final = 1000

QUOTA: Final = "quota"
NODES: Final = "nodes"
FRAGMENTATION: Final = "fragmentation"
TURN: Final = "turn"


@dataclass(frozen=True, slots=True)
class FlavorRow:
    """A GPU flavor: its nodes' GPUs against the nominal quota all queues hold of it."""

    flavor: str
    product: str
    nodes: int
    gpus_total: int
    gpus_unhealthy: int
    gpus_free: int
    gpus_nominal: int
    cluster_queues: tuple[str, ...]

    @property
    def gpus_healthy(self) -> int:
        return self.gpus_total - self.gpus_unhealthy

    def to_json(self) -> dict[str, object]:
        return {
            "flavor": self.flavor,
            "product": self.product or None,
            "nodes": self.nodes,
            "gpus_total": self.gpus_total,
            "gpus_healthy": self.gpus_healthy,
            "gpus_free": self.gpus_free,
            "gpus_nominal": self.gpus_nominal,
            "quota_over_hardware": self.gpus_nominal - self.gpus_healthy,
            "cluster_queues": list(self.cluster_queues),
        }


@dataclass(frozen=True, slots=True)
class Waiting:
    """One workload waiting, and what holds it."""

    namespace: str
    name: str
    cluster_queue: str
    admitted: bool
    gpus: int
    """Whole GPUs it waits for (for an admitted one: of its pods no node holds)."""
    blocked_by: str
    """``quota``, ``nodes``, ``fragmentation`` or ``turn``."""
    flavor: str
    quota_short: int
    """GPUs of quota it lacks in ``flavor`` (0: its quota room holds it)."""
    missing: Missing | None

    def summary(self) -> str:
        if self.blocked_by == TURN:
            return f"quota and free GPUs of {self.flavor} hold it now: Kueue admits it next"
        if self.blocked_by == QUOTA:
            return f"{self.quota_short} GPUs short of quota in {self.flavor}; free GPUs hold it"
        assert self.missing is not None
        text = self.missing.text()
        if self.blocked_by == FRAGMENTATION:
            text = (
                f"{self.missing.gpus_free} GPUs free in {self.flavor} but not "
                f"{self.missing.ask.gpus} together where needed; {text}"
            )
        if self.quota_short:
            text += f" (and {self.quota_short} GPUs more quota)"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "cluster_queue": self.cluster_queue,
            "admitted": self.admitted,
            "gpus": self.gpus,
            "blocked_by": self.blocked_by,
            "flavor": self.flavor or None,
            "quota_short_gpus": self.quota_short,
            "needs": None if self.missing is None else self.missing.to_json(),
            "summary": self.summary(),
        }


@dataclass(frozen=True, slots=True)
class QueueFlavor:
    flavor: str
    nominal: int
    used: int
    borrowed: int
    room: int
    """Quota room now (idle nominal and what it may borrow), whole GPUs."""

    def to_json(self) -> dict[str, object]:
        return {
            "flavor": self.flavor,
            "gpus_nominal": self.nominal,
            "gpus_used": self.used,
            "gpus_borrowed": self.borrowed,
            "gpus_quota_room": self.room,
        }


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    cohort: str
    flavors: tuple[QueueFlavor, ...]
    waiting: tuple[Waiting, ...]

    def gpus_blocked(self, *kinds: str) -> int:
        return sum(w.gpus for w in self.waiting if w.blocked_by in kinds)

    @property
    def needs(self) -> str:
        """``quota``, ``nodes``, ``quota+nodes`` or ``-`` (nothing waits, or only its turn)."""
        wants = [
            kind
            for kind, found in (
                (QUOTA, self.gpus_blocked(QUOTA)),
                (NODES, self.gpus_blocked(NODES, FRAGMENTATION)),
            )
            if found
        ]
        return "+".join(wants) or "-"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cohort": self.cohort or None,
            "flavors": [f.to_json() for f in self.flavors],
            "workloads_waiting": len(self.waiting),
            "gpus_waiting": sum(w.gpus for w in self.waiting),
            "gpus_blocked_by_quota": self.gpus_blocked(QUOTA),
            "gpus_blocked_by_nodes": self.gpus_blocked(NODES),
            "gpus_blocked_by_fragmentation": self.gpus_blocked(FRAGMENTATION),
            "gpus_waiting_turn": self.gpus_blocked(TURN),
            "needs": self.needs,
        }


@dataclass(frozen=True, slots=True)
class CapacityReport:
    flavors: tuple[FlavorRow, ...]
    queues: tuple[QueueRow, ...]
    recommendations: tuple[str, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "flavors": [f.to_json() for f in self.flavors],
            "cluster_queues": [q.to_json() for q in self.queues],
            "waiting": [w.to_json() for q in self.queues for w in q.waiting],
            "recommendations": list(self.recommendations),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- pods of admitted work


def waiting_pods(
    workloads: Sequence[Workload], pods: Iterable[Mapping[str, Any]], levels: Sequence[Level]
) -> dict[tuple[str, str], tuple[Ask, ...]]:
    """(namespace, workload) → its pods no node holds yet, as asks alike pods share, for
    each admitted workload: its pods found by the job controller's labels (a Job's
    ``job-name``, a JobSet's ``jobset-name``) or by name (a plain Pod)."""
    owners = {
        (w.namespace, *w.owner): (w.namespace, w.name)
        for w in workloads
        if w.admitted and w.owner is not None
    }
    mine: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = field_map(pod, "metadata")
        namespace = str(meta.get("namespace") or "default")
        pod_labels = field_map(meta, "labels")
        key = (
            owners.get((namespace, "Job", str(pod_labels.get(labels.JOB_NAME))))
            or owners.get((namespace, "JobSet", str(pod_labels.get(labels.JOBSET_NAME))))
            or owners.get((namespace, "Pod", str(meta.get("name"))))
        )
        if key is not None:
            mine.setdefault(key, []).append(pod)
    found = {key: pod_asks(members, levels) for key, members in mine.items()}
    return {key: asks for key, asks in found.items() if asks}


def pod_asks(pods: Iterable[Mapping[str, Any]], levels: Sequence[Level]) -> tuple[Ask, ...]:
    """The pods among ``pods`` that wait for a node and ask whole GPUs, alike ones as
    one ask (same GPUs, same domain level, same node selection); a gang's ask is at least
    its required members, those the job controller has not made yet too."""
    shapes: dict[tuple[int, str | None, str, NodeSelection], int] = {}
    gangs: dict[tuple[int, str | None, str, NodeSelection], int] = {}
    for pod in pods:
        meta, spec = field_map(pod, "metadata"), field_map(pod, "spec")
        if spec.get("nodeName") or field_map(pod, "status").get("phase", "Pending") != "Pending":
            continue
        demand = read_demand(spec, field_map(meta, "annotations"), field_map(meta, "labels"))
        if demand.demand.gpus > 0:
            shape = (
                demand.demand.gpus,
                *_level(demand.demand, levels),
                node_selection(spec, []),
            )
            shapes[shape] = shapes.get(shape, 0) + 1
            if demand.demand.gang is not None:
                # a gang starts its required members together, made yet or not
                gangs[shape] = max(gangs.get(shape, 0), demand.demand.gang.min_count)
    return tuple(
        Ask(max(n, gangs.get(shape, 0)), shape[0], shape[1], shape[2], shape[3])
        for shape, n in shapes.items()
    )


def _level(demand: PodDemand, levels: Sequence[Level]) -> tuple[str | None, str]:
    """(node label, short name) of the domain the pod must share with its gang."""
    wanted = demand.topology
    if wanted is None or wanted.mode is not TopologyMode.REQUIRED:
        return None, ""
    for name, label in levels:
        if wanted.level in (name, label, level_short_name(label)):
            return label, level_short_name(label)
    return None, ""


def pending_asks(workload: Workload, levels: Sequence[Level]) -> tuple[Ask, ...]:
    """A pending workload's pod sets of whole GPUs as asks."""
    found = []
    for count, demand in workload.pod_sets:
        if demand.gpus > 0 and count > 0:
            label, name = _level(demand, levels)
            found.append(Ask(count, demand.gpus, label, name))
    return tuple(found)


# ---------------------------------------------------------------- quota


class QuotaUse:
    """Quota use while the report walks the waiting work: (queue, flavor) → milli-GPUs
    in use. Local to one ``capacity_report`` call."""

    def __init__(self, policy: Policy, workloads: Iterable[Workload]) -> None:
        self.policy = policy
        self.used: dict[tuple[str, str], int] = {}
        for w in workloads:
            if w.admitted:
                for (flavor, resource), amount in w.usage.items():
                    if resource == GPU:
                        key = (w.cluster_queue, flavor)
                        self.used[key] = self.used.get(key, 0) + amount
        self.cohorts: dict[str, list[str]] = {}
        for cq in policy.cluster_queues.values():
            if cq.cohort:
                self.cohorts.setdefault(cq.cohort, []).append(cq.name)

    def nominal_of(self, queue: str, flavor: str) -> tuple[int, int, int | None]:
        cq = self.policy.cluster_queue(queue)
        quota = cq.quotas.get((flavor, GPU)) if cq is not None else None
        if quota is None:
            return 0, 0, 0
        return quota.nominal, quota.lendable, quota.borrowing_limit

    def room(self, queue: str, flavor: str) -> int:
        """Milli-GPUs the queue could still reserve in the flavor."""
        nominal, _, borrowing_limit = self.nominal_of(queue, flavor)
        used = self.used.get((queue, flavor), 0)
        cq = self.policy.cluster_queue(queue)
        members = self.cohorts.get(cq.cohort or "", []) if cq is not None else []
        lendable = borrowed = 0
        for other in members:
            o_nominal, o_lendable, _ = self.nominal_of(other, flavor)
            o_used = self.used.get((other, flavor), 0)
            borrowed += max(0, o_used - o_nominal)
            if other != queue:
                lendable += max(0, min(o_lendable, o_nominal - o_used))
        may_borrow = max(0, lendable - borrowed)
        if borrowing_limit is not None:
            may_borrow = min(may_borrow, max(0, borrowing_limit - max(0, used - nominal)))
        return max(0, nominal - used) + may_borrow

    def take(self, queue: str, flavor: str, milli: int) -> None:
        self.used[(queue, flavor)] = self.used.get((queue, flavor), 0) + milli

    def row(self, queue: str, flavor: str) -> QueueFlavor:
        nominal, _, _ = self.nominal_of(queue, flavor)
        used = self.used.get((queue, flavor), 0)
        return QueueFlavor(
            flavor,
            nominal // MILLI,
            used // MILLI,
            max(0, used - nominal) // MILLI,
            self.room(queue, flavor) // MILLI,
        )


# ---------------------------------------------------------------- pools


def flavor_nodes(nodes: Nodes, flavor: Flavor | None) -> Nodes:
    """The GPU nodes carrying every node label of the flavor (all of them for a flavor
    without labels; none for a flavor the policy lacks)."""
    if flavor is None:
        return {}
    return {
        name: node
        for name, node in nodes.items()
        if node.gpus and all(node.labels.get(k) == v for k, v in flavor.node_labels.items())
    }
