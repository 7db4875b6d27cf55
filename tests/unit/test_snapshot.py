"""The snapshot's pure helpers: choosing GPUs for unannotated pods, applying allocations,
and the sharded read-only map that keeps snapshots cheap."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.model import Allocation, GpuDevice, NodeName, NodeState, PodDemand
from cluster.sharded import ShardedMap, batches
from cluster.snapshot import (
    NodeChangeLog,
    apply_allocation,
    indices_match,
    pick_gpus,
)


def node(
    free: tuple[int, ...] = (1000,) * 8,
    *,
    islands: int = 2,
    unhealthy: tuple[int, ...] = (),
    name: str = "n1",
) -> NodeState:
    per_island = max(1, len(free) // islands)
    return NodeState(
        name=NodeName(name),
        gpus=tuple(
            GpuDevice(index=i, island=i // per_island, healthy=i not in unhealthy, free_milli=f)
            for i, f in enumerate(free)
        ),
    )


WHOLE = 1000


@pytest.mark.parametrize(
    ("free", "unhealthy", "demand", "expected"),
    [
        pytest.param((WHOLE,) * 8, (), PodDemand(gpus=1), (0,), id="one-gpu-lowest-index"),
        pytest.param((WHOLE,) * 8, (), PodDemand(gpus=4), (0, 1, 2, 3), id="fills-first-island"),
        pytest.param(
            (0, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE),
            (),
            PodDemand(gpus=4),
            (4, 5, 6, 7),
            id="skips-island-that-cannot-hold-it",
        ),
        pytest.param(
            (0, WHOLE, WHOLE, WHOLE, 0, WHOLE, WHOLE, WHOLE),
            (),
            PodDemand(gpus=4),
            (1, 2, 3, 5),
            id="spans-islands-when-none-fits",
        ),
        pytest.param((WHOLE,) * 8, (0, 1), PodDemand(gpus=3), (4, 5, 6), id="unhealthy-never-used"),
        pytest.param(
            (500, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE, WHOLE),
            (),
            PodDemand(gpus=1),
            (1,),
            id="shared-gpu-is-not-whole-free",
        ),
        pytest.param((WHOLE,) * 8, (), PodDemand(gpus=9), None, id="too-many"),
        pytest.param(
            (WHOLE, 300, 600, 300, WHOLE, WHOLE, WHOLE, WHOLE),
            (),
            PodDemand(gpu_milli=250),
            (1,),
            id="share-tightest-lowest-index",
        ),
        pytest.param(
            (WHOLE, 300, 600, 300, WHOLE, WHOLE, WHOLE, WHOLE),
            (1,),
            PodDemand(gpu_milli=250),
            (3,),
            id="share-skips-unhealthy",
        ),
        pytest.param(
            (WHOLE, 300, 600, 300, WHOLE, WHOLE, WHOLE, WHOLE),
            (),
            PodDemand(gpu_milli=700),
            (0,),
            id="share-takes-whole-gpu-when-needed",
        ),
        pytest.param((100,) * 8, (), PodDemand(gpu_milli=200), None, id="share-no-room"),
        pytest.param((0,) * 8, (), PodDemand(), (), id="no-gpu-demand"),
    ],
)
def test_pick_gpus(
    free: tuple[int, ...],
    unhealthy: tuple[int, ...],
    demand: PodDemand,
    expected: tuple[int, ...] | None,
) -> None:
    assert pick_gpus(node(free, unhealthy=unhealthy), demand) == expected


@given(
    free=st.lists(st.sampled_from([0, 100, 500, 999, 1000]), min_size=1, max_size=8),
    gpus=st.integers(0, 8),
    milli=st.integers(1, 999),
    share=st.booleans(),
)
def test_pick_gpus_only_returns_gpus_that_hold_the_demand(
    free: list[int], gpus: int, milli: int, share: bool
) -> None:
    demand = PodDemand(gpu_milli=milli) if share else PodDemand(gpus=gpus)
    state = node(tuple(free), islands=2)
    picked = pick_gpus(state, demand)
    if picked is None:
        return
    assert indices_match(picked, demand) or not demand.uses_gpu
    for index in picked:
        gpu = state.gpus[index]
        assert gpu.healthy
        assert gpu.free_milli >= demand.milli_per_gpu


def test_apply_allocation_takes_and_gives_back() -> None:
    start = node()
    taken = apply_allocation(start, Allocation(NodeName("n1"), (2, 5), 300), 1)
    assert [g.free_milli for g in taken.gpus] == [1000, 1000, 700, 1000, 1000, 700, 1000, 1000]
    assert apply_allocation(taken, Allocation(NodeName("n1"), (2, 5), 300), -1) == start
    assert start.gpus[2].free_milli == 1000, "the input node is not modified"


def test_apply_allocation_clamps_and_rejects_mistakes() -> None:
    full = apply_allocation(node(), Allocation(NodeName("n1"), (0,), 1000), 1)
    assert apply_allocation(full, Allocation(NodeName("n1"), (0,), 500), 1).gpus[0].free_milli == 0
    assert (
        apply_allocation(node(), Allocation(NodeName("n1"), (0,), 500), -1).gpus[0].free_milli
        == 1000
    )
    with pytest.raises(ValueError, match="has no GPU 9"):
        apply_allocation(node(), Allocation(NodeName("n1"), (9,), 1000), 1)
    with pytest.raises(ValueError, match="not n1"):
        apply_allocation(node(), Allocation(NodeName("n2"), (0,), 1000), 1)
    with pytest.raises(ValueError, match="sign"):
        apply_allocation(node(), Allocation(NodeName("n1"), (0,), 1000), 0)


def test_sharded_map_reads_like_a_dict() -> None:
    items = {f"ns/pod-{i}": i for i in range(1000)}
    frozen = ShardedMap.of(items)
    assert len(frozen) == 1000
    assert dict(frozen) == items
    assert frozen["ns/pod-7"] == 7
    assert frozen.get("ns/missing") is None
    assert frozen.get("ns/missing", -1) == -1
    assert "ns/pod-999" in frozen
    not_a_key: object = 3
    assert not_a_key not in frozen
    assert list(frozen) == list(ShardedMap.of(items)), "iteration order does not depend on luck"
    with pytest.raises(KeyError):
        frozen["ns/missing"]
    # the views walk the shards, in the keys' order
    assert list(frozen.values()) == [frozen[key] for key in frozen]
    assert list(frozen.items()) == [(key, frozen[key]) for key in frozen]
    assert len(frozen.values()) == len(frozen.items()) == 1000
    assert ("ns/pod-3", 3) in frozen.items()
    assert ("ns/pod-3", 4) not in frozen.items()
    assert 999 in frozen.values()
    assert 1000 not in frozen.values()


@given(st.integers(0, 3000), st.integers(1, 500), st.booleans())
def test_batches_give_every_value_once_in_iteration_order(
    count: int, size: int, sharded: bool
) -> None:
    items = {f"ns/pod-{i}": i for i in range(count)}
    source: Mapping[str, int] = ShardedMap.of(items) if sharded else items
    parts = list(batches(source, size))
    assert [v for part in parts for v in part] == list(source.values())
    assert all(part for part in parts)
    # whole shards: a batch is cut at the first shard that reaches the size
    assert all(len(part) >= size for part in parts[:-1])
    if not sharded:
        assert all(len(part) == size for part in parts[:-1])


def test_a_batch_holds_at_least_one_value() -> None:
    with pytest.raises(ValueError, match="at least one"):
        next(batches({"a": 1}, 0))


# ---------------------------------------------------------------------------- change log


def test_the_change_log_names_the_nodes_changed_between_two_generations() -> None:
    log = NodeChangeLog()
    for generation, name in ((1, "a"), (1, "b"), (2, "c"), (4, "a")):
        log.record(generation, NodeName(name))
    assert log.since(0, 4) == ["a", "b", "c", "a"]
    assert log.since(1, 4) == ["c", "a"]
    assert log.since(1, 3) == ["c"]
    assert log.since(2, 3) == []
    assert log.since(4, 4) == []


def test_the_change_log_says_when_it_no_longer_reaches_back() -> None:
    log = NodeChangeLog(limit=4)
    for generation in range(1, 12):
        log.record(generation, NodeName(f"n{generation}"))
    assert log.since(0, 11) is None  # the oldest changes are forgotten
    recent = log.since(8, 11)
    assert recent == ["n9", "n10", "n11"]


def test_the_change_log_keeps_a_generation_whole() -> None:
    log = NodeChangeLog(limit=2)
    for name in "abcde":
        log.record(1, NodeName(name))  # one relist changed five nodes
    log.record(2, NodeName("f"))
    assert log.since(0, 2) is None
    assert log.since(1, 2) == ["f"]
