"""Rule 5b: the namespace's ResourceQuotas, which still apply after Kueue admits a job.

Layer: PURE. A function from (workload, queue, policy) to notes or a denial: no I/O, no
clock, no aiohttp, no pydantic. The limits and the sums are ``webhook.namespace_quota``'s
(the console names the same conflicts from the same arithmetic).

Kueue admits against its own quota; kube-apiserver counts the namespace's quota when the
job controller creates each pod. A job asking more whole GPUs (or more pods) than a
quota of its namespace holds in all would be admitted, take its queue's quota, and hang
with pod creations refused in events nobody reads: it is denied at submit, with the
numbers. A quota below the nominal GPUs of the job's ClusterQueue is a warning: this job
may fit, but Kueue can admit more from the namespace than the quota lets it create.
Quotas with scopes are left out of the denial (they may not select this job's pods).
"""

from __future__ import annotations

from cluster import labels
from cluster.echo import echo
from webhook.namespace_quota import QuotaLimit, below_nominal
from webhook.queues import Policy
from webhook.rules.gang import breakdown, gpu_asks
from webhook.rules.outcome import FORBIDDEN, Denied, Notes, QueueChoice, plural
from webhook.workload import Workload


def _asked(workload: Workload, limit: QuotaLimit) -> tuple[int, str]:
    """What the workload asks of ``limit``'s resource in all, and how it adds up."""
    if limit.gpus:
        for ask in gpu_asks(workload.templates):
            if ask.resource == labels.GPU_RESOURCE:
                return ask.total, breakdown(ask)
        return 0, ""
    pods = [(t.name, t.count) for t in workload.templates if t.count]
    shown = " + ".join(f"{echo(name, quote=False)}: {count}" for name, count in pods if name)
    return sum(count for _, count in pods), shown


def _over(workload: Workload, limit: QuotaLimit, queue: QueueChoice) -> Denied | None:
    asked, parts = _asked(workload, limit)
    if asked <= limit.hard:
        return None
    unit = "GPUs" if limit.gpus else "pods"
    namespace = echo(workload.namespace, quote=False)
    return Denied(
        FORBIDDEN,
        "resourcequota",
        f"{workload.kind_word} {workload.display_name} asks for {plural(asked, unit[:-1])}"
        f"{f' ({parts})' if parts else ''}; {limit.name} allows at most {limit.hard} "
        f"{unit} ({limit.resource}) in namespace {namespace}, so its pods could never all "
        f"be created after Kueue admits it; ask for at most {limit.hard} "
        f"{unit}, or have an admin raise the quota's hard {limit.resource} to {asked}",
        queue=queue.local.name,
    )


def rule_namespace_quota(workload: Workload, queue: QueueChoice, policy: Policy) -> Notes | Denied:
    """Deny what a quota of the namespace could never hold; warn of a quota below the
    queue's nominal GPUs."""
    notes = []
    for limit in policy.quotas_in(workload.namespace):
        if not limit.scoped:
            denied = _over(workload, limit, queue)
            if denied is not None:
                return denied
        nominal = below_nominal(limit, queue.cluster)
        if nominal is not None:
            notes.append(
                f"{limit.name} allows {limit.hard} GPUs ({limit.resource}), below the "
                f"nominal {nominal} GPUs of ClusterQueue {queue.cluster.name} that queue "
                f"{queue.local.name} sends jobs to: Kueue may admit jobs of this namespace "
                "whose pods the quota then refuses; have an admin raise the quota to "
                f"{nominal} or lower the ClusterQueue's nominal"
            )
    return tuple(notes)
