"""``tessera upgrade-plan``'s planning: nodes in the order their jobs end, in waves that
each keep a share of every flavor's GPUs schedulable.

Table-driven over the rules an operator relies on, then one invariant under any fleet
(hypothesis): every wave keeps at least the share asked of each pool, and every node
selected is in exactly one wave (or the plan is refused because one node alone would
take too much).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cluster.clock import ManualClock
from console.source import build_snapshot
from console.upgrade import (
    PlanError,
    Requirement,
    UpgradeNode,
    UpgradePlan,
    parse_keep,
    parse_selector,
    parse_window,
    percent,
    plan_upgrade,
    selected,
    upgrade_nodes,
)
from tests.console_cluster import NOW, example_objects
from webhook.policy_build import policy_from_objects

H = timedelta(hours=1)
RESERVED, SPOT = "flavor h100-reserved", "flavor h100-spot"


def node(
    name: str,
    end: timedelta | None = timedelta(0),
    *,
    pools: tuple[str, ...] = (RESERVED,),
    gpus: int = 8,
    schedulable: int | None = None,
) -> UpgradeNode:
    """A node whose jobs end ``end`` after NOW (None: a pod without a time limit)."""
    return UpgradeNode(
        name=name,
        pools=pools,
        gpus=gpus,
        gpus_schedulable=gpus if schedulable is None else schedulable,
        free_at=None if end is None else NOW + end,
        pods=() if end == timedelta(0) else (f"ns/{name}-job",),
        unlimited=(f"ns/{name}-job",) if end is None else (),
    )


def waves(plan: UpgradePlan) -> list[tuple[timedelta, list[str]]]:
    """Each wave as (start after NOW, its nodes)."""
    return [(w.start - NOW, [n.name for n in w.nodes]) for w in plan.waves]


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("text", "keep"),
    [
        ("80%", Fraction(4, 5)),
        ("87.5%", Fraction(7, 8)),
        ("0.8", Fraction(4, 5)),
        (".75", Fraction(3, 4)),
        ("0%", Fraction(0)),
        ("0", Fraction(0)),
    ],
)
def test_keep_is_a_percentage_or_a_fraction(text: str, keep: Fraction) -> None:
    assert parse_keep(text) == keep


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100%", "leaves none to upgrade"),
        ("1", "leaves none to upgrade"),
        ("80", "give a share such as 80% or 0.8"),
        ("-10%", "give a share"),
        ("lots", "give a share"),
    ],
)
def test_keep_refuses_what_is_no_share_below_all(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_keep(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("600", 600)]
)
def test_window_is_a_go_duration_or_seconds(text: str, seconds: int) -> None:
    assert parse_window(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0", "2 hours", "-1h", ""])
def test_window_refuses_what_is_no_positive_duration(text: str) -> None:
    with pytest.raises(PlanError, match="--window"):
        parse_window(text)


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("pool=a", (Requirement("pool", "a", True),)),
        ("pool==a", (Requirement("pool", "a", True),)),
        ("example.com/pool!=a", (Requirement("example.com/pool", "a", False),)),
        ("gpu, !cordon", (Requirement("gpu", None, True), Requirement("cordon", None, False))),
    ],
)
def test_selector_terms_as_kubectl_reads_them(text: str, terms: tuple[Requirement, ...]) -> None:
    assert parse_selector(text) == terms


@pytest.mark.parametrize("text", ["", "a=b,", "pool in (a,b)", "a=b=c", "-bad=x"])
def test_selector_refuses_what_kubectl_would_not_read_so(text: str) -> None:
    with pytest.raises(PlanError, match="--selector"):
        parse_selector(text)


def test_selector_matches_every_term() -> None:
    terms = parse_selector("pool=a,!cordoned,gpu")
    assert selected({"pool": "a", "gpu": "8"}, terms)
    assert not selected({"pool": "a", "gpu": "8", "cordoned": ""}, terms)
    assert not selected({"pool": "b", "gpu": "8"}, terms)
    assert not selected({"pool": "a"}, terms)


def test_percent_never_reads_more_than_the_share() -> None:
    assert [percent(Fraction(n, d)) for n, d in ((20, 24), (31, 40), (1, 2), (1, 1))] == [
        "83.3%",
        "77.5%",
        "50%",
        "100%",
    ]


# ---------------------------------------------------------------- the nodes of a cluster


def test_a_node_s_jobs_end_at_its_pods_start_plus_time_limit() -> None:
    objects = example_objects()
    snapshot, _ = build_snapshot(objects, (), ManualClock(NOW))
    flavors = policy_from_objects(o for o in objects if o["kind"] == "ResourceFlavor").flavors
    nodes = {
        n.name: n
        for n in upgrade_nodes(
            snapshot, [o for o in objects if o["kind"] == "Pod"], flavors.values(), NOW
        )
    }
    assert len(nodes) == 7
    # train-0 started at 04:00 with 4 h, small-0 at 05:00 with 2 h
    assert nodes["gpu-r1-0"].free_at == NOW + 2 * H
    assert nodes["gpu-r1-1"].free_at == NOW + 1 * H
    # no pod holds its GPUs: free now
    assert (nodes["gpu-r2-0"].free_at, nodes["gpu-r2-0"].pods) == (NOW, ())
    # tune-0 ends at 06:30, but the notebook beside it has no time limit
    assert nodes["gpu-r3-0"].free_at is None
    assert nodes["gpu-r3-0"].unlimited == ("team-cv/notebook-0",)
    assert nodes["gpu-r3-0"].pods == ("team-cv/notebook-0", "team-cv/tune-0")
    assert nodes["gpu-r3-0"].pools == (SPOT,)
    # GPU 5 is unhealthy: seven of its eight GPUs are schedulable
    assert (nodes["gpu-r1-2"].gpus, nodes["gpu-r1-2"].gpus_schedulable) == (8, 7)
    assert nodes["gpu-r2-1"].drain_after == NOW + 2 * H


def test_a_pod_not_started_yet_counts_its_limit_from_now() -> None:
    objects = example_objects()
    for obj in objects:
        if obj["kind"] == "Pod" and obj["metadata"]["name"] == "small-0":
            del obj["status"]["startTime"]
    snapshot, _ = build_snapshot(objects, (), ManualClock(NOW))
    pods = [o for o in objects if o["kind"] == "Pod"]
    nodes = {n.name: n for n in upgrade_nodes(snapshot, pods, (), NOW)}
    assert nodes["gpu-r1-1"].free_at == NOW + 2 * H
    # without flavors, the GPU product is the pool
    assert nodes["gpu-r1-1"].pools == ("product NVIDIA-H100-80GB-HBM3",)


# ---------------------------------------------------------------- planning

FOUR_NODES = [node("a", 3 * H), node("b", 1 * H), node("c"), node("d", 2 * H)]

PLANS = [
    pytest.param(
        FOUR_NODES,
        Fraction(1, 2),
        None,
        [(timedelta(0), ["c"]), (2 * H, ["b", "d"]), (4 * H, ["a"])],
        id="in-the-order-the-jobs-end",
    ),
    pytest.param(
        FOUR_NODES,
        Fraction(0),
        None,
        [(timedelta(0), ["c"]), (2 * H, ["b", "d"]), (4 * H, ["a"])],
        id="a-wave-waits-for-no-node-that-is-not-free",
    ),
    pytest.param(
        FOUR_NODES,
        Fraction(3, 4),
        None,
        [(timedelta(0), ["c"]), (2 * H, ["b"]), (4 * H, ["d"]), (6 * H, ["a"])],
        id="one-node-of-four-at-a-time",
    ),
    pytest.param(
        [node("a"), node("b"), node("c"), node("d")],
        Fraction(1, 2),
        None,
        [(timedelta(0), ["a", "b"]), (2 * H, ["c", "d"])],
        id="idle-nodes-by-name",
    ),
    pytest.param(
        [node("late", 5 * H), node("a"), node("b")],
        Fraction(1, 3),
        None,
        [(timedelta(0), ["a", "b"]), (5 * H, ["late"])],
        id="a-wave-starts-when-its-first-node-is-free",
    ),
    pytest.param(
        [node("x", None), node("a", 1 * H), node("b"), node("y", None)],
        Fraction(1, 2),
        None,
        [(timedelta(0), ["b"]), (2 * H, ["a"]), (4 * H, ["x", "y"])],
        id="unknown-ends-come-last",
    ),
    pytest.param(
        [
            node("r1"),
            node("r2"),
            node("s1", pools=(SPOT,)),
            node("s2", pools=(SPOT,)),
            node("both", pools=(RESERVED, SPOT)),
        ],
        Fraction(1, 2),
        None,
        # reserved has 24 GPUs, spot 24 (the node of both counts in each): 12 may go
        [(timedelta(0), ["both"]), (2 * H, ["r1", "s1"]), (4 * H, ["r2", "s2"])],
        id="a-node-of-two-flavors-counts-in-both",
    ),
    pytest.param(
        [node("a"), node("b"), node("c"), node("sick", schedulable=4)],
        Fraction(1, 2),
        None,
        # 28 of 32 schedulable, 16 must stay: 12 may go (all healthy, two nodes would)
        [(timedelta(0), ["a", "sick"]), (2 * H, ["b"]), (4 * H, ["c"])],
        id="unhealthy-gpus-count-as-out-already",
    ),
    pytest.param(
        FOUR_NODES,
        Fraction(1, 2),
        NOW + 10 * H,
        [(10 * H, ["c", "b"]), (12 * H, ["d", "a"])],
        id="not-before",
    ),
]


@pytest.mark.parametrize(("nodes", "keep", "not_before", "expected"), PLANS)
def test_plan(
    nodes: list[UpgradeNode],
    keep: Fraction,
    not_before: datetime | None,
    expected: list[tuple[timedelta, list[str]]],
) -> None:
    plan = plan_upgrade(
        nodes, {n.name for n in nodes}, now=NOW, window=2 * H, keep=keep, not_before=not_before
    )
    assert waves(plan) == expected


def test_the_share_kept_counts_every_gpu_of_the_flavor_not_only_those_selected() -> None:
    fleet = [node("a"), node("b"), node("other-1"), node("other-2")]
    plan = plan_upgrade(fleet, {"a", "b"}, now=NOW, window=2 * H, keep=Fraction(1, 2))
    assert waves(plan) == [(timedelta(0), ["a", "b"])]
    (kept,) = plan.waves[0].kept
    assert (kept.pool, kept.gpus_kept, kept.gpus_total) == (RESERVED, 16, 32)


def test_the_example_cluster_in_four_waves() -> None:
    objects = example_objects()
    snapshot, _ = build_snapshot(objects, (), ManualClock(NOW))
    flavors = policy_from_objects(o for o in objects if o["kind"] == "ResourceFlavor").flavors
    pods = [o for o in objects if o["kind"] == "Pod"]
    nodes = upgrade_nodes(snapshot, pods, flavors.values(), NOW)
    plan = plan_upgrade(nodes, {n.name for n in nodes}, now=NOW, window=2 * H, keep=Fraction(1, 2))
    assert waves(plan) == [
        (timedelta(0), ["gpu-r1-2", "gpu-r2-0", "gpu-r3-1"]),
        (2 * H, ["gpu-r2-1", "gpu-r1-1"]),
        (4 * H, ["gpu-r1-0"]),
        (6 * H, ["gpu-r3-0"]),
    ]
    assert plan.done is None
    assert not plan.waves[-1].start_known
    assert any("team-cv/notebook-0 has no time limit" in n for n in plan.notes)
    # gpu-r2-1's own window (08:00) is its wave's start: nothing to say of it
    assert not any(n.startswith("gpu-r2-1") for n in plan.notes)


def test_a_window_the_plan_moves_is_said() -> None:
    drained = UpgradeNode("a", (RESERVED,), 8, 8, NOW, drain_after=NOW + 5 * H)
    plan = plan_upgrade([drained, node("b")], {"a"}, now=NOW, window=2 * H, keep=Fraction(1, 2))
    assert plan.notes == (
        "a drains after 2026-01-01T11:00:00Z already; wave 1 drains it after 2026-01-01T06:00:00Z",
    )


def test_a_node_that_alone_breaks_the_share_is_refused_with_the_numbers() -> None:
    fleet = [node("a"), node("b", schedulable=7), node("c"), node("d"), node("e")]
    with pytest.raises(PlanError) as refused:
        plan_upgrade(fleet, {"a", "b", "c"}, now=NOW, window=2 * H, keep=Fraction(4, 5))
    assert str(refused.value) == (
        "node a cannot go out even alone: flavor h100-reserved would keep 31 of its 40 GPUs "
        "schedulable (77.5%), below --keep 80% (1 of them unhealthy or cordoned already); "
        "1 more node the same: lower --keep or upgrade them by hand"
    )
    # b has 7 schedulable GPUs to take out, which leaves 32: it alone could go
    assert refused.value.nodes == ("a", "c")


def test_nothing_selected_is_no_plan() -> None:
    with pytest.raises(PlanError, match="no GPU node matches"):
        plan_upgrade(FOUR_NODES, set(), now=NOW, window=H, keep=Fraction(1, 2))


# ---------------------------------------------------------------- the invariant

POOLS = ("flavor a", "flavor b", "product c")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[UpgradeNode], set[str]]:
    count = draw(st.integers(1, 12))
    fleet = []
    for i in range(count):
        gpus = draw(st.integers(1, 8))
        ends = st.none() | st.integers(-60, 48 * 60).map(lambda m: timedelta(minutes=m))
        end = draw(ends)
        fleet.append(
            UpgradeNode(
                name=f"n{i}",
                pools=tuple(sorted(draw(st.sets(st.sampled_from(POOLS), min_size=1)))),
                gpus=gpus,
                gpus_schedulable=draw(st.integers(0, gpus)),
                free_at=None if end is None else NOW + end,
                unlimited=("ns/p",) if end is None else (),
            )
        )
    chosen = draw(st.sets(st.sampled_from([n.name for n in fleet]), min_size=1))
    return fleet, chosen


def _plan_or_refusal(
    nodes: list[UpgradeNode], chosen: set[str], *, window: timedelta, keep: Fraction
) -> UpgradePlan | PlanError:
    try:
        return plan_upgrade(nodes, chosen, now=NOW, window=window, keep=keep)
    except PlanError as refused:
        return refused


@settings(max_examples=300, deadline=None)
@given(
    fleet=fleets(),
    keep=st.fractions(0, 1).filter(lambda f: f < 1),
    window_m=st.integers(1, 600),
)
def test_every_wave_keeps_the_share_and_every_node_is_in_one_wave(
    fleet: tuple[list[UpgradeNode], set[str]], keep: Fraction, window_m: int
) -> None:
    nodes, chosen = fleet
    window = timedelta(minutes=window_m)
    total: Counter[str] = Counter()
    schedulable: Counter[str] = Counter()
    for n in nodes:
        for pool in n.pools:
            total[pool] += n.gpus
            schedulable[pool] += n.gpus_schedulable
    plan = _plan_or_refusal(nodes, chosen, window=window, keep=keep)
    if isinstance(plan, PlanError):
        # only when some selected node, out alone, leaves a pool less than the share
        event("refused")
        assert plan.nodes
        for name in plan.nodes:
            alone = next(n for n in nodes if n.name == name)
            assert name in chosen
            assert any(
                Fraction(schedulable[p] - alone.gpus_schedulable, total[p]) < keep
                for p in alone.pools
            )
        return
    event("planned in " + (f"{len(plan.waves)} waves" if len(plan.waves) < 4 else "4+ waves"))
    planned = [n.name for w in plan.waves for n in w.nodes]
    assert sorted(planned) == sorted(chosen)  # each selected node once, no other
    previous_end = None
    for wave in plan.waves:
        out: Counter[str] = Counter()
        for n in wave.nodes:
            for pool in n.pools:
                out[pool] += n.gpus_schedulable
            # a wave starts once its nodes' jobs have ended
            assert n.free_at is None or n.free_at <= wave.start
        # every pool the wave takes GPUs of keeps the share, and the plan says so
        assert {k.pool for k in wave.kept} == set(out)
        for kept in wave.kept:
            assert kept.gpus_kept == schedulable[kept.pool] - out[kept.pool]
            assert Fraction(kept.gpus_kept, total[kept.pool]) >= keep
        # one wave at a time
        assert wave.start >= NOW
        assert previous_end is None or wave.start >= previous_end
        previous_end = wave.end
    # nodes whose end is unknown come after all the others
    known = [w.start_known for w in plan.waves]
    assert known == sorted(known, reverse=True)
