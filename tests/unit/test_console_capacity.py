"""``tessera capacity`` and the shortfall it shares with ``why``: whether waiting work
needs quota or nodes, and how many nodes, placed as the extender places pods."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cluster import labels
from cluster.clock import ManualClock
from cluster.model import NodeName, NodeRequirement, NodeSelection, NodeState
from console.capacity import waiting_pods
from console.capacity_walk import capacity_report
from console.nodes import policy_levels
from console.queues import read_workloads
from console.shortfall import Ask, place
from console.source import build_snapshot
from tests.builders import (
    BLOCK_LABEL,
    RACK_LABEL,
    cq_obj,
    flavor_obj,
    lq_obj,
    node_json,
    pod_json,
    topology_obj,
    workload_obj,
)
from webhook.policy_build import policy_from_objects

NOW = datetime(2026, 1, 1, 6, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"
FLAVOR = flavor_obj("h100", {labels.GFD_PRODUCT: H100})
TOPOLOGY = topology_obj("default", [BLOCK_LABEL, RACK_LABEL, labels.HOSTNAME])


def pool(
    *nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()
) -> dict[NodeName, NodeState]:
    snapshot, _ = build_snapshot([*nodes, *pods], [RACK_LABEL], ManualClock(NOW))
    return dict(snapshot.nodes)


def held(node: str, indices: str) -> dict[str, Any]:
    count = len(indices.split(","))
    return pod_json(
        f"p-{node}-{indices}", gpus=count, node=node, gpu_indices=indices, phase="Running"
    )


RACK = Ask(3, 8, RACK_LABEL, "rack")


@pytest.mark.parametrize(
    ("nodes", "pods", "ask", "expected"),
    [
        # (pods that fit now, nodes needed, fragmented, text) or None: it fits
        ([node_json("a"), node_json("b")], (), Ask(2, 8), None),
        (
            [node_json("a")],
            (),
            Ask(3, 8),
            (1, 2, False, f"needs 2 more nodes of {H100}"),
        ),
        (
            [node_json("a", rack="r1"), node_json("b", rack="r1"), node_json("c", rack="r2")],
            (),
            RACK,
            (2, 1, True, f"needs 1 more node of {H100} in one rack"),
        ),
        # four GPUs free on each of two nodes, in islands of four: 8 free, no 8 together
        (
            [node_json("a", islands="0-3,4-7"), node_json("b", islands="0-3,4-7")],
            (held("a", "0,1,2,3"), held("b", "4,5,6,7")),
            Ask(1, 8),
            (0, 1, True, f"needs 1 more node of {H100}"),
        ),
        ([node_json("a", islands="0-3,4-7")], (held("a", "0,1,2,3"),), Ask(1, 4), None),
        # a draining or cordoned node starts nothing
        (
            [
                node_json("a", drain_after="2026-01-01T08:00:00Z"),
                node_json("b", unschedulable=True),
            ],
            (),
            Ask(1, 8),
            (0, 1, False, f"needs 1 more node of {H100}"),
        ),
        # only the nodes the pods' node selector lets them onto
        (
            [node_json("a", labels={"pool": "p"}), node_json("b")],
            (),
            Ask(2, 8, selection=NodeSelection(required=(NodeRequirement("pool", "In", ("p",)),))),
            (1, 1, True, f"needs 1 more node of {H100}"),
        ),
        (
            [node_json("a")],
            (),
            Ask(1, 16),
            (0, None, False, "no node of the pool holds a pod of 16 GPUs, even empty"),
        ),
    ],
)
def test_shortfall_counts_pods_as_the_extender_places_them(
    nodes: list[dict[str, Any]], pods: tuple[dict[str, Any], ...], ask: Ask, expected: Any
) -> None:
    placed = place(pool(*nodes, pods=pods), [ask])
    if expected is None:
        assert placed.fits
        return
    missing = placed.missing
    assert missing is not None
    assert (missing.pods_fit, missing.nodes, missing.fragmented, missing.text()) == expected


def test_an_ask_that_fits_takes_its_gpus_and_one_that_does_not_takes_none() -> None:
    nodes = pool(node_json("a"), node_json("b"))
    first = place(nodes, [Ask(1, 8)])
    assert first.fits
    assert sum(n.whole_free for n in first.nodes.values()) == 8
    second = place(first.nodes, [Ask(1, 4), Ask(2, 8)])
    assert second.missing is not None
    assert second.missing.pods_fit == 0
    # the gang does not start, so its first pod set took nothing either
    assert second.nodes == first.nodes


# ---------------------------------------------------------------- the walk


def cluster(
    *queues: dict[str, Any], nodes: int = 2, workloads: tuple[dict[str, Any], ...] = (), **kw: Any
) -> list[dict[str, Any]]:
    made = [node_json(f"n{i}", rack=f"r{i // 2}", block="b1") for i in range(nodes)]
    return [*made, *kw.get("pods", ()), FLAVOR, TOPOLOGY, *queues, *workloads]


def judge(objects: list[dict[str, Any]]) -> Any:
    policy = policy_from_objects(o for o in objects if o["kind"] not in ("Node", "Pod", "Workload"))
    workloads, _ = read_workloads(objects, policy)
    levels = policy_levels(policy)
    snapshot, _ = build_snapshot(objects, [label for _, label in levels], ManualClock(NOW))
    waiting = waiting_pods(workloads, [o for o in objects if o["kind"] == "Pod"], levels)
    return capacity_report(policy, workloads, snapshot, waiting, levels)


def running(name: str, queue: str, gpus: int) -> dict[str, Any]:
    return workload_obj(
        name, gpus=gpus, admitted_at="2026-01-01T01:00:00Z", cluster_queue=queue, flavor="h100"
    )


LQ = lq_obj("team-nlp", "training", "nlp")


@pytest.mark.parametrize(
    ("objects", "blocked", "advice"),
    [
        # free GPUs, quota and a node for it: only its turn
        (
            cluster(
                cq_obj("nlp", {"h100": {"nvidia.com/gpu": (16,)}}),
                LQ,
                workloads=(workload_obj("w", gpus=8),),
            ),
            [("w", "turn", 0)],
            [],
        ),
        # the queue's quota is used up while a node is free: quota
        (
            cluster(
                cq_obj("nlp", {"h100": {"nvidia.com/gpu": (8,)}}),
                LQ,
                nodes=3,
                workloads=(running("r", "nlp", 8), workload_obj("w", gpus=8)),
            ),
            [("w", "quota", 8)],
            [
                "ClusterQueue nlp: 1 workload(s) asking 8 GPUs wait for quota while free GPUs of "
                "h100 would hold them: raise its nominal quota of nvidia.com/gpu in h100 by 8",
                "flavor h100: 16 of its 24 healthy GPUs are in no queue's nominal quota: no Kueue "
                "workload can use them",
            ],
        ),
        # quota enough, GPUs not: nodes, counted
        (
            cluster(
                cq_obj("nlp", {"h100": {"nvidia.com/gpu": (32,)}}),
                LQ,
                nodes=1,
                workloads=(workload_obj("w", gpus=8, count=3),),
            ),
            [("w", "nodes", 0)],
            [
                f"ClusterQueue nlp: 1 workload(s) asking 24 GPUs do not fit the free GPUs of h100: "
                f"needs 2 more nodes of {H100}",
                "flavor h100: the queues' nominal quotas add up to 32 GPUs but its 1 nodes have 8 "
                "healthy: Kueue can admit 24 GPUs of work no node holds",
            ],
        ),
    ],
)
def test_waiting_work_is_judged_by_quota_and_by_nodes(
    objects: list[dict[str, Any]], blocked: list[tuple[str, str, int]], advice: list[str]
) -> None:
    found = judge(objects)
    assert [
        (w.name, w.blocked_by, w.quota_short) for q in found.queues for w in q.waiting
    ] == blocked
    assert list(found.recommendations) == advice


def test_a_lender_s_lending_limit_is_named_when_it_holds_idle_quota_back() -> None:
    objects = cluster(
        cq_obj("nlp", {"h100": {"nvidia.com/gpu": (8,)}}, cohort="research"),
        cq_obj("cv", {"h100": {"nvidia.com/gpu": (8, None, 0)}}, cohort="research"),
        LQ,
        workloads=(running("r", "nlp", 8), workload_obj("w", gpus=8)),
    )
    found = judge(objects)
    (nlp,) = [q for q in found.queues if q.name == "nlp"]
    assert nlp.needs == "quota"
    assert found.recommendations[0].endswith(
        "by 8, or raise cv's lendingLimit (8 GPUs of it idle it may not lend)"
    )
    # without the lending limit, cv's idle quota is nlp's to borrow: only its turn
    objects[-4] = cq_obj("cv", {"h100": {"nvidia.com/gpu": (8,)}}, cohort="research")
    assert [w.blocked_by for q in judge(objects).queues for w in q.waiting] == ["turn"]


def test_pods_of_an_admitted_workload_that_no_node_holds_wait_for_nodes() -> None:
    admitted = running("job-llm", "nlp", 8)
    admitted["metadata"]["ownerReferences"] = [
        {"kind": "Job", "name": "llm", "uid": "u", "controller": True}
    ]
    admitted["spec"]["podSets"][0]["count"] = 3
    pods = [
        pod_json(
            f"llm-{i}",
            gpus=8,
            topology="required:topology-rack",
            labels={labels.JOB_NAME: "llm"},
        )
        for i in range(3)
    ]
    found = judge(
        cluster(
            cq_obj("nlp", {"h100": {"nvidia.com/gpu": (24,)}}),
            LQ,
            nodes=4,
            workloads=(admitted,),
            pods=pods,
        )
    )
    ((w,),) = [q.waiting for q in found.queues]
    assert (w.admitted, w.gpus, w.blocked_by) == (True, 24, "fragmentation")
    assert w.summary() == (
        f"32 GPUs free in h100 but not 8 together where needed; needs 1 more node of {H100} "
        "in one topology-rack"
    )
    assert found.to_json()["waiting"][0]["needs"]["domain"] in ("r0", "r1")
