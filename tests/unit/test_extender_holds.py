"""What the live extender holds from one plan to the next (``extender.holds``): a
waiting gang gets the rack that frees soonest, from when its pods' time limits end; at
most ``max_reservations`` gangs hold one, the higher priority first, then the oldest; a
gang that has begun to land keeps its nodes until it has started; a gang whose pods
are gone (a Kueue requeue) keeps its hold for the grace and its place in the order;
and a cluster without gangs holds nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.convert.grammar import AnnotationError
from cluster.model import (
    GangId,
    GangSpec,
    NodeName,
    NodeRequirement,
    NodeSelection,
    NodeState,
    PodDemand,
    PodInfo,
    Promise,
    TopologyConstraint,
    TopologyMode,
)
from cluster.snapshot import Snapshot
from extender.holds import (
    Hold,
    HoldRules,
    Holds,
    changed,
    hold_of,
    lease_name,
    lease_of,
    next_holds,
)
from extender.reservations import Reservation, ReservationRules
from tests.builders import RACK_LABEL
from tests.unit.test_extender_builders import CONFIG, NOW, node, pod, snapshot
from tests.unit.test_extender_invariants import DEMANDS

RULES = HoldRules(ReservationRules(max_reservations=2), timedelta(minutes=3))


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def short_job(name: str, where: str, *, minutes: float, started: float = -10) -> PodInfo:
    """A running 8-GPU job on ``where`` whose time limit ends ``minutes`` from now."""
    limit = round((minutes - started) * 60)
    placed = pod(name, PodDemand(gpus=8, time_limit_s=limit), node=where, indices=tuple(range(8)))
    return replace(placed, started_at=at(started))


def member(
    name: str, gang: str, *, created: float = -5, priority: int = 0, size: int = 2
) -> PodInfo:
    want = PodDemand(
        gpus=8,
        gang=GangSpec(GangId(gang), size, size),
        topology=TopologyConstraint(TopologyMode.REQUIRED, "rack"),
        time_limit_s=3600,
    )
    return replace(pod(name, want), created_at=at(created), priority=priority)


NODES = [node("........", f"{r}{i}", rack=r) for r in ("r1", "r2") for i in (1, 2)]
BUSY = [
    short_job("s1", "r11", minutes=20),
    short_job("s2", "r12", minutes=30),
    short_job("s3", "r21", minutes=50),
    short_job("s4", "r22", minutes=60),
]


def plan(pods: list[PodInfo], held: dict[GangId, Hold] | None = None, now: float = 0) -> Holds:
    return next_holds(snapshot(NODES, [*BUSY, *pods]), CONFIG, RULES, held or {}, at(now))


def test_a_waiting_gang_holds_the_rack_that_frees_soonest_from_then() -> None:
    holds = plan([member("g-0", "ns.g"), member("g-1", "ns.g")])
    hold = holds.held[GangId("ns.g")]
    assert hold.reservation.nodes == (NodeName("r11"), NodeName("r12"))
    assert hold.reservation.start == at(30)
    assert hold.since == at(-5)
    assert holds.promises() == {
        NodeName("r11"): (Promise(at(30), GangId("ns.g")),),
        NodeName("r12"): (Promise(at(30), GangId("ns.g")),),
    }


def test_the_higher_priority_then_the_oldest_hold_up_to_the_bound() -> None:
    waiting = [
        member("old-0", "ns.old", created=-30),
        member("new-0", "ns.new", created=-10),
        member("vip-0", "ns.vip", created=-1, priority=10),
    ]
    holds = plan(waiting)
    assert sorted(holds.held) == ["ns.old", "ns.vip"]
    assert holds.held[GangId("ns.vip")].reservation.start == at(30)  # the first rack to free
    assert holds.unreserved == ("ns.new",)


def test_a_reserved_gang_that_fits_now_is_held_from_now_until_its_members_land() -> None:
    waiting = [member("g-0", "ns.g"), member("g-1", "ns.g")]
    held = plan(waiting).held
    assert held[GangId("ns.g")].reservation.start == at(30)
    free = [node("........", f"r3{i}", rack="r3") for i in (1, 2)]
    snap = snapshot([*NODES, *free], [*BUSY, *waiting])
    holds = next_holds(snap, CONFIG, RULES, held, at(1))
    assert holds.held[GangId("ns.g")].reservation == Reservation(
        GangId("ns.g"), "r3", (NodeName("r31"), NodeName("r32")), at(1)
    )


def test_a_gang_that_fits_now_and_held_nothing_holds_nothing() -> None:
    """A plan asked for by another gang changes no answer for one that can start now."""
    free = [node("........", f"r3{i}", rack="r3") for i in (1, 2)]
    snap = snapshot([*NODES, *free], [*BUSY, member("g-0", "ns.g"), member("g-1", "ns.g")])
    assert next_holds(snap, CONFIG, RULES, {}, NOW).held == {}


def test_a_gang_holds_only_nodes_its_node_selector_lets_it_use() -> None:
    # r1 frees first and r3 is free now, but the gang's pods select the nodes of pool b
    # (r2): kube-scheduler would never offer the others, so holding them would keep
    # GPUs idle for a gang that cannot use them, and starve it.
    pools = {"r1": "a", "r2": "b", "r3": "a"}
    free = [node("........", f"r3{i}", rack="r3") for i in (1, 2)]
    nodes = [replace(n, labels={**n.labels, "pool": pools[n.domains[RACK_LABEL]]})
             for n in [*NODES, *free]]  # fmt: skip
    pool_b = NodeSelection(required=(NodeRequirement("pool", "In", ("b",)),))
    members = [
        replace(m, demand=replace(m.demand, selection=pool_b))
        for m in (member("g-0", "ns.g"), member("g-1", "ns.g"))
    ]
    holds = next_holds(snapshot(nodes, [*BUSY, *members]), CONFIG, RULES, {}, NOW)
    hold = holds.held[GangId("ns.g")]
    assert (hold.reservation.nodes, hold.reservation.start) == (
        (NodeName("r21"), NodeName("r22")),
        at(60),
    )
    # the same gang with no selector fits the free rack now: placed, not held
    unselected = next_holds(
        snapshot(nodes, [*BUSY, member("g-0", "ns.g"), member("g-1", "ns.g")]),
        CONFIG, RULES, {}, NOW,
    )  # fmt: skip
    assert unselected.held == {}


def test_a_gang_that_began_to_land_keeps_its_nodes_until_it_has_started() -> None:
    held = plan([member("g-0", "ns.g"), member("g-1", "ns.g")]).held
    landed = replace(member("g-0", "ns.g"), node=NodeName("r11"), gpu_indices=tuple(range(8)))
    later = plan([landed, member("g-1", "ns.g")], dict(held), now=31).held
    reservation = later[GangId("ns.g")].reservation
    assert reservation.nodes == held[GangId("ns.g")].reservation.nodes
    assert reservation.start == at(30)  # already begun: from then on
    both = replace(member("g-1", "ns.g"), node=NodeName("r12"), gpu_indices=tuple(range(8)))
    assert plan([landed, both], dict(later), now=32).held == {}


def test_a_requeued_gang_keeps_its_hold_for_the_grace_and_its_place_in_the_order() -> None:
    held = plan([member("g-0", "ns.g", created=-20)]).held
    gone = plan([member("y-0", "ns.young", created=-1)], dict(held), now=2).held
    assert gone[GangId("ns.g")] == held[GangId("ns.g")]  # its pods are gone: kept
    # back within the grace, with new pods: served before the younger gang still
    back = [member("g-0", "ns.g", created=1), member("y-0", "ns.young", created=-1)]
    again = plan(back, dict(gone), now=2.5).held
    assert again[GangId("ns.g")].since == at(-20)
    assert again[GangId("ns.g")].reservation.start == at(30)
    assert again[GangId("ns.young")].reservation.start == at(60)
    # gone for longer than the grace: released
    assert GangId("ns.g") not in plan([], dict(gone), now=3.5).held


def test_a_record_is_written_when_made_moved_released_or_seen_long_after() -> None:
    first = plan([member("g-0", "ns.g")]).held
    every = timedelta(minutes=1)
    seen_again = {g: replace(h, seen=at(0.5)) for g, h in first.items()}
    assert list(changed(first, seen_again, every)) == []
    seen_later = {g: replace(h, seen=at(1)) for g, h in first.items()}
    assert list(changed(first, seen_later, every)) == ["ns.g"]
    moved = {
        g: replace(h, reservation=replace(h.reservation, start=at(45))) for g, h in first.items()
    }
    assert list(changed(first, moved, every)) == ["ns.g"]
    assert list(changed(first, {}, every)) == ["ns.g"]
    assert list(changed({}, first, every)) == ["ns.g"]


def test_a_hold_reads_back_from_its_lease() -> None:
    hold = plan([member("g-0", "ns.g")]).held[GangId("ns.g")]
    lease = lease_of(hold, "tessera-system")
    assert lease["metadata"]["name"] == "tessera-reservation-ns.g"
    assert lease["metadata"]["annotations"] == {
        "tessera.dev/reservation": "domain=r1;start=2026-11-29T18:30:00Z;nodes=r11,r12"
    }
    assert hold_of(lease) == hold
    assert len(lease_name(GangId("ns." + "x" * 300))) == 253


def test_a_lease_without_its_record_is_refused() -> None:
    lease = lease_of(plan([member("g-0", "ns.g")]).held[GangId("ns.g")], "tessera-system")
    del lease["spec"]["holderIdentity"]
    with pytest.raises(AnnotationError, match="lacks its holder"):
        hold_of(lease)


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(DEMANDS, max_size=6))
def test_without_gangs_nothing_is_held(shapes: list[PodDemand]) -> None:
    """Lone pods only, as on the openb traces: no plan reserves anything."""
    nodes: list[NodeState] = [node("........", f"n{i}", rack="r1") for i in range(3)]
    waiting = [pod(f"p{i}", replace(want, gang=None)) for i, want in enumerate(shapes)]
    snap: Snapshot = snapshot(nodes, [*BUSY[:1], *waiting])
    holds = next_holds(snap, CONFIG, RULES, {}, NOW)
    assert holds.held == {}
    assert holds.promises() == {}
