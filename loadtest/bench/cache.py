"""Micro-benchmark of the cluster cache at fleet scale (a measurement, not a test).

Layer: ROOT (a script: reads argv, writes a temporary file, prints a table). Must not be
imported by the servers or run by pytest. ``python -m loadtest.bench.cache [--nodes
5000 --pods 150000]`` writes a ``v1 List`` of GPU nodes and GPU pods (deterministic
seed), then goes the way a standalone extender goes: ``cluster.files.load_objects``,
``cluster.convert``, ``ClusterCache``; and prints how long each step takes and how much
memory the process holds.

The fleet: 8-GPU nodes in two NVLink islands (``0-3,4-7``), block/rack/hostname labels
and GPU Feature Discovery labels, a few unhealthy GPUs and drain windows. The pods:
whole-GPU pods are mostly 1-GPU with some 2/4/8-GPU gang members, and the rest are
shares; pods are bound node by node until the fleet is nearly full (with
``tessera.dev/gpu-indices``), and the remainder is pending. 40,000 GPUs cannot hold
150,000 mostly-whole-GPU pods, so shares are common enough that most pods are bound:
a bound pod costs the cache more (an allocation, per-GPU accounting) than a pending one.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cluster import jsonio
from cluster import labels as keys
from cluster.cache import ClusterCache
from cluster.clock import Clock, SystemClock
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.files import load_objects
from cluster.model import Allocation, NodeState, PodInfo
from cluster.snapshot import pick_gpus

BLOCK_LABEL: Final = "topology.tessera.dev/block"
RACK_LABEL: Final = "topology.tessera.dev/rack"
LEVELS: Final = (BLOCK_LABEL, RACK_LABEL, keys.HOSTNAME)
NODES_PER_RACK: Final = 16
RACKS_PER_BLOCK: Final = 16
GPUS_PER_NODE: Final = 8
ISLANDS: Final = ((0, 1, 2, 3), (4, 5, 6, 7))
FULL: Final = 1000
BOUND_SHARE: Final = 0.75
"""Pods bound before the fleet is full: the rest of the 150,000 wait as pending."""

# (weight, whole GPUs, share milli). 4- and 8-GPU pods come as gangs of GANG_SIZE. About
# 320 milli per pod on average, so that 75 % of 150,000 pods fit on 40,000 GPUs.
SHAPES: Final = (
    (60.0, 0, 100),
    (15.0, 0, 200),
    (10.0, 1, 0),
    (1.0, 2, 0),
    (0.25, 4, 0),
    (0.1, 8, 0),
)
GANG_SIZE: Final = 4
NAMESPACES: Final = 40


# ---------------------------------------------------------------------------- the fleet file


def _node(i: int, rng: random.Random) -> dict[str, Any]:
    rack, block = i // NODES_PER_RACK, i // (NODES_PER_RACK * RACKS_PER_BLOCK)
    name = f"gpu-b{block:02d}-r{rack:03d}-n{i:05d}"
    annotations = {keys.NVLINK_ISLANDS: "0-3,4-7"}
    if rng.random() < 0.01:
        annotations[keys.UNHEALTHY_GPUS] = str(rng.randrange(GPUS_PER_NODE))
    if rng.random() < 0.02:
        annotations[keys.DRAIN_AFTER] = "2026-12-01T02:00:00Z"
    h100 = i % 5 != 0
    resources = {
        "cpu": "192",
        "memory": "2063291072Ki",
        "ephemeral-storage": "7499362940Ki",
        keys.GPU_RESOURCE: str(GPUS_PER_NODE),
        "pods": "110",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "labels": {
                keys.HOSTNAME: name,
                RACK_LABEL: f"r{rack:03d}",
                BLOCK_LABEL: f"b{block:02d}",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge" if h100 else "p4d.24xlarge",
                keys.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3" if h100 else "NVIDIA-A100-SXM4-80GB",
                keys.GFD_MEMORY: "81559",
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
            },
            "annotations": annotations,
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{i:017x}"},
        "status": {"capacity": resources, "allocatable": resources},
    }


@dataclass(slots=True)
class _Shape:
    gpus: int
    milli: int


def _shapes(rng: random.Random) -> Iterator[_Shape]:
    """Pod shapes in arrival order; gang members arrive together."""
    weights = [w for w, _, _ in SHAPES]
    while True:
        _, gpus, milli = rng.choices(SHAPES, weights)[0]
        for _ in range(GANG_SIZE if gpus >= 4 else 1):
            yield _Shape(gpus, milli)


def _place(free: list[int], shape: _Shape) -> tuple[int, ...] | None:
    """First fit on one node: whole GPUs from one island when possible, shares packed."""
    if shape.gpus:
        whole = [i for i, f in enumerate(free) if f == FULL]
        for island in ISLANDS:
            inside = [i for i in whole if i in island]
            if len(inside) >= shape.gpus:
                return tuple(inside[: shape.gpus])
        return tuple(whole[: shape.gpus]) if len(whole) >= shape.gpus else None
    fits = [i for i, f in enumerate(free) if shape.milli <= f < FULL]
    fits = fits or [i for i, f in enumerate(free) if f >= shape.milli]
    return (fits[0],) if fits else None


def _pod(
    number: int, shape: _Shape, node: str | None, indices: tuple[int, ...], gang: int
) -> dict[str, Any]:
    # a gang's members are one job's pods: one namespace, one gang id
    namespace = f"team-{(gang if gang >= 0 else number) % NAMESPACES:02d}"
    job = f"job-{gang if gang >= 0 else number}"
    name = f"{job}-{number:06d}"
    resource_name = keys.GPU_RESOURCE if shape.gpus else keys.GPU_MILLI_RESOURCE
    amount = str(shape.gpus or shape.milli)
    labels = {keys.QUEUE_NAME: "research", keys.JOB_NAME: job}
    annotations: dict[str, str] = {}
    if gang >= 0:
        labels[keys.GANG] = f"{namespace}.{job}"
        annotations[keys.GANG_SIZE] = str(GANG_SIZE)
        annotations[keys.TOPOLOGY] = "required:" + RACK_LABEL
    if node is not None:
        annotations[keys.GPU_INDICES] = ",".join(map(str, indices))
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"10000000-0000-4000-8000-{number:012d}",
            # kube-scheduler's pods carry one, and /prioritize reads a pod /filter decoded
            # by it: without it the cycle would decode every pod twice
            "resourceVersion": str(1_000 + number),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "activeDeadlineSeconds": 86400,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:2026.01",
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", resource_name: amount},
                        "limits": {resource_name: amount},
                    },
                }
            ],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def write_fleet(
    path: Path,
    nodes: int,
    pods: int,
    seed: int,
    *,
    label_node: Callable[[dict[str, Any]], None] | None = None,
    on_pending: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[int, int]:
    """Write the fleet as a ``v1 List``, one item at a time so that the benchmark's peak
    memory is the loader's, not the generator's. Returns (bound, pending) pod counts.

    ``label_node`` may add labels to each node before it is written (another benchmark
    adds a topology level); ``on_pending`` sees every pending pod as it is written.
    """
    rng = random.Random(seed)
    bound = 0
    with path.open("wb") as out:
        out.write(b'{"apiVersion":"v1","kind":"List","items":[')
        node_dicts = [_node(i, rng) for i in range(nodes)]
        if label_node is not None:
            for node in node_dicts:
                label_node(node)
        for i, node in enumerate(node_dicts):
            out.write((b"," if i else b"") + jsonio.dumps(node))
        shapes = _shapes(rng)
        target = int(pods * BOUND_SHARE)
        number = 0
        for node in node_dicts:
            free = [FULL] * GPUS_PER_NODE
            misses = 0
            while misses < 3 and bound < target:
                shape = next(shapes)
                indices = _place(free, shape)
                if indices is None:
                    misses += 1
                    continue
                for index in indices:
                    free[index] -= shape.milli or FULL
                member = number // GANG_SIZE if shape.gpus >= 4 else -1
                item = _pod(number, shape, node["metadata"]["name"], indices, member)
                out.write(b"," + jsonio.dumps(item))
                number += 1
                bound += 1
        while number < pods:
            shape = next(shapes)
            member = number // GANG_SIZE if shape.gpus >= 4 else -1
            item = _pod(number, shape, None, (), member)
            if on_pending is not None:
                on_pending(item)
            out.write(b"," + jsonio.dumps(item))
            number += 1
        out.write(b"]}")
    return bound, number - bound


# ---------------------------------------------------------------------------- measuring


def rss_now_mib() -> float:
    """Resident memory right now (VmRSS), which can shrink; 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_peak_mib() -> float:
    """The process's high-water mark (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(slots=True)
class _Table:
    rows: list[tuple[str, str]]

    def add(self, label: str, value: str) -> None:
        self.rows.append((label, value))

    def render(self) -> str:
        width = max(len(label) for label, _ in self.rows)
        return "\n".join(f"  {label:<{width}}  {value}" for label, value in self.rows)


@dataclass(slots=True)
class _Lap:
    wall: float
    cpu: float

    def __truediv__(self, n: int) -> _Lap:
        return _Lap(self.wall / n, self.cpu / n)

    def __add__(self, other: _Lap) -> _Lap:
        return _Lap(self.wall + other.wall, self.cpu + other.cpu)

    def ms(self) -> str:
        return f"{self.wall * 1e3:>10,.1f} ms   (CPU {self.cpu * 1e3:,.1f} ms)"

    def us(self) -> str:
        return f"{self.wall * 1e6:>10,.2f} µs   (CPU {self.cpu * 1e6:,.2f} µs)"


class _Stopwatch:
    """Wall time from the injected clock, next to this process's CPU time.

    The clock rather than time.perf_counter: on Linux both read CLOCK_MONOTONIC with
    nanosecond resolution, and the Clock keeps the project's one seam for time (ruff bans
    time.monotonic outside cluster/clock.py). CPU time (time.process_time) is shown too
    because on a shared machine the wall figure includes waiting for a core.
    """

    __slots__ = ("_clock", "_cpu", "_wall")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._wall = clock.monotonic()
        self._cpu = time.process_time()

    def lap(self) -> _Lap:
        """Time since the previous lap (or since the start), and start the next one."""
        wall, cpu = self._clock.monotonic(), time.process_time()
        lap = _Lap(wall - self._wall, cpu - self._cpu)
        self._wall, self._cpu = wall, cpu
        return lap


def _bind_cycle(cache: ClusterCache, pending: list[PodInfo], clock: Clock, table: _Table) -> None:
    """The bind path, 2,000 times: assume a pending pod where ``pick_gpus`` puts it on
    some node, take a snapshot (the next /filter's), forget. Shows what one change costs
    with copy-on-write: one node rebuilt, one shard of each pod map copied."""
    names = list(cache.snapshot().nodes)
    binds = 0
    assume = snapshot = forget = _Lap(0.0, 0.0)
    for i, pod in enumerate(pending[:2000]):
        node = cache.snapshot().nodes[names[(i * 7919) % len(names)]]
        indices = pick_gpus(node, pod.demand)
        if not indices:
            continue
        allocation = Allocation(node.name, indices, pod.demand.milli_per_gpu)
        watch = _Stopwatch(clock)
        cache.assume(pod, allocation)
        assume += watch.lap()
        cache.snapshot()
        snapshot += watch.lap()
        cache.forget(pod.key)
        forget += watch.lap()
        binds += 1
    if binds:
        table.add(f"assume (mean of {binds:,})", (assume / binds).us())
        table.add("snapshot after one change", (snapshot / binds).us())
        table.add("forget", (forget / binds).us())


def _convert(objects: list[dict[str, Any]]) -> tuple[list[NodeState], list[PodInfo]]:
    nodes = [node_from_json(obj, LEVELS) for obj in objects if obj.get("kind") == "Node"]
    pods = [pod_from_json(obj) for obj in objects if obj.get("kind") == "Pod"]
    return nodes, pods


def _heap_by_owner(path: Path) -> tuple[float, float]:
    """Python heap (tracemalloc, MiB) held by the converted records and by the cache's
    own structures, from a second, untimed load of the same file. RSS cannot say this:
    the allocator keeps the arenas of the freed JSON dicts."""
    tracemalloc.start()
    try:
        objects = load_objects(path)
        node_states, pod_infos = _convert(objects)
        del objects
        gc.collect()
        records = tracemalloc.get_traced_memory()[0]
        cache = ClusterCache(SystemClock())
        cache.replace_nodes(node_states)
        cache.replace_pods(pod_infos)
        cache.snapshot()
        gc.collect()
        structures = tracemalloc.get_traced_memory()[0] - records
    finally:
        tracemalloc.stop()
    return records / 2**20, structures / 2**20


def run(nodes: int, pods: int, seed: int, clock: Clock, *, by_owner: bool = True) -> str:
    table = _Table([])
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        path = Path(tmp) / "fleet.json"
        watch = _Stopwatch(clock)
        bound, pending = write_fleet(path, nodes, pods, seed)
        written = watch.lap()
        size = path.stat().st_size
        table.add("fleet", f"{nodes:,} nodes x {GPUS_PER_NODE} GPUs, {pods:,} GPU pods")
        table.add("pods bound / pending", f"{bound:,} / {pending:,}")
        table.add("file (v1 List JSON)", f"{size / 2**20:,.1f} MiB")
        table.add("write the file", written.ms())
        gc.collect()
        rss = [("RSS before parse", rss_now_mib())]

        watch = _Stopwatch(clock)
        objects = load_objects(path)
        table.add("parse (load_objects)", watch.lap().ms())
        rss.append(("RSS after parse", rss_now_mib()))
        node_states, pod_infos = _convert(objects)
        table.add("convert (node_from_json, pod_from_json)", watch.lap().ms())
        del objects
        gc.collect()
        rss.append(("RSS after convert (JSON dicts freed)", rss_now_mib()))

        cache = ClusterCache(clock)
        watch = _Stopwatch(clock)
        cache.replace_nodes(node_states)
        cache.replace_pods(pod_infos)
        table.add("cache build (replace_nodes + replace_pods)", watch.lap().ms())
        cache.replace_pods(pod_infos)
        table.add("relist, nothing changed (replace_pods)", watch.lap().ms())
        pending_pods = [pod for pod in pod_infos if pod.node is None]
        del node_states, pod_infos
        gc.collect()
        rss.append(("RSS with the cache built", rss_now_mib()))

        _snapshots(cache, clock, table)
        _bind_cycle(cache, pending_pods, clock, table)
        _counters(cache, table)
        for label, mib in rss:
            table.add(label, f"{mib:,.0f} MiB")
        table.add("RSS peak (getrusage)", f"{rss_peak_mib():,.0f} MiB")
        if by_owner:
            del cache, pending_pods
            gc.collect()
            records, structures = _heap_by_owner(path)
            table.add("heap: converted records (tracemalloc)", f"{records:,.0f} MiB")
            table.add("heap: cache structures (tracemalloc)", f"{structures:,.0f} MiB")
    return table.render()


def _snapshots(cache: ClusterCache, clock: Clock, table: _Table) -> None:
    watch = _Stopwatch(clock)
    cache.snapshot()
    table.add("snapshot, first", watch.lap().us())
    repeats = 100_000
    for _ in range(repeats):
        cache.snapshot()
    table.add("snapshot, repeat (same generation)", (watch.lap() / repeats).us())


def _counters(cache: ClusterCache, table: _Table) -> None:
    """What the cache holds, per GPU product."""
    counters = cache.counters()
    table.add("", "")
    table.add(
        "cache: nodes / pods / bound",
        f"{counters.nodes:,} / {counters.pods:,} / {counters.bound:,}",
    )
    for product, totals in counters.products.items():
        allocated = totals.allocated_milli / FULL
        table.add(f"  {product}", f"{totals.gpus:,} GPUs, {allocated:,.1f} allocated")
    table.add("", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.cache",
        description="Load a fleet from a file into the cluster cache and time each step.",
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-heap",
        action="store_true",
        help="skip the second, untimed load that splits the heap by owner (tracemalloc)",
    )
    args = parser.parse_args(argv)
    print(run(args.nodes, args.pods, args.seed, SystemClock(), by_owner=not args.no_heap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
