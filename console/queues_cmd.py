"""``tessera queues``: pending and admitted work per ClusterQueue and LocalQueue.

Layer: I/O (it awaits the ``Source``). Reads Kueue's objects, Workloads and the
namespaces' ResourceQuotas, lets the PURE ``console.queues`` count them and
``console.rquota`` name the quotas that fight Kueue, and renders the tables. Must not
count or decide anything itself, nor read the environment or the clock (both arrive
from ``__main__``).
"""

from __future__ import annotations

from cluster.clock import Clock
from console import render
from console.output import Output, json_text
from console.queues import queues_report, read_workloads
from console.rquota import conflicts, read_limits
from console.source import KUEUE_KINDS, Source, resource_quotas
from webhook.policy_build import policy_from_objects


async def queues(source: Source, clock: Clock, *, output: str = "table") -> Output:
    objects = await source.objects((*KUEUE_KINDS, "WorkloadPriorityClass", "Workload"))
    policy = policy_from_objects(o for o in objects if o["kind"] != "Workload")
    workloads, problems = read_workloads(objects, policy)
    report = queues_report(policy, workloads, clock.now(), problems)
    quota_objs, unread = await resource_quotas(source)
    limits = read_limits(quota_objs)
    clashes = conflicts(limits, policy, workloads)
    notes = (*(f"note: {p}" for p in report.problems), *unread)
    if output == "json":
        shown = {
            **report.to_json(),
            "resource_quotas": [limit.to_json() for limit in limits],
            "resource_quota_conflicts": list(clashes),
        }
        return Output(json_text(shown), notes)
    d = render.duration
    cq = render.table(
        (
            "CLUSTERQUEUE",
            "COHORT",
            "PENDING",
            "ADMITTED",
            "GPUS-PENDING",
            "GPUS-ADMITTED",
            "NOMINAL",
            "BORROWED",
            "LENT",
            "OLDEST-WAIT",
            "P90-WAIT",
        ),
        [
            (
                q.name,
                q.cohort or None,
                q.waits.pending,
                q.waits.admitted,
                q.waits.gpus_pending,
                q.waits.gpus_admitted,
                q.nominal,
                q.borrowed,
                q.lent,
                d(q.waits.oldest_pending_s),
                d(q.waits.p90_wait_s),
            )
            for q in report.cluster_queues
        ],
    )
    lq = render.table(
        (
            "NAMESPACE",
            "LOCALQUEUE",
            "CLUSTERQUEUE",
            "PENDING",
            "ADMITTED",
            "GPUS-PENDING",
            "GPUS-ADMITTED",
            "OLDEST-WAIT",
            "P90-WAIT",
        ),
        [
            (
                q.namespace,
                q.name,
                q.cluster_queue or None,
                q.waits.pending,
                q.waits.admitted,
                q.waits.gpus_pending,
                q.waits.gpus_admitted,
                d(q.waits.oldest_pending_s),
                d(q.waits.p90_wait_s),
            )
            for q in report.local_queues
        ],
    )
    tail = "".join(f"* {clash}\n" for clash in clashes)
    return Output(cq + "\n" + lq + (f"\nRESOURCEQUOTA CONFLICTS\n{tail}" if tail else ""), notes)
