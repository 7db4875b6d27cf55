"""``python -m loadtest selfcheck``: the cluster-model self-check on real trace data.

Layer: ROOT (wires data, the cache and a report). Loads the Alibaba openb GPU nodes
(or a synthetic HGX fleet when the shared data folder is absent) as the Node objects a
kubelet would register, feeds them through the same conversion and cache the servers
use, then places the trace's pods one by one, best fit over the snapshot, assuming each
placement as the extender's bind does. It prints what a person checks first: GPUs,
placements, allocation and how fast snapshots and assumptions are, with no server
running (``python -m loadtest demo`` runs the servers). Must not be imported by the
servers.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from cluster.cache import AllocationConflict, ClusterCache
from cluster.clock import Clock
from cluster.convert.pods import pod_from_json
from cluster.feed import CacheFeed
from cluster.model import Allocation, NodeState, PodDemand
from cluster.snapshot import Snapshot, pick_gpus
from loadtest.inputs.traces import (
    TraceMissing,
    TraceNode,
    TracePod,
    node_object,
    pod_object,
    read_openb_nodes,
    read_openb_pods,
)


@dataclass(frozen=True, slots=True)
class DemoReport:
    source: str
    nodes: int
    gpus: int
    pods: int
    placed: int
    skipped: int
    allocated_pct: float
    load_s: float
    place_s: float
    snapshot_us: float
    peak_rss_mib: float

    def lines(self) -> list[str]:
        per_pod_us = self.place_s / max(self.pods, 1) * 1e6
        return [
            f"cluster model self-check on {self.source}",
            f"  nodes loaded            {self.nodes:>10,}   ({self.gpus:,} GPUs)",
            f"  load + convert + cache  {self.load_s * 1000:>10.1f} ms",
            f"  pods arrived            {self.pods:>10,}",
            f"  placed / fit nowhere    {self.placed:>10,} / {self.skipped:,}",
            f"  GPU capacity allocated  {self.allocated_pct:>10.2f} %",
            f"  decide + assume         {per_pod_us:>10.1f} µs per pod",
            f"  snapshot after a change {self.snapshot_us:>10.1f} µs",
            f"  peak RSS                {self.peak_rss_mib:>10.1f} MiB",
        ]


def synthetic_fleet(count: int = 64) -> list[TraceNode]:
    """HGX-like nodes: 8 GPUs, 2 TB memory, 224 cores."""
    return [TraceNode(f"hgx-{i:03d}", 224_000, 2_097_152, 8, "H100") for i in range(count)]


def synthetic_pods(nodes: list[TraceNode]) -> list[TracePod]:
    """A mix shaped like the openb trace: mostly one GPU, some shares, a few 8-GPU pods."""
    sizes = [(1, 1000)] * 6 + [(0, 0)] + [(1, 250), (1, 500), (2, 1000), (4, 1000), (8, 1000)]
    capacity = sum(n.gpus for n in nodes) * 1000
    pods: list[TracePod] = []
    arrived = 0
    while arrived < capacity * 1.1:
        num, milli = sizes[len(pods) % len(sizes)]
        pods.append(TracePod(f"pod-{len(pods):05d}", 4000, 16384, num, milli))
        arrived += num * milli
    return pods


def best_fit(snapshot: Snapshot, demand: PodDemand) -> Allocation | None:
    """The node left with the least free GPU capacity that still holds the pod."""
    best: tuple[int, NodeState, tuple[int, ...]] | None = None
    for node in snapshot.nodes.values():
        # Cheap totals first: most nodes of a busy cluster are ruled out by them alone.
        if node.free_milli < demand.total_milli or (
            demand.products and node.product not in demand.products
        ):
            continue
        indices = pick_gpus(node, demand)
        if indices is not None and (best is None or node.free_milli < best[0]):
            best = (node.free_milli, node, indices)
    if best is None:
        return None
    return Allocation(best[1].name, best[2], demand.milli_per_gpu)


def run(clock: Clock, data_dir: Path, *, max_pods: int | None = None) -> DemoReport:
    try:
        nodes, pods, source = read_openb_nodes(data_dir), read_openb_pods(data_dir), "openb"
    except TraceMissing:
        nodes = synthetic_fleet()
        pods, source = synthetic_pods(nodes), "a synthetic 64-node HGX fleet"
    if max_pods is not None:
        pods = pods[:max_pods]

    start = clock.monotonic()
    cache = ClusterCache(clock)
    CacheFeed(cache).load([node_object(n) for n in nodes])
    loaded = clock.monotonic()

    placed = skipped = 0
    for trace_pod in pods:
        pod = pod_from_json(pod_object(trace_pod))
        if not pod.demand.uses_gpu:
            continue
        allocation = best_fit(cache.snapshot(), pod.demand)
        try:
            if allocation is None:
                raise AllocationConflict("fits nowhere")
            cache.assume(pod, allocation)
            placed += 1
        except AllocationConflict:
            skipped += 1
    done = clock.monotonic()

    snapshot = cache.snapshot()
    total = sum(len(n.gpus) for n in snapshot.nodes.values()) * 1000
    free = sum(g.free_milli for n in snapshot.nodes.values() for g in n.gpus)
    before = clock.monotonic()
    cache.forget(next(iter(snapshot.assumed)))
    cache.snapshot()
    snapshot_us = (clock.monotonic() - before) * 1e6
    return DemoReport(
        source=source,
        nodes=len(snapshot.nodes),
        gpus=total // 1000,
        pods=len(pods),
        placed=placed,
        skipped=skipped,
        allocated_pct=100.0 * (total - free) / total,
        load_s=loaded - start,
        place_s=done - loaded,
        snapshot_us=snapshot_us,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
