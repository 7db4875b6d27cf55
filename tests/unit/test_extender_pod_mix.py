"""The pod mix the server learns from its cache: the same mix the placement simulation
learns from a trace, counted in batches so that requests keep being answered, and put in
use only when it moved enough to matter."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.model import (
    Allocation,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodPhase,
    pod_key,
)
from extender.config import (
    DEFAULT_POD_MIX,
    MixEntry,
    count_shapes,
    mix_distance,
    mix_from_counts,
    mix_from_demands,
)
from extender.learning import LiveConfig, learn_pod_mix, relearn_pod_mix
from extender.metrics import ExtenderMetrics
from extender.settings import ExtenderSettings

NODE = NodeState(
    name=NodeName("n1"),
    product="H100",
    cpu_milli=128_000,
    gpus=tuple(GpuDevice(i, 0) for i in range(8)),
)


def pod(
    name: str,
    *,
    gpus: int = 0,
    milli: int = 0,
    cpu: int = 12_000,
    products: tuple[str, ...] = (),
    node: str | None = None,
    indices: tuple[int, ...] = (),
) -> PodInfo:
    return PodInfo(
        key=pod_key("team-a", name),
        uid=f"uid-{name}",
        demand=PodDemand(gpus=gpus, gpu_milli=milli, cpu_milli=cpu, products=products),
        node=NodeName(node) if node else None,
        gpu_indices=indices,
        phase=PodPhase.RUNNING if node else PodPhase.PENDING,
    )


CLOCK = ManualClock()


def cache_with(*pods: PodInfo) -> ClusterCache:
    cache = ClusterCache(ManualClock())
    cache.replace_nodes([NODE])
    cache.replace_pods(pods)
    return cache


async def test_the_learned_mix_is_the_mix_of_every_pod_the_cache_holds() -> None:
    # bound, pending and assumed pods, of whole GPUs, shares, CPU and products
    pods = [
        pod("bound-0", gpus=1, node="n1", indices=(0,)),
        pod("bound-1", gpus=1, node="n1", indices=(1,)),
        pod("bound-2", gpus=2, cpu=24_000, node="n1", indices=(2, 3)),
        *(pod(f"pending-{i}", gpus=1) for i in range(6)),
        pod("share-0", milli=500, cpu=4_000, products=("NVIDIA-A100",)),
        pod("share-1", milli=470, cpu=4_000),
    ]
    cache = cache_with(*pods)
    assumed = pod("assumed", gpus=4, cpu=48_000)
    cache.assume(assumed, Allocation(NodeName("n1"), (4, 5, 6, 7), 1000))
    live, metrics = LiveConfig(ExtenderSettings().to_config()), ExtenderMetrics(cache.counters)

    assert await relearn_pod_mix(live, cache.snapshot(), metrics, CLOCK.now)

    expected = mix_from_demands(p.demand for p in [*pods, assumed])
    assert live.current.pod_mix == expected
    assert MixEntry(gpus=1, weight=8.0, cpu_milli=12_000) in expected
    assert live.mix_pods == len(pods) + 1
    exposition = metrics.exposition().decode()
    assert f"tessera_extender_pod_mix_sizes {float(len(expected))}" in exposition
    assert f"tessera_extender_pod_mix_pods {float(len(pods) + 1)}" in exposition


async def test_counting_in_batches_counts_every_pod_once() -> None:
    pods = [pod(f"p-{i}", gpus=1 + i % 3, cpu=1000 * (i % 5)) for i in range(100)]
    snapshot = cache_with(*pods).snapshot()
    counts = await learn_pod_mix(snapshot, batch=7)
    assert counts == Counter(count_shapes(p.demand for p in pods))
    assert mix_from_counts(counts) == mix_from_demands(p.demand for p in pods)


async def test_without_gpu_pods_the_built_in_mix_stays() -> None:
    cache = cache_with()
    live, metrics = LiveConfig(ExtenderSettings().to_config()), ExtenderMetrics(cache.counters)
    before = live.current

    assert not await relearn_pod_mix(live, cache.snapshot(), metrics, CLOCK.now)

    assert live.current is before
    assert before.pod_mix == DEFAULT_POD_MIX
    assert mix_from_demands([]) == DEFAULT_POD_MIX
    assert "tessera_extender_pod_mix_pods 0.0" in metrics.exposition().decode()


async def test_the_mix_is_replaced_only_when_it_moved_enough_to_matter() -> None:
    cache = cache_with(*(pod(f"one-{i}", gpus=1) for i in range(200)))
    live, metrics = LiveConfig(ExtenderSettings().to_config()), ExtenderMetrics(cache.counters)
    assert await relearn_pod_mix(live, cache.snapshot(), metrics, CLOCK.now)
    learned = live.current
    kept = live.memo

    # one more pod of a known size: the same decisions, so the node memos stay warm
    cache.upsert_pod(pod("one-more", gpus=1))
    assert not await relearn_pod_mix(live, cache.snapshot(), metrics, CLOCK.now)
    assert live.current is learned
    assert live.memo is kept

    # a quarter of the pods now ask for 8 GPUs: a new mix, with a decision cache of its own
    for i in range(70):
        cache.upsert_pod(pod(f"eight-{i}", gpus=8, cpu=96_000))
    assert await relearn_pod_mix(live, cache.snapshot(), metrics, CLOCK.now)
    now = live.current
    assert MixEntry(gpus=8, weight=70.0, cpu_milli=96_000) in now.pod_mix
    assert live.memo is not kept  # nothing decided under the old mix is read again
    assert now.levels == learned.levels
    assert now.weights == learned.weights
    assert "tessera_extender_pod_mix_changes_total 2.0" in metrics.exposition().decode()


demands = st.lists(
    st.builds(
        PodDemand,
        gpus=st.sampled_from([0, 0, 1, 2, 8]),
        gpu_milli=st.sampled_from([0, 250, 470, 1000]),
        cpu_milli=st.sampled_from([0, 4000, 12_000]),
        products=st.sampled_from([(), ("T4",)]),
    ),
    max_size=60,
)


@given(demands, st.integers(1, 20))
def test_counts_of_batches_add_up_to_the_count_of_the_whole(
    items: list[PodDemand], size: int
) -> None:
    total: Counter[tuple[int, int, int, tuple[str, ...]]] = Counter()
    for start in range(0, len(items), size):
        total.update(count_shapes(items[start : start + size]))
    assert total == Counter(count_shapes(items))
    assert mix_from_counts(total) == mix_from_demands(items)


@given(demands, demands)
def test_mix_distance_is_a_share_of_weight(a: list[PodDemand], b: list[PodDemand]) -> None:
    mix_a, mix_b = mix_from_demands(a), mix_from_demands(b)
    distance = mix_distance(mix_a, mix_b)
    assert 0.0 <= distance <= 1.0 + 1e-9
    assert abs(distance - mix_distance(mix_b, mix_a)) < 1e-9
    assert mix_distance(mix_a, mix_a) < 1e-9
    # the weights are shares: the same mix counted twice as often has not moved
    assert mix_distance(mix_from_demands(a), mix_from_demands(a + a)) < 1e-9
