"""Reservations and backfill (``extender.reservations``, ``extender.promises``): when a
node can hold a gang's members as its pods end by their time limits, which domain a
waiting gang is promised and from when, and which other pods may still start there.

Nodes are built with the pods on them: ``busy("n1", "r1", [(4, 30), (4, None)])`` is a
node of eight GPUs in rack r1 holding a 4-GPU pod whose time limit ends in 30 minutes
and a 4-GPU pod without a time limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.model import (
    Allocation,
    GangId,
    GangSpec,
    NodeName,
    NodeState,
    PodDemand,
    PodInfo,
    Promise,
    TopologyConstraint,
    TopologyMode,
)
from cluster.snapshot import apply_allocation
from extender.config import ExtenderConfig
from extender.context import FIT, Unfit
from extender.holdings import holdings
from extender.outlooks import ANYWHERE, Holding, Outlook, node_outlook
from extender.promises import (
    backfill_verdict,
    ends_in_time,
    latest_start,
    promise_verdict,
)
from extender.reservations import (
    Estimate,
    GangDemand,
    PlanInput,
    Reservation,
    ReservationRules,
    estimate_domain,
    gang_demands,
    node_promises,
    plan_reservations,
)
from tests.builders import RACK_LABEL
from tests.unit.test_extender_builders import CONFIG, NOW, node, pod, snapshot

RULES = ReservationRules()
MEMBER = PodDemand(gpus=8, time_limit_s=3600)
CONFIG_RACK = ExtenderConfig(levels=CONFIG.levels)


def names(*given: str) -> tuple[NodeName, ...]:
    return tuple(NodeName(n) for n in given)


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def busy(
    name: str, rack: str, pods: Sequence[tuple[int, float | None]] = (), gpus: int = 8
) -> tuple[NodeState, tuple[Holding, ...]]:
    """A node of ``gpus`` GPUs (one island) holding ``pods`` of (GPUs, minutes until
    their time limits end; None: no limit), placed from GPU 0 up."""
    state = node("." * gpus, name, rack=rack)
    held: list[Holding] = []
    first = 0
    for count, minutes in pods:
        allocation = Allocation(NodeName(name), tuple(range(first, first + count)), 1000)
        state = apply_allocation(state, allocation, 1)
        held.append(Holding(allocation, None if minutes is None else at(minutes)))
        first += count
    return state, tuple(held)


def cluster_of(*built: tuple[NodeState, tuple[Holding, ...]], **options: object) -> PlanInput:
    return PlanInput(
        nodes={n.name: n for n, _ in built},
        holdings={n.name: h for n, h in built},
        config=CONFIG_RACK,
        **options,  # type: ignore[arg-type]
    )


def gang(
    name: str = "team-a.train-7",
    members: int = 2,
    *,
    limit_s: int | None = 3600,
    since: float = 0,
    priority: int = 0,
    gpus: int = 8,
) -> GangDemand:
    return GangDemand(
        GangId(name),
        PodDemand(gpus=gpus, time_limit_s=limit_s),
        members,
        RACK_LABEL,
        at(since),
        priority,
    )


# ---------------------------------------------------------------- one node

OUTLOOKS = [
    pytest.param([], MEMBER, 1, (), 1, id="empty-holds-one-now"),
    pytest.param([(4, 10), (4, 30)], MEMBER, 0, ((at(30), 1),), 1, id="whole-node-when-last-ends"),
    pytest.param(
        [(4, 10), (4, 30)],
        PodDemand(gpus=4),
        0,
        ((at(10), 1), (at(30), 2)),
        2,
        id="half-node-as-each-ends",
    ),
    pytest.param([(4, 20), (4, 20)], MEMBER, 0, ((at(20), 1),), 1, id="ending-together-one-step"),
    pytest.param([(4, 10), (4, None)], MEMBER, 0, (), 1, id="no-limit-blocks"),
    pytest.param([(8, 0)], MEMBER, 1, (), 1, id="ending-now-is-free-now"),
    pytest.param([(8, -30)], MEMBER, 0, ((at(1), 1),), 1, id="overrun-ends-a-grace-after-now"),
]


@pytest.mark.parametrize(("pods", "member", "now", "steps", "blocked"), OUTLOOKS)
def test_node_outlook(
    pods: list[tuple[int, float | None]],
    member: PodDemand,
    now: int,
    steps: tuple[tuple[datetime, int], ...],
    blocked: int,
) -> None:
    state, held = busy("n1", "r1", pods)
    outlook = node_outlook(
        state, held, member, NOW, grace=RULES.overrun_grace, islands_required=True
    )
    assert (outlook.now, outlook.steps, outlook.blocked) == (now, steps, blocked)


def test_cpu_counts_when_the_node_says_how_much_it_has() -> None:
    state, held = busy("n1", "r1", [(4, 10)])
    state = NodeState(
        state.name, state.gpus, cpu_milli=64_000, cpu_requested_milli=60_000, domains=state.domains
    )
    held = (Holding(held[0].allocation, held[0].ends, cpu_milli=60_000),)
    member = PodDemand(gpus=2, cpu_milli=16_000)
    outlook = node_outlook(
        state, held, member, NOW, grace=RULES.overrun_grace, islands_required=True
    )
    assert (outlook.now, outlook.steps) == (0, ((at(10), 4),))


# ---------------------------------------------------------------- one domain


def outlook(name: str, now: int, *steps: tuple[float, int], blocked: int | None = None) -> Outlook:
    rising = tuple((at(m), n) for m, n in steps)
    last = rising[-1][1] if rising else now
    return Outlook(NodeName(name), now, rising, last if blocked is None else blocked)


DOMAINS = [
    pytest.param([outlook("a", 1), outlook("b", 1)], {}, 3600, NOW, ("a", "b"), id="fits-now"),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, (20, 1)), outlook("c", 0, (10, 1))],
        {},
        3600,
        at(10),
        ("a", "c"),
        id="when-the-second-frees",
    ),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, (20, 1))],
        {"a": Promise(at(30))},
        3600,
        None,
        (),
        id="drain-before-the-gang-ends-rules-the-node-out",
    ),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, (20, 1))],
        {"a": Promise(at(90))},
        3600,
        at(20),
        ("a", "b"),
        id="drain-after-the-gang-ends",
    ),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, (40, 1)), outlook("c", 0, (60, 1))],
        {"a": Promise(at(90))},
        3600,
        at(60),
        ("b", "c"),
        id="a-drain-cuts-the-node-off-in-time",
    ),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, blocked=1)], {}, 3600, None, ("a", "b"), id="unknown"
    ),
    pytest.param(
        [outlook("a", 1), outlook("b", 0, (20, 1))],
        {"a": Promise(at(90))},
        None,
        None,
        (),
        id="a-gang-without-a-limit-never-goes-to-a-draining-node",
    ),
]


@pytest.mark.parametrize(("outlooks", "promised", "limit", "start", "nodes"), DOMAINS)
def test_estimate_domain(
    outlooks: list[Outlook],
    promised: dict[str, Promise],
    limit: int | None,
    start: datetime | None,
    nodes: tuple[str, ...],
) -> None:
    promises = {NodeName(k): v for k, v in promised.items()}
    found = estimate_domain("r1", outlooks, 2, limit_s=limit, promised=promises, now=NOW)
    if not nodes:
        assert found is None
    else:
        assert found == Estimate("r1", start, tuple(NodeName(n) for n in nodes))


def test_unknown_start_when_only_pods_without_a_time_limit_stand_in_the_way() -> None:
    found = estimate_domain(
        "r1", [outlook("a", 1), outlook("b", 0, blocked=1)], 2, limit_s=60, promised={}, now=NOW
    )
    assert found is not None
    assert found.start is None


# ---------------------------------------------------------------- the plan


def test_a_gang_that_fits_now_gets_no_reservation() -> None:
    cluster = cluster_of(busy("a", "r1"), busy("b", "r1"), busy("c", "r2", [(8, 10)]))
    plan = plan_reservations([gang()], cluster, {}, NOW)
    assert plan.reservations == ()
    assert plan.fits_now == ((GangId("team-a.train-7"), Estimate("r1", NOW, names("a", "b"))),)


def test_the_rack_whose_pods_end_soonest_is_reserved() -> None:
    cluster = cluster_of(
        busy("a1", "r1", [(8, 40)]),
        busy("a2", "r1"),
        busy("b1", "r2", [(4, 5), (4, 20)]),
        busy("b2", "r2"),
        busy("c1", "r3", [(8, None)]),
        busy("c2", "r3"),
    )
    plan = plan_reservations([gang()], cluster, {}, NOW)
    assert plan.reservations == (
        Reservation(GangId("team-a.train-7"), "r2", names("b2", "b1"), at(20)),
    )


def test_a_rack_waiting_on_pods_without_a_time_limit_is_reserved_last() -> None:
    blocked = [busy("c1", "r3", [(8, None)]), busy("c2", "r3")]
    later = [busy("d1", "r4", [(8, 600)]), busy("d2", "r4")]
    plan = plan_reservations([gang()], cluster_of(*blocked, *later), {}, NOW)
    assert [(r.domain, r.start) for r in plan.reservations] == [("r4", at(600))]
    alone = plan_reservations([gang()], cluster_of(*blocked), {}, NOW)
    assert [(r.domain, r.start) for r in alone.reservations] == [("r3", None)]


def test_equal_starts_go_to_the_least_fragmented_rack() -> None:
    # three members of 4 GPUs: each rack holds one now and two more at +30 min; r1's
    # free GPUs (six on a2) leave more that the pod mix cannot use than r2's (four on b2)
    cluster = cluster_of(
        busy("a1", "r1", [(8, 30)]),
        busy("a2", "r1", [(2, None)]),
        busy("b1", "r2", [(8, 30)]),
        busy("b2", "r2", [(4, None)]),
    )
    plan = plan_reservations([gang(members=3, gpus=4)], cluster, {}, NOW)
    assert [(r.domain, r.start) for r in plan.reservations] == [("r2", at(30))]


def test_the_oldest_gang_first_and_a_higher_priority_before_it() -> None:
    racks = [busy(f"{r}{i}", r, [(8, 10 * (k + 1))]) for k, r in enumerate("xy") for i in (1, 2)]
    cluster = cluster_of(*racks, rules=ReservationRules(max_reservations=1))
    old, new = gang("ns.old", since=-60), gang("ns.new", since=-1)
    plan = plan_reservations([new, old], cluster, {}, NOW)
    assert [r.gang for r in plan.reservations] == ["ns.old"]
    assert plan.unreserved == ("ns.new",)
    urgent = gang("ns.urgent", since=-1, priority=100)
    plan = plan_reservations([old, urgent], cluster, {}, NOW)
    assert [(r.gang, r.domain) for r in plan.reservations] == [("ns.urgent", "x")]


def test_a_later_gang_does_not_count_on_an_earlier_gangs_nodes() -> None:
    racks = [busy(f"{r}{i}", r, [(8, 10 * (k + 1))]) for k, r in enumerate("xy") for i in (1, 2)]
    plan = plan_reservations(
        [gang("ns.first", since=-2), gang("ns.second", since=-1)], cluster_of(*racks), {}, NOW
    )
    assert [(r.gang, r.domain, r.start) for r in plan.reservations] == [
        ("ns.first", "x", at(10)),
        ("ns.second", "y", at(20)),
    ]


def test_a_short_gang_may_use_an_earlier_gangs_rack_before_its_start() -> None:
    # ns.first waits for rack x at +60 min; ns.quick's 20 minutes end before then
    racks = [busy("x1", "x", [(8, 60)]), busy("x2", "x"), busy("x3", "x")]
    first = gang("ns.first", members=3, since=-2)
    quick = gang("ns.quick", members=2, since=-1, limit_s=20 * 60)
    plan = plan_reservations([first, quick], cluster_of(*racks), {}, NOW)
    assert [(r.gang, r.start) for r in plan.reservations] == [("ns.first", at(60))]
    assert [g for g, _ in plan.fits_now] == ["ns.quick"]


def test_a_reservation_moves_to_a_rack_that_became_sooner_and_keeps_its_own_on_a_tie() -> None:
    held = {GangId("team-a.train-7"): Reservation(GangId("team-a.train-7"), "x", (), at(60))}
    sooner = [
        busy("x1", "x", [(8, 50)]),
        busy("x2", "x"),
        busy("y1", "y", [(8, 10)]),
        busy("y2", "y"),
    ]
    plan = plan_reservations([gang()], cluster_of(*sooner), held, NOW)
    assert [(r.domain, r.start) for r in plan.reservations] == [("y", at(10))]
    tied = [
        busy("w1", "w", [(8, 50)]),
        busy("w2", "w"),
        busy("x1", "x", [(8, 50)]),
        busy("x2", "x"),
    ]
    plan = plan_reservations([gang()], cluster_of(*tied), held, NOW)
    assert [(r.domain, r.start) for r in plan.reservations] == [("x", at(50))]


def test_a_pod_outliving_its_limit_pushes_the_start_and_keeps_the_reservation() -> None:
    racks = [
        busy("x1", "x", [(8, -5)]),
        busy("x2", "x"),
        busy("y1", "y", [(8, 5)]),
        busy("y2", "y"),
    ]
    held = {GangId("team-a.train-7"): Reservation(GangId("team-a.train-7"), "x", (), at(-10))}
    plan = plan_reservations([gang()], cluster_of(*racks), held, NOW)
    assert [(r.domain, r.start) for r in plan.reservations] == [("x", NOW + RULES.overrun_grace)]


def test_a_gang_no_rack_can_hold_is_unplaceable() -> None:
    plan = plan_reservations(
        [gang(members=3)], cluster_of(busy("a", "r1"), busy("b", "r1")), {}, NOW
    )
    assert plan.unplaceable == ("team-a.train-7",)


def test_without_a_level_the_nodes_that_free_first_anywhere() -> None:
    anywhere = GangDemand(GangId("ns.solo"), MEMBER, 1, None, NOW)
    cluster = cluster_of(busy("a", "r1", [(8, 30)]), busy("b", "r2", [(8, 10)]))
    plan = plan_reservations([anywhere], cluster, {}, NOW)
    assert plan.reservations == (Reservation(GangId("ns.solo"), ANYWHERE, names("b"), at(10)),)


# ---------------------------------------------------------------- backfill and its words

EXAMPLE_NOW = datetime(2026, 11, 29, 13, 50, tzinfo=UTC)
HELD = Reservation(
    GangId("team-a.train-7"), "r12", (NodeName("hgx-012"),), EXAMPLE_NOW + timedelta(minutes=15)
)

VERDICTS = [
    pytest.param(10 * 60, None, FIT, id="ends-in-time-backfills"),
    pytest.param(15 * 60, None, FIT, id="ends-right-at-the-start"),
    pytest.param(
        30 * 60,
        None,
        "node hgx-012 is reserved for gang team-a.train-7 from 14:05:00Z: "
        "this pod's time limit ends 14:20:00Z",
        id="ends-too-late",
    ),
    pytest.param(
        None,
        None,
        "node hgx-012 is reserved for gang team-a.train-7 from 14:05:00Z: "
        "this pod has no time limit (activeDeadlineSeconds) to end before it",
        id="no-limit-never-backfills",
    ),
    pytest.param(30 * 60, "team-a.train-7", FIT, id="the-gangs-own-member"),
    pytest.param(
        24 * 3600,
        None,
        "node hgx-012 is reserved for gang team-a.train-7 from 14:05:00Z: "
        "this pod's time limit ends 2026-11-30T13:50:00Z",
        id="another-day-says-the-date",
    ),
]


@pytest.mark.parametrize(("limit", "own", "expected"), VERDICTS)
def test_backfill_verdict(limit: int | None, own: str | None, expected: object) -> None:
    ends = None if limit is None else EXAMPLE_NOW + timedelta(seconds=limit)
    verdict = backfill_verdict(
        "hgx-012",
        (HELD.promise,),
        pod_gang=GangId(own) if own else None,
        ends=ends,
        limit_s=limit,
        now=EXAMPLE_NOW,
    )
    assert verdict == (FIT if expected is FIT else Unfit(str(expected), resolvable=False))


def test_a_reservation_of_unknown_start_takes_no_other_pod() -> None:
    promise = Promise(None, GangId("team-a.train-7"))
    verdict = promise_verdict(promise, "hgx-012", EXAMPLE_NOW, 60, EXAMPLE_NOW)
    assert verdict == Unfit(
        "node hgx-012 is reserved for gang team-a.train-7, which starts when pods without a "
        "time limit end there: no other pod may start on it meanwhile",
        resolvable=False,
    )


def test_a_maintenance_window_and_a_reservation_are_one_list_of_promises() -> None:
    draining = node(
        "........", "hgx-012", rack="r12", drain_after=EXAMPLE_NOW + timedelta(minutes=10)
    )
    promises = node_promises(draining, [HELD])
    assert [p.gang for p in promises] == [None, "team-a.train-7"]
    verdict = backfill_verdict(
        "hgx-012",
        promises,
        pod_gang=None,
        ends=EXAMPLE_NOW + timedelta(minutes=12),
        limit_s=12 * 60,
        now=EXAMPLE_NOW,
    )
    assert verdict == Unfit(
        "node drains for maintenance at 2026-11-29T14:00:00Z; pod's time limit of 12m would "
        "end at 2026-11-29T14:02:00Z",
        resolvable=False,
    )


def test_the_rule_solved_for_the_start() -> None:
    start = at(60)
    assert latest_start(1800, start) == at(30)
    assert ends_in_time(at(30) + timedelta(seconds=1800), start)
    assert not ends_in_time(at(31) + timedelta(seconds=1800), start)
    assert latest_start(None, start) is None
    assert latest_start(1800, None) is None


# ---------------------------------------------------------------- from a snapshot


def test_holdings_end_at_start_plus_limit_or_from_now_when_not_started() -> None:
    started = replace(
        pod(
            "a",
            PodDemand(gpus=4, time_limit_s=600, cpu_milli=8000),
            node="n1",
            indices=(0, 1, 2, 3),
        ),
        started_at=at(-5),
    )
    waiting = pod("b", PodDemand(gpus=2, time_limit_s=600), node="n1", indices=(4, 5))
    endless = pod("c", PodDemand(gpus=1), node="n1", indices=(6,))
    held = holdings(snapshot([node("........", "n1")], [started, waiting, endless]), NOW)
    ends = {h.allocation.indices: (h.ends, h.cpu_milli) for h in held[NodeName("n1")]}
    assert ends == {(0, 1, 2, 3): (at(5), 8000), (4, 5): (at(10), 0), (6,): (None, 0)}


def test_gang_demands_waiting_gangs_in_their_order() -> None:
    def member(name: str, gang_id: str, created: float, priority: int = 0) -> PodInfo:
        want = PodDemand(
            gpus=8,
            gang=GangSpec(GangId(gang_id), 2, 2),
            topology=TopologyConstraint(TopologyMode.REQUIRED, "rack"),
            time_limit_s=600,
        )
        return replace(pod(name, want), created_at=at(created), priority=priority)

    pods = [
        member("old-0", "ns.old", -30),
        member("old-1", "ns.old", -20),
        member("new-0", "ns.new", -10),
        member("vip-0", "ns.vip", -1, priority=10),
    ]
    found = gang_demands(snapshot([node("........", "n1", rack="r1")], pods), CONFIG_RACK, NOW)
    assert [(d.gang, d.members, d.level, d.since) for d in found] == [
        ("ns.vip", 2, RACK_LABEL, at(-1)),
        ("ns.old", 2, RACK_LABEL, at(-30)),
        ("ns.new", 2, RACK_LABEL, at(-10)),
    ]


# ---------------------------------------------------------------- invariants

MINUTES = st.one_of(st.integers(-30, 600), st.integers(1, 120), st.none())
"""Mostly known ends, some past (overruns), some never (no time limit)."""


@st.composite
def racks(draw: st.DrawFn) -> PlanInput:
    built = []
    for r in range(draw(st.integers(1, 4))):
        for i in range(draw(st.integers(1, 4))):
            sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4))
            pods: list[tuple[int, float | None]] = []
            used = 0
            for size in sizes:
                if used + size <= 8:
                    pods.append((size, draw(MINUTES)))
                    used += size
            built.append(busy(f"r{r}n{i}", f"r{r}", pods))
    return cluster_of(*built)


def _holds_at(
    cluster: PlanInput, names: Sequence[NodeName], when: datetime, member: PodDemand
) -> int:
    """Members ``names`` hold at ``when`` with every pod ended by then released: by
    brute force, not by outlooks."""
    total = 0
    for name in names:
        state = cluster.nodes[name]
        for h in cluster.holdings[name]:
            ends = h.ends if h.ends is None or h.ends >= NOW else NOW + RULES.overrun_grace
            if ends is not None and ends <= when:
                state = apply_allocation(state, h.allocation, -1)
        total += sum(1 for g in state.gpus if g.whole_free) // member.gpus
    return total


@settings(max_examples=150, deadline=None)
@given(racks(), st.integers(1, 4), st.integers(1, 8 * 3600))
def test_the_reserved_rack_is_the_earliest_and_holds_the_gang_then(
    cluster: PlanInput, members: int, limit: int
) -> None:
    wanted = gang(members=members, limit_s=limit)
    plan = plan_reservations([wanted], cluster, {}, NOW)
    groups = cluster.memo.domains(cluster.nodes, wanted.member, RACK_LABEL, True)
    estimates = [
        estimate_domain(
            d,
            [
                node_outlook(
                    cluster.nodes[n],
                    cluster.holdings[n],
                    wanted.member,
                    NOW,
                    grace=RULES.overrun_grace,
                    islands_required=True,
                )
                for n in names
            ],
            members,
            limit_s=limit,
            promised={},
            now=NOW,
        )
        for d, names in groups.items()
    ]
    known = [e.start for e in estimates if e is not None and e.start is not None]
    if plan.fits_now:
        assert plan.reservations == ()  # no reservation when the gang fits now
        assert min(known) == NOW
        return
    if not plan.reservations:
        assert plan.unplaceable == (wanted.gang,)
        return
    (held,) = plan.reservations
    if known:
        assert held.start == min(known)  # the earliest over every rack
        assert held.start is not None
        assert _holds_at(cluster, held.nodes, held.start, wanted.member) >= members
        before = held.start - timedelta(seconds=1)
        if before >= NOW:
            for d, names in groups.items():
                assert _holds_at(cluster, names, before, wanted.member) < members, d
    else:
        assert held.start is None


@settings(max_examples=150, deadline=None)
@given(racks(), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 12 * 3600)))
def test_a_backfilled_pod_always_ends_before_the_reservation_starts(
    cluster: PlanInput, members: int, pod_limit: int | None
) -> None:
    plan = plan_reservations([gang(members=members)], cluster, {}, NOW)
    ends = None if pod_limit is None else NOW + timedelta(seconds=pod_limit)
    for reservation in plan.reservations:
        for name in reservation.nodes:
            promises = node_promises(cluster.nodes[name], plan.reservations)
            verdict = backfill_verdict(
                name, promises, pod_gang=None, ends=ends, limit_s=pod_limit, now=NOW
            )
            if verdict is FIT:
                assert ends is not None
                assert reservation.start is not None
                assert ends <= reservation.start


def test_outlooks_are_kept_while_the_node_and_its_pods_are_the_same() -> None:
    state, held = busy("n1", "r1", [(8, 30)])
    cluster = cluster_of((state, held))
    memo = cluster.memo
    first = memo.outlook(state, held, MEMBER, NOW, grace=RULES.overrun_grace, islands_required=True)
    assert (
        memo.outlook(state, held, MEMBER, at(10), grace=RULES.overrun_grace, islands_required=True)
        is first
    )
    # past the pod's end the kept outlook would hide an overrun: made again
    later = memo.outlook(
        state, held, MEMBER, at(31), grace=RULES.overrun_grace, islands_required=True
    )
    assert later is not first
    assert later.steps == ((at(32), 1),)
