"""The capacity figures on /metrics, as Prometheus parses them: GPUs per product, flavor
and state, the FGD fragmentation, the largest gang per topology level; counted from the
snapshot at each scrape, so a bind shows at the next one.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.model import Allocation, NodeName
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from extender.metrics import ExtenderMetrics
from tests.builders import BLOCK_LABEL, RACK_LABEL, node_json, pod_json

NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
SPOT = {"example.com/pool": "spot"}
CONFIG = ExtenderConfig(
    levels=(
        TopologyLevel("block", BLOCK_LABEL),
        TopologyLevel("rack", RACK_LABEL),
        HOSTNAME_LEVEL,
    )
)
FLAVORS = {
    "h100-spot": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", **SPOT},
    "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "anything": {},
}


Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: ExtenderMetrics) -> Scraped:
    found: Scraped = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Scraped, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def cluster() -> ClusterCache:
    cache = ClusterCache(ManualClock(NOW))
    nodes = [
        node_json("h-1", block="b1", rack="r1", islands="0-3,4-7"),
        node_json("h-2", block="b1", rack="r1", unhealthy="5"),
        node_json("h-3", block="b1", rack="r2"),
        node_json("h-4", block="b2", rack="r3", drain_after="2026-11-30T00:00:00Z"),
        node_json("s-1", block="b2", rack="r3", labels=SPOT),
        node_json("a-1", block="b2", rack="r4", product=A100),
    ]
    cache.replace_nodes(node_from_json(n, CONFIG.level_labels) for n in nodes)
    cache.replace_pods(
        [
            pod_from_json(pod_json("half", node="h-1", gpu_indices="0,1,2,3", gpus=4)),
            pod_from_json(pod_json("share", node="h-3", gpu_indices="7", gpu_milli=500)),
        ]
    )
    return cache


def test_gpus_per_product_flavor_and_state() -> None:
    cache = cluster()
    metrics = ExtenderMetrics(cache.counters)
    metrics.watch_capacity(cache.snapshot, lambda: CONFIG, lambda: FLAVORS)
    found = scrape(metrics)
    h100 = {"product": "NVIDIA-H100-80GB-HBM3", "flavor": "h100"}
    gpus = "tessera_extender_capacity_gpus"
    assert [value(found, gpus, **h100, state=s) for s in ("total", "allocated", "free")] == [
        32,
        5,
        26,
    ]
    assert value(found, gpus, **h100, state="unhealthy") == 1
    assert value(found, gpus, **h100, state="draining") == 8
    assert value(found, "tessera_extender_capacity_nodes", **h100) == 4
    spot = {"product": "NVIDIA-H100-80GB-HBM3", "flavor": "h100-spot"}
    assert value(found, gpus, **spot, state="free") == 8
    # no flavor's labels match an A100 node (the empty flavor says nothing)
    assert value(found, gpus, product=A100, flavor="", state="total") == 8


def test_largest_gang_per_level_counts_only_nodes_that_could_start_one_now() -> None:
    cache = cluster()
    metrics = ExtenderMetrics(cache.counters)
    metrics.watch_capacity(cache.snapshot, lambda: CONFIG, lambda: FLAVORS)
    found = scrape(metrics)
    gang = "tessera_extender_largest_gang_pods"
    h100 = "NVIDIA-H100-80GB-HBM3"
    # h-1 has 4 free, h-2 7 healthy, h-3 a share taken, h-4 draining: only s-1 starts an
    # 8-GPU pod
    assert {
        level: value(found, gang, product=h100, level=level)
        for level in ("block", "rack", "hostname", "cluster")
    } == {"block": 1, "rack": 1, "hostname": 1, "cluster": 1}
    assert value(found, gang, product=A100, level="cluster") == 1

    # the next scrape counts what the cache holds then
    cache.assume(
        pod_from_json(pod_json("late", gpus=8)), Allocation(NodeName("s-1"), tuple(range(8)), 1000)
    )
    again = scrape(metrics)
    assert value(again, gang, product=h100, level="cluster") == 0
    spot = {"product": h100, "flavor": "h100-spot"}
    assert value(again, "tessera_extender_capacity_gpus", **spot, state="allocated") == 8


def test_fragmentation_counts_free_gpus_the_pod_mix_cannot_use() -> None:
    cache = cluster()
    metrics = ExtenderMetrics(cache.counters)
    metrics.watch_capacity(cache.snapshot, lambda: CONFIG, lambda: FLAVORS)
    found = scrape(metrics)
    h100 = {"product": "NVIDIA-H100-80GB-HBM3", "flavor": "h100"}
    fragmented = value(found, "tessera_extender_gpu_fragmented_gpus", **h100)
    spot = value(
        found,
        "tessera_extender_gpu_fragmented_gpus",
        product="NVIDIA-H100-80GB-HBM3",
        flavor="h100-spot",
    )
    # an empty node strands nothing the mix asks for; half-used and sick nodes do
    assert spot == 0
    assert 0 < fragmented < 26


def test_sums_corrected_node_by_node_equal_a_count_from_scratch() -> None:
    """Scrape after scrape the sums are corrected for the nodes that changed, came or
    went; they must equal what a new collector counts from the same snapshot."""
    cache = cluster()
    kept = ExtenderMetrics(cache.counters)
    kept.watch_capacity(cache.snapshot, lambda: CONFIG, lambda: FLAVORS)
    scrape(kept)
    cache.assume(
        pod_from_json(pod_json("late", gpus=8)), Allocation(NodeName("s-1"), tuple(range(8)), 1000)
    )
    cache.delete_node(NodeName("a-1"))
    cache.upsert_node(node_from_json(node_json("h-5", block="b2", rack="r5"), CONFIG.level_labels))
    cache.upsert_node(node_from_json(node_json("h-2", block="b1", rack="r1"), CONFIG.level_labels))
    corrected = scrape(kept)
    fresh = ExtenderMetrics(cache.counters)
    fresh.watch_capacity(cache.snapshot, lambda: CONFIG, lambda: FLAVORS)
    counted = scrape(fresh)
    ours = (
        "tessera_extender_capacity",
        "tessera_extender_gpu_fragmented",
        "tessera_extender_largest",
    )
    assert {k: v for k, v in corrected.items() if k[0].startswith(ours)} == {
        k: v for k, v in counted.items() if k[0].startswith(ours)
    }
    assert not any(
        k[1] == (("flavor", ""), ("product", A100), ("state", "total")) for k in corrected
    )
    # s-1 is full now; h-5 came empty, h-2 came back with all eight GPUs healthy
    cluster_gang = value(
        corrected, "tessera_extender_largest_gang_pods", product=H100, level="cluster"
    )
    assert cluster_gang == 2
