"""Namespace ResourceQuotas that fight Kueue: a quota on ``requests.nvidia.com/gpu`` (or on
pods) still applies after Kueue admits a job, so the job controller's pod creations
fail and the job hangs with events nobody reads.

Layer: PURE. From ResourceQuota objects (decoded JSON), the queue policy and the
Workloads to frozen records and sentences: no I/O, no clock. Must not raise on a
malformed quota: a field that cannot be read is left out. The records and the sums are
``webhook.namespace_quota``'s, which the webhook's submit-time rule reads too.

The conflicts named:

* a namespace's quota below the nominal GPU quota of a ClusterQueue its LocalQueues
  point at: Kueue can admit there more than the namespace may create;
* a workload asking more GPUs (or pods) than a quota of its namespace allows in all:
  its pods can never all be created;
* an admitted workload whose pods are not all there while the quota has less room left
  than the GPUs (or pods) missing: the job controller is being refused now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from console.queues import Workload
from console.why import WhyReport
from webhook.namespace_quota import QuotaLimit as Limit
from webhook.namespace_quota import below_nominal, read_limits
from webhook.queues import Policy

__all__ = [
    "Limit",
    "conflicts",
    "job_refusals",
    "read_limits",
    "refusing",
    "with_refusals",
]


def _pods(w: Workload) -> int:
    return sum(count for count, _ in w.pod_sets)


def _asked(limit: Limit, w: Workload) -> int:
    return w.gpus if limit.gpus else _pods(w)


def conflicts(
    limits: Sequence[Limit], policy: Policy, workloads: Sequence[Workload]
) -> tuple[str, ...]:
    """The first two conflicts of the module's docstring, as sentences."""
    found = []
    for limit in limits:
        if not limit.gpus:
            continue
        queues = sorted(
            {
                lq.cluster_queue
                for (ns, _), lq in policy.local_queues.items()
                if ns == limit.namespace
            }
        )
        for name in queues:
            cq = policy.cluster_queue(name)
            if cq is None:
                continue
            nominal = below_nominal(limit, cq)
            if nominal is not None:
                found.append(
                    f"{limit.name} allows {limit.hard} GPUs ({limit.resource}), below "
                    f"ClusterQueue {name}'s nominal {nominal} that namespace "
                    f"{limit.namespace} queues to: Kueue can admit jobs whose pods it refuses"
                )
    for w in workloads:
        for limit in limits:
            if limit.namespace == w.namespace and _asked(limit, w) > limit.hard:
                found.append(
                    f"workload {w.namespace}/{w.name} asks {_asked(limit, w)} {limit.unit}, "
                    f"more than {limit.name} allows ({limit.hard}): its pods can never all "
                    "be created"
                )
    return tuple(found)


def refusing(
    limits: Sequence[Limit], namespace: str, missing_gpus: int, missing_pods: int
) -> tuple[str, ...]:
    """The third conflict: the quotas of ``namespace`` with less room than the GPUs and
    pods an admitted job still has to create."""
    found = []
    for limit in limits:
        missing = missing_gpus if limit.gpus else missing_pods
        if limit.namespace == namespace and missing > limit.room:
            found.append(
                f"{limit.name}: {limit.used} of {limit.hard} {limit.unit} used "
                f"({limit.resource}), {missing} more needed: the job controller cannot create "
                "the rest of its pods"
            )
    return tuple(found)


def job_refusals(limits: Sequence[Limit], workload: Workload, pods_found: int) -> tuple[str, ...]:
    """``refusing`` for an admitted workload of which ``pods_found`` pods exist."""
    expected = _pods(workload)
    if not workload.admitted or pods_found >= expected or expected <= 0:
        return ()
    missing = expected - pods_found
    return refusing(limits, workload.namespace, workload.gpus * missing // expected, missing)


def with_refusals(report: WhyReport, refusals: Sequence[str]) -> WhyReport:
    """``tessera why``'s answer with the quotas refusing the job's pods in its verdict:
    no other stage would say why the pods are missing."""
    if not refusals:
        return report
    return replace(
        report, verdict=f"{report.verdict}; {refusals[0]}", notes=(*report.notes, *refusals[1:])
    )
