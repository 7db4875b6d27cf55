"""``tessera capacity``'s walk over the waiting work: each workload tried on its queue's
quota and its flavors' free GPUs in turn, as ``console.capacity`` describes.

Layer: PURE. No I/O, no clock. Must not place a pod any other way than
``console.shortfall`` does, nor word a recommendation (``console.advice`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from cluster.model import NodeName, NodeState
from cluster.snapshot import Snapshot
from console import advice
from console.capacity import (
    FRAGMENTATION,
    GPU,
    MILLI,
    NODES,
    QUOTA,
    TURN,
    CapacityReport,
    FlavorRow,
    QueueRow,
    QuotaUse,
    Waiting,
    flavor_nodes,
    pending_asks,
)
from console.nodes import Level
from console.queues import Workload
from console.shortfall import Ask, Nodes, Placement, place
from extender.capacity import node_figures
from webhook.queues import Policy


def capacity_report(
    policy: Policy,
    workloads: Sequence[Workload],
    snapshot: Snapshot,
    waiting: Mapping[tuple[str, str], tuple[Ask, ...]],
    levels: Sequence[Level],
    *,
    islands_required: bool = True,
) -> CapacityReport:
    """The flavors, the queues and what their waiting work needs (module docstring)."""
    quota = QuotaUse(policy, workloads)
    rows = {
        name: [quota.row(name, f) for f in _gpu_flavors(policy, name)]
        for name in policy.cluster_queues
    }
    nodes: dict[NodeName, NodeState] = dict(snapshot.nodes)
    found: dict[str, list[Waiting]] = {}
    admitted = sorted(
        (w for w in workloads if w.admitted and waiting.get((w.namespace, w.name))),
        key=lambda w: (_stamp(w.admitted_at or w.created), w.namespace, w.name),
    )
    for w in admitted:
        flavor = next((f for (f, r) in w.usage if r == GPU), "")
        asks = waiting[(w.namespace, w.name)]
        pool = flavor_nodes(nodes, policy.flavor(flavor))
        placement = place(pool, asks, islands_required=islands_required)
        nodes.update(placement.nodes)
        missing = placement.missing
        blocked = TURN if missing is None else FRAGMENTATION if missing.fragmented else NODES
        found.setdefault(w.cluster_queue, []).append(
            Waiting(
                w.namespace,
                w.name,
                w.cluster_queue,
                True,
                sum(a.total for a in asks),
                blocked,
                flavor,
                0,
                missing,
            )
        )
    pending = sorted(
        (w for w in workloads if not w.admitted and w.gpus > 0),
        key=lambda w: (_stamp(w.created), w.namespace, w.name),
    )
    for w in pending:
        judged = _judge(w, pending_asks(w, levels), policy, quota, nodes, islands_required)
        found.setdefault(w.cluster_queue, []).append(judged)
    queues = tuple(
        QueueRow(
            name,
            (policy.cluster_queues[name].cohort or "") if name in policy.cluster_queues else "",
            tuple(rows.get(name, ())),
            tuple(found.get(name, ())),
        )
        for name in sorted({*policy.cluster_queues, *found})
    )
    flavors = _flavor_rows(policy, snapshot.nodes, islands_required)
    return CapacityReport(
        flavors=flavors,
        queues=queues,
        recommendations=tuple(advice.recommendations(queues, flavors, policy, quota)),
        notes=policy.problems,
    )


def _stamp(when: datetime | None) -> float:
    """Seconds since the epoch; a workload of unknown time goes last."""
    return when.timestamp() if when is not None else float("inf")


def _gpu_flavors(policy: Policy, queue: str) -> tuple[str, ...]:
    cq = policy.cluster_queue(queue)
    return cq.flavors_for(GPU) if cq is not None else ()


def _judge(  # noqa: PLR0917 - the walk's state, passed down as it is
    w: Workload,
    asks: tuple[Ask, ...],
    policy: Policy,
    quota: QuotaUse,
    nodes: dict[NodeName, NodeState],
    islands_required: bool,
) -> Waiting:
    """A pending workload tried on its queue's GPU flavors in order (module docstring);
    what it is given is taken from ``quota`` and ``nodes``."""
    ask = w.gpus * MILLI
    tried: list[tuple[str, int, Placement]] = []
    for flavor in _gpu_flavors(policy, w.cluster_queue):
        short = -(-max(0, ask - quota.room(w.cluster_queue, flavor)) // MILLI)
        placement = place(
            flavor_nodes(nodes, policy.flavor(flavor)), asks, islands_required=islands_required
        )
        if not short and placement.fits:
            quota.take(w.cluster_queue, flavor, ask)
            nodes.update(placement.nodes)
            return Waiting(
                w.namespace, w.name, w.cluster_queue, False, w.gpus, TURN, flavor, 0, None
            )
        tried.append((flavor, short, placement))
    for flavor, short, placement in tried:
        if placement.fits:
            nodes.update(placement.nodes)  # as if it had the quota: what comes after gets less
            return Waiting(
                w.namespace, w.name, w.cluster_queue, False, w.gpus, QUOTA, flavor, short, None
            )
    short_of = [(flavor, short, p.missing) for flavor, short, p in tried if p.missing is not None]
    if not short_of:
        return Waiting(w.namespace, w.name, w.cluster_queue, False, w.gpus, QUOTA, "", w.gpus, None)
    # the flavor that needs the fewest new nodes (min keeps the queue's order on a tie)
    flavor, short, missing = min(short_of, key=lambda t: (t[2].nodes is None, t[2].nodes or 0))
    blocked = FRAGMENTATION if missing.fragmented else NODES
    return Waiting(
        w.namespace, w.name, w.cluster_queue, False, w.gpus, blocked, flavor, short, missing
    )


def _flavor_rows(policy: Policy, nodes: Nodes, islands_required: bool) -> tuple[FlavorRow, ...]:
    """The flavors some queue has GPU quota in, or whose nodes have GPUs."""
    rows = []
    for name in sorted(policy.flavors):
        flavor = policy.flavors[name]
        members = flavor_nodes(nodes, flavor)
        queues = tuple(
            sorted(q.name for q in policy.cluster_queues.values() if (name, GPU) in q.quotas)
        )
        if not members and not queues:
            continue
        figures = [node_figures(n, islands_required=islands_required) for n in members.values()]
        products = sorted({n.product for n in members.values() if n.product})
        rows.append(
            FlavorRow(
                flavor=name,
                product=flavor.product or ",".join(products),
                nodes=len(members),
                gpus_total=sum(f.gpus_total for f in figures),
                gpus_unhealthy=sum(f.gpus_unhealthy for f in figures),
                gpus_free=sum(f.gpus_free for f in figures),
                gpus_nominal=sum(
                    policy.cluster_queues[q].quotas[(name, GPU)].nominal for q in queues
                )
                // MILLI,
                cluster_queues=queues,
            )
        )
    return tuple(rows)
