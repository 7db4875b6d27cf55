"""What the extender remembers between requests (``extender.memo.DecisionCache``) never
changes a decision:

* a node answers the same verdict and score with a warm cache as with a fresh one,
  whatever pod shapes and configurations filled the caches before;
* answers shared by node state (``DecisionCache.by_state``) are the ones a fresh cache
  gives each node on its own, and nodes in one state do share them;
* a gang's room per domain, carried from one snapshot to the next as nodes change, is
  the room counted afresh on the same cluster;
* a gang member answered by name (its nodes' domains, a lone pod's answers of its
  shape) gets the verdicts of judging each node whole;
* a changed node (an allocation, a cordon, a GPU gone unhealthy) is a new object, which
  no answer kept by node object is for, so the change shows at once;
* a node stays a plain frozen value whatever was decided on it, a cache answers only
  for its own config, and every table stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.model import (
    Allocation,
    GangId,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    PodKey,
    Promise,
)
from cluster.snapshot import Snapshot, apply_allocation, pick_gpus
from extender.config import ExtenderConfig
from extender.context import FIT, PodContext, Unfit
from extender.decide import filter_nodes, score_nodes
from extender.filters import KEPT_JUDGES, judge_facts, node_facts, run_filters
from extender.gangs import build_context, prepare_gang_shape
from extender.gpus import choose_gpus
from extender.memo import DecisionCache
from extender.scores import score_node
from tests.unit.test_extender_builders import (
    CONFIG,
    NOW,
    RELAXED,
    cluster,
    demand,
    node,
    pod,
    snapshot,
)
from tests.unit.test_extender_invariants import CONFIGS, DEMANDS, TOPOLOGIES, nodes


def _node(*free: int) -> NodeState:
    gpus = tuple(GpuDevice(i, i // 4, True, milli) for i, milli in enumerate(free))
    return NodeState(name=NodeName("n1"), gpus=gpus, product="NVIDIA-H100-80GB-HBM3")


def _decide(node: NodeState, demand: PodDemand, memo: DecisionCache) -> tuple[object, float]:
    ctx = build_context(snapshot([node]), pod("p", demand), memo.config, NOW, memo)
    return run_filters(ctx, node), score_node(ctx, node)


def _fresh(node: NodeState, demand: PodDemand, config: ExtenderConfig) -> tuple[object, float]:
    """The decision with a cache that has seen nothing (and a fresh copy of the node)."""
    return _decide(replace(node), demand, DecisionCache(config))


class _Caches:
    """One warm decision cache per config, as the server keeps one per config in use."""

    def __init__(self) -> None:
        self._by_config: dict[int, tuple[ExtenderConfig, DecisionCache]] = {}

    def __call__(self, config: ExtenderConfig) -> DecisionCache:
        kept = self._by_config.setdefault(id(config), (config, DecisionCache(config)))
        return kept[1]


@settings(max_examples=200)
@given(
    node=nodes(),
    demand=DEMANDS,
    config=CONFIGS,
    before=st.lists(st.tuples(DEMANDS, CONFIGS), max_size=6),
)
def test_a_warm_cache_decides_as_a_fresh_one(
    node: NodeState,
    demand: PodDemand,
    config: ExtenderConfig,
    before: list[tuple[PodDemand, ExtenderConfig]],
) -> None:
    warm = _Caches()
    for other, other_config in before:
        _decide(node, other, warm(other_config))
    _decide(node, demand, warm(config))  # and once with this very shape
    assert _decide(node, demand, warm(config)) == _fresh(node, demand, config)


def test_an_allocation_is_seen_at_once() -> None:
    memo = DecisionCache(CONFIG)
    node = _node(1000, 1000, 1000, 1000, 0, 0, 0, 0)
    demand = PodDemand(gpus=4)
    assert _decide(node, demand, memo)[0] is FIT
    after = apply_allocation(node, Allocation(node.name, (0,), 1000), 1)
    verdict, _score = _decide(after, demand, memo)
    assert isinstance(verdict, Unfit)
    assert "3 healthy GPUs free in island 0, pod needs 4" in verdict.reason
    assert _decide(node, demand, memo)[0] is FIT  # the old object still answers for itself


def test_a_cordon_or_a_sick_gpu_is_seen_at_once() -> None:
    memo = DecisionCache(CONFIG)
    node = _node(*[1000] * 8)
    demand = PodDemand(gpus=4)
    assert _decide(node, demand, memo)[0] is FIT
    cordoned = _decide(replace(node, unschedulable=True), demand, memo)[0]
    assert isinstance(cordoned, Unfit)
    assert "cordoned" in cordoned.reason
    sick = replace(node, gpus=tuple(replace(g, healthy=g.index >= 6) for g in node.gpus))
    verdict = _decide(sick, demand, memo)[0]
    assert isinstance(verdict, Unfit)
    assert "2 healthy GPUs" in verdict.reason


def test_the_configuration_is_part_of_what_is_remembered() -> None:
    node = _node(1000, 1000, 0, 0, 1000, 1000, 0, 0)  # 2 + 2 free in two islands
    demand = PodDemand(gpus=3)
    strict = _decide(node, demand, DecisionCache(CONFIG))[0]
    relaxed = _decide(node, demand, DecisionCache(RELAXED))[0]
    assert isinstance(strict, Unfit)
    assert relaxed is FIT


def test_a_cache_answers_only_for_its_own_config() -> None:
    with pytest.raises(ValueError, match="config it was made for"):
        PodContext(PodKey("ns/p"), PodDemand(gpus=1), NOW, RELAXED, memo=DecisionCache(CONFIG))
    # an equal config is not enough: the server makes a cache with each config it uses
    with pytest.raises(ValueError, match="config it was made for"):
        build_context(
            snapshot([]), pod("p", PodDemand(gpus=1)), replace(CONFIG), NOW, DecisionCache(CONFIG)
        )


def test_a_node_stays_a_plain_value_whatever_was_decided_on_it() -> None:
    node = _node(1000, 1000)
    fresh = replace(node)
    memo = DecisionCache(CONFIG)
    _decide(node, PodDemand(gpus=1), memo)
    assert memo.sizes()["per_node"] > 0  # what was kept is in the cache, not the node
    assert node == fresh
    assert repr(node) == repr(fresh)
    assert not hasattr(node, "__dict__")  # nowhere to keep anything on it


def test_the_cache_stays_bounded() -> None:
    node = _node(*[1000] * 8)
    memo = DecisionCache(CONFIG)
    for milli in range(1, 400):
        _decide(node, PodDemand(gpu_milli=milli), memo)
    assert memo.sizes()["per_node"] <= 64


def test_a_gang_sees_room_taken_since_its_last_request() -> None:
    """The first member's room per rack is kept in the cache; a node that lost its free
    island is a new object, so the rack's room shrinks at once."""
    nodes = [node(".... ....", "a", rack="r1"), node(".... ....", "b", rack="r2")]
    member = demand(4, gang="ns.job", size=2, topology="required:rack")
    first = snapshot(nodes)
    memo = DecisionCache(CONFIG)
    verdict = run_filters(
        build_context(first, pod("m0", member), CONFIG, NOW, memo), first.nodes[NodeName("a")]
    )
    assert verdict is FIT  # r1 holds two 4-GPU members on node a
    taken = cluster(nodes, [pod("other", demand(4), node="a", indices=(0, 1, 2, 3))]).snapshot()
    later = run_filters(
        build_context(taken, pod("m0", member), CONFIG, NOW, memo), taken.nodes[NodeName("a")]
    )
    assert isinstance(later, Unfit)
    assert "the node's rack has room for 1 member" in later.reason


@settings(max_examples=100)
@given(
    group=st.lists(nodes(), min_size=1, max_size=6),
    demands=st.lists(DEMANDS, min_size=1, max_size=4),
    config=CONFIGS,
)
def test_answers_shared_by_state_are_each_nodes_own(
    group: list[NodeState], demands: list[PodDemand], config: ExtenderConfig
) -> None:
    warm = DecisionCache(config)
    for each in group:
        for want in demands:
            _decide(each, want, warm)
    for each in group:
        for want in demands:
            # fresh node objects: their answers come from by_state, or afresh
            assert _decide(replace(each), want, warm) == _fresh(each, want, config)


def test_nodes_in_one_state_share_their_answers() -> None:
    memo = DecisionCache(CONFIG)
    first = _node(1000, 1000, 0, 0, 1000, 0, 0, 0)
    _decide(first, PodDemand(gpus=2), memo)
    shared = memo.sizes()["by_state"]
    twin = replace(first, name=NodeName("n2"))
    assert _decide(twin, PodDemand(gpus=2), memo) == _decide(first, PodDemand(gpus=2), memo)
    assert memo.sizes()["by_state"] == shared  # the twin computed nothing new
    other = _node(1000, 1000, 1000, 0, 1000, 0, 0, 0)
    _decide(other, PodDemand(gpus=2), memo)
    assert memo.sizes()["by_state"] > shared


def test_a_draining_node_kept_by_name_is_judged_at_each_requests_time() -> None:
    """The answer kept for a draining node holds its own verdicts, never the time: each
    request's clock and time limit decide again, whatever an earlier request found."""
    memo = DecisionCache(CONFIG)
    drains = NOW + timedelta(hours=2)
    snap = cluster(
        [node(".... ....", "draining", drain_after=drains), node(".... ....", "steady")]
    ).snapshot()
    names = ["draining", "steady"]

    def fits(limit_s: int | None, at: datetime = NOW) -> tuple[str, ...]:
        want = pod("p", demand(1, time_limit_s=limit_s))
        return filter_nodes(snap, want, names, CONFIG, at, memo=memo).fits

    for _ in range(2):  # the second round reads every answer from what the first kept
        assert fits(3600) == ("draining", "steady")
        assert fits(3 * 3600) == ("steady",)
        assert fits(None) == ("steady",)
        assert fits(3600, NOW + timedelta(minutes=90)) == ("steady",)
        assert fits(3600) == ("draining", "steady")


_RACKS = ("r1", "r1", "r2", "r2", "r3", "r3")
_STEPS = st.lists(
    st.tuples(st.sampled_from(["take", "take", "give", "cordon", "drain"]), st.integers(0, 5)),
    max_size=12,
)


_TEAM_MEMBER = demand(2, gang="ns.team", size=3, topology="required:rack")
_GANG_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "join", "join", "give", "cordon", "drain"]), st.integers(0, 5)
    ),
    max_size=12,
)
"""Steps of ``_changing_cluster`` that also place members of ``_TEAM_MEMBER``'s gang."""


def _rooms_of(snap: Snapshot, memo: DecisionCache) -> tuple[object, object]:
    member = pod("m0", demand(4, gang="ns.job", size=2, topology="required:rack"))
    gang = build_context(snap, member, memo.config, NOW, memo).gang
    assert gang is not None
    rooms = gang.rooms
    if rooms is None:
        return None, None
    fits = {**rooms.fits_on, **rooms.draining_fits}
    return {v: (rooms.free[v], rooms.total[v]) for v in rooms.free}, fits


_LAYOUTS = st.lists(
    st.sampled_from([".... ....", "xx.. ....", "xxxx xx..", "xxxx xxxx", "x... ...."]),
    min_size=6,
    max_size=6,
)


def _changing_cluster(
    layouts: list[str], steps: list[tuple[str, int]]
) -> Iterator[tuple[Snapshot, Snapshot]]:
    """After each step (a 2-GPU pod placed or ended, a member of ``_TEAM_MEMBER``'s gang
    placed, a node cordoned or draining): the snapshot of one cache that saw every step,
    and a fresh cache's of the same cluster."""
    base = [
        node(layout, f"n{i}", rack=rack)
        for i, (layout, rack) in enumerate(zip(layouts, _RACKS, strict=True))
    ]
    live = cluster(base)
    placed: list[PodInfo] = []
    current = {n.name: n for n in base}
    yield live.snapshot(), live.snapshot()
    for number, (action, index) in enumerate(steps):
        name = NodeName(f"n{index}")
        if action in ("take", "join"):
            state = live.snapshot().nodes[name]
            indices = pick_gpus(state, PodDemand(gpus=2))
            if indices is not None:
                shape = demand(2) if action == "take" else _TEAM_MEMBER
                taker = pod(f"{action}{number}", shape, node=name, indices=indices)
                live.upsert_pod(taker)
                placed.append(taker)
        elif action == "give" and placed:
            gone = placed.pop(index % len(placed))
            live.delete_pod(gone.key)
        else:
            changed = (
                replace(current[name], unschedulable=True)
                if action == "cordon"
                else replace(current[name], drain_after=NOW)
            )
            current[name] = changed
            live.upsert_node(changed)
        yield live.snapshot(), cluster(current.values(), placed).snapshot()


@settings(max_examples=60, deadline=None)
@given(layouts=_LAYOUTS, steps=_STEPS)
def test_room_counts_carried_across_snapshots_match_a_fresh_count(
    layouts: list[str], steps: list[tuple[str, int]]
) -> None:
    memo = DecisionCache(CONFIG)
    for live, fresh in _changing_cluster(layouts, steps):
        assert _rooms_of(live, memo) == _rooms_of(fresh, DecisionCache(CONFIG))


@settings(max_examples=30, deadline=None)
@given(layouts=_LAYOUTS, steps=_GANG_STEPS)
def test_a_gang_shape_prepared_before_any_request_is_what_a_request_finds(
    layouts: list[str], steps: list[tuple[str, int]]
) -> None:
    memo = DecisionCache(CONFIG)
    changes = _changing_cluster(layouts, steps)
    first, _ = next(changes)
    # a gang of the asking members' shape: what the server finds among its pods
    shape = demand(2, gang="other.job", size=3, topology="required:rack")
    assert prepare_gang_shape(first, shape, memo, NOW)
    assert memo.sizes()["carried"] == 1  # the room, kept as a request keeps it
    assert _rooms_of(first, memo) == _rooms_of(first, DecisionCache(CONFIG))
    names = [f"n{i}" for i in range(6)] + ["gone"]
    for live, fresh in [(first, first), *changes]:
        assert _rooms_of(live, memo) == _rooms_of(fresh, DecisionCache(CONFIG))
        # the first member, then followers once a member of the gang is placed
        want = pod("asking", _TEAM_MEMBER)
        assert filter_nodes(live, want, names, CONFIG, NOW, memo=memo) == filter_nodes(
            fresh, want, names, CONFIG, NOW
        )


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(demand(4), id="no-gang"),
        pytest.param(demand(4, gang="ns.job", size=2), id="gang-without-topology"),
        pytest.param(
            demand(4, gang="ns.job", size=2, topology="required:zone"), id="level-not-configured"
        ),
    ],
)
def test_a_shape_without_a_known_level_has_nothing_to_prepare(shape: PodDemand) -> None:
    memo = DecisionCache(CONFIG)
    snap = cluster([node(".... ....", "n0", rack="r0")]).snapshot()
    assert not prepare_gang_shape(snap, shape, memo, NOW)
    assert not any(memo.sizes().values())


@settings(max_examples=60, deadline=None)
@given(
    layouts=_LAYOUTS,
    steps=_STEPS,
    shapes=st.lists(st.sampled_from([demand(1), demand(2), demand(4), demand(0, 300)]), min_size=1),
)
def test_answers_kept_by_name_across_snapshots_match_fresh_ones(
    layouts: list[str], steps: list[tuple[str, int]], shapes: list[PodDemand]
) -> None:
    memo = DecisionCache(CONFIG)
    names = [f"n{i}" for i in range(6)] + ["gone"]
    for number, (live, fresh) in enumerate(_changing_cluster(layouts, steps)):
        want = pod("p", shapes[number % len(shapes)])
        assert filter_nodes(live, want, names, CONFIG, NOW, memo=memo) == filter_nodes(
            fresh, want, names, CONFIG, NOW
        )
        assert score_nodes(live, want, names, CONFIG, NOW, memo=memo) == score_nodes(
            fresh, want, names, CONFIG, NOW
        )
        # on the nodes it fits, as /filter ranks them to choose one (scores by state)
        fits = filter_nodes(fresh, want, names, CONFIG, NOW).fits
        assert score_nodes(live, want, fits, CONFIG, NOW, memo=memo, fitting=True) == (
            score_nodes(fresh, want, fits, CONFIG, NOW, fitting=True)
        )


def test_the_tables_kept_by_name_stay_bounded_whatever_the_pod_shapes() -> None:
    memo = DecisionCache(CONFIG)
    snap = cluster([node(".... ....", f"n{i}", rack="r1") for i in range(3)]).snapshot()
    names = ["n0", "n1", "n2"]
    for milli in range(1, 300):
        want = pod("p", demand(0, milli))
        assert filter_nodes(snap, want, names, CONFIG, NOW, memo=memo).fits == tuple(names)
        score_nodes(snap, want, names, CONFIG, NOW, memo=memo)
    # answers by node name, one table per pod shape; by node object, the same
    assert 0 < memo.sizes()["by_name"] <= 64
    assert 0 < memo.sizes()["per_node"] <= 64


@settings(max_examples=80, deadline=None)
@given(
    layouts=_LAYOUTS,
    steps=_GANG_STEPS,
    asks=st.lists(
        st.sampled_from(
            ["required:rack", "required:rack", "preferred:rack", "required:zone", None, "lone"]
        ),
        min_size=1,
    ),
)
def test_a_gang_members_answers_by_name_are_those_of_each_node_judged_whole(
    layouts: list[str], steps: list[tuple[str, int]], asks: list[str | None]
) -> None:
    """Members of one gang (the first, then followers as members are placed), with a
    topology level required, preferred, unknown or none, and lone pods of their shape,
    asking one after another: what each request answers with what earlier requests
    kept by name (the lone pods' answers, each node's rack) is what judging every
    node afresh answers."""
    memo = DecisionCache(CONFIG)
    names = [f"n{i}" for i in range(6)] + ["gone"]
    for number, (live, fresh) in enumerate(_changing_cluster(layouts, steps)):
        ask = asks[number % len(asks)]
        if ask == "lone":
            want = pod("asking", demand(2))
        else:
            want = pod("asking", demand(2, gang="ns.team", size=3, topology=ask))
        kept = filter_nodes(live, want, names, CONFIG, NOW, memo=memo)
        assert kept == filter_nodes(fresh, want, names, CONFIG, NOW)
        ctx = build_context(fresh, want, CONFIG, NOW)
        for name in names[:-1]:
            verdict = run_filters(ctx, fresh.nodes[NodeName(name)])
            if verdict is FIT:
                assert name in kept.fits
            else:
                assert isinstance(verdict, Unfit)
                where = kept.failed if verdict.resolvable else kept.unresolvable
                assert where.get(NodeName(name)) == verdict.reason


_LATE = timedelta(hours=9)


@st.composite
def _judged_clusters(draw: st.DrawFn) -> tuple[Snapshot, PodInfo]:
    """A few nodes, some cordoned or draining (before or after the pod's time limit
    ends), some of them holding members of the asking pod's gang, some reserved for
    its gang or another (from before or after its time limit ends, or a time not
    known yet)."""
    members = []
    for i in range(draw(st.integers(1, 5))):
        made = draw(nodes(f"n{i}"))
        drain = draw(st.sampled_from([None, None, NOW + timedelta(hours=1), NOW + _LATE]))
        members.append(replace(made, drain_after=drain, unschedulable=draw(st.booleans())))
    size = draw(st.integers(1, 4))
    want = replace(
        draw(DEMANDS),
        gang=None if draw(st.booleans()) else GangSpec(GangId("ns.g"), size, size),
        topology=draw(TOPOLOGIES),
        time_limit_s=draw(st.sampled_from([None, 3600, 4 * 3600])),
    )
    placed: list[PodInfo] = []
    current = {n.name: n for n in members}
    for i in range(draw(st.integers(0, 2)) if want.gang is not None else 0):
        where = draw(st.sampled_from(sorted(current)))
        chosen = choose_gpus(current[where], want, CONFIG)
        if chosen:
            placed.append(pod(f"m{i}", want, node=where, indices=chosen))
            current[where] = apply_allocation(
                current[where], Allocation(where, chosen, want.milli_per_gpu), 1
            )
    cache = cluster(members, placed)
    held = draw(st.lists(st.sampled_from(sorted(current)), max_size=3, unique=True))
    promise = st.builds(
        Promise,
        st.sampled_from([None, NOW + timedelta(minutes=30), NOW + _LATE]),
        st.sampled_from([GangId("ns.g"), GangId("ns.x")]),
    )
    cache.promise({name: (draw(promise),) for name in held})
    return cache.snapshot(), pod("asking", want)


@settings(max_examples=200)
@given(cluster=_judged_clusters(), config=CONFIGS)
def test_a_node_judged_from_its_kept_facts_gets_the_verdict_of_judging_it_whole(
    cluster: tuple[Snapshot, PodInfo], config: ExtenderConfig
) -> None:
    """What ``DecisionCache.by_name`` keeps of a node (``NodeFacts``: its domain at the
    gang's level, drain time, node-only verdicts) gives the verdict ``run_filters``
    gives reading the node, for gang members and lone pods, draining and reserved
    nodes and not, a first member and followers; facts made for one pod answer for
    another of its shape and gang level, whatever its gang."""
    assert KEPT_JUDGES  # or no gang member is answered by name: slower, never wrong
    snap, asking = cluster
    ctx = build_context(snap, asking, config, NOW)
    # a pod of the same shape in another gang (none of its members placed) or none
    spec = asking.demand.gang and GangSpec(GangId("ns.other"), 2, 2)
    other = replace(asking, key=PodKey("ns/other"), demand=replace(asking.demand, gang=spec))
    twin = build_context(snap, other, config, NOW)
    for judged in snap.nodes.values():
        whole = run_filters(ctx, judged)
        assert judge_facts(ctx, node_facts(ctx, judged)) == whole
        assert judge_facts(ctx, node_facts(twin, judged)) == whole


@settings(max_examples=60, deadline=None)
@given(layouts=_LAYOUTS, steps=_GANG_STEPS, node_=nodes(), demand_=DEMANDS, config=CONFIGS)
def test_a_cache_that_keeps_nothing_decides_as_one_that_keeps_and_keeps_nothing(
    layouts: list[str],
    steps: list[tuple[str, int]],
    node_: NodeState,
    demand_: PodDemand,
    config: ExtenderConfig,
) -> None:
    """``DecisionCache(keep=False)`` (the placement study's, which shows each node object
    once): the same verdicts and scores, on one node and for gang members and lone pods
    over a changing cluster, and no table that grows."""
    forgetful = DecisionCache(config, keep=False)
    for _ in range(2):
        assert _decide(node_, demand_, forgetful) == _fresh(node_, demand_, config)
    names = [f"n{i}" for i in range(6)]
    forgetful = DecisionCache(CONFIG, keep=False)
    for live, _fresh_snap in _changing_cluster(layouts, steps):
        for want in (pod("asking", _TEAM_MEMBER), pod("lone", demand(2))):
            assert filter_nodes(live, want, names, CONFIG, NOW, memo=forgetful) == filter_nodes(
                live, want, names, CONFIG, NOW
            )
            assert score_nodes(live, want, names, CONFIG, NOW, memo=forgetful) == score_nodes(
                live, want, names, CONFIG, NOW
            )
    sizes = forgetful.sizes()
    assert sizes["by_state"] == sizes["by_name"] == sizes["carried"] == 0
    assert len(forgetful.states) == len(forgetful.fragmentation) == 0


def test_a_state_is_named_by_one_number_that_never_names_another() -> None:
    memo = DecisionCache(CONFIG)
    first = memo.state_id(("H100", False, 110, ((0, 0, True, 1000),)))
    assert memo.state_id(("H100", False, 110, ((0, 0, True, 1000),))) == first
    other = memo.state_id(("H100", True, 110, ((0, 0, True, 1000),)))
    assert other != first
    # past its bound the table starts over; the numbers go on, so an answer kept under
    # an old number is never taken for a new state's
    given = {memo.state_id(("state", i)) for i in range(100_001)}
    assert len(given) == 100_001
    assert not given & {first, other}
    again = memo.state_id(("H100", False, 110, ((0, 0, True, 1000),)))
    assert again not in given | {other}
