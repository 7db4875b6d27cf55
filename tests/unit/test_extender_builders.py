"""Builders for the extender's tests, and the tests that pin down their notation.

A node's GPUs are written as a layout, one character per GPU and one word per NVLink
island: ``"#... ...."`` is two islands of four with GPU 0 fully used. ``.`` is a free
GPU, ``#`` a fully used one, ``1``-``9`` one with that many hundred milli free, ``x`` an
unhealthy one. Clusters go through the real ``ClusterCache``, so gangs and allocations
in a snapshot are what the cache makes of bound pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.labels import HOSTNAME
from cluster.model import (
    MILLI_PER_GPU,
    GangId,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodPhase,
    TopologyConstraint,
    TopologyMode,
    pod_key,
)
from cluster.snapshot import Snapshot
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from extender.context import PodContext
from extender.gangs import build_context
from tests.builders import BLOCK_LABEL, H100, RACK_LABEL

NOW = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)
BLOCK = TopologyLevel("block", BLOCK_LABEL)
RACK = TopologyLevel("rack", RACK_LABEL)
CONFIG = ExtenderConfig(levels=(BLOCK, RACK, HOSTNAME_LEVEL))
RELAXED = ExtenderConfig(levels=CONFIG.levels, islands_required=False)


def gpus(layout: str) -> tuple[GpuDevice, ...]:
    built: list[GpuDevice] = []
    for island, word in enumerate(layout.split()):
        for mark in word:
            index = len(built)
            if mark == ".":
                built.append(GpuDevice(index, island))
            elif mark == "#":
                built.append(GpuDevice(index, island, free_milli=0))
            elif mark == "x":
                built.append(GpuDevice(index, island, healthy=False))
            elif mark.isdigit() and mark != "0":
                built.append(GpuDevice(index, island, free_milli=int(mark) * 100))
            else:
                raise ValueError(f"unknown GPU mark {mark!r} in {layout!r}")
    return tuple(built)


def node(
    layout: str = ".... ....",
    name: str = "n1",
    *,
    product: str = H100,
    rack: str | None = None,
    block: str | None = None,
    drain_after: datetime | None = None,
    unschedulable: bool = False,
) -> NodeState:
    domains = {HOSTNAME: name}
    if rack is not None:
        domains[RACK_LABEL] = rack
    if block is not None:
        domains[BLOCK_LABEL] = block
    return NodeState(
        name=NodeName(name),
        gpus=gpus(layout),
        product=product,
        labels=dict(domains),
        domains=domains,
        drain_after=drain_after,
        unschedulable=unschedulable,
    )


def demand(
    gpus: int = 0,
    milli: int = 0,
    *,
    gang: str | None = None,
    size: int = 4,
    min_count: int | None = None,
    topology: str | None = None,
    products: tuple[str, ...] = (),
    time_limit_s: int | None = None,
) -> PodDemand:
    spec = None
    if gang is not None:
        spec = GangSpec(GangId(gang), size, size if min_count is None else min_count)
    constraint = None
    if topology is not None:
        mode, _, level = topology.partition(":")
        constraint = TopologyConstraint(TopologyMode(mode), level)
    return PodDemand(
        gpus=gpus,
        gpu_milli=milli,
        gang=spec,
        topology=constraint,
        time_limit_s=time_limit_s,
        products=products,
    )


def pod(
    name: str = "p",
    want: PodDemand | None = None,
    *,
    node: str | None = None,
    indices: tuple[int, ...] = (),
    namespace: str = "ns",
) -> PodInfo:
    return PodInfo(
        key=pod_key(namespace, name),
        uid=f"uid-{name}",
        demand=want or PodDemand(gpus=1),
        node=NodeName(node) if node is not None else None,
        gpu_indices=indices,
        phase=PodPhase.RUNNING if node is not None else PodPhase.PENDING,
    )


def cluster(nodes: Iterable[NodeState], pods: Iterable[PodInfo] = ()) -> ClusterCache:
    """A cache holding ``nodes`` (their layouts are capacity) and ``pods``."""
    cache = ClusterCache(ManualClock(NOW))
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    return cache


def snapshot(nodes: Iterable[NodeState], pods: Iterable[PodInfo] = ()) -> Snapshot:
    return cluster(nodes, pods).snapshot()


def context(
    want: PodDemand,
    *,
    snap: Snapshot | None = None,
    config: ExtenderConfig = CONFIG,
    now: datetime = NOW,
    name: str = "p",
) -> PodContext:
    return build_context(snap or Snapshot(), pod(name, want), config, now)


def free_milli(state: NodeState) -> Mapping[int, int]:
    return {g.index: g.free_milli for g in state.gpus}


# ---------------------------------------------------------------- the notation itself


def test_layout_marks_make_the_gpus_they_say() -> None:
    built = gpus("#5x. ..")
    assert [(g.index, g.island, g.healthy, g.free_milli) for g in built] == [
        (0, 0, True, 0),
        (1, 0, True, 500),
        (2, 0, False, MILLI_PER_GPU),
        (3, 0, True, MILLI_PER_GPU),
        (4, 1, True, MILLI_PER_GPU),
        (5, 1, True, MILLI_PER_GPU),
    ]


def test_cluster_counts_bound_pods_against_the_layout() -> None:
    snap = snapshot(
        [node("....", rack="r1")],
        [pod("a", PodDemand(gpu_milli=300), node="n1", indices=(2,))],
    )
    assert free_milli(snap.nodes[NodeName("n1")]) == {0: 1000, 1: 1000, 2: 700, 3: 1000}
