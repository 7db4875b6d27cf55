"""A reservation in the live filter pipeline (``filters.filter_reserved``): on a node a
gang's reservation holds, another pod starts only if its time limit ends before the
reservation starts (backfill), with a reason a user can act on; the gang's members go
there; another gang does not count the GPUs kept free there; and nothing a request
kept by node name outlives a reservation made or released."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import pytest

from cluster.cache import ClusterCache
from cluster.model import GangId, NodeName, NodeState, PodInfo, Promise
from cluster.snapshot import Snapshot
from extender.context import FIT, Unfit, Verdict
from extender.decide import filter_nodes, score_nodes
from extender.filters import filter_reserved, run_filters
from extender.gangs import build_context
from extender.memo import DecisionCache
from tests.unit.test_extender_builders import CONFIG, NOW, cluster, demand, node, pod

BIG = GangId("ns.big")
START = NOW + timedelta(hours=2)
HELD = (Promise(START, BIG),)
UNKNOWN = (Promise(None, BIG),)


def promised(cache: ClusterCache, promises: Mapping[str, tuple[Promise, ...]]) -> Snapshot:
    cache.promise({NodeName(name): held for name, held in promises.items()})
    return cache.snapshot()


def reserved_cluster(
    nodes: Iterable[NodeState],
    held: Mapping[str, tuple[Promise, ...]],
    pods: Iterable[PodInfo] = (),
) -> Snapshot:
    return promised(cluster(nodes, pods), held)


def big_member(size: int = 2) -> PodInfo:
    return pod("big-0", demand(8, gang=str(BIG), size=size, topology="required:rack"))


@pytest.mark.parametrize(
    ("held", "asking", "expected"),
    [
        pytest.param((), pod("p", demand(1)), FIT, id="not-reserved"),
        pytest.param(HELD, pod("p", demand(1, time_limit_s=3600)), FIT, id="ends-in-time"),
        pytest.param(HELD, pod("p", demand(1, time_limit_s=7200)), FIT, id="ends-at-the-start"),
        pytest.param(
            HELD,
            pod("p", demand(1, time_limit_s=3 * 3600)),
            Unfit(
                "node n1 is reserved for gang ns.big from 20:00:00Z: this pod's time limit "
                "ends 21:00:00Z",
                resolvable=False,
            ),
            id="ends-too-late",
        ),
        pytest.param(
            HELD,
            pod("p", demand(1)),
            Unfit(
                "node n1 is reserved for gang ns.big from 20:00:00Z: this pod has no time "
                "limit (activeDeadlineSeconds) to end before it",
                resolvable=False,
            ),
            id="no-time-limit",
        ),
        pytest.param(
            UNKNOWN,
            pod("p", demand(1, time_limit_s=60)),
            Unfit(
                "node n1 is reserved for gang ns.big, which starts when pods without a time "
                "limit end there: no other pod may start on it meanwhile",
                resolvable=False,
            ),
            id="start-unknown",
        ),
        pytest.param(HELD, big_member(1), FIT, id="the-gangs-own-member"),
        pytest.param(UNKNOWN, big_member(1), FIT, id="the-gangs-own-member-start-unknown"),
    ],
)
def test_a_reserved_node_takes_the_gang_and_what_ends_in_time(
    held: tuple[Promise, ...], asking: PodInfo, expected: Verdict
) -> None:
    snap = reserved_cluster([node(rack="r1")], {"n1": held} if held else {})
    ctx = build_context(snap, asking, CONFIG, NOW)
    target = snap.nodes[NodeName("n1")]
    assert filter_reserved(ctx, target) == expected
    assert run_filters(ctx, target) == expected  # in the pipeline, nothing else refuses


def test_a_refused_pod_is_told_the_reservation_and_no_preemption_is_tried() -> None:
    snap = reserved_cluster([node(name="a1", rack="r1"), node(name="b1", rack="r2")], {"a1": HELD})
    late = filter_nodes(
        snap, pod("late", demand(1, time_limit_s=4 * 3600)), ["a1", "b1"], CONFIG, NOW
    )
    assert late.fits == ("b1",)
    assert not late.failed
    assert late.unresolvable[NodeName("a1")].startswith("node a1 is reserved for gang ns.big")
    short = filter_nodes(
        snap, pod("short", demand(1, time_limit_s=1800)), ["a1", "b1"], CONFIG, NOW
    )
    assert short.fits == ("a1", "b1")


RACK_R1 = [node(name="a1", rack="r1"), node(name="a2", rack="r1")]
RACK_R2 = [node("#### ####", "b1", rack="r2"), node(".... ....", "b2", rack="r2")]


def test_another_gang_does_not_count_the_gpus_kept_free_for_a_reservation() -> None:
    snap = reserved_cluster([*RACK_R1, *RACK_R2], {"a1": HELD, "a2": HELD})
    other = pod("o-0", demand(8, gang="ns.other", size=2, topology="required:rack"))
    outcome = filter_nodes(snap, other, ["a1", "a2", "b1", "b2"], CONFIG, NOW)
    assert outcome.fits == ()
    assert outcome.unresolvable[NodeName("a1")].startswith("node a1 is reserved for gang ns.big")
    # r2 has room for one member of two: and r1, kept for ns.big, is not counted
    assert outcome.failed[NodeName("b2")] == (
        "the node's rack has room for 1 member of gang ns.other now, it needs 2 together"
    )
    mine = filter_nodes(snap, big_member(), ["a1", "a2", "b1", "b2"], CONFIG, NOW)
    assert mine.fits == ("a1", "a2")


def test_a_reservation_made_or_released_shows_in_answers_kept_by_name() -> None:
    cache = cluster([*RACK_R1, *RACK_R2])
    memo = DecisionCache(CONFIG)
    names = ["a1", "a2", "b2"]
    lone = pod("lone", demand(2, time_limit_s=4 * 3600))
    member = pod("o-0", demand(8, gang="ns.other", size=1, topology="required:rack"))

    def answers() -> tuple[object, ...]:
        snap = cache.snapshot()
        return (
            filter_nodes(snap, lone, names, CONFIG, NOW, memo=memo).fits,
            filter_nodes(snap, member, names, CONFIG, NOW, memo=memo).fits,
            tuple(s is not None for s in score_nodes(snap, lone, names, CONFIG, NOW, memo=memo)),
        )

    assert answers() == (("a1", "a2", "b2"), ("a1", "a2", "b2"), (True, True, True))
    promised(cache, {"a1": HELD})
    assert answers() == (("a2", "b2"), ("a2", "b2"), (False, True, True))
    promised(cache, {})
    assert answers() == (("a1", "a2", "b2"), ("a1", "a2", "b2"), (True, True, True))


def test_a_time_past_the_reservations_start_refuses_every_other_pod() -> None:
    snap = reserved_cluster([node(rack="r1")], {"n1": HELD})
    later: datetime = START + timedelta(minutes=1)
    ctx = build_context(snap, pod("p", demand(1, time_limit_s=60)), CONFIG, later)
    verdict = filter_reserved(ctx, snap.nodes[NodeName("n1")])
    assert isinstance(verdict, Unfit)
    assert not verdict.resolvable
