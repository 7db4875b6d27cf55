"""A plan with the memo its caller keeps (``extender.holds.PlanMemo``: the pods holding
GPUs per node and the gang members carried shard by shard, outlooks and domain totals
carried from one plan to the next) decides what a plan from nothing decides, on random
changes to a cache."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.model import GangId, NodeName, PodDemand, PodInfo, pod_key
from cluster.snapshot import Snapshot
from extender.holdings import GangPodsMemo, HoldingsMemo, holdings
from extender.holds import Hold, HoldRules, PlanMemo, next_holds
from extender.outlooks import Holding
from extender.reservations import ReservationRules, gang_demands
from tests.unit.test_extender_builders import CONFIG, NOW, cluster, demand, node, pod

NODES = ("n1", "n2", "n3", "n4")
RACKS = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}
RULES = HoldRules(ReservationRules(max_reservations=2))

Step = tuple[int, str | None, int, int | None, int | None, int]
Held = dict[NodeName, tuple[Holding, ...]]
# one step: (pod number, node or None to delete it, GPU, time limit, started minutes ago,
# minutes the clock moves on)
_STEP = st.tuples(
    st.integers(0, 11),
    st.sampled_from((*NODES, None)),
    st.integers(0, 7),
    st.sampled_from((None, 600, 3600)),
    st.sampled_from((None, 0, 5, 50)),
    st.sampled_from((0, 0, 1, 20)),
)


def _bound(number: int, where: str, gpu: int, limit: int | None, ago: int | None) -> PodInfo:
    started = None if ago is None else NOW - timedelta(minutes=ago)
    want = PodDemand(gpus=1, cpu_milli=1000, time_limit_s=limit)
    placed = pod(f"p{number}", want, node=where, indices=(gpu,) if number % 3 else ())
    return replace(placed, started_at=started)


def _waiting(name: str, members: int) -> list[PodInfo]:
    want = demand(8, gang=f"ns.{name}", size=members, topology="required:rack", time_limit_s=900)
    return [replace(pod(f"{name}-{i}", want), created_at=NOW) for i in range(members)]


def _unchanged_reused(before: Held, after: Held) -> bool:
    return all(after[n] is before[n] for n in after.keys() & before.keys() if after[n] == before[n])


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=25))
def test_carried_holdings_are_the_snapshots_holdings(steps: list[Step]) -> None:
    cache = cluster([node(name=n, rack=RACKS[n]) for n in NODES])
    memo, now = HoldingsMemo(), NOW
    last: Held = {}
    for number, where, gpu, limit, ago, later in steps:
        if where is None:
            cache.delete_pod(pod_key("ns", f"p{number}"))
        else:
            cache.upsert_pod(_bound(number, where, gpu, limit, ago))
        now += timedelta(minutes=later)
        snapshot = cache.snapshot()
        found = memo.holdings(snapshot, now)
        assert found == holdings(snapshot, now)
        assert _unchanged_reused(last, found)  # what the outlook memo finds by identity
        last = found


def test_a_snapshot_made_by_hand_is_read_whole() -> None:
    bound = _bound(1, "n1", 0, 600, 5)
    snapshot = Snapshot(
        nodes={n.name: n for n in [node(name="n1")]},
        pods={bound.key: bound},
        allocations=cluster([node(name="n1")], [bound]).snapshot().allocations,
    )
    plain = replace(snapshot, pods=dict(snapshot.pods), allocations=dict(snapshot.allocations))
    assert HoldingsMemo().holdings(plain, NOW) == holdings(plain, NOW) != {}


@settings(max_examples=40, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=15), st.sampled_from((1, 2)))
def test_a_plan_with_the_memo_decides_as_one_without(steps: list[Step], members: int) -> None:
    cache = cluster(
        [node(name=n, rack=RACKS[n]) for n in NODES],
        [*_waiting("big", members), *_waiting("small", 1)],
    )
    memo = PlanMemo(CONFIG)
    held: dict[GangId, Hold] = {}
    now = NOW
    for number, where, gpu, limit, ago, later in steps:
        if where is None:
            cache.delete_pod(pod_key("ns", f"p{number}"))
        else:
            cache.upsert_pod(_bound(number, where, gpu, limit, ago))
        now += timedelta(minutes=later)
        snapshot = cache.snapshot()
        fresh = next_holds(snapshot, CONFIG, RULES, held, now)
        assert next_holds(snapshot, CONFIG, RULES, held, now, memo=memo) == fresh
        held = dict(fresh.held)


# (pod number, gang number, node, or "" pending, or None deleted)
_MEMBER = st.tuples(st.integers(0, 40), st.integers(0, 3), st.sampled_from((*NODES, "", None)))


@settings(max_examples=60, deadline=None)
@given(st.lists(_MEMBER, min_size=1, max_size=30))
def test_carried_gang_members_are_the_snapshots(steps: list[tuple[int, int, str | None]]) -> None:
    cache = cluster([node(name=n, rack=RACKS[n]) for n in NODES])
    memo = GangPodsMemo()
    for number, gang, where in steps:
        key = pod_key("ns", f"m{number}")
        if where is None:
            cache.delete_pod(key)
        else:
            want = demand(1, gang=f"ns.g{gang}", size=2 + number % 2, time_limit_s=600)
            cache.upsert_pod(pod(f"m{number}", want, node=where or None))
        snapshot = cache.snapshot()
        specs, unbound = memo.members(snapshot.pods)
        members = [(k, p) for k, p in snapshot.pods.items() if p.demand.gang is not None]
        firsts: dict[GangId, object] = {}
        for _, p in members:
            assert p.demand.gang is not None
            firsts.setdefault(p.demand.gang.id, p.demand.gang)
        assert specs == firsts
        assert list(specs) == list(firsts)
        assert unbound == [(k, p) for k, p in members if p.node is None]
        assert gang_demands(snapshot, CONFIG, NOW, unbound=unbound) == gang_demands(
            snapshot, CONFIG, NOW
        )
