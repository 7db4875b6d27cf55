"""The extender's filters and GPU choice, one table each: which nodes a pod may go to,
what a person reads when it may not, and whether preemption could help."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.model import (
    NodeRequirement,
    NodeSelection,
    NodeState,
    PodDemand,
    Taint,
    Toleration,
)
from extender.config import ExtenderConfig
from extender.context import FIT, Unfit, Verdict
from extender.decide import filter_nodes
from extender.filters import (
    FILTERS,
    filter_gang_domain,
    filter_gang_room,
    filter_gpus,
    filter_maintenance,
    filter_node_selection,
    filter_product,
    filter_schedulable,
    run_filters,
)
from extender.gpus import choose_gpus
from tests.builders import H100, RACK_LABEL
from tests.unit.test_extender_builders import (
    CONFIG,
    NOW,
    RELAXED,
    context,
    demand,
    node,
    pod,
    snapshot,
)


def unfit(reason: str, resolvable: bool) -> Unfit:
    return Unfit(reason, resolvable)


# ---------------------------------------------------------------- GPUs


@pytest.mark.parametrize(
    ("layout", "want", "config", "expected"),
    [
        pytest.param(".... ....", demand(4), CONFIG, FIT, id="empty-node"),
        pytest.param("#... ....", demand(4), CONFIG, FIT, id="second-island-whole"),
        pytest.param(
            "#... #...",
            demand(4),
            CONFIG,
            unfit(
                "3 healthy GPUs free in island 0, pod needs 4 "
                "(6 free on the node, but 4 must share one NVLink island)",
                True,
            ),
            id="no-island-holds-it",
        ),
        pytest.param("#... #...", demand(4), RELAXED, FIT, id="islands-relaxed-may-span"),
        pytest.param("x... x...", demand(4), CONFIG, FIT, id="no-island-has-4-healthy-so-spans"),
        pytest.param(
            "##.. ##..",
            demand(3),
            CONFIG,
            unfit(
                "2 healthy GPUs free in island 0, pod needs 3 "
                "(4 free on the node, but 3 must share one NVLink island)",
                True,
            ),
            id="best-island-is-named",
        ),
        pytest.param(
            "xx.. ....",
            demand(8),
            CONFIG,
            unfit("node has 6 healthy GPUs (GPU 0,1 unhealthy), pod needs 8", False),
            id="too-few-healthy-at-all",
        ),
        pytest.param(
            "#### ####",
            demand(1),
            CONFIG,
            unfit("all 8 healthy GPUs are in use, pod needs 1", True),
            id="full-node",
        ),
        pytest.param(
            "5... ....",
            demand(8),
            CONFIG,
            unfit("7 healthy GPUs free, pod needs 8", True),
            id="a-shared-gpu-is-not-free-for-whole-pods",
        ),
        pytest.param(
            "",
            demand(1),
            CONFIG,
            unfit("node has no GPUs (nvidia.com/gpu allocatable is 0)", False),
            id="no-gpus",
        ),
        pytest.param("5### ####", demand(milli=500), CONFIG, FIT, id="share-fits-exactly"),
        pytest.param(
            "5### 3###",
            demand(milli=600),
            CONFIG,
            unfit(
                "at most 500 milli-GPU free on one healthy GPU (GPU 0), "
                "pod needs 600 milli of one GPU",
                True,
            ),
            id="share-needs-one-gpu-not-a-sum",
        ),
        pytest.param(
            "x### ####",
            demand(milli=100),
            CONFIG,
            unfit("all 7 healthy GPUs are in use, pod needs 100 milli of one GPU", True),
            id="unhealthy-free-gpu-is-not-counted",
        ),
        pytest.param(
            "xxxx",
            demand(milli=100),
            CONFIG,
            unfit("all 4 GPUs of the node are unhealthy", False),
            id="all-unhealthy",
        ),
        pytest.param("....", PodDemand(), CONFIG, FIT, id="pod-without-gpus"),
    ],
)
def test_filter_gpus(
    layout: str, want: PodDemand, config: ExtenderConfig, expected: Verdict
) -> None:
    assert filter_gpus(context(want, config=config), node(layout)) == expected


# ---------------------------------------------------------------- product, cordon, drain


@pytest.mark.parametrize(
    ("product", "accepted", "expected"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", ("H100",), FIT, id="short-name"),
        pytest.param("NVIDIA-H100-80GB-HBM3", ("h100-80gb",), FIT, id="any-case-and-parts"),
        pytest.param("NVIDIA-H100-80GB-HBM3", ("A100", "H100"), FIT, id="one-of-several"),
        pytest.param("NVIDIA-H100-80GB-HBM3", (), FIT, id="any-product"),
        pytest.param(
            "NVIDIA-H100-80GB-HBM3",
            ("A100",),
            unfit("node has NVIDIA-H100-80GB-HBM3 GPUs; pod accepts A100", False),
            id="other-product",
        ),
        pytest.param(
            "NVIDIA-H100-80GB-HBM3",
            ("H10",),
            unfit("node has NVIDIA-H100-80GB-HBM3 GPUs; pod accepts H10", False),
            id="a-prefix-is-not-a-part",
        ),
        pytest.param(
            "",
            ("H100", "A100"),
            unfit("node has no GPU product label; pod accepts H100 or A100", False),
            id="unlabelled-node",
        ),
    ],
)
def test_filter_product(product: str, accepted: tuple[str, ...], expected: Verdict) -> None:
    assert filter_product(context(demand(1, products=accepted)), node(product=product)) == expected


def test_a_cordoned_node_takes_nothing_and_preemption_cannot_help() -> None:
    assert filter_schedulable(context(demand(1)), node(unschedulable=True)) == unfit(
        "node is cordoned (spec.unschedulable)", False
    )
    assert filter_schedulable(context(demand(1)), node()) is FIT


DRAIN = NOW + timedelta(hours=2)


@pytest.mark.parametrize(
    ("drain", "limit_s", "expected"),
    [
        pytest.param(None, None, FIT, id="no-maintenance"),
        pytest.param(DRAIN, 3600, FIT, id="ends-before-drain"),
        pytest.param(DRAIN, 7200, FIT, id="ends-exactly-at-drain"),
        pytest.param(
            DRAIN,
            3 * 3600 + 1800,
            unfit(
                "node drains for maintenance at 2026-11-29T20:00:00Z; pod's time limit of "
                "3h30m would end at 2026-11-29T21:30:00Z",
                False,
            ),
            id="ends-after-drain",
        ),
        pytest.param(
            DRAIN,
            None,
            unfit(
                "node drains for maintenance at 2026-11-29T20:00:00Z; pod has no time limit "
                "(activeDeadlineSeconds) to end before it",
                False,
            ),
            id="no-time-limit",
        ),
        pytest.param(
            NOW - timedelta(minutes=5),
            60,
            unfit(
                "node drains for maintenance at 2026-11-29T17:55:00Z; pod's time limit of "
                "1m would end at 2026-11-29T18:01:00Z",
                False,
            ),
            id="drain-already-began",
        ),
    ],
)
def test_filter_maintenance(drain: datetime | None, limit_s: int | None, expected: Verdict) -> None:
    state = node(drain_after=drain)
    assert filter_maintenance(context(demand(1, time_limit_s=limit_s)), state) == expected


# ---------------------------------------------------------------- gangs


def gang_member(
    topology: str | None = "required:rack",
    gpus: int = 4,
    *,
    milli: int = 0,
    size: int = 4,
    min_count: int | None = None,
    products: tuple[str, ...] = (),
) -> PodDemand:
    return demand(
        gpus,
        milli,
        gang="ns.job",
        size=size,
        min_count=min_count,
        topology=topology,
        products=products,
    )


RACKS = [
    node(".... ....", "a1", rack="r1", block="b1"),
    node(".... ....", "a2", rack="r1", block="b1"),
    node(".... ....", "b1", rack="r2", block="b1"),
]
PLACED = [pod("m0", gang_member(), node="a1", indices=(0, 1, 2, 3))]


@pytest.mark.parametrize(
    ("want", "target", "expected"),
    [
        pytest.param(gang_member(), RACKS[1], FIT, id="same-rack"),
        pytest.param(gang_member(), RACKS[0], FIT, id="same-node"),
        pytest.param(
            gang_member(),
            RACKS[2],
            unfit("gang ns.job has 1 member in rack r1; the node is in another rack", False),
            id="other-rack",
        ),
        pytest.param(
            gang_member(),
            node("....", "bare"),
            unfit(
                "node has no cloud.example.com/topology-rack label; gang ns.job must stay in "
                "one rack",
                False,
            ),
            id="node-without-the-level-label",
        ),
        pytest.param(
            gang_member(topology="required:cloud.example.com/topology-rack"),
            RACKS[2],
            unfit("gang ns.job has 1 member in rack r1; the node is in another rack", False),
            id="level-named-by-its-label",
        ),
        pytest.param(
            gang_member(topology="required:zone"),
            RACKS[1],
            unfit(
                "gang ns.job requires topology level 'zone', which is not one of the "
                "extender's levels (block, rack, hostname)",
                False,
            ),
            id="unknown-level",
        ),
        pytest.param(gang_member("preferred:rack"), RACKS[2], FIT, id="preferred-is-a-score"),
        pytest.param(gang_member(None), RACKS[2], FIT, id="no-topology"),
    ],
)
def test_filter_gang_domain(want: PodDemand, target: NodeState, expected: Verdict) -> None:
    snap = snapshot(RACKS, PLACED)
    assert filter_gang_domain(context(want, snap=snap, name="m1"), target) == expected


def test_outside_its_gangs_domain_a_node_is_refused_for_that_whatever_else_it_has() -> None:
    # a cordoned node, one of another product and one that drains too soon, in another
    # rack: the member is told about the rack, which is what keeps it from each of them
    soon = NOW + timedelta(minutes=5)
    others = [
        node(".... ....", "cordoned", rack="r2", unschedulable=True),
        node(".... ....", "draining", rack="r2", drain_after=soon),
        node(".... ....", "other-product", rack="r2", product="NVIDIA-L4"),
    ]
    member = replace(gang_member(products=(H100,)), time_limit_s=3600)
    snap = snapshot([*RACKS, *others], PLACED)
    outcome = filter_nodes(snap, pod("m1", member), [n.name for n in others], CONFIG, NOW)
    assert outcome.unresolvable == {
        n.name: "gang ns.job has 1 member in rack r1; the node is in another rack" for n in others
    }
    # the same nodes in the gang's rack give their own reasons
    inside = [replace(n, domains={**n.domains, RACK_LABEL: "r1"}) for n in others]
    snap = snapshot([*RACKS, *inside], PLACED)
    outcome = filter_nodes(snap, pod("m1", member), [n.name for n in inside], CONFIG, NOW)
    assert "another rack" not in " ".join(outcome.unresolvable.values())
    assert set(outcome.unresolvable) == {n.name for n in inside}


def test_gang_reasons_name_no_other_domain_so_kube_scheduler_counts_them_as_one() -> None:
    # kube-scheduler's event lists each distinct reason with its node count: a reason
    # naming each node's own rack would list every rack of the cluster
    nodes = [node(".... ....", f"n{i}", rack=f"r{i % 7}") for i in range(40)]
    member = pod("m0", gang_member(), node="n0", indices=(0, 1, 2, 3))
    snap = snapshot(nodes, [member])
    outcome = filter_nodes(snap, pod("m1", gang_member()), [n.name for n in nodes], CONFIG, NOW)
    assert len(outcome.fits) == 6  # n0, n7, ... n35: rack r0
    assert set(outcome.unresolvable.values()) == {
        "gang ns.job has 1 member in rack r0; the node is in another rack"
    }
    first = snapshot(
        [node(f"{'#' * (i % 3)}{'.' * (8 - i % 3)}", f"n{i}", rack=f"r{i}") for i in range(9)]
    )
    outcome = filter_nodes(
        first, pod("m0", gang_member(size=4, gpus=8)), [f"n{i}" for i in range(9)], CONFIG, NOW
    )
    # nine racks, two room sizes: two reasons, none of them a rack's name
    assert outcome.fits == ()
    assert set(outcome.unresolvable.values()) == {
        f"the node's rack has room for {n} of gang ns.job now, it needs 4 together"
        for n in ("0 members", "1 member")
    }


@pytest.mark.parametrize(
    ("layouts", "want", "expected"),
    [
        pytest.param(
            [".... ....", ".... ...."],
            gang_member(size=4),
            FIT,
            id="two-empty-nodes-hold-four",
        ),
        pytest.param(
            ["##.. ##..", "##.. ##..", "##.. ##..", "##.. ##.."],
            gang_member(size=2),
            unfit(
                "the node's rack has room for 0 members of gang ns.job now, it needs 2 together",
                True,
            ),
            id="gpu-sums-are-not-room-for-whole-pods",
        ),
        pytest.param(
            ["#... ....", "#... ...."],
            gang_member(size=4),
            unfit(
                "the node's rack has room for 2 members of gang ns.job now, it needs 4 together",
                True,
            ),
            id="room-taken-by-others-is-resolvable",
        ),
        pytest.param(
            ["....", "...."],
            gang_member(size=4),
            unfit(
                "the node's rack has room for 2 members of gang ns.job now, it needs 4 together",
                False,
            ),
            id="rack-too-small-even-empty",
        ),
        pytest.param(
            ["....", "...."],
            gang_member(size=4, min_count=2),
            FIT,
            id="gang-min-is-what-counts",
        ),
        pytest.param(
            ["5555 5555"],
            gang_member(gpus=0, size=4, milli=500),
            FIT,
            id="shares-count-per-gpu",
        ),
    ],
)
def test_filter_gang_room_for_the_first_member(
    layouts: list[str], want: PodDemand, expected: Verdict
) -> None:
    nodes = [node(layout, f"n{i}", rack="r1") for i, layout in enumerate(layouts)]
    nodes.append(node(".... ....", "elsewhere", rack="r2"))
    ctx = context(want, snap=snapshot(nodes), name="m0")
    assert filter_gang_room(ctx, nodes[0]) == expected


def test_gang_room_skips_nodes_the_pod_could_never_use() -> None:
    nodes = [
        node(".... ....", "n0", rack="r1"),
        node(".... ....", "cordoned", rack="r1", unschedulable=True),
        node(".... ....", "a100", rack="r1", product="NVIDIA-A100-SXM4-80GB"),
    ]
    want = gang_member(size=4, products=("H100",))
    verdict = filter_gang_room(context(want, snap=snapshot(nodes), name="m0"), nodes[0])
    assert verdict == unfit(
        "the node's rack has room for 2 members of gang ns.job now, it needs 4 together", False
    )


# ---------------------------------------------------------------- node selection

SPOT = NodeRequirement("flavor", "In", ("spot",))
NO_MATCH = unfit("node does not match the pod's node selector or required node affinity", False)


def selecting(selection: NodeSelection | None, gpus: int = 1) -> PodDemand:
    return replace(demand(gpus), selection=selection)


def labelled(labels: dict[str, str], name: str = "n1", taints: tuple[Taint, ...] = ()) -> NodeState:
    return replace(node(".... ....", name), labels=labels, taints=taints)


GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("selection", "state", "expected"),
    [
        pytest.param(None, labelled({}, taints=(GPU_TAINT,)), FIT, id="not-known"),
        pytest.param(
            NodeSelection(),
            labelled({}, taints=(GPU_TAINT,)),
            unfit(
                "node has taint nvidia.com/gpu=present:NoSchedule, which the pod does not tolerate",
                False,
            ),
            id="no-toleration",
        ),
        pytest.param(NodeSelection((SPOT,)), labelled({"flavor": "spot"}), FIT, id="selector"),
        pytest.param(
            NodeSelection((SPOT,)), labelled({"flavor": "reserved"}), NO_MATCH, id="selector-off"
        ),
        pytest.param(NodeSelection((SPOT,)), labelled({}), NO_MATCH, id="selector-unlabelled"),
        pytest.param(
            NodeSelection(terms=((NodeRequirement("flavor", "NotIn", ("spot",)),),)),
            labelled({}),
            FIT,
            id="not-in-absent-label",
        ),
        pytest.param(
            NodeSelection(terms=((SPOT,), (NodeRequirement("flavor", "In", ("reserved",)),))),
            labelled({"flavor": "reserved"}),
            FIT,
            id="one-term-of-two",
        ),
        pytest.param(
            NodeSelection(terms=((SPOT, NodeRequirement("zone", "Exists")),)),
            labelled({"flavor": "spot"}),
            NO_MATCH,
            id="a-term-needs-all-its-items",
        ),
        pytest.param(
            NodeSelection(terms=((NodeRequirement("gen", "Gt", ("3",)),),)),
            labelled({"gen": "4"}),
            FIT,
            id="gt",
        ),
        pytest.param(
            NodeSelection(terms=((NodeRequirement("gen", "Lt", ("3",)),),)),
            labelled({"gen": "x"}),
            NO_MATCH,
            id="lt-not-a-number",
        ),
        pytest.param(
            NodeSelection(terms=((NodeRequirement("gpu-off", "DoesNotExist"),),)),
            labelled({"gpu-off": ""}),
            NO_MATCH,
            id="does-not-exist",
        ),
        pytest.param(
            NodeSelection(terms=((NodeRequirement("metadata.name", "In", ("n1",), field=True),),)),
            labelled({}),
            FIT,
            id="match-fields-name",
        ),
        pytest.param(NodeSelection(terms=()), labelled({}), NO_MATCH, id="no-term-matches-none"),
        pytest.param(
            NodeSelection((SPOT,)),
            labelled({"flavor": "spot"}, taints=(GPU_TAINT,)),
            unfit(
                "node has taint nvidia.com/gpu=present:NoSchedule, which the pod does not tolerate",
                False,
            ),
            id="untolerated-taint",
        ),
        pytest.param(
            NodeSelection((SPOT,), tolerations=(Toleration("nvidia.com/gpu", "Exists"),)),
            labelled({"flavor": "spot"}, taints=(GPU_TAINT,)),
            FIT,
            id="tolerated-by-key",
        ),
        pytest.param(
            NodeSelection((SPOT,), tolerations=(Toleration(operator="Exists"),)),
            labelled({"flavor": "spot"}, taints=(GPU_TAINT,)),
            FIT,
            id="tolerates-everything",
        ),
        pytest.param(
            NodeSelection(
                (SPOT,), tolerations=(Toleration("nvidia.com/gpu", "Equal", "other", ""),)
            ),
            labelled({"flavor": "spot"}, taints=(GPU_TAINT,)),
            unfit(
                "node has taint nvidia.com/gpu=present:NoSchedule, which the pod does not tolerate",
                False,
            ),
            id="value-differs",
        ),
        pytest.param(
            NodeSelection(
                (SPOT,), tolerations=(Toleration("nvidia.com/gpu", "Exists", "", "NoExecute"),)
            ),
            labelled({"flavor": "spot"}, taints=(GPU_TAINT,)),
            unfit(
                "node has taint nvidia.com/gpu=present:NoSchedule, which the pod does not tolerate",
                False,
            ),
            id="effect-differs",
        ),
        pytest.param(
            NodeSelection((SPOT,)),
            labelled({"flavor": "spot"}, taints=(Taint("soft", "", "PreferNoSchedule"),)),
            FIT,
            id="prefer-no-schedule-is-no-bar",
        ),
    ],
)
def test_filter_node_selection(
    selection: NodeSelection | None, state: NodeState, expected: Verdict
) -> None:
    assert filter_node_selection(context(selecting(selection)), state) == expected


def test_gang_room_counts_only_nodes_of_the_members_flavor() -> None:
    """Two flavors share rack r1: its one spot node cannot be the first of a spot gang of
    two whole-node members, though the rack's reserved node has room; rack r2 can."""

    def flavored(name: str, rack: str, flavor: str) -> NodeState:
        return replace(node(".... ....", name, rack=rack), labels={"flavor": flavor})

    nodes = [
        flavored("spot-1", "r1", "spot"),
        flavored("reserved-1", "r1", "reserved"),
        flavored("spot-2", "r2", "spot"),
        flavored("spot-3", "r2", "spot"),
    ]
    want = replace(gang_member(size=2, gpus=8), selection=NodeSelection((SPOT,)))
    outcome = filter_nodes(
        snapshot(nodes), pod("m0", want), ["spot-1", "spot-2", "spot-3"], CONFIG, NOW
    )
    assert outcome.fits == ("spot-2", "spot-3")
    assert outcome.unresolvable == {
        "spot-1": "the node's rack has room for 1 member of gang ns.job now, it needs 2 together"
    }


def test_gang_room_is_not_checked_once_a_member_is_placed() -> None:
    snap = snapshot(RACKS, PLACED)
    want = gang_member(size=16)
    assert filter_gang_room(context(want, snap=snap, name="m1"), RACKS[1]) is FIT


# ---------------------------------------------------------------- all together


def test_an_unresolvable_reason_wins_over_a_resolvable_one() -> None:
    state = node("#### ####", unschedulable=True)
    assert run_filters(context(demand(1)), state) == unfit(
        "node is cordoned (spec.unschedulable)", False
    )


def test_a_fitting_node_passes_every_filter() -> None:
    assert run_filters(context(demand(2, products=("H100",), time_limit_s=60)), node()) is FIT


_MARKS = st.text(alphabet=".#x5", min_size=4, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    layout=st.tuples(_MARKS, _MARKS).map(" ".join),
    rack=st.sampled_from(["r1", "r2", None]),
    cordoned=st.booleans(),
    drains_in_h=st.sampled_from([None, 1, 8]),
    want=st.sampled_from(
        [
            demand(2),
            demand(milli=500),
            gang_member(),
            gang_member(gpus=2, size=3),
            gang_member("preferred:rack"),
            gang_member("required:zone"),
        ]
    ),
    placed=st.booleans(),
    limit_h=st.sampled_from([None, 2]),
)
def test_run_filters_gives_the_first_unresolvable_reason_else_the_first_reason(
    *,
    layout: str,
    rack: str | None,
    cordoned: bool,
    drains_in_h: int | None,
    want: PodDemand,
    placed: bool,
    limit_h: int | None,
) -> None:
    # the rule as FILTERS and their docstrings state it, against run_filters' shortcuts
    drain = None if drains_in_h is None else NOW + timedelta(hours=drains_in_h)
    target = node(layout, "t", rack=rack, drain_after=drain, unschedulable=cordoned)
    want = replace(want, time_limit_s=None if limit_h is None else limit_h * 3600)
    others = [node(".... ....", "a1", rack="r1"), node(".... ....", "b1", rack="r2")]
    members = [pod("m0", gang_member(), node="a1", indices=(0, 1, 2, 3))] if placed else []
    ctx = context(want, snap=snapshot([*others, target], members), name="m1")
    verdicts = [check(ctx, target) for check in FILTERS]
    unfit = [v for v in verdicts if isinstance(v, Unfit)]
    hopeless = [v for v in unfit if not v.resolvable]
    expected = hopeless[0] if hopeless else unfit[0] if unfit else FIT
    assert run_filters(ctx, target) == expected


# ---------------------------------------------------------------- choosing GPUs


@pytest.mark.parametrize(
    ("layout", "want", "config", "expected"),
    [
        pytest.param("#... ....", demand(1), CONFIG, (1,), id="best-fit-island-first"),
        pytest.param("#... ....", demand(3), CONFIG, (1, 2, 3), id="fills-the-partial-island"),
        pytest.param("#... ....", demand(4), CONFIG, (4, 5, 6, 7), id="only-whole-island"),
        pytest.param("##.. #...", demand(2), CONFIG, (2, 3), id="tightest-island"),
        pytest.param("#... ....", demand(6), CONFIG, (1, 2, 4, 5, 6, 7), id="spans-fewest"),
        pytest.param("##.. ##..", demand(4), RELAXED, (2, 3, 6, 7), id="relaxed-spans"),
        pytest.param("##.. ##..", demand(4), CONFIG, None, id="strict-refuses-to-span"),
        pytest.param("x... ....", demand(1), CONFIG, (1,), id="unhealthy-shrinks-an-island"),
        pytest.param("xxx. x...", demand(2), CONFIG, (5, 6), id="unhealthy-never-chosen"),
        pytest.param("5.7. ....", demand(milli=300), CONFIG, (0,), id="tightest-share"),
        pytest.param("5.7. ....", demand(milli=600), CONFIG, (2,), id="share-skips-too-small"),
        pytest.param(
            "5.7. ....", demand(milli=800), CONFIG, (1,), id="share-on-whole-gpu-in-busy-island"
        ),
        pytest.param("#### ####", demand(milli=1), CONFIG, None, id="no-room-for-a-share"),
        pytest.param("....", PodDemand(), CONFIG, (), id="no-gpu-no-indices"),
    ],
)
def test_choose_gpus(
    layout: str, want: PodDemand, config: ExtenderConfig, expected: tuple[int, ...] | None
) -> None:
    assert choose_gpus(node(layout), want, config) == expected
