"""Preemption over a snapshot: which of kube-scheduler's proposed victims are kept on
each node, the fewest that make room, and nothing for a pod no eviction can help."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.model import PodDemand, PodKey
from extender.decide import filter_nodes
from extender.preemption import NodeVictims, Victim, preempt
from tests.unit.test_extender_builders import CONFIG, NOW, demand, node, pod, snapshot

FULL = [
    pod("two-a", demand(2), node="n1", indices=(0, 1)),
    pod("two-b", demand(2), node="n1", indices=(2, 3)),
    pod("four", demand(4), node="n1", indices=(4, 5, 6, 7)),
    pod("half", demand(milli=500), node="n2", indices=(0,)),
    pod("half2", demand(milli=500), node="n2", indices=(0,)),
    pod("rest", demand(7), node="n2", indices=(1, 2, 3, 4, 5, 6, 7)),
]


def victims(*names: str, pdb: int = 0) -> NodeVictims:
    return NodeVictims(tuple(Victim(f"uid-{n}") for n in names), pdb)


def preempted(want: PodDemand, proposals: dict[str, NodeVictims]) -> dict[str, NodeVictims]:
    snap = snapshot(
        [
            node(".... ....", "n1"),
            node(".... ....", "n2"),
            node(".... ....", "a100", product="A100"),
        ],
        FULL,
    )
    return {str(k): v for k, v in preempt(snap, pod("p", want), proposals, CONFIG, NOW).items()}


@pytest.mark.parametrize(
    ("want", "proposals", "expected"),
    [
        pytest.param(
            demand(4),
            {"n1": victims("two-a", "two-b", "four", pdb=2)},
            {"n1": victims("four", pdb=1)},
            id="one-victim-frees-an-island",
        ),
        pytest.param(
            demand(4),
            {"n1": victims("two-a", "two-b")},
            {"n1": victims("two-a", "two-b")},
            id="both-halves-of-an-island",
        ),
        pytest.param(
            demand(4),
            {"n1": victims("two-a", "four")},
            {"n1": victims("four")},
            id="a-useless-victim-is-spared",
        ),
        pytest.param(
            demand(2),
            {"n1": victims("four", "two-b")},
            {"n1": victims("two-b")},
            id="fewest-milli-among-equal-counts",
        ),
        pytest.param(
            demand(4),
            {"n1": victims("two-a")},
            {},
            id="not-enough-freed-drops-the-node",
        ),
        pytest.param(
            demand(1),
            {"n2": victims("half", "half2")},
            {"n2": victims("half", "half2")},
            id="a-shared-gpu-needs-all-its-sharers",
        ),
        pytest.param(demand(1), {"n2": victims("half")}, {}, id="one-sharer-is-not-enough"),
        pytest.param(
            demand(1),
            {"n2": victims("half", "half2", "rest")},
            {"n2": victims("rest")},
            id="fewest-victims-even-if-larger",
        ),
        pytest.param(
            demand(milli=500),
            {"n2": victims("half", "half2", "rest")},
            {"n2": victims("half")},
            id="a-share-needs-one-sharer-gone",
        ),
        pytest.param(
            demand(4),
            {"n1": NodeVictims((Victim("uid-unknown"), Victim("uid-four")), 0)},
            {"n1": NodeVictims((Victim("uid-unknown"), Victim("uid-four")), 0)},
            id="victims-without-gpus-are-kept-for-kube-scheduler",
        ),
        pytest.param(
            demand(4, products=("H100",)),
            {"a100": victims(), "ghost": victims()},
            {},
            id="hopeless-nodes",
        ),
        pytest.param(
            demand(4, products=("A100",)),
            {"n1": victims("four")},
            {},
            id="product-mismatch-no-eviction-helps",
        ),
    ],
)
def test_preempt(
    want: PodDemand, proposals: dict[str, NodeVictims], expected: dict[str, NodeVictims]
) -> None:
    assert preempted(want, proposals) == expected


def test_preempt_finds_victims_by_key_when_given_whole_pods() -> None:
    proposal = NodeVictims((Victim("uid-four", PodKey("ns/four")),))
    assert preempted(demand(4), {"n1": proposal}) == {"n1": proposal}


def test_preempt_counts_the_room_a_gang_gains_from_eviction() -> None:
    nodes = [node(".... ....", "n1", rack="r1"), node(".... ....", "n2", rack="r1")]
    held = [
        pod("x", demand(4), node="n1", indices=(0, 1, 2, 3)),
        pod("y", demand(4), node="n1", indices=(4, 5, 6, 7)),
    ]
    member = demand(4, gang="ns.g", size=3, topology="required:rack")
    snap = snapshot(nodes, held)
    assert filter_nodes(snap, pod("m", member), ["n2"], CONFIG, NOW).failed
    got = preempt(snap, pod("m", member), {"n1": victims("x", "y")}, CONFIG, NOW)
    assert got == {"n1": victims("x")}


def test_preempt_settles_for_a_minimal_set_when_subsets_are_too_many() -> None:
    snap = snapshot([node(".... ....", "n1")], FULL)
    proposal = {"n1": victims("two-a", "two-b", "four")}
    got = preempt(snap, pod("p", demand(4)), proposal, CONFIG, NOW, max_subsets=1)
    # greedy, sparing from the last: minimal (neither pair can be spared), not the smallest
    assert got == {"n1": victims("two-a", "two-b")}


def test_a_pod_with_an_unusable_gpu_request_gets_no_victims() -> None:
    unusable = replace(
        pod("p", PodDemand()), refusal="the pod's nvidia.com/gpu request is unusable"
    )
    held = snapshot([node(".... ....", "n1")], FULL)
    assert preempt(held, unusable, {"n1": victims("four")}, CONFIG, NOW) == {}
