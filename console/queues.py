"""``tessera queues``: what each ClusterQueue and LocalQueue holds and how long it waits.

Layer: PURE. From Kueue's objects (the queue ``Policy`` the webhook reads, and the
``Workload`` objects, ``kueue.x-k8s.io/v1beta2``) to frozen records: no I/O, no clock
(``now`` is a value). Must never raise on a malformed Workload: it is skipped and the
reason kept in ``problems``.

What the numbers mean:

* A workload is *admitted* while its ``QuotaReserved`` (or ``Admitted``) condition is
  ``True`` — it holds quota — and *pending* otherwise; one with ``Finished`` ``True`` is
  left out. Its queue is ``spec.queueName`` in its namespace.
* *GPUs asked*: whole GPUs (``nvidia.com/gpu``) over all its pods, each pod read by
  ``cluster.convert.demand.read_demand`` like the extender reads a pod; GPU shares are counted
  apart as ``gpu_milli``.
* *Wait*: for a pending workload, from its creation until ``now``; for an admitted one,
  from creation until its quota was reserved (the condition's ``lastTransitionTime``).
  ``oldest`` is the longest wait of a pending workload; ``p90`` the 90th percentile
  (nearest rank) over all the queue's workloads.
* *Nominal* is the ClusterQueue's ``nominalQuota`` of ``nvidia.com/gpu`` summed over its
  flavors. *Used* is what its admitted workloads reserved (``status.admission``'s
  ``resourceUsage`` per flavor); *borrowed*, per flavor, what is used above nominal.
  *Lent*: Kueue does not say which queue lent what, so what the cohort borrows of a
  flavor is shared among the other queues of the cohort in proportion to what each has
  idle and may lend (its ``lendingLimit``, else its nominal, less what it uses).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cluster import labels
from cluster.convert.demand import read_demand
from cluster.model import PodDemand
from cluster.quantity import QuantityError, to_milli
from console.reading import field_list, field_map, timestamp
from webhook.queues import Policy

GPU = labels.GPU_RESOURCE
_ADMITTED = ("QuotaReserved", "Admitted")


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    queue: str
    cluster_queue: str
    """From ``status.admission`` when admitted; else what its LocalQueue points at."""
    admitted: bool
    created: datetime | None
    admitted_at: datetime | None
    gpus: int
    gpu_milli: int
    usage: Mapping[tuple[str, str], int]
    """(flavor, resource) → milli-units reserved, for an admitted workload."""
    pod_sets: tuple[tuple[int, PodDemand], ...] = ()
    """(pods, what each asks) per pod set, in the Workload's order."""
    owner: tuple[str, str] | None = None
    """(kind, name) of the object Kueue made it for (its controller ownerReference)."""

    def wait_s(self, now: datetime) -> float | None:
        if self.created is None:
            return None
        end = self.admitted_at if self.admitted else now
        if end is None:
            return None
        return max(0.0, (end - self.created).total_seconds())


def workload_from_json(obj: Mapping[str, Any], policy: Policy) -> Workload | None:
    """A Workload object, or None for one that is finished. ``ValueError`` for one that
    cannot be read at all (no name or no queue)."""
    meta = field_map(obj, "metadata")
    spec = field_map(obj, "spec")
    status = field_map(obj, "status")
    name = meta.get("name")
    namespace = meta.get("namespace") or "default"
    queue = spec.get("queueName")
    if not isinstance(name, str) or not name:
        raise ValueError("a Workload without metadata.name")
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"Workload {namespace}/{name} has no spec.queueName")
    conditions = {
        c.get("type"): c for c in field_list(status, "conditions") if isinstance(c, Mapping)
    }
    if conditions.get("Finished", {}).get("status") == "True":
        return None
    reserved = [conditions[t] for t in _ADMITTED if conditions.get(t, {}).get("status") == "True"]
    admission = field_map(status, "admission")
    gpus = milli = 0
    pod_sets: list[tuple[int, PodDemand]] = []
    for pod_set in field_list(spec, "podSets"):
        count = pod_set.get("count", 1) if isinstance(pod_set, Mapping) else 0
        count = count if isinstance(count, int) and count > 0 else 0
        template = field_map(pod_set, "template")
        demand = read_demand(
            field_map(template, "spec"),
            field_map(field_map(template, "metadata"), "annotations"),
            field_map(field_map(template, "metadata"), "labels"),
        ).demand
        gpus += count * demand.gpus
        milli += count * demand.gpu_milli
        pod_sets.append((count, demand))
    usage: dict[tuple[str, str], int] = {}
    if reserved:
        for assignment in field_list(admission, "podSetAssignments"):
            flavors = field_map(assignment, "flavors")
            for resource, quantity in field_map(assignment, "resourceUsage").items():
                flavor = flavors.get(resource)
                if not isinstance(flavor, str):
                    continue
                try:
                    amount = to_milli(quantity)
                except QuantityError:
                    continue
                usage[(flavor, resource)] = usage.get((flavor, resource), 0) + amount
    local = policy.local_queue(namespace, queue)
    cluster_queue = admission.get("clusterQueue") if reserved else None
    if not isinstance(cluster_queue, str) or not cluster_queue:
        cluster_queue = local.cluster_queue if local is not None else ""
    return Workload(
        namespace=namespace,
        name=name,
        queue=queue,
        cluster_queue=cluster_queue,
        admitted=bool(reserved),
        created=timestamp(meta.get("creationTimestamp")),
        admitted_at=timestamp(reserved[0].get("lastTransitionTime")) if reserved else None,
        gpus=gpus,
        gpu_milli=milli,
        usage=usage,
        pod_sets=tuple(pod_sets),
        owner=_controller(meta),
    )


def _controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in field_list(meta, "ownerReferences"):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return None


def read_workloads(
    objs: Iterable[Mapping[str, Any]], policy: Policy
) -> tuple[tuple[Workload, ...], tuple[str, ...]]:
    """The live workloads among ``objs`` (kind ``Workload``), and why any were skipped."""
    found: list[Workload] = []
    problems: list[str] = []
    for obj in objs:
        if obj.get("kind") != "Workload":
            continue
        try:
            workload = workload_from_json(obj, policy)
        except ValueError as exc:
            problems.append(f"{exc}; skipped")
            continue
        if workload is not None:
            found.append(workload)
    return tuple(found), tuple(problems)


# ---------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class Waits:
    pending: int
    admitted: int
    gpus_pending: int
    gpus_admitted: int
    gpu_milli_pending: int
    gpu_milli_admitted: int
    oldest_pending_s: float | None
    p90_wait_s: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "pending": self.pending,
            "admitted": self.admitted,
            "gpus_pending": self.gpus_pending,
            "gpus_admitted": self.gpus_admitted,
            "gpu_milli_pending": self.gpu_milli_pending,
            "gpu_milli_admitted": self.gpu_milli_admitted,
            "oldest_pending_wait_s": self.oldest_pending_s,
            "p90_wait_s": self.p90_wait_s,
        }


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile (``share`` in 0..1) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def waits(workloads: Sequence[Workload], now: datetime) -> Waits:
    pending = [w for w in workloads if not w.admitted]
    admitted = [w for w in workloads if w.admitted]
    pending_waits = [s for w in pending if (s := w.wait_s(now)) is not None]
    all_waits = [s for w in workloads if (s := w.wait_s(now)) is not None]
    return Waits(
        pending=len(pending),
        admitted=len(admitted),
        gpus_pending=sum(w.gpus for w in pending),
        gpus_admitted=sum(w.gpus for w in admitted),
        gpu_milli_pending=sum(w.gpu_milli for w in pending),
        gpu_milli_admitted=sum(w.gpu_milli for w in admitted),
        oldest_pending_s=max(pending_waits, default=None),
        p90_wait_s=percentile(all_waits, 0.9),
    )


@dataclass(frozen=True, slots=True)
class ClusterQueueRow:
    name: str
    cohort: str
    waits: Waits
    nominal: int
    used: int
    borrowed: int
    lent: int
    """Whole GPUs (``nvidia.com/gpu``), summed over the queue's flavors."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cohort": self.cohort or None,
            **self.waits.to_json(),
            "gpus_nominal": self.nominal,
            "gpus_used": self.used,
            "gpus_borrowed": self.borrowed,
            "gpus_lent": self.lent,
        }


@dataclass(frozen=True, slots=True)
class LocalQueueRow:
    namespace: str
    name: str
    cluster_queue: str
    waits: Waits

    def to_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "cluster_queue": self.cluster_queue,
            **self.waits.to_json(),
        }


@dataclass(frozen=True, slots=True)
class QueuesReport:
    cluster_queues: tuple[ClusterQueueRow, ...]
    local_queues: tuple[LocalQueueRow, ...]
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_queues": [q.to_json() for q in self.cluster_queues],
            "local_queues": [q.to_json() for q in self.local_queues],
            "problems": list(self.problems),
        }


def queues_report(
    policy: Policy, workloads: Sequence[Workload], now: datetime, problems: Sequence[str] = ()
) -> QueuesReport:
    """Every ClusterQueue and LocalQueue of the policy, and any queue a workload names
    that the policy lacks (so that nothing waiting is hidden)."""
    by_cq: dict[str, list[Workload]] = {name: [] for name in policy.cluster_queues}
    by_lq: dict[tuple[str, str], list[Workload]] = {key: [] for key in policy.local_queues}
    for w in workloads:
        by_cq.setdefault(w.cluster_queue, []).append(w)
        by_lq.setdefault((w.namespace, w.queue), []).append(w)
    used = _used(workloads)
    lent = _lent(policy, used)
    cq_rows = []
    for name in sorted(by_cq):
        cq = policy.cluster_queue(name)
        nominal = 0
        borrowed = 0
        used_here = 0
        if cq is not None:
            for flavor in cq.flavors:
                quota = cq.quotas.get((flavor, GPU))
                amount = used.get((name, flavor), 0)
                used_here += amount
                nominal_milli = quota.nominal if quota is not None else 0
                nominal += nominal_milli
                borrowed += max(0, amount - nominal_milli)
        else:
            used_here = sum(v for (q, _), v in used.items() if q == name)
        cq_rows.append(
            ClusterQueueRow(
                name=name or "(unknown)",
                cohort=(cq.cohort or "") if cq is not None else "",
                waits=waits(by_cq[name], now),
                nominal=nominal // 1000,
                used=used_here // 1000,
                borrowed=borrowed // 1000,
                lent=sum(v for (q, _), v in lent.items() if q == name) // 1000,
            )
        )
    lq_rows = []
    for namespace, lq_name in sorted(by_lq):
        local = policy.local_queue(namespace, lq_name)
        lq_rows.append(
            LocalQueueRow(
                namespace=namespace,
                name=lq_name,
                cluster_queue=local.cluster_queue if local is not None else "",
                waits=waits(by_lq[(namespace, lq_name)], now),
            )
        )
    all_problems = (*policy.problems, *problems)
    return QueuesReport(tuple(cq_rows), tuple(lq_rows), tuple(all_problems))


def _used(workloads: Iterable[Workload]) -> dict[tuple[str, str], int]:
    """(ClusterQueue, flavor) → milli-GPUs its admitted workloads reserved."""
    used: dict[tuple[str, str], int] = {}
    for w in workloads:
        if not w.admitted:
            continue
        for (flavor, resource), amount in w.usage.items():
            if resource == GPU:
                used[(w.cluster_queue, flavor)] = used.get((w.cluster_queue, flavor), 0) + amount
    return used


def _lent(policy: Policy, used: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """(ClusterQueue, flavor) → milli-GPUs its cohort borrows of its idle quota, shared
    in proportion to what each lender has idle (see the module's docstring)."""
    cohorts: dict[str, list[str]] = {}
    for cq in policy.cluster_queues.values():
        if cq.cohort:
            cohorts.setdefault(cq.cohort, []).append(cq.name)
    lent: dict[tuple[str, str], int] = {}
    for members in cohorts.values():
        flavors = {
            flavor
            for name in members
            for (flavor, res) in policy.cluster_queues[name].quotas
            if res == GPU
        }
        for flavor in sorted(flavors):
            idle: dict[str, int] = {}
            borrowed = 0
            for name in members:
                quota = policy.cluster_queues[name].quotas.get((flavor, GPU))
                amount = used.get((name, flavor), 0)
                nominal = quota.nominal if quota is not None else 0
                borrowed += max(0, amount - nominal)
                if quota is not None:
                    idle[name] = max(0, min(quota.lendable, nominal - amount))
            available = sum(idle.values())
            if not borrowed or not available:
                continue
            for name, spare in idle.items():
                lent[(name, flavor)] = min(spare, borrowed * spare // available)
    return lent
