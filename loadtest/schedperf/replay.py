"""``python -m loadtest.schedperf.replay``: what sched-perf's pods cost the extender's
decisions and cache, replayed in process, without sockets.

Layer: ROOT (times the extender's PURE verbs and the cache's writes with a CPU clock
it is given; reads the openb trace). Must not decide anything itself nor change a
decision: it calls the verbs as the HTTP shell does, on the cache's snapshots, and
plays kube-scheduler only as far as choosing which names to send.

Each of ``sched-perf``'s pods (``loadtest.schedperf.workload``: the same trace draws,
gangs and HGX nodes) goes through what the extender sees of it in the ``tessera``
profile with the shipped settings: the pod watch's ``ADDED`` event (parsed and
converted into the cache), ``/filter`` with the names kube-scheduler would send, the
bind's plan and assumption, and the watch's event of the bound pod. kube-scheduler's
names: from where the last pod's search stopped, the first nodes its own filters pass
(whole GPUs, CPU, memory and pods by count, as it counts them: it ignores GPU shares),
as many as its adaptive ``percentageOfNodesToScore`` looks for; a gang member placed
after the first is kept in its gang's rack by the pod affinity the webhook writes.

It answers in a few seconds, where ``sched-perf`` takes minutes and four processes
whose share of two cores moves from run to run: a change to the decisions shows here
first. It does not show what the real loop adds (HTTP, the Binding, the watch's
stream, cold caches between requests): ``sched-perf`` measures that.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cluster import jsonio, labels
from cluster.cache import ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.feed import CacheFeed
from cluster.model import NodeName
from extender import verbs, wire
from extender.memo import DecisionCache
from extender.settings import ExtenderSettings
from loadtest.inputs.traces import DEFAULT_DATA_DIR, TraceMissing, read_openb_pods
from loadtest.schedperf.workload import (
    CPU_MILLI_PER_GPU,
    GPUS_PER_NODE,
    LEVELS,
    MEMORY_MIB_PER_GPU,
    PodShape,
    hgx_nodes,
    pod_manifest,
    shapes,
)
from loadtest.stack.fleet import FakeNode

SCHEDULER: Final = "tessera-gpu"
STAGES: Final = ("added", "filter", "bind", "bound")
MAX_PODS: Final = 110
"""The HGX node's pod limit (``loadtest.stack.fleet.FakeNode.status``)."""

CpuClock = Callable[[], float]


def names_to_find(nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for with its adaptive sample
    (``percentageOfNodesToScore`` left out): ``numFeasibleNodesToFind``."""
    if nodes < 100:
        return nodes
    percent = max(5, 50 - nodes // 125)
    return max(100, nodes * percent // 100)


@dataclass(slots=True)
class _InTree:
    """What kube-scheduler counts of each node, and where its last search stopped."""

    names: Sequence[str]
    racks: Mapping[str, str]
    gpus: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    pods: dict[str, int] = field(default_factory=dict)
    start: int = 0

    def __post_init__(self) -> None:
        for name in self.names:
            self.gpus[name] = GPUS_PER_NODE
            self.cpu[name] = CPU_MILLI_PER_GPU * GPUS_PER_NODE
            self.memory[name] = MEMORY_MIB_PER_GPU * GPUS_PER_NODE
            self.pods[name] = MAX_PODS

    def fits(self, name: str, pod: PodShape) -> bool:
        return (
            self.gpus[name] >= pod.gpus
            and self.cpu[name] >= pod.cpu_milli
            and self.memory[name] >= pod.memory_mib
            and self.pods[name] > 0
        )

    def sample(self, pod: PodShape, rack: str | None) -> list[str]:
        """The names kube-scheduler sends ``/filter`` for ``pod``."""
        wanted, total = names_to_find(len(self.names)), len(self.names)
        found: list[str] = []
        looked = 0
        while looked < total and len(found) < wanted:
            name = self.names[(self.start + looked) % total]
            looked += 1
            if (rack is None or self.racks[name] == rack) and self.fits(name, pod):
                found.append(name)
        self.start = (self.start + looked) % total
        return found

    def bind(self, name: str, pod: PodShape) -> None:
        self.gpus[name] -= pod.gpus
        self.cpu[name] -= pod.cpu_milli
        self.memory[name] -= pod.memory_mib
        self.pods[name] -= 1


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay: CPU seconds of each stage over all pods, and the pods placed."""

    cpu_s: Mapping[str, float]
    placed: int
    pods: int
    gang_racks: Mapping[str, frozenset[str]]
    """Each gang's racks, for the one reading the result (one each, by the rules)."""

    def ms_per_pod(self, stage: str) -> float:
        return 1000 * self.cpu_s[stage] / max(1, self.pods)


class _Extender:
    """The extender's state as its app holds it (settings of the shipped Deployment),
    and the verbs called on it as its shell calls them, each stage's CPU counted."""

    def __init__(self, fleet: Sequence[FakeNode], clock: Clock, cpu: CpuClock) -> None:
        settings = ExtenderSettings(
            topology_levels=LEVELS,  # type: ignore[arg-type]  # parsed by pydantic
            choose_in_filter=True,
        )
        now = clock.now()
        self.config = settings.to_config()
        self.cache = ClusterCache(clock, settings.assume_ttl_s)
        self.feed = CacheFeed(self.cache, levels=self.config.level_labels)
        self.feed.replace_nodes([{**n.manifest(now), **n.status(now)} for n in fleet])
        self.feed.replace_pods([])
        self.memo = DecisionCache(self.config)
        self.recent = wire.RecentPods(settings.recent_pods)
        self.clock, self.cpu = clock, cpu
        self.spent = dict.fromkeys(STAGES, 0.0)

    def watch(self, kind: str, pod: dict[str, Any], stage: str) -> None:
        """The pod watch's event: its line parsed, the pod converted into the cache."""
        began = self.cpu()
        event = jsonio.loads(jsonio.dumps({"type": kind, "object": pod}))
        self.feed.pod_event(kind, event["object"])
        self.spent[stage] += self.cpu() - began

    def filter(self, pod: dict[str, Any], names: Sequence[str]) -> NodeName | None:
        """``/filter``: the node chosen (the first named when several fit)."""
        body = jsonio.dumps({"Pod": pod, "NodeNames": names})
        began = self.cpu()
        reply = verbs.handle_filter(
            body,
            self.cache.snapshot(),
            self.config,
            self.clock.now(),
            recent=self.recent,
            memo=self.memo,
        )
        self.spent["filter"] += self.cpu() - began
        named = jsonio.loads(reply.body).get("NodeNames") or []
        return NodeName(named[0]) if named else None

    def bind(self, pod: dict[str, Any], node: NodeName) -> tuple[int, ...] | None:
        """``/bind``'s plan and assumption: the GPU indices taken (None: refused)."""
        metadata = pod["metadata"]
        binding = {
            "PodName": metadata["name"],
            "PodNamespace": metadata["namespace"],
            "PodUID": metadata["uid"],
            "Node": node,
        }
        began = self.cpu()
        step = verbs.plan_bind(
            jsonio.dumps(binding),
            self.cache.snapshot(),
            self.config,
            self.clock.now(),
            seen=self.recent,
            memo=self.memo,
        )
        indices: tuple[int, ...] | None = None
        if not isinstance(step, verbs.Reply):
            allocation = step.plan.allocation
            indices = ()
            if allocation is not None:
                self.cache.assume(step.plan.pod, allocation)
                indices = allocation.indices
        self.spent["bind"] += self.cpu() - began
        return indices


def replay(pods: Sequence[PodShape], node_count: int, clock: Clock, cpu: CpuClock) -> Replay:
    """Every pod of ``pods`` through the extender, on ``node_count`` fresh HGX nodes."""
    now = clock.now()
    fleet = hgx_nodes(node_count)
    extender = _Extender(fleet, clock, cpu)
    racks = {n.name: n.rack for n in fleet}
    in_tree = _InTree([n.name for n in fleet], racks)
    gang_racks: dict[str, set[str]] = {}
    version = 0
    placed = 0
    for number, shape in enumerate(pods):
        version += 1
        pod = pod_manifest(shape, SCHEDULER)
        metadata = pod["metadata"]
        metadata.update(
            uid=f"00000000-0000-0000-0000-{number:012d}",
            resourceVersion=str(version),
            creationTimestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        pod["status"] = {"phase": "Pending"}
        extender.watch("ADDED", pod, "added")
        rack = next(iter(gang_racks.get(shape.gang, ())), None) if shape.gang else None
        node = extender.filter(pod, in_tree.sample(shape, rack))
        indices = None if node is None else extender.bind(pod, node)
        if node is None or indices is None:
            continue
        version += 1
        pod["spec"]["nodeName"] = node
        metadata["resourceVersion"] = str(version)
        if indices:
            annotations = metadata.setdefault("annotations", {})
            annotations[labels.GPU_INDICES] = ",".join(map(str, indices))
        extender.watch("MODIFIED", pod, "bound")
        in_tree.bind(node, shape)
        placed += 1
        if shape.gang:
            gang_racks.setdefault(shape.gang, set()).add(racks[node])
    return Replay(
        extender.spent,
        placed,
        len(pods),
        {gang: frozenset(r) for gang, r in gang_racks.items()},
    )


def report(runs: Sequence[Replay], nodes: int) -> str:
    """CPU a pod of each stage, the median of the runs (and their range)."""
    first = runs[0]
    lines = [
        f"{first.pods} pods on {nodes} nodes, {names_to_find(nodes)} names a /filter, "
        f"{len(runs)} run(s); placed {first.placed}",
        f"{'stage':<10} {'CPU ms/pod':>10}   range",
    ]
    for stage in (*STAGES, "total"):
        values = [
            sum(r.ms_per_pod(s) for s in STAGES) if stage == "total" else r.ms_per_pod(stage)
            for r in runs
        ]
        lines.append(
            f"{stage:<10} {statistics.median(values):>10.3f}   {min(values):.3f}-{max(values):.3f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.schedperf.replay",
        description="sched-perf's pods through the extender's decisions, in process.",
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gang-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", default="default", help="openb pod list")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    try:
        trace = read_openb_pods(args.data, args.trace)
    except TraceMissing as exc:
        print(f"python -m loadtest.schedperf.replay: {exc}", file=sys.stderr)
        return 2
    pods = shapes(trace, args.pods, gang_share=args.gang_share, seed=args.seed)
    clock = SystemClock()
    runs = [replay(pods, args.nodes, clock, time.process_time) for _ in range(args.repeats)]
    print(report(runs, args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
