"""The cluster cache: what bind and the watch do to GPU accounting, as a user would see it
in a snapshot. Table tests for each behaviour, then a state machine that throws random
sequences of watch events, binds, forgets, expiries and relists at the cache and checks
that no GPU is ever over-allocated and that every snapshot equals a recomputation from
scratch."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cluster.cache import AllocationConflict, ClusterCache
from cluster.cache_records import ProductCounters
from cluster.clock import ManualClock
from cluster.convert.nodes import node_from_json
from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GangId,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodKey,
    PodPhase,
    Promise,
    pod_key,
)
from cluster.snapshot import Snapshot, indices_match, pick_gpus
from tests.builders import node_json

# ---------------------------------------------------------------------------- builders

NS = "team-a"
TTL = 30.0


def gpu_node(
    name: str = "n1",
    *,
    gpus: int = 8,
    islands: int = 2,
    unhealthy: Iterable[int] = (),
    product: str = "H100",
) -> NodeState:
    per_island = max(1, gpus // islands)
    bad = set(unhealthy)
    return NodeState(
        name=NodeName(name),
        product=product,
        gpus=tuple(GpuDevice(i, i // per_island, i not in bad) for i in range(gpus)),
    )


def gpu_pod(
    name: str,
    *,
    gpus: int = 0,
    milli: int = 0,
    node: str | None = None,
    indices: Iterable[int] = (),
    phase: PodPhase | None = None,
    gang: str | None = None,
    uid: str | None = None,
) -> PodInfo:
    spec = GangSpec(GangId(gang), 4, 4) if gang else None
    return PodInfo(
        key=pod_key(NS, name),
        uid=uid or f"uid-{name}",
        demand=PodDemand(gpus=gpus, gpu_milli=milli, gang=spec),
        node=NodeName(node) if node else None,
        gpu_indices=tuple(indices),
        phase=phase or (PodPhase.RUNNING if node else PodPhase.PENDING),
    )


def bound(pod: PodInfo, node: str, *indices: int) -> PodInfo:
    return replace(pod, node=NodeName(node), gpu_indices=indices, phase=PodPhase.RUNNING)


def at(node: str, *indices: int, milli: int = MILLI_PER_GPU) -> Allocation:
    return Allocation(NodeName(node), indices, milli)


def key(name: str) -> PodKey:
    return pod_key(NS, name)


def new_cache(*nodes: NodeState) -> tuple[ClusterCache, ManualClock]:
    clock = ManualClock()
    cache = ClusterCache(clock, assume_ttl_s=TTL)
    cache.replace_nodes(nodes or [gpu_node()])
    return cache, clock


def free(cache: ClusterCache, node: str = "n1") -> list[int]:
    return [gpu.free_milli for gpu in cache.snapshot().nodes[NodeName(node)].gpus]


FULL = MILLI_PER_GPU
ALL_FREE = [FULL] * 8

# ---------------------------------------------------------------------------- assume & co


def test_assume_takes_gpus_at_once_and_confirmation_keeps_them() -> None:
    cache, _ = new_cache()
    pod = gpu_pod("a", gpus=2, gang="team-a.job")
    cache.assume(pod, at("n1", 0, 1))
    snap = cache.snapshot()
    assert free(cache) == [0, 0, *ALL_FREE[2:]]
    assert snap.assumed == {key("a")}
    assert snap.pods[key("a")] == pod
    assert snap.gangs[GangId("team-a.job")] == (key("a"),)
    assert snap.gang_nodes(GangId("team-a.job")) == ("n1",)

    cache.upsert_pod(bound(pod, "n1", 0, 1))
    snap = cache.snapshot()
    assert snap.assumed == frozenset()
    assert snap.allocations[key("a")] == at("n1", 0, 1)
    assert free(cache) == [0, 0, *ALL_FREE[2:]]
    assert snap.pods[key("a")].node == "n1"


def test_watch_wins_when_it_shows_another_placement() -> None:
    cache, _ = new_cache(gpu_node("n1"), gpu_node("n2"))
    pod = gpu_pod("a", gpus=1)
    cache.assume(pod, at("n1", 0))
    cache.upsert_pod(bound(pod, "n2", 5))
    assert free(cache, "n1") == ALL_FREE
    assert free(cache, "n2")[5] == 0
    assert cache.snapshot().allocations[key("a")] == at("n2", 5)
    assert cache.counters().assumptions_confirmed == 1


def test_pending_watch_update_does_not_cancel_an_assumption() -> None:
    cache, _ = new_cache()
    pod = gpu_pod("a", milli=400)
    cache.assume(pod, at("n1", 3, milli=400))
    cache.upsert_pod(replace(pod, deleting=False))  # the watch catches up: still pending
    assert cache.snapshot().assumed == {key("a")}
    assert free(cache)[3] == 600


@pytest.mark.parametrize("seen_by_watch", [False, True])
def test_forget_frees_the_gpus(seen_by_watch: bool) -> None:
    cache, _ = new_cache()
    pod = gpu_pod("a", gpus=4)
    if seen_by_watch:
        cache.upsert_pod(pod)
    cache.assume(pod, at("n1", 4, 5, 6, 7))
    assert cache.forget(key("a")) is True
    assert cache.forget(key("a")) is False
    snap = cache.snapshot()
    assert free(cache) == ALL_FREE
    assert key("a") not in snap.allocations
    assert (key("a") in snap.pods) is seen_by_watch, "a pod the watch never showed is gone"


def test_expire_drops_only_assumptions_past_their_ttl() -> None:
    cache, clock = new_cache()
    cache.assume(gpu_pod("old", gpus=1), at("n1", 0))
    clock.advance(TTL / 2)
    cache.assume(gpu_pod("new", gpus=1), at("n1", 1))
    cache.assume(gpu_pod("confirmed", gpus=1), at("n1", 2))
    cache.upsert_pod(gpu_pod("confirmed", gpus=1, node="n1", indices=[2]))
    assert cache.expire() == []
    clock.advance(TTL / 2)
    assert cache.expire() == [key("old")]
    assert free(cache)[:3] == [FULL, 0, 0]
    clock.advance(TTL)
    assert cache.expire() == [key("new")]
    assert free(cache)[:3] == [FULL, FULL, 0], "a confirmed pod does not expire"
    assert cache.counters().assumptions_expired == 2


def test_reassuming_the_same_allocation_restarts_the_ttl() -> None:
    cache, clock = new_cache()
    pod = gpu_pod("a", gpus=1)
    cache.assume(pod, at("n1", 0))
    generation = cache.generation
    clock.advance(TTL - 1)
    cache.assume(pod, at("n1", 0))
    assert cache.generation == generation
    clock.advance(TTL - 1)
    assert cache.expire() == []


# ---------------------------------------------------------------------------- conflicts


def _hold_gpu0(cache: ClusterCache) -> None:
    cache.upsert_pod(gpu_pod("bound", milli=700, node="n1", indices=[0]))
    cache.assume(gpu_pod("assumed", milli=200), at("n1", 0, milli=200))


@pytest.mark.parametrize(
    ("allocation", "message"),
    [
        pytest.param(
            at("n1", 0, milli=200),
            "GPU 0 on node n1 has 100 milli free, pod team-a/new needs 200: held by "
            "team-a/assumed (200 milli, assumed), team-a/bound (700 milli, bound)",
            id="share-over-capacity",
        ),
        pytest.param(at("n2", 0, milli=50), "node n2 is not in the cache", id="unknown-node"),
        pytest.param(at("n1", 8, milli=50), "node n1 has no GPU 8", id="no-such-gpu"),
        pytest.param(at("n1", 6, milli=50), "GPU 6 on node n1 is unhealthy", id="unhealthy"),
    ],
)
def test_assume_refuses_to_over_allocate(allocation: Allocation, message: str) -> None:
    cache, _ = new_cache(gpu_node(unhealthy=[6]))
    _hold_gpu0(cache)
    before = cache.snapshot()
    with pytest.raises(AllocationConflict) as raised:
        cache.assume(gpu_pod("new", milli=allocation.milli_per_gpu), allocation)
    assert str(raised.value) == message
    assert cache.snapshot() is before, "a refused assumption changes nothing"
    assert cache.counters().assume_conflicts == 1


def test_whole_gpu_conflicts_with_any_share() -> None:
    cache, _ = new_cache()
    _hold_gpu0(cache)
    with pytest.raises(AllocationConflict, match="GPU 0 on node n1 has 100 milli free"):
        cache.assume(gpu_pod("big", gpus=2), at("n1", 1, 0))


def test_assume_refuses_a_pod_already_bound_or_assumed_elsewhere() -> None:
    cache, _ = new_cache()
    cache.upsert_pod(gpu_pod("a", gpus=1, node="n1", indices=[0]))
    with pytest.raises(AllocationConflict, match="team-a/a is already bound to node n1"):
        cache.assume(gpu_pod("a", gpus=1), at("n1", 1))
    cache.assume(gpu_pod("b", gpus=1), at("n1", 1))
    with pytest.raises(AllocationConflict, match=r"already assumed on node n1 GPU\(s\) 1;"):
        cache.assume(gpu_pod("b", gpus=1), at("n1", 2))


@pytest.mark.parametrize(
    ("pod", "allocation"),
    [
        pytest.param(gpu_pod("a", gpus=2), at("n1", 0), id="too-few-gpus"),
        pytest.param(gpu_pod("a", gpus=2), at("n1", 0, 0), id="duplicate-gpu"),
        pytest.param(gpu_pod("a", milli=300), at("n1", 0, milli=400), id="wrong-share"),
        pytest.param(gpu_pod("a", milli=300), at("n1", 0, 1, milli=300), id="share-on-two"),
        pytest.param(gpu_pod("a"), at("n1", 0), id="no-gpu-demand"),
    ],
)
def test_assume_rejects_an_allocation_that_does_not_fit_the_demand(
    pod: PodInfo, allocation: Allocation
) -> None:
    cache, _ = new_cache()
    with pytest.raises(ValueError, match="team-a/a"):
        cache.assume(pod, allocation)


# ---------------------------------------------------------------------------- the watch


def test_terminal_or_deleted_pods_free_their_gpus() -> None:
    cache, _ = new_cache()
    done = gpu_pod("done", gpus=1, node="n1", indices=[0])
    gone = gpu_pod("gone", gpus=1, node="n1", indices=[1])
    cache.replace_pods([done, gone])
    assert free(cache)[:2] == [0, 0]
    cache.upsert_pod(replace(done, phase=PodPhase.SUCCEEDED))
    cache.delete_pod(key("gone"))
    assert free(cache) == ALL_FREE
    assert len(cache.snapshot().pods) == 0


def test_a_deleting_pod_still_holds_its_gpus() -> None:
    cache, _ = new_cache()
    pod = gpu_pod("a", gpus=1, node="n1", indices=[0])
    cache.upsert_pod(replace(pod, deleting=True))
    assert free(cache)[0] == 0


def test_the_end_of_an_older_pod_keeps_the_assumption_of_its_successor() -> None:
    cache, _ = new_cache()
    cache.upsert_pod(gpu_pod("a", gpus=1, uid="old"))
    cache.assume(gpu_pod("a", gpus=1, uid="new"), at("n1", 0))
    cache.delete_pod(key("a"), uid="old")
    assert cache.snapshot().assumed == {key("a")}
    cache.upsert_pod(gpu_pod("a", gpus=1, uid="old", phase=PodPhase.FAILED))
    assert cache.snapshot().assumed == {key("a")}
    cache.delete_pod(key("a"), uid="new")
    assert cache.snapshot().assumed == frozenset()
    assert free(cache) == ALL_FREE


def test_pods_without_gpus_are_ignored() -> None:
    cache, _ = new_cache()
    generation = cache.generation
    cache.upsert_pod(gpu_pod("web", node="n1"))
    cache.replace_pods([gpu_pod("web", node="n1")])
    assert cache.generation == generation
    assert len(cache.snapshot().pods) == 0


def cpu_pod(name: str, cores: int, node: str | None = "n1", gpus: int = 0) -> PodInfo:
    pod = gpu_pod(name, node=node, gpus=gpus)
    return replace(pod, demand=replace(pod.demand, cpu_milli=cores * 1000))


def cpu_free(cache: ClusterCache, node: str = "n1") -> int:
    return cache.snapshot().nodes[NodeName(node)].cpu_free_milli // 1000


def test_the_cpu_of_every_pod_on_a_node_is_counted_gpus_or_not() -> None:
    cache, _ = new_cache(replace(gpu_node(), cpu_milli=64_000))
    cache.upsert_pod(bound(cpu_pod("train", 12, node=None, gpus=1), "n1", 0))
    cache.upsert_pod(cpu_pod("logs", 2))  # a daemon without GPUs
    cache.upsert_pod(cpu_pod("queued", 8, node=None))  # not bound: holds nothing
    assert cpu_free(cache) == 64 - 12 - 2
    # an assumed GPU pod counts at once, like its GPUs
    cache.assume(cpu_pod("next", 16, node=None, gpus=1), at("n1", 1))
    assert cpu_free(cache) == 64 - 12 - 2 - 16
    cache.upsert_pod(replace(cpu_pod("logs", 2), phase=PodPhase.SUCCEEDED))
    cache.delete_pod(key("train"))
    assert cpu_free(cache) == 64 - 16
    # a relist is the truth: the daemon is back, the assumption stays
    cache.replace_pods([cpu_pod("logs", 4)])
    assert cpu_free(cache) == 64 - 16 - 4
    cache.forget(key("next"))
    assert cpu_free(cache) == 64 - 4


def test_unchanged_watch_events_do_not_bump_the_generation() -> None:
    cache, _ = new_cache()
    pod = gpu_pod("a", gpus=1, node="n1", indices=[0])
    cache.upsert_pod(pod)
    snap = cache.snapshot()
    cache.upsert_pod(replace(pod))
    cache.upsert_node(gpu_node())
    assert cache.snapshot() is snap


@pytest.mark.parametrize(
    ("pods", "expected_free", "expected_indices"),
    [
        pytest.param(
            [gpu_pod("a", gpus=2, node="n1")], [0, 0, *ALL_FREE[2:]], {"a": (0, 1)}, id="whole"
        ),
        pytest.param(
            [
                gpu_pod("x", gpus=1, node="n1", indices=[1]),
                gpu_pod("a", gpus=4, node="n1"),
            ],
            [FULL, 0, FULL, FULL, 0, 0, 0, 0],
            {"a": (4, 5, 6, 7)},
            id="one-island-when-it-fits",
        ),
        pytest.param(
            [
                gpu_pod("x", milli=700, node="n1", indices=[5]),
                gpu_pod("a", milli=250, node="n1"),
            ],
            [*ALL_FREE[:5], 50, *ALL_FREE[6:]],
            {"a": (5,)},
            id="share-tightest",
        ),
        pytest.param(
            [gpu_pod("a", gpus=2, node="n1", indices=[1, 2, 3])],
            [0, 0, *ALL_FREE[2:]],
            {"a": (0, 1)},
            id="indices-that-do-not-fit-the-demand",
        ),
    ],
)
def test_pods_bound_without_usable_indices_get_gpus_picked(
    pods: list[PodInfo], expected_free: list[int], expected_indices: dict[str, tuple[int, ...]]
) -> None:
    cache, _ = new_cache()
    cache.replace_pods(pods)
    assert free(cache) == expected_free
    allocations = cache.snapshot().allocations
    assert {name: allocations[key(name)].indices for name in expected_indices} == expected_indices


def test_exact_indices_push_a_picked_pod_elsewhere() -> None:
    cache, _ = new_cache()
    cache.upsert_pod(gpu_pod("legacy", gpus=1, node="n1"))
    assert cache.snapshot().allocations[key("legacy")].indices == (0,)
    cache.upsert_pod(gpu_pod("exact", gpus=1, node="n1", indices=[0]))
    assert cache.snapshot().allocations[key("legacy")].indices == (1,)
    assert free(cache)[:3] == [0, 0, FULL]
    assert cache.problems == ()


def test_watch_over_commitment_is_counted_clamped_and_reported() -> None:
    cache, _ = new_cache()
    cache.upsert_pod(gpu_pod("a", gpus=1, node="n1", indices=[0]))
    cache.upsert_pod(gpu_pod("b", milli=500, node="n1", indices=[0]))
    assert free(cache)[0] == 0
    assert cache.problems == (
        "GPU 0 on node n1 is over-committed (1500 of 1000 milli): held by "
        "team-a/a (1000 milli, bound), team-a/b (500 milli, bound)",
    )
    with pytest.raises(AllocationConflict, match="GPU 0 on node n1 has 0 milli free"):
        cache.assume(gpu_pod("c", milli=1), at("n1", 0, milli=1))
    cache.delete_pod(key("a"))
    assert free(cache)[0] == 500, "removing one holder gives back exactly its share"
    assert not cache.problems


def test_unannotated_pod_on_a_full_node_is_still_counted() -> None:
    cache, _ = new_cache(gpu_node(gpus=2, islands=1))
    cache.replace_pods(
        [
            gpu_pod("a", gpus=2, node="n1", indices=[0, 1]),
            gpu_pod("late", gpus=1, node="n1"),
        ]
    )
    assert free(cache) == [0, 0]
    assert cache.snapshot().allocations[key("late")].indices == (0,)
    assert any("team-a/late is bound to node n1 without" in p for p in cache.problems)


def test_a_node_deleted_and_readded_keeps_its_pods_allocations() -> None:
    cache, _ = new_cache()
    cache.replace_pods(
        [gpu_pod("a", gpus=1, node="n1", indices=[3]), gpu_pod("b", milli=10, node="n1")]
    )
    before = cache.snapshot()
    cache.delete_node(NodeName("n1"))
    assert NodeName("n1") not in cache.snapshot().nodes
    assert cache.snapshot().allocations[key("a")] == at("n1", 3)
    cache.upsert_node(gpu_node())
    after = cache.snapshot()
    assert dict(after.nodes) == dict(before.nodes)
    assert dict(after.allocations) == dict(before.allocations)


def test_pods_bound_to_an_unknown_node_are_accounted_when_it_arrives() -> None:
    cache, _ = new_cache(gpu_node("n1"))
    cache.replace_pods(
        [gpu_pod("a", gpus=1, node="n9", indices=[2]), gpu_pod("b", gpus=1, node="n9")]
    )
    assert key("b") not in cache.snapshot().allocations
    cache.upsert_node(gpu_node("n9"))
    assert free(cache, "n9")[:3] == [0, FULL, 0]


# ---------------------------------------------------------------------------- relists


@pytest.mark.parametrize(
    ("relisted", "still_assumed", "expected_allocation"),
    [
        pytest.param([], True, at("n1", 0), id="absent-keeps-assumption"),
        pytest.param([gpu_pod("a", gpus=1)], True, at("n1", 0), id="pending-keeps-assumption"),
        pytest.param(
            [gpu_pod("a", gpus=1, node="n1", indices=[0])], False, at("n1", 0), id="bound-confirms"
        ),
        pytest.param(
            [gpu_pod("a", gpus=1, node="n1", indices=[6])], False, at("n1", 6), id="watch-wins"
        ),
        pytest.param(
            [gpu_pod("a", gpus=1, phase=PodPhase.FAILED)], False, None, id="finished-cancels"
        ),
        pytest.param(
            [gpu_pod("a", gpus=1, phase=PodPhase.FAILED, uid="older")],
            True,
            at("n1", 0),
            id="older-pod-finished-keeps-assumption",
        ),
    ],
)
def test_relist_keeps_assumptions_unless_contradicted(
    relisted: list[PodInfo], still_assumed: bool, expected_allocation: Allocation | None
) -> None:
    cache, _ = new_cache()
    cache.assume(gpu_pod("a", gpus=1), at("n1", 0))
    cache.replace_pods(relisted)
    snap = cache.snapshot()
    assert (key("a") in snap.assumed) is still_assumed
    assert snap.allocations.get(key("a")) == expected_allocation


def test_relist_replaces_the_watch_state() -> None:
    cache, _ = new_cache()
    cache.replace_pods(
        [gpu_pod("a", gpus=2, node="n1", indices=[0, 1]), gpu_pod("b", gpus=1, node="n1")]
    )
    cache.replace_pods([gpu_pod("b", gpus=1, node="n1"), gpu_pod("c", milli=500)])
    snap = cache.snapshot()
    assert set(snap.pods) == {key("b"), key("c")}
    assert set(snap.allocations) == {key("b")}
    assert sum(FULL - f for f in free(cache)) == FULL


def test_node_relist_deletes_unlisted_nodes() -> None:
    cache, _ = new_cache(gpu_node("n1"), gpu_node("n2"))
    cache.replace_nodes([gpu_node("n2", unhealthy=[0])])
    nodes = cache.snapshot().nodes
    assert set(nodes) == {"n2"}
    assert not nodes[NodeName("n2")].gpus[0].healthy


# ---------------------------------------------------------------------------- snapshots & rebuild


def test_snapshots_are_immutable_and_reused_until_something_changes() -> None:
    cache, _ = new_cache()
    first = cache.snapshot()
    assert cache.snapshot() is first
    cache.assume(gpu_pod("a", gpus=1), at("n1", 0))
    second = cache.snapshot()
    assert second.generation == first.generation + 1
    assert first.nodes[NodeName("n1")].gpus[0].free_milli == FULL
    assert key("a") not in first.pods
    assert first.assumed == frozenset()
    cache.forget(key("a"))
    assert second.nodes[NodeName("n1")].gpus[0].free_milli == 0
    assert key("a") in second.allocations


def test_reservations_promises_show_in_the_next_snapshot_and_log_only_their_nodes() -> None:
    cache, _ = new_cache(gpu_node("n1"), gpu_node("n2"), gpu_node("n3"))
    first = cache.snapshot()
    held = (Promise(datetime(2030, 1, 1, tzinfo=UTC), GangId("ns.big")),)
    cache.promise({NodeName("n1"): held, NodeName("n2"): held})
    second = cache.snapshot()
    assert dict(second.promises) == {NodeName("n1"): held, NodeName("n2"): held}
    assert not first.promises
    assert second.node_log is not None
    assert sorted(second.node_log.since(first.generation, second.generation) or []) == [
        "n1",
        "n2",
    ]
    cache.promise({NodeName("n1"): held, NodeName("n2"): held})  # the same: nothing new
    assert cache.snapshot() is second
    cache.promise({NodeName("n2"): held})  # released on n1 only
    third = cache.snapshot()
    assert third.node_log is not None
    assert third.node_log.since(second.generation, third.generation) == ["n1"]
    assert third.nodes is second.nodes  # no node object changed: only what is promised


def test_every_snapshot_keeps_its_own_pods_across_thousands_of_writes() -> None:
    cache, _ = new_cache(*(gpu_node(f"n{i}") for i in range(250)))
    taken: list[tuple[Snapshot, int]] = []
    for i in range(2000):
        pod = gpu_pod(f"p{i}", gpus=1)
        cache.assume(pod, at(f"n{i // 8}", i % 8))
        if i % 3 == 0:
            cache.forget(key(f"p{i - 3}"))
        if i % 97 == 0:
            taken.append((cache.snapshot(), i))
    for snap, i in taken:
        expected = {key(f"p{j}") for j in range(i + 1) if j % 3 != 0 or j > i - 3}
        assert set(snap.pods) == set(snap.allocations) == snap.assumed == expected
        assert len(snap.pods) == len(expected)


def test_unchanged_nodes_are_shared_between_snapshots() -> None:
    cache, _ = new_cache(gpu_node("n1"), gpu_node("n2"))
    first = cache.snapshot()
    cache.assume(gpu_pod("a", gpus=1), at("n1", 0))
    second = cache.snapshot()
    assert second.nodes[NodeName("n2")] is first.nodes[NodeName("n2")]
    assert second.nodes[NodeName("n1")] is not first.nodes[NodeName("n1")]


def test_rebuild_from_bound_pods_reproduces_the_live_allocation() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(3)]
    live, _ = new_cache(*nodes)
    placements = [
        (gpu_pod("w0", gpus=4, gang="team-a.train"), at("n0", 0, 1, 2, 3)),
        (gpu_pod("w1", gpus=4, gang="team-a.train"), at("n0", 4, 5, 6, 7)),
        (gpu_pod("s0", milli=300), at("n1", 2, milli=300)),
        (gpu_pod("s1", milli=600), at("n1", 2, milli=600)),
        (gpu_pod("one", gpus=1), at("n2", 7)),
    ]
    for pod, allocation in placements:
        live.assume(pod, allocation)
        live.upsert_pod(bound(pod, allocation.node, *allocation.indices))
    live.forget(key("never-assumed"))
    bound_pods = [live.snapshot().pods[pod.key] for pod, _ in placements]

    rebuilt, _ = new_cache(*nodes)
    rebuilt.replace_pods(reversed(bound_pods))
    assert dict(rebuilt.snapshot().nodes) == dict(live.snapshot().nodes)
    assert dict(rebuilt.snapshot().allocations) == dict(live.snapshot().allocations)
    assert dict(rebuilt.snapshot().gangs) == dict(live.snapshot().gangs)


def test_counters_per_product() -> None:
    cache, _ = new_cache(
        gpu_node("h", product="H100", unhealthy=[7]), gpu_node("a", product="A100")
    )
    cache.upsert_pod(gpu_pod("x", gpus=2, node="h", indices=[0, 1]))
    cache.assume(gpu_pod("y", milli=250), at("a", 0, milli=250))
    counters = cache.counters()
    assert (counters.nodes, counters.pods, counters.bound, counters.assumed) == (2, 2, 1, 1)
    assert counters.products == {
        "A100": ProductCounters(
            nodes=1, gpus=8, healthy_gpus=8, allocated_milli=250, whole_free_gpus=7
        ),
        "H100": ProductCounters(
            nodes=1, gpus=8, healthy_gpus=7, allocated_milli=2000, whole_free_gpus=5
        ),
    }
    cache.delete_node(NodeName("a"))
    assert set(cache.counters().products) == {"H100"}


# ---------------------------------------------------------------------------- state machine

NODE_SHAPES = {"n0": (8, 2), "n1": (4, 1), "n2": (2, 1)}
DEMANDS = {
    "p0": PodDemand(gpus=1, cpu_milli=4000),
    "p1": PodDemand(gpus=2, gang=GangSpec(GangId("team-a.g1"), 3, 3)),
    "p2": PodDemand(gpus=4, cpu_milli=16000),
    "p3": PodDemand(gpu_milli=300, cpu_milli=1500),
    "p4": PodDemand(gpu_milli=600, gang=GangSpec(GangId("team-a.g1"), 3, 3)),
    "p5": PodDemand(gpu_milli=500),
    "p6": PodDemand(gpus=1, gang=GangSpec(GangId("team-a.g2"), 2, 2)),
    "p7": PodDemand(gpus=8),
    "p8": PodDemand(gpu_milli=250, gang=GangSpec(GangId("team-a.g2"), 2, 2)),
}
node_names = st.sampled_from(sorted(NODE_SHAPES))
pod_names = st.sampled_from(sorted(DEMANDS))
CPU_ONLY = ("c0", "c1")
"""Pods without GPUs: the cache keeps only their node and CPU."""


def over_committed(snap: Snapshot) -> set[tuple[NodeName, int]]:
    used: dict[tuple[NodeName, int], int] = {}
    for allocation in snap.allocations.values():
        for index in allocation.indices:
            slot = (allocation.node, index)
            used[slot] = used.get(slot, 0) + allocation.milli_per_gpu
    return {slot for slot, milli in used.items() if milli > MILLI_PER_GPU}


class CacheMachine(RuleBasedStateMachine):
    """A model of the cache's inputs (nodes and pods as the watch reports them, and the
    live assumptions) next to the real cache."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.cache = ClusterCache(self.clock, assume_ttl_s=TTL)
        self.nodes: dict[NodeName, NodeState] = {}
        self.watch: dict[PodKey, PodInfo] = {}
        self.assumed: dict[PodKey, tuple[PodInfo, Allocation, float]] = {}
        self.incarnation: dict[str, int] = dict.fromkeys(DEMANDS, 0)
        self.foreign = False
        self.kept: tuple[Snapshot, dict[str, object]] | None = None
        self.logged: Snapshot | None = None
        self.cpu_only: dict[PodKey, PodInfo] = {}

    # -------------------------------------------------------------- helpers
    def pod(
        self, name: str, node: NodeName | None = None, indices: tuple[int, ...] = ()
    ) -> PodInfo:
        return PodInfo(
            key=key(name),
            uid=f"{name}-{self.incarnation[name]}",
            demand=DEMANDS[name],
            node=node,
            gpu_indices=indices,
            phase=PodPhase.RUNNING if node else PodPhase.PENDING,
        )

    def watch_bound(self, pod: PodInfo) -> None:
        self.watch[pod.key] = pod
        self.assumed.pop(pod.key, None)
        self.cache.upsert_pod(pod)

    def free_choice(self, name: str, node: NodeName) -> tuple[int, ...] | None:
        state = self.cache.snapshot().nodes.get(node)
        return None if state is None else pick_gpus(state, DEMANDS[name])

    # -------------------------------------------------------------- nodes
    @rule(name=node_names, unhealthy=st.sets(st.integers(0, 7), max_size=2))
    def upsert_node(self, name: str, unhealthy: set[int]) -> None:
        gpus, islands = NODE_SHAPES[name]
        node = gpu_node(name, gpus=gpus, islands=islands, unhealthy=unhealthy)
        self.nodes[node.name] = node
        self.cache.upsert_node(node)

    @rule(name=node_names)
    def delete_node(self, name: str) -> None:
        self.nodes.pop(NodeName(name), None)
        self.cache.delete_node(NodeName(name))

    @rule(drop=st.sets(node_names))
    def relist_nodes(self, drop: set[str]) -> None:
        self.nodes = {n: s for n, s in self.nodes.items() if n not in drop}
        self.cache.replace_nodes(self.nodes.values())

    # -------------------------------------------------------------- bind
    @rule(name=pod_names, node=node_names, data=st.data())
    def assume(self, name: str, node: NodeName, data: st.DataObject) -> None:
        demand = DEMANDS[name]
        snap = self.cache.snapshot()
        state = snap.nodes.get(node)
        chosen = self.free_choice(name, node) if data.draw(st.booleans()) else None
        if chosen is None:
            width = NODE_SHAPES[node][0] + 1  # one index past the end, on purpose
            count = demand.gpus or 1
            chosen = tuple(
                data.draw(st.lists(st.integers(0, width - 1), min_size=count, max_size=count))
            )
        allocation = Allocation(node, chosen, demand.milli_per_gpu)
        pod = self.pod(name)
        if not indices_match(chosen, demand):
            with pytest.raises(ValueError, match="does not match"):
                self.cache.assume(pod, allocation)
            return
        watched = self.watch.get(pod.key)
        previous = self.assumed.get(pod.key)
        gpus = {} if state is None else {g.index: g for g in state.gpus}
        if watched is not None and watched.node is not None:
            feasible = False
        elif previous is not None:
            feasible = previous[1] == allocation
        else:
            feasible = state is not None and all(
                i in gpus and gpus[i].healthy and gpus[i].free_milli >= demand.milli_per_gpu
                for i in chosen
            )
        if feasible:
            self.cache.assume(pod, allocation)
            self.assumed[pod.key] = (
                previous[0] if previous else pod,
                allocation,
                self.clock.monotonic() + TTL,
            )
        else:
            with pytest.raises(AllocationConflict):
                self.cache.assume(pod, allocation)
        assert over_committed(self.cache.snapshot()) <= over_committed(snap)

    @rule(name=pod_names)
    def forget(self, name: str) -> None:
        snap = self.cache.snapshot()
        assert self.cache.forget(key(name)) is (self.assumed.pop(key(name), None) is not None)
        assert over_committed(self.cache.snapshot()) <= over_committed(snap)

    @rule(seconds=st.sampled_from([0.0, 1.0, TTL / 2, TTL]))
    def tick_and_expire(self, seconds: float) -> None:
        snap = self.cache.snapshot()
        self.clock.advance(seconds)
        now = self.clock.monotonic()
        due = {k for k, (_, _, deadline) in self.assumed.items() if deadline <= now}
        assert set(self.cache.expire()) == due
        for k in due:
            del self.assumed[k]
        assert over_committed(self.cache.snapshot()) <= over_committed(snap)

    # -------------------------------------------------------------- the watch
    @rule(name=pod_names)
    def watch_pending(self, name: str) -> None:
        current = self.watch.get(key(name))
        if current is not None and current.node is not None:
            return  # a bound pod never goes back to pending
        pod = self.pod(name)
        self.watch[pod.key] = pod
        self.cache.upsert_pod(pod)

    @precondition(lambda self: bool(self.assumed))
    @rule(data=st.data(), how=st.sampled_from(["same", "no-indices", "elsewhere"]))
    def watch_confirms(self, data: st.DataObject, how: str) -> None:
        k = data.draw(st.sampled_from(sorted(self.assumed)))
        name = k.split("/")[1]
        _, allocation, _ = self.assumed[k]
        node, indices = allocation.node, allocation.indices
        if how == "no-indices":
            indices = ()
        elif how == "elsewhere":
            other = data.draw(node_names)
            choice = self.free_choice(name, NodeName(other))
            if choice is not None:
                node, indices = NodeName(other), choice
        self.watch_bound(self.pod(name, node, indices))

    @rule(name=pod_names, node=node_names, with_indices=st.booleans())
    def watch_binds_unassumed(self, name: str, node: NodeName, with_indices: bool) -> None:
        current = self.watch.get(key(name))
        if key(name) in self.assumed or (current is not None and current.node is not None):
            return
        choice = self.free_choice(name, node)
        if choice is None:
            return
        self.watch_bound(self.pod(name, node, choice if with_indices else ()))

    @rule(name=pod_names, node=node_names, data=st.data())
    def foreign_scheduler_binds(self, name: str, node: NodeName, data: st.DataObject) -> None:
        demand = DEMANDS[name]
        size = NODE_SHAPES[node][0]
        count = min(demand.gpus or 1, size)
        indices = data.draw(st.permutations(range(size)))[:count]
        self.foreign = True
        self.watch_bound(self.pod(name, node, tuple(indices)))

    @rule(name=pod_names, finished=st.booleans())
    def pod_ends(self, name: str, finished: bool) -> None:
        pod = self.pod(name)
        if finished:
            self.cache.upsert_pod(replace(pod, phase=PodPhase.SUCCEEDED))
        else:
            self.cache.delete_pod(pod.key, uid=pod.uid)
        self.watch.pop(pod.key, None)
        self.assumed.pop(pod.key, None)
        self.incarnation[name] += 1

    @rule(name=pod_names)
    def stale_delete_of_older_pod(self, name: str) -> None:
        if self.incarnation[name] == 0:
            return
        stale_uid = f"{name}-{self.incarnation[name] - 1}"
        self.cache.delete_pod(key(name), uid=stale_uid)
        self.watch.pop(key(name), None)
        assumed = self.assumed.get(key(name))
        if assumed is not None and assumed[0].uid == stale_uid:
            del self.assumed[key(name)]

    @rule(gone=st.sets(pod_names), finished=st.sets(pod_names))
    def relist_pods(self, gone: set[str], finished: set[str]) -> None:
        listed: list[PodInfo] = []
        for k, pod in list(self.watch.items()):
            name = k.split("/")[1]
            if name in gone or name in finished:
                del self.watch[k]
            else:
                listed.append(pod)
                if pod.node is not None:
                    self.assumed.pop(k, None)
        for name in sorted(finished):
            listed.append(replace(self.pod(name), phase=PodPhase.FAILED))
            self.assumed.pop(key(name), None)
        listed.extend(self.cpu_only.values())
        self.cache.replace_pods(listed)

    @rule(
        name=st.sampled_from(CPU_ONLY),
        node=st.none() | node_names,
        cores=st.integers(0, 8),
        end=st.sampled_from(["running", "finished", "deleted"]),
    )
    def cpu_only_pod(self, name: str, node: str | None, cores: int, end: str) -> None:
        pod = replace(
            gpu_pod(name, node=node),
            demand=PodDemand(cpu_milli=cores * 1000),
        )
        if end == "deleted":
            self.cpu_only.pop(pod.key, None)
            self.cache.delete_pod(pod.key)
        elif end == "finished":
            self.cpu_only.pop(pod.key, None)
            self.cache.upsert_pod(replace(pod, phase=PodPhase.SUCCEEDED))
        else:
            self.cpu_only[pod.key] = pod
            self.cache.upsert_pod(pod)

    @rule()
    def non_gpu_pod_is_ignored(self) -> None:
        generation = self.cache.generation
        self.cache.upsert_pod(gpu_pod("web", node="n0"))
        assert self.cache.generation == generation

    # -------------------------------------------------------------- invariants
    @invariant()
    def snapshot_equals_recomputation(self) -> None:  # noqa: C901 - the whole oracle
        snap = self.cache.snapshot()
        assert self.cache.snapshot() is snap

        pods = dict(self.watch)
        for k, (pod, _, _) in self.assumed.items():
            pods.setdefault(k, pod)
        assert dict(snap.pods) == pods
        assert snap.assumed == frozenset(self.assumed)

        exact: dict[PodKey, Allocation] = {k: a for k, (_, a, _) in self.assumed.items()}
        picked: dict[PodKey, NodeName] = {}
        for k, pod in self.watch.items():
            if pod.node is None:
                continue
            if indices_match(pod.gpu_indices, pod.demand):
                exact[k] = Allocation(pod.node, pod.gpu_indices, pod.demand.milli_per_gpu)
            else:
                picked[k] = pod.node
        allocations = dict(snap.allocations)
        assert set(allocations) <= set(exact) | set(picked)
        for k, allocation in exact.items():
            assert allocations[k] == allocation
        for k, node in picked.items():
            found = allocations.get(k)
            if found is None:
                assert node not in self.nodes, f"{k} bound to a known node has no GPUs"
                continue
            assert found.node == node
            assert len(set(found.indices)) == len(found.indices)
            if node in self.nodes:  # on a node too small for the pod, all of it is counted
                needed = min(pods[k].demand.gpus or 1, len(self.nodes[node].gpus))
                assert len(found.indices) == needed

        assert set(snap.nodes) == set(self.nodes)
        for name, base in self.nodes.items():
            used = dict.fromkeys(range(len(base.gpus)), 0)
            for allocation in allocations.values():
                if allocation.node == name:
                    for index in allocation.indices:
                        used[index] += allocation.milli_per_gpu
            # CPU: of every pod holding GPUs here, and of the pods without GPUs bound here
            cpu = sum(pods[k].demand.cpu_milli for k, a in allocations.items() if a.node == name)
            cpu += sum(p.demand.cpu_milli for p in self.cpu_only.values() if p.node == name)
            expected = replace(
                base,
                gpus=tuple(
                    replace(g, free_milli=max(0, g.free_milli - used[g.index])) for g in base.gpus
                ),
                cpu_requested_milli=cpu,
            )
            assert snap.nodes[name] == expected

        gangs: dict[GangId, list[PodKey]] = {}
        for k in allocations:
            gang = pods[k].demand.gang
            if gang is not None:
                gangs.setdefault(gang.id, []).append(k)
        assert dict(snap.gangs) == {g: tuple(sorted(members)) for g, members in gangs.items()}

    @invariant()
    def never_over_allocated_unless_the_watch_says_so(self) -> None:
        if not self.foreign:
            assert over_committed(self.cache.snapshot()) == set()
            assert self.cache.problems == ()

    @invariant()
    def old_snapshots_never_change(self) -> None:
        if self.kept is not None:
            snap, contents = self.kept
            assert dict(snap.nodes) == contents["nodes"]
            assert dict(snap.pods) == contents["pods"]
            assert dict(snap.allocations) == contents["allocations"]
            assert dict(snap.gangs) == contents["gangs"]
        snap = self.cache.snapshot()
        self.kept = (
            snap,
            {
                "nodes": dict(snap.nodes),
                "pods": dict(snap.pods),
                "allocations": dict(snap.allocations),
                "gangs": dict(snap.gangs),
            },
        )

    @invariant()
    def the_change_log_names_every_changed_node(self) -> None:
        snap = self.cache.snapshot()
        before, self.logged = self.logged, snap
        if before is None:
            return
        assert snap.node_log is not None
        named = snap.node_log.since(before.generation, snap.generation)
        assert named is not None  # a short run never outgrows the log
        changed = {
            name
            for name in before.nodes.keys() | snap.nodes.keys()
            if before.nodes.get(name) is not snap.nodes.get(name)
        }
        assert changed <= set(named)

    @invariant()
    def rebuild_from_bound_pods_matches(self) -> None:
        snap = self.cache.snapshot()
        rebuilt = ClusterCache(ManualClock(), assume_ttl_s=TTL)
        rebuilt.replace_nodes(self.nodes.values())
        rebuilt.replace_pods([*self.watch.values(), *self.cpu_only.values()])
        rebuilt_allocations = rebuilt.snapshot().allocations
        for k, pod in self.watch.items():
            if pod.node is not None and indices_match(pod.gpu_indices, pod.demand):
                assert rebuilt_allocations[k] == snap.allocations[k]
        exact_only = not self.assumed and all(
            p.node is None or indices_match(p.gpu_indices, p.demand) for p in self.watch.values()
        )
        if exact_only:
            assert dict(rebuilt.snapshot().nodes) == dict(snap.nodes)

    @invariant()
    def counters_agree(self) -> None:
        snap = self.cache.snapshot()
        counters = self.cache.counters()
        assert counters.nodes == len(snap.nodes)
        assert counters.pods == len(snap.pods)
        assert counters.assumed == len(snap.assumed)
        assert counters.bound == len(snap.allocations) - len(snap.assumed)
        allocated = sum(MILLI_PER_GPU - g.free_milli for n in snap.nodes.values() for g in n.gpus)
        assert sum(p.allocated_milli for p in counters.products.values()) == allocated


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_node_advertising_a_negative_gpu_count_has_none_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="cluster.cache")
    cache = ClusterCache(ManualClock())
    broken = node_from_json(node_json("n1", gpus="-1"))
    cache.replace_nodes([broken])
    cache.upsert_node(broken)  # the watch repeats it: nothing new to say
    cache.replace_nodes([broken])  # a relist
    assert cache.snapshot().nodes[NodeName("n1")].gpus == ()
    (line,) = [r for r in caplog.records if r.name == "cluster.cache"]
    assert line.message == "node values ignored"
    fields = line.tessera_fields  # type: ignore[attr-defined]
    assert fields["node"] == "n1"
    assert fields["problems"] == [
        "status.allocatable['nvidia.com/gpu'] is '-1': a count cannot be negative; "
        "the node offers no GPUs"
    ]
