"""``tessera capacity``: per flavor and ClusterQueue, quota against hardware, and whether
the work waiting needs more quota or more nodes.

Layer: I/O (it awaits the ``Source``). Reads Nodes, Pods, Kueue's objects, Workloads and
ResourceQuotas, lets the PURE ``console.capacity_walk`` judge them (and ``console.rquota``
name the namespace quotas that cap what Kueue admits) and renders the report. Must not judge
anything itself, nor read the environment or the clock (both arrive from ``__main__``).
"""

from __future__ import annotations

from typing import Final

from cluster.clock import Clock
from console import render
from console.capacity import CapacityReport, waiting_pods
from console.capacity_walk import capacity_report
from console.nodes import policy_levels
from console.output import Output, json_text
from console.queues import read_workloads
from console.rquota import conflicts, read_limits
from console.source import KUEUE_KINDS, Source, build_snapshot, resource_quotas
from webhook.policy_build import policy_from_objects

WAITING_SHOWN: Final = 20


async def capacity(source: Source, clock: Clock, *, output: str = "table") -> Output:
    objects = await source.objects(("Node", "Pod", *KUEUE_KINDS, "Workload"))
    policy = policy_from_objects(o for o in objects if o["kind"] in KUEUE_KINDS)
    workloads, problems = read_workloads(objects, policy)
    levels = policy_levels(policy)
    snapshot, cache_problems = build_snapshot(objects, [label for _, label in levels], clock)
    waiting = waiting_pods(workloads, (o for o in objects if o["kind"] == "Pod"), levels)
    report = capacity_report(policy, workloads, snapshot, waiting, levels)
    quota_objs, unread = await resource_quotas(source)
    clashes = conflicts(read_limits(quota_objs), policy, workloads)
    notes = (*(f"note: {p}" for p in (*report.notes, *problems, *cache_problems)), *unread)
    if output == "json":
        return Output(json_text({**report.to_json(), "resource_quota_conflicts": clashes}), notes)
    tail = "".join(f"* {clash}\n" for clash in clashes)
    return Output(
        capacity_text(report) + (f"\nRESOURCEQUOTA CONFLICTS\n{tail}" if tail else ""), notes
    )


def capacity_text(report: CapacityReport) -> str:
    parts = [
        render.table(
            ("FLAVOR", "PRODUCT", "NODES", "GPUS", "HEALTHY", "FREE", "NOMINAL", "QUEUES"),
            [
                (
                    f.flavor,
                    f.product or None,
                    f.nodes,
                    f.gpus_total,
                    f.gpus_healthy,
                    f.gpus_free,
                    f.gpus_nominal,
                    ",".join(f.cluster_queues) or None,
                )
                for f in report.flavors
            ],
        ),
        "\n",
        render.table(
            (
                "CLUSTERQUEUE",
                "COHORT",
                "FLAVOR",
                "NOMINAL",
                "USED",
                "BORROWED",
                "ROOM",
                "WAITING",
                "GPUS-WAITING",
                "BY-QUOTA",
                "BY-NODES",
                "NEEDS",
            ),
            [
                (
                    q.name,
                    q.cohort or None,
                    f.flavor if f else None,
                    f.nominal if f else None,
                    f.used if f else None,
                    f.borrowed if f else None,
                    f.room if f else None,
                    *(
                        (
                            len(q.waiting),
                            sum(w.gpus for w in q.waiting),
                            q.gpus_blocked("quota"),
                            q.gpus_blocked("nodes", "fragmentation"),
                            q.needs,
                        )
                        if i == 0
                        else (None, None, None, None, None)
                    ),
                )
                for q in report.queues
                for i, f in enumerate(q.flavors or (None,))
            ],
        ),
    ]
    waiting = [w for q in report.queues for w in q.waiting]
    if waiting:
        parts += [
            "\n",
            render.table(
                ("WAITING", "CLUSTERQUEUE", "STATE", "GPUS", "BLOCKED-BY", "WHY"),
                [
                    (
                        f"{w.namespace}/{w.name}",
                        w.cluster_queue or None,
                        "admitted" if w.admitted else "pending",
                        w.gpus,
                        w.blocked_by,
                        w.summary(),
                    )
                    for w in waiting[:WAITING_SHOWN]
                ],
            ),
        ]
        if len(waiting) > WAITING_SHOWN:
            parts.append(f"... and {len(waiting) - WAITING_SHOWN} more (-o json lists all)\n")
    if report.recommendations:
        parts.append("\n" + "".join(f"* {r}\n" for r in report.recommendations))
    else:
        parts.append("\nnothing waits for quota or nodes\n")
    return "".join(parts)
