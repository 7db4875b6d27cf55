"""The plain recommendations of ``tessera capacity``: which quota to raise, which nodes
to add, which flavor's quota and hardware disagree.

Layer: PURE. Sentences from the records ``console.capacity`` made: no I/O, no clock.
Must not judge what waits for what: ``console.capacity`` has.
"""

from __future__ import annotations

from collections.abc import Sequence

from console.capacity import (
    FRAGMENTATION,
    MILLI,
    NODES,
    QUOTA,
    FlavorRow,
    QueueRow,
    QuotaUse,
    Waiting,
)
from webhook.queues import Policy


def recommendations(
    queues: Sequence[QueueRow], flavors: Sequence[FlavorRow], policy: Policy, quota: QuotaUse
) -> list[str]:
    """Plain sentences: which quota to raise, which nodes to add, which flavor's quota
    and hardware disagree."""
    found: list[str] = []
    for q in queues:
        found += _quota_advice(q, policy, quota)
        found += _node_advice(q)
    for f in flavors:
        if f.cluster_queues and f.gpus_nominal > f.gpus_healthy:
            found.append(
                f"flavor {f.flavor}: the queues' nominal quotas add up to {f.gpus_nominal} GPUs "
                f"but its {f.nodes} nodes have {f.gpus_healthy} healthy: Kueue can admit "
                f"{f.gpus_nominal - f.gpus_healthy} GPUs of work no node holds"
            )
        elif f.gpus_nominal < f.gpus_healthy:
            found.append(
                f"flavor {f.flavor}: {f.gpus_healthy - f.gpus_nominal} of its {f.gpus_healthy} "
                "healthy GPUs are in no queue's nominal quota: no Kueue workload can use them"
            )
    return found


def _quota_advice(q: QueueRow, policy: Policy, quota: QuotaUse) -> list[str]:
    by_flavor: dict[str, list[Waiting]] = {}
    for w in q.waiting:
        if w.blocked_by == QUOTA:
            by_flavor.setdefault(w.flavor, []).append(w)
    found = []
    for flavor, waits in sorted(by_flavor.items()):
        asked = sum(w.gpus for w in waits)
        if not flavor:
            found.append(
                f"ClusterQueue {q.name or '?'}: {len(waits)} workload(s) asking {asked} GPUs, "
                "but it has no GPU flavor: give it quota of nvidia.com/gpu"
            )
            continue
        room = quota.room(q.name, flavor) // MILLI
        raise_by = max(asked - room, *(w.quota_short for w in waits))
        text = (
            f"ClusterQueue {q.name}: {len(waits)} workload(s) asking {asked} GPUs wait for "
            f"quota while free GPUs of {flavor} would hold them: raise its nominal quota of "
            f"nvidia.com/gpu in {flavor} by {raise_by}"
        )
        text += "".join(_lending_hints(q.name, flavor, policy, quota))
        found.append(text)
    return found


def _lending_hints(queue: str, flavor: str, policy: Policy, quota: QuotaUse) -> list[str]:
    """The cohort members with idle quota of the flavor that they may not lend."""
    cq = policy.cluster_queue(queue)
    if cq is None or not cq.cohort:
        return []
    hints = []
    for other in sorted(quota.cohorts.get(cq.cohort, [])):
        nominal, lendable, _ = quota.nominal_of(other, flavor)
        idle = max(0, nominal - quota.used.get((other, flavor), 0))
        locked = (idle - min(idle, lendable)) // MILLI
        if other != queue and locked > 0:
            hints.append(
                f", or raise {other}'s lendingLimit ({locked} GPUs of it idle it may not lend)"
            )
    return hints


def _node_advice(q: QueueRow) -> list[str]:
    by_flavor: dict[str, list[Waiting]] = {}
    for w in q.waiting:
        if w.blocked_by in (NODES, FRAGMENTATION) and w.missing is not None:
            by_flavor.setdefault(w.flavor, []).append(w)
    found = []
    for flavor, waits in sorted(by_flavor.items()):
        asked = sum(w.gpus for w in waits)
        counts = [w.missing.nodes for w in waits if w.missing is not None]
        if len(waits) == 1 and waits[0].missing is not None:
            need = waits[0].missing.text()
        elif any(c is None for c in counts):
            need = "some ask more GPUs per pod than any node of it has"
        else:
            product = next((w.missing.product for w in waits if w.missing is not None), "")
            need = f"needs {sum(c or 0 for c in counts)} more nodes of {product or 'it'}"
        scattered = [w for w in waits if w.blocked_by == FRAGMENTATION]
        tail = (
            f" ({len(scattered)} of them would fit the free GPUs if they were not scattered)"
            if scattered
            else ""
        )
        found.append(
            f"ClusterQueue {q.name}: {len(waits)} workload(s) asking {asked} GPUs do not fit "
            f"the free GPUs of {flavor}: {need}{tail}"
        )
    return found
