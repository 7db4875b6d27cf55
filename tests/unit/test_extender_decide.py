"""Filter, bind and the request's nodes over a snapshot: what filter answers per node,
what bind takes, and how full Node objects meet the cache (preemption's tests are in
``test_extender_preemption``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from cluster.convert.nodes import node_from_json
from cluster.model import (
    UNCONSTRAINED,
    Allocation,
    NodeName,
    NodeSelection,
    PodDemand,
    PodInfo,
    PodKey,
    Taint,
    Toleration,
)
from cluster.snapshot import Snapshot
from extender import decide
from extender.config import ExtenderConfig
from extender.decide import BindPlan, BindRefusal
from tests import builders
from tests.unit.test_extender_builders import (
    CONFIG,
    NOW,
    cluster,
    demand,
    free_milli,
    node,
    pod,
    snapshot,
)

# ---------------------------------------------------------------- filter


def test_filter_sorts_every_candidate_into_fits_failed_or_unresolvable() -> None:
    snap = snapshot(
        [
            node(".... ....", "free"),
            node("#### ####", "busy"),
            node(".... ....", "cordoned", unschedulable=True),
        ]
    )
    outcome = decide.filter_nodes(
        snap, pod("p", demand(2)), ["busy", "free", "cordoned", "ghost"], CONFIG, NOW
    )
    assert outcome.fits == ("free",)
    assert outcome.failed == {"busy": "all 8 healthy GPUs are in use, pod needs 2"}
    assert outcome.unresolvable == {
        "cordoned": "node is cordoned (spec.unschedulable)",
        "ghost": (
            "node ghost is not in the extender's cache (not seen by its watch yet, or deleted)"
        ),
    }


def test_filter_counts_assumed_pods() -> None:
    cache = cluster([node(".... ....", "n1")], [pod("a", demand(4))])
    info = cache.snapshot().pods[PodKey("ns/a")]
    cache.assume(info, Allocation(NodeName("n1"), (0, 1, 2, 3), 1000))
    outcome = decide.filter_nodes(cache.snapshot(), pod("c", demand(8)), ["n1"], CONFIG, NOW)
    assert outcome.failed == {"n1": "4 healthy GPUs free, pod needs 8"}


# ---------------------------------------------------------------- choosing in filter

CHOOSING = replace(CONFIG, choose_in_filter=True)
PREFERS = NodeSelection(prefers=True)
SOFT_TAINT = Taint("example.com/spot", "true", "PreferNoSchedule")


def _choice(
    names: list[str],
    *,
    config: ExtenderConfig = CHOOSING,
    selection: NodeSelection | None = UNCONSTRAINED,
    tainted: str = "",
) -> NodeName | None:
    """Which node ``/filter`` names alone for a 4-GPU pod over ``names``: ``half`` (4 of
    8 GPUs in use: the pod fills it), ``empty`` and ``empty2`` (8 free), ``full``."""
    layouts = {
        "half": "#### ....",
        "empty": ".... ....",
        "empty2": ".... ....",
        "full": "#### ####",
    }
    nodes = [
        replace(node(layout, name), taints=(SOFT_TAINT,) if name == tainted else ())
        for name, layout in layouts.items()
    ]
    new = pod("p", replace(demand(4), selection=selection))
    snap = snapshot(nodes)
    outcome = decide.filter_nodes(snap, new, names, config, NOW)
    chosen = decide.choose(snap, new, outcome, config, NOW)
    assert replace(chosen, chosen=None) == outcome  # what fits and why not stays whole
    return chosen.chosen


@pytest.mark.parametrize(
    ("names", "kwargs", "chosen"),
    [
        pytest.param(["empty", "half"], {}, "half", id="the best score, though named last"),
        pytest.param(["half", "empty"], {}, "half", id="the best score, named first"),
        pytest.param(["empty", "empty2"], {}, "empty", id="equals: the first named"),
        pytest.param(["empty2", "empty"], {}, "empty2", id="equals: the first named again"),
        pytest.param(["full", "half"], {}, None, id="one fits: nothing to choose"),
        pytest.param(["empty", "half"], {"config": CONFIG}, None, id="off"),
        pytest.param(["empty", "half"], {"selection": PREFERS}, None, id="the pod prefers"),
        pytest.param(["empty", "half"], {"selection": None}, None, id="selection unknown"),
        pytest.param(
            ["empty", "half"], {"tainted": "half"}, "empty", id="PreferNoSchedule: the next"
        ),
        pytest.param(
            ["half", "full", "empty"], {"tainted": "empty"}, "half", id="taint on a worse one"
        ),
    ],
)
def test_choose_names_the_best_node_when_the_choice_is_the_extenders(
    names: list[str], kwargs: dict[str, Any], chosen: str | None
) -> None:
    assert _choice(names, **kwargs) == chosen


def test_choose_takes_an_avoided_node_when_every_fit_is_avoided() -> None:
    tolerated = replace(UNCONSTRAINED, tolerations=(Toleration("example.com/spot", "Exists"),))
    assert _choice(["empty", "half"], tainted="half", selection=tolerated) == "half"
    assert _choice(["half"], tainted="half") is None  # one fit: kube-scheduler's anyway


# ---------------------------------------------------------------- full Node objects


def test_request_nodes_take_gpu_use_from_the_cache_and_the_rest_from_the_request() -> None:
    cached = node_from_json(
        builders.node_json("n1", islands="0-3,4-7", rack="r1"), CONFIG.level_labels
    )
    snap = snapshot([cached], [pod("a", demand(2), node="n1", indices=(0, 1))])
    sent = builders.node_json("n1", islands="0-3,4-7", rack="r9", unhealthy="7")
    given = decide.request_nodes(snap, [sent], CONFIG)
    merged = given.snapshot.nodes[NodeName("n1")]
    assert given.names == ("n1",)
    assert free_milli(merged) == {0: 0, 1: 0, 2: 1000, 3: 1000, 4: 1000, 5: 1000, 6: 1000, 7: 1000}
    assert merged.domains[builders.RACK_LABEL] == "r9"
    assert [g.index for g in merged.gpus if not g.healthy] == [7]


def test_request_nodes_keep_the_stricter_view_of_health_cordon_and_drain() -> None:
    soon = "2026-11-29T19:00:00Z"
    cached = node_from_json(
        builders.node_json("n1", unhealthy="3", unschedulable=True, drain_after=soon),
        CONFIG.level_labels,
    )
    sent = builders.node_json("n1", drain_after="2026-11-30T00:00:00Z")
    merged = decide.request_nodes(snapshot([cached]), [sent], CONFIG).snapshot.nodes[NodeName("n1")]
    assert [g.index for g in merged.gpus if not g.healthy] == [3]
    assert merged.unschedulable
    assert merged.drain_after == cached.drain_after


def test_request_nodes_unknown_to_the_cache_are_unresolvable() -> None:
    given = decide.request_nodes(snapshot([]), [builders.node_json("new")], CONFIG)
    assert given.names == ()
    assert given.unresolvable == {
        "new": "node new is not in the extender's cache (not seen by its watch yet, or deleted)"
    }


def test_request_node_without_a_name_is_reported_not_raised() -> None:
    nameless = builders.node_json("x")
    del nameless["metadata"]["name"]
    given = decide.request_nodes(snapshot([]), [nameless], CONFIG)
    assert list(given.unresolvable) == ["Nodes.items[0]"]


@pytest.mark.parametrize(
    "want",
    [
        pytest.param(demand(1), id="lone-pod"),
        pytest.param(demand(1, gang="ns.g", size=2, topology="required:rack"), id="gang-member"),
    ],
)
def test_a_requests_own_node_is_judged_whatever_was_kept_for_the_cached_one(
    want: PodDemand,
) -> None:
    """Answers kept by node name describe the cache's nodes: a request that sends its
    own copy (cordoned here, the cache's is not) is judged on that copy, and leaves
    the cache's answers as they were."""
    config = replace(CONFIG)
    cache = cluster([node(".... ....", "n1", rack="r1"), node(".... ....", "n2", rack="r1")])
    names = ["n1", "n2"]
    asking = pod("p", want)
    assert decide.filter_nodes(cache.snapshot(), asking, names, config, NOW).fits == ("n1", "n2")
    scores = decide.score_nodes(cache.snapshot(), asking, names, config, NOW)
    assert None not in scores
    sent = builders.node_json("n1", rack="r1", unschedulable=True)
    given = decide.request_nodes(cache.snapshot(), [sent], config)
    outcome = decide.filter_nodes(given.snapshot, asking, given.names, config, NOW)
    assert outcome.unresolvable == {"n1": "node is cordoned (spec.unschedulable)"}
    assert decide.score_nodes(given.snapshot, asking, given.names, config, NOW) == [None]
    assert decide.filter_nodes(cache.snapshot(), asking, names, config, NOW).fits == ("n1", "n2")
    assert decide.score_nodes(cache.snapshot(), asking, names, config, NOW) == scores


def test_the_overlay_still_shows_the_other_cached_nodes() -> None:
    cached = [node(".... ....", "n1"), node(".... ....", "n2")]
    given = decide.request_nodes(snapshot(cached), [builders.node_json("n1")], CONFIG)
    assert sorted(given.snapshot.nodes) == ["n1", "n2"]
    assert len(given.snapshot.nodes) == 2


# ---------------------------------------------------------------- bind


def bind_cluster(*pods: PodInfo) -> Snapshot:
    return snapshot([node("#... ....", "n1", rack="r1"), node(".... ....", "n2", rack="r2")], pods)


def test_plan_bind_takes_the_gpus_choose_gpus_names() -> None:
    snap = bind_cluster(pod("p", demand(3)))
    plan = decide.plan_bind(snap, PodKey("ns/p"), "n1", CONFIG, NOW, uid="uid-p")
    assert plan == BindPlan(snap.pods[PodKey("ns/p")], Allocation(NodeName("n1"), (1, 2, 3), 1000))
    assert isinstance(plan, BindPlan)
    assert plan.gpu_indices == "1,2,3"


def test_plan_bind_of_a_share_takes_its_milli() -> None:
    snap = bind_cluster(pod("p", demand(milli=250)))
    plan = decide.plan_bind(snap, PodKey("ns/p"), "n1", CONFIG, NOW)
    assert isinstance(plan, BindPlan)
    assert plan.allocation == Allocation(NodeName("n1"), (1,), 250)


@pytest.mark.parametrize(
    ("pods", "target", "uid", "reason"),
    [
        pytest.param(
            [],
            "n1",
            "",
            "pod ns/p is not in the extender's cache yet; retry later",
            id="unknown-pod",
        ),
        pytest.param(
            [pod("p", demand(1))],
            "n1",
            "other",
            "pod ns/p in the extender's cache has UID uid-p, the binding is for UID other "
            "(deleted and re-created?)",
            id="recreated-pod",
        ),
        pytest.param(
            [pod("p", demand(1), node="n2", indices=(0,))],
            "n1",
            "",
            "pod ns/p is already bound to node n2",
            id="already-bound",
        ),
        pytest.param(
            [pod("p", demand(1))],
            "n9",
            "",
            "cannot bind pod ns/p: node n9 is not in the extender's cache (not seen by its "
            "watch yet, or deleted)",
            id="unknown-node",
        ),
        pytest.param(
            [pod("p", demand(4)), pod("q", demand(4), node="n1", indices=(4, 5, 6, 7))],
            "n1",
            "",
            "cannot bind pod ns/p to node n1: 3 healthy GPUs free in island 0, pod needs 4",
            id="gpus-taken-meanwhile",
        ),
    ],
)
def test_plan_bind_refuses_with_a_reason(
    pods: list[PodInfo], target: str, uid: str, reason: str
) -> None:
    got = decide.plan_bind(bind_cluster(*pods), PodKey("ns/p"), target, CONFIG, NOW, uid=uid)
    assert got == BindRefusal(reason)


def test_plan_bind_rechecks_every_filter_at_bind_time() -> None:
    drain = NOW + timedelta(minutes=30)
    snap = snapshot([node(drain_after=drain)], [pod("p", demand(1, time_limit_s=3600))])
    got = decide.plan_bind(snap, PodKey("ns/p"), "n1", CONFIG, NOW)
    assert isinstance(got, BindRefusal)
    assert "drains for maintenance" in got.reason


def test_a_retried_bind_gets_the_gpus_it_was_assumed_with() -> None:
    cache = cluster([node(".... ....", "n1")], [pod("p", demand(2))])
    info = cache.snapshot().pods[PodKey("ns/p")]
    held = Allocation(NodeName("n1"), (6, 7), 1000)
    cache.assume(info, held)
    assert decide.plan_bind(cache.snapshot(), info.key, "n1", CONFIG, NOW) == BindPlan(info, held)
    other = decide.plan_bind(cache.snapshot(), info.key, "n2", CONFIG, NOW)
    assert other == BindRefusal("pod ns/p is already being bound to node n1")


def test_plan_bind_accepts_a_pod_the_watch_has_not_shown_yet() -> None:
    fresh = pod("p", demand(1))
    got = decide.plan_bind(bind_cluster(), fresh, "n2", CONFIG, NOW)
    assert got == BindPlan(fresh, Allocation(NodeName("n2"), (0,), 1000))


def test_a_pod_without_gpus_binds_without_an_allocation() -> None:
    # the cache keeps GPU pods only: the pod comes from the /filter request
    got = decide.plan_bind(bind_cluster(), pod("p", PodDemand()), "n1", CONFIG, NOW)
    assert isinstance(got, BindPlan)
    assert got.allocation is None
    assert got.gpu_indices == ""


# ---------------------------------------------------------------- a GPU request that is no count


REFUSAL = "the pod's nvidia.com/gpu request is unusable: containers['c'].resources.requests is '-1'"


def unusable(name: str = "p") -> PodInfo:
    """A pod whose GPU request could not be read: its demand shows no GPUs."""
    return replace(pod(name, PodDemand()), refusal=REFUSAL)


def test_a_pod_with_an_unusable_gpu_request_fits_no_node_and_preemption_cannot_help() -> None:
    snap = snapshot([node(".... ....", "free"), node("#### ####", "busy")])
    outcome = decide.filter_nodes(snap, unusable(), ["free", "busy", "ghost"], CONFIG, NOW)
    assert outcome.fits == ()
    assert outcome.failed == {}
    assert outcome.unresolvable == {"free": REFUSAL, "busy": REFUSAL, "ghost": REFUSAL}


def test_a_pod_with_an_unusable_gpu_request_given_full_nodes_fits_none_of_them() -> None:
    given = decide.request_nodes(
        snapshot([node(".... ....", "n1")]), [builders.node_json("n1")], CONFIG
    )
    outcome = decide.filter_nodes(
        given.snapshot, unusable(), given.names, CONFIG, NOW, unresolvable=given.unresolvable
    )
    assert (outcome.fits, dict(outcome.unresolvable)) == ((), {"n1": REFUSAL})


def test_a_pod_with_an_unusable_gpu_request_is_never_bound_or_scored() -> None:
    snap = bind_cluster()
    assert decide.plan_bind(snap, unusable(), "n1", CONFIG, NOW) == BindRefusal(
        f"cannot bind pod ns/p: {REFUSAL}"
    )
    assert decide.score_nodes(snap, unusable(), ["n1", "n2"], CONFIG, NOW) == [None, None]
    assert decide.prioritize(snap, unusable(), ["n1", "n2"], CONFIG, NOW) == [0, 0]
