"""``tessera nodes`` and ``tessera queues`` count what the extender and Kueue count, and
the node writes offer only values the extender reads back the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cluster import labels
from cluster.clock import ManualClock
from cluster.convert.grammar import parse_rfc3339, parse_topology_levels
from cluster.convert.nodes import node_from_json
from console import annotate
from console.nodes import node_gpus, nodes_report, policy_levels
from console.queues import percentile, queues_report, read_workloads
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
LEVELS = (("block", BLOCK_LABEL), ("rack", RACK_LABEL), ("hostname", labels.HOSTNAME))


def report(objects: list[dict[str, Any]], *, gang_gpus: int = 8) -> Any:
    snapshot, _ = build_snapshot(objects, [label for _, label in LEVELS], ManualClock(NOW))
    policy = policy_from_objects(o for o in objects if o["kind"] not in ("Node", "Pod"))
    return nodes_report(snapshot, policy.flavors, LEVELS, NOW, gang_gpus=gang_gpus)


@pytest.mark.parametrize(
    ("node", "pods", "expected"),
    [
        (node_json("n"), [], (8, 0, 8, 0, 1, 1)),
        (node_json("n", islands="0-3,4-7"), [], (8, 0, 8, 0, 2, 1)),
        (
            node_json("n", islands="0-3,4-7"),
            [pod_json(gpus=4, node="n", gpu_indices="0,1,2,3", phase="Running")],
            (8, 4, 4, 0, 1, 0),
        ),
        (
            node_json("n", islands="0-3,4-7"),
            [pod_json(gpu_milli=250, node="n", gpu_indices="6", phase="Running")],
            (8, 1, 7, 0, 1, 0),
        ),
        (node_json("n", islands="0-3,4-7", unhealthy="1,5"), [], (8, 0, 6, 2, 0, 0)),
        (
            node_json("n", unhealthy="0"),
            [pod_json(gpus=1, node="n", gpu_indices="0", phase="Running")],
            (8, 1, 7, 1, 0, 0),
        ),
        (
            node_json("n"),
            [pod_json(gpus=8, node="n", gpu_indices="0,1,2,3,4,5,6,7", phase="Succeeded")],
            (8, 0, 8, 0, 1, 1),
        ),
    ],
    ids=["empty", "two-islands", "half-held", "a-share", "unhealthy", "unhealthy-held", "finished"],
)
def test_a_node_counts_gpus_as_the_extender_does(
    node: dict[str, Any], pods: list[dict[str, Any]], expected: tuple[int, ...]
) -> None:
    """(total, allocated, free, unhealthy, islands fully free, 8-GPU pods that fit now)."""
    (row,) = report([node, *pods]).nodes
    assert (
        row.gpus_total,
        row.gpus_allocated,
        row.gpus_free,
        row.gpus_unhealthy,
        row.islands_free,
        row.gang_pods,
    ) == expected


def test_draining_and_cordoned_nodes_start_no_gang_but_are_listed_with_their_window() -> None:
    found = report(
        [
            node_json("a", rack="r1", block="b1"),
            node_json("b", rack="r1", block="b1", drain_after="2026-01-01T08:00:00Z"),
            node_json("c", rack="r2", block="b1", unschedulable=True),
            node_json("d", rack="r3", block="b2"),
            node_json("e", rack="r3", block="b2"),
            node_json("cpu-only", gpus=None),
        ]
    )
    assert [r.name for r in found.nodes] == ["a", "b", "c", "d", "e"]
    assert [(r.name, r.gang_pods) for r in found.nodes] == [
        ("a", 1),
        ("b", 0),
        ("c", 0),
        ("d", 1),
        ("e", 1),
    ]
    assert dict(found.largest_gang) == {"block": 2, "rack": 2, "hostname": 1, "cluster": 3}
    (drain,) = found.drains
    assert (drain.node, drain.in_s) == ("b", 7200.0)


def test_groups_are_per_product_flavor_block_and_rack() -> None:
    reserved = {labels.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3", "example.com/capacity": "reserved"}
    found = report(
        [
            flavor_obj("h100", {labels.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
            flavor_obj("h100-reserved", reserved),
            node_json("a", rack="r1", block="b1", labels={"example.com/capacity": "reserved"}),
            node_json("b", rack="r1", block="b1", labels={"example.com/capacity": "reserved"}),
            node_json("c", rack="r2", block="b1"),
            node_json("d", product="NVIDIA-A100-SXM4-80GB", rack="r2", block="b1"),
        ]
    )
    assert [(g.product, g.flavor, g.domains, g.nodes, g.gpus_free) for g in found.groups] == [
        ("NVIDIA-A100-SXM4-80GB", "", (("block", "b1"), ("rack", "r2")), 1, 8),
        ("NVIDIA-H100-80GB-HBM3", "h100", (("block", "b1"), ("rack", "r2")), 1, 8),
        (
            "NVIDIA-H100-80GB-HBM3",
            "h100-reserved,h100",
            (("block", "b1"), ("rack", "r1")),
            2,
            16,
        ),
    ]


def test_the_json_keeps_the_fields_scripts_rely_on() -> None:
    shown = report([node_json("a")]).to_json()
    (node,) = shown["nodes"]
    assert {"name", "gpus_total", "gpus_allocated", "gpus_free", "gpus_unhealthy"} <= set(node)


def test_one_node_gpu_by_gpu_names_the_pods_holding_each() -> None:
    objects = [
        node_json("n", islands="0-3,4-7", unhealthy="7"),
        pod_json("a-0", gpus=2, node="n", gpu_indices="0,1", phase="Running"),
        pod_json("b-0", gpu_milli=300, node="n", gpu_indices="4", phase="Running"),
        pod_json("c-0", gpu_milli=200, node="n", gpu_indices="4", phase="Running"),
    ]
    snapshot, _ = build_snapshot(objects, (), ManualClock(NOW))
    gpus = node_gpus(snapshot, "n")
    assert gpus is not None
    assert [(g.index, g.island, g.healthy, g.pods, g.milli_used) for g in gpus][:2] == [
        (0, 0, True, ("team-nlp/a-0",), 1000),
        (1, 0, True, ("team-nlp/a-0",), 1000),
    ]
    assert (gpus[4].pods, gpus[4].milli_used) == (("team-nlp/b-0", "team-nlp/c-0"), 500)
    assert (gpus[7].healthy, gpus[7].island) == (False, 1)
    assert node_gpus(snapshot, "nope") is None


def test_levels_come_from_the_flag_or_else_the_kueue_topologies() -> None:
    assert parse_topology_levels("block=a/b, rack=a/r") == (("block", "a/b"), ("rack", "a/r"))
    with pytest.raises(ValueError, match="'rack' is not"):
        parse_topology_levels("rack")
    policy = policy_from_objects([topology_obj("t", [BLOCK_LABEL, RACK_LABEL, labels.HOSTNAME])])
    assert policy_levels(policy) == (
        ("topology-block", BLOCK_LABEL),
        ("topology-rack", RACK_LABEL),
        ("hostname", labels.HOSTNAME),
    )
    assert policy_levels(policy_from_objects([])) == (("hostname", labels.HOSTNAME),)


# ---------------------------------------------------------------- queues

POLICY_OBJECTS = [
    flavor_obj("h100", {labels.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
    cq_obj("nlp", {"h100": {labels.GPU_RESOURCE: (16,)}}, cohort="research"),
    cq_obj("cv", {"h100": {labels.GPU_RESOURCE: (16, None, 4)}}, cohort="research"),
    cq_obj("solo", {"h100": {labels.GPU_RESOURCE: (8,)}}),
    lq_obj("team-nlp", "training", "nlp"),
    lq_obj("team-cv", "training", "cv"),
]


def queues(workloads: list[dict[str, Any]]) -> Any:
    policy = policy_from_objects(POLICY_OBJECTS)
    found, problems = read_workloads(workloads, policy)
    return queues_report(policy, found, NOW, problems)


def test_pending_and_admitted_workloads_their_gpus_and_waits_per_queue() -> None:
    shown = queues(
        [
            workload_obj(
                "a",
                gpus=8,
                count=2,
                created="2026-01-01T01:00:00Z",
                admitted_at="2026-01-01T01:30:00Z",
                cluster_queue="nlp",
                flavor="h100",
            ),
            workload_obj("b", gpus=8, created="2026-01-01T05:00:00Z"),
            workload_obj("c", gpus=4, count=2, created="2026-01-01T03:00:00Z"),
            workload_obj("done", gpus=8, finished=True),
        ]
    )
    nlp = {q.name: q for q in shown.cluster_queues}["nlp"]
    assert (nlp.waits.pending, nlp.waits.admitted) == (2, 1)
    assert (nlp.waits.gpus_pending, nlp.waits.gpus_admitted) == (16, 16)
    assert nlp.waits.oldest_pending_s == 3 * 3600
    assert nlp.waits.p90_wait_s == 3 * 3600  # waits 30m, 1h, 3h
    (lq,) = [q for q in shown.local_queues if q.namespace == "team-nlp"]
    assert (lq.cluster_queue, lq.waits.pending) == ("nlp", 2)


def test_borrowing_above_nominal_is_lent_by_the_cohort_within_its_lending_limits() -> None:
    shown = queues(
        [
            workload_obj(
                "big",
                gpus=8,
                count=3,
                created="2026-01-01T01:00:00Z",
                admitted_at="2026-01-01T01:00:00Z",
                cluster_queue="nlp",
                flavor="h100",
            ),
        ]
    )
    by_name = {q.name: q for q in shown.cluster_queues}
    assert (by_name["nlp"].nominal, by_name["nlp"].used, by_name["nlp"].borrowed) == (16, 24, 8)
    # cv may lend only 4 of its 16: the rest nlp borrows is no one's to claim here
    assert (by_name["cv"].lent, by_name["solo"].lent) == (4, 0)


def test_a_workload_without_a_queue_is_skipped_and_said() -> None:
    broken = workload_obj("x")
    del broken["spec"]["queueName"]
    shown = queues([broken])
    assert shown.problems == ("Workload team-nlp/x has no spec.queueName; skipped",)


@pytest.mark.parametrize(
    ("values", "p90"), [([], None), ([5.0], 5.0), ([float(i) for i in range(1, 11)], 9.0)]
)
def test_p90_is_the_nearest_rank(values: list[float], p90: float | None) -> None:
    assert percentile(values, 0.9) == p90


# ---------------------------------------------------------------- node writes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("+2h", NOW + timedelta(hours=2)),
        ("+90m", NOW + timedelta(minutes=90)),
        ("+1d", NOW + timedelta(days=1)),
        ("2026-02-01T02:00:00+01:00", datetime(2026, 2, 1, 1, 0, tzinfo=UTC)),
        ("2026-02-01T02:00:00.75Z", datetime(2026, 2, 1, 2, 0, tzinfo=UTC)),
    ],
)
def test_drain_times_read_as_written_and_round_trip_through_the_extenders_parser(
    text: str, expected: datetime
) -> None:
    when = annotate.drain_time(text, NOW)
    assert when == expected
    write = annotate.drain(node_from_json(node_json("n")), when, "driver 570")
    value = write.patch["metadata"]["annotations"][labels.DRAIN_AFTER]
    assert parse_rfc3339(value) == expected
    assert value.endswith("Z")
    assert "(driver 570)" in write.message


@pytest.mark.parametrize("text", ["tomorrow", "2026-02-01 02:00", "+2w", "2026-02-01T02:00:00"])
def test_a_drain_time_the_extender_would_ignore_is_refused(text: str) -> None:
    with pytest.raises(annotate.WriteError, match="RFC 3339"):
        annotate.drain_time(text, NOW)


@pytest.mark.parametrize(
    ("value", "written"),
    [("3,5", "3,5"), ("5, 3", "3,5"), ("0-2", "0,1,2"), ("", None), (" ", None)],
)
def test_gpu_health_writes_the_list_the_extender_reads(value: str, written: str | None) -> None:
    write = annotate.gpu_health(node_from_json(node_json("n")), value)
    assert write.patch == {"metadata": {"annotations": {labels.UNHEALTHY_GPUS: written}}}
    assert write.warning is (written is not None)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("8", "has no GPU 8"),
        ("2,9-10", "has no GPU 9,10"),
        ("x", "not a GPU index"),
        ("1,1", "twice"),
    ],
)
def test_gpu_health_refuses_indices_the_extender_would_skip(value: str, complaint: str) -> None:
    with pytest.raises(annotate.WriteError, match=complaint):
        annotate.gpu_health(node_from_json(node_json("n")), value)


def test_undrain_removes_the_window_and_refuses_a_node_without_one() -> None:
    draining = node_from_json(node_json("n", drain_after="2026-01-01T08:00:00Z"))
    assert annotate.undrain(draining).patch == {
        "metadata": {"annotations": {labels.DRAIN_AFTER: None}}
    }
    with pytest.raises(annotate.WriteError, match=r"no tessera\.dev/drain-after"):
        annotate.undrain(node_from_json(node_json("n")))


def test_the_event_names_the_node_and_says_why() -> None:
    obj = node_json("n")
    write = annotate.gpu_health(node_from_json(obj), "5", "XID 79")
    event = annotate.node_event(write, obj, NOW)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "n",
        "uid": obj["metadata"]["uid"],
    }
    assert (event["reason"], event["type"]) == (annotate.REASON_GPU_HEALTH, "Warning")
    assert event["message"] == "GPU 5 marked unhealthy: no new pod is given them (XID 79)"
    assert event["metadata"]["namespace"] == "default"
