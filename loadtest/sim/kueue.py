"""The load test's Kueue: GPU quota per ClusterQueue and flavor, borrowing in the cohort,
FIFO admission per queue.

Layer: PURE. Reads the Kueue objects an admin applies (ClusterQueue, LocalQueue,
ResourceFlavor) into frozen records and decides admissions as plain functions over a
mutable ``QuotaBook`` the simulator owns; no I/O, no clock, no async. Must not talk to
the servers: it stands in for Kueue, which is not one of them.

What is modelled (enough to show queueing, waiting and borrowing, not all of Kueue):

* Only the GPU resources count (``nvidia.com/gpu``, ``tessera.dev/gpu-milli``); CPU and
  memory quotas are assumed to suffice.
* A workload is admitted to the first flavor of its ClusterQueue, in the queue's order,
  that it may use (the webhook's affinity allows it) and whose quota holds it: the
  ClusterQueue's own unused nominal quota first, then borrowing. Borrowing is capped by
  the queue's ``borrowingLimit`` (none: unlimited) and by what the rest of the cohort
  leaves unused of its nominal quota (each queue lending at most its ``lendingLimit``);
  a queue under its nominal quota waits while others borrow what it would need.
* Order: per ClusterQueue, the oldest pending workload first. ``StrictFIFO`` stops at a
  head that does not fit; ``BestEffortFIFO`` (the examples' choice) tries the next ones.
* No preemption, no priority ordering across queues (arrival order decides).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import labels

GPU_RESOURCES = (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE)


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    flavor: str
    resource: str
    nominal: int
    borrowing_limit: int | None
    """None: may borrow whatever the cohort lends."""
    lending_limit: int | None
    """None: lends all of its unused nominal quota."""


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    cohort: str | None
    strict_fifo: bool
    flavors: tuple[str, ...]
    """Flavor names in the queue's order (the order Kueue tries them)."""
    quotas: Mapping[tuple[str, str], FlavorQuota]
    """(flavor, resource) → quota."""


@dataclass(frozen=True, slots=True)
class Flavor:
    name: str
    node_labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class KueueSetup:
    cluster_queues: Mapping[str, ClusterQueue]
    local_queues: Mapping[tuple[str, str], str]
    """(namespace, LocalQueue) → ClusterQueue."""
    flavors: Mapping[str, Flavor]


def _int(value: Any) -> int:
    return int(str(value))


def setup_from_objects(objects: Iterable[Mapping[str, Any]]) -> KueueSetup:
    """The queues and flavors among ``objects`` (other kinds are ignored)."""
    cqs: dict[str, ClusterQueue] = {}
    lqs: dict[tuple[str, str], str] = {}
    flavors: dict[str, Flavor] = {}
    for obj in objects:
        kind, meta, spec = obj.get("kind"), obj.get("metadata") or {}, obj.get("spec") or {}
        if kind == "ResourceFlavor":
            flavors[meta["name"]] = Flavor(meta["name"], dict(spec.get("nodeLabels") or {}))
        elif kind == "LocalQueue":
            lqs[(meta.get("namespace", "default"), meta["name"])] = spec["clusterQueue"]
        elif kind == "ClusterQueue":
            order: list[str] = []
            quotas: dict[tuple[str, str], FlavorQuota] = {}
            for group in spec.get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    for res in flavor.get("resources") or []:
                        if res["name"] not in GPU_RESOURCES:
                            continue
                        if flavor["name"] not in order:
                            order.append(flavor["name"])
                        quotas[(flavor["name"], res["name"])] = FlavorQuota(
                            flavor["name"],
                            res["name"],
                            _int(res.get("nominalQuota", 0)),
                            _int(res["borrowingLimit"]) if "borrowingLimit" in res else None,
                            _int(res["lendingLimit"]) if "lendingLimit" in res else None,
                        )
            cqs[meta["name"]] = ClusterQueue(
                meta["name"],
                spec.get("cohortName") or spec.get("cohort"),
                spec.get("queueingStrategy") == "StrictFIFO",
                tuple(order),
                quotas,
            )
    return KueueSetup(cqs, lqs, flavors)


@dataclass(frozen=True, slots=True)
class Workload:
    """One job waiting for quota: what it needs of one GPU resource, in order of arrival."""

    key: str
    cluster_queue: str
    resource: str
    amount: int
    allowed_flavors: frozenset[str] | None
    """Flavors the webhook's affinity lets it use; None: any of the queue's."""
    seq: int


@dataclass(slots=True)
class QuotaBook:
    """Usage per (ClusterQueue, flavor, resource); the simulator's single writer."""

    setup: KueueSetup
    used: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def usage(self, cq: str, flavor: str, resource: str) -> int:
        return self.used.get((cq, flavor, resource), 0)

    def fits(self, cq_name: str, flavor: str, resource: str, amount: int) -> bool:
        cq = self.setup.cluster_queues[cq_name]
        quota = cq.quotas.get((flavor, resource))
        if quota is None:
            return False
        after = self.usage(cq_name, flavor, resource) + amount
        if quota.borrowing_limit is not None and after > quota.nominal + quota.borrowing_limit:
            return False
        if cq.cohort is None:
            return after <= quota.nominal
        # After the admission, everything borrowed in the cohort must still be covered by
        # what the lenders leave unused (each within its lending limit). This also holds
        # back a lender that wants its quota back while others borrow it: without
        # preemption it waits for the borrowers to finish, and the fleet is never
        # over-committed.
        borrowed = lendable = 0
        for other in self.setup.cluster_queues.values():
            q = other.quotas.get((flavor, resource))
            if other.cohort != cq.cohort or q is None:
                continue
            used = self.usage(other.name, flavor, resource)
            if other.name == cq_name:
                used += amount
            borrowed += max(0, used - q.nominal)
            cap = q.nominal if q.lending_limit is None else q.lending_limit
            lendable += min(max(0, q.nominal - used), cap)
        return borrowed <= lendable

    def take(self, cq: str, flavor: str, resource: str, amount: int) -> None:
        key = (cq, flavor, resource)
        self.used[key] = self.used.get(key, 0) + amount

    def release(self, cq: str, flavor: str, resource: str, amount: int) -> None:
        key = (cq, flavor, resource)
        left = self.used.get(key, 0) - amount
        if left < 0:
            raise ValueError(f"released more {resource} than {cq}/{flavor} used")
        self.used[key] = left


@dataclass(frozen=True, slots=True)
class Admission:
    workload: Workload
    flavor: str
    borrowed: bool


def choose_flavor(book: QuotaBook, workload: Workload) -> Admission | None:
    cq = book.setup.cluster_queues[workload.cluster_queue]
    for flavor in cq.flavors:
        if workload.allowed_flavors is not None and flavor not in workload.allowed_flavors:
            continue
        if book.fits(workload.cluster_queue, flavor, workload.resource, workload.amount):
            quota = cq.quotas[(flavor, workload.resource)]
            used = book.usage(workload.cluster_queue, flavor, workload.resource)
            return Admission(workload, flavor, used + workload.amount > quota.nominal)
    return None


def admit_pending(book: QuotaBook, pending: Sequence[Workload]) -> list[Admission]:
    """Admit what fits now, oldest first per ClusterQueue, taking quota in ``book``.

    Queues take turns one workload at a time, the way Kueue's scheduler cycles over the
    heads of its queues, so one busy queue cannot starve the others of borrowable quota.
    """
    by_queue: dict[str, list[Workload]] = {}
    for workload in sorted(pending, key=lambda w: w.seq):
        by_queue.setdefault(workload.cluster_queue, []).append(workload)
    admitted: list[Admission] = []
    blocked: set[str] = set()
    cursor = dict.fromkeys(by_queue, 0)
    progress = True
    while progress:
        progress = False
        for name, queue in by_queue.items():
            if name in blocked:
                continue
            strict = book.setup.cluster_queues[name].strict_fifo
            while cursor[name] < len(queue):
                workload = queue[cursor[name]]
                cursor[name] += 1
                admission = choose_flavor(book, workload)
                if admission is not None:
                    book.take(name, admission.flavor, workload.resource, workload.amount)
                    admitted.append(admission)
                    progress = True
                    break
                if strict:
                    blocked.add(name)
                    break
    return admitted
