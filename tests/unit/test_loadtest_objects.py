"""What the load test does as kube-apiserver and the Job controller: reviews, applying the
webhook's JSON patch, a job's demand and pods, and the synthetic inputs."""

from __future__ import annotations

import base64
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from cluster import jsonio, labels
from extender import wire
from loadtest.bench.extender_cluster import probe_pod
from loadtest.inputs import fleet, trace_input
from loadtest.inputs.traces import TraceNode, TracePod
from loadtest.sim import objects


def answer(uid: str, **response: Any) -> bytes:
    return jsonio.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": uid, **response},
        }
    )


def patch(ops: list[dict[str, Any]]) -> str:
    return base64.b64encode(jsonio.dumps(ops)).decode()


JOB = fleet.job_object("j", fleet.TEAMS[0], pods=2, gpus=4)


def test_the_review_carries_the_object_and_its_kind() -> None:
    review = objects.admission_review(JOB, "u1")
    request = review["request"]
    assert (request["uid"], request["operation"], request["namespace"]) == (
        "u1",
        "CREATE",
        "team-nlp",
    )
    assert request["kind"] == {"group": "batch", "version": "v1", "kind": "Job"}
    assert request["object"] is JOB


def test_an_allowed_answer_is_applied_as_a_json_patch() -> None:
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {"op": "add", "path": "/metadata/annotations/tessera.dev~1gang-size", "value": "2"},
        {"op": "replace", "path": "/spec/parallelism", "value": 2},
    ]
    verdict = objects.read_verdict(
        JOB, "u1", answer("u1", allowed=True, patchType="JSONPatch", patch=patch(ops))
    )
    assert verdict.allowed
    assert verdict.patch_ops == 3
    assert verdict.patched["spec"]["suspend"] is True
    assert verdict.patched["metadata"]["annotations"]["tessera.dev/gang-size"] == "2"
    assert "suspend" not in JOB["spec"]  # the request's object is left alone


def test_a_denial_keeps_code_and_message() -> None:
    body = answer("u1", allowed=False, status={"code": 403, "message": "queue x does not exist"})
    verdict = objects.read_verdict(JOB, "u1", body)
    assert (verdict.allowed, verdict.code, verdict.message) == (
        False,
        403,
        "queue x does not exist",
    )


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        answer("other", allowed=True),
        answer("u1", allowed=True, patchType="Merge", patch=patch([])),
        answer(
            "u1",
            allowed=True,
            patchType="JSONPatch",
            patch=patch([{"op": "replace", "path": "/nope", "value": 1}]),
        ),
    ],
)
def test_a_bad_answer_is_reported(body: bytes) -> None:
    with pytest.raises(objects.BadAnswer):
        objects.read_verdict(JOB, "u1", body)


def test_demand_pods_and_unsuspend() -> None:
    demand = objects.job_demand(JOB)
    assert (demand.pods, demand.resource, demand.per_pod, demand.total) == (
        2,
        labels.GPU_RESOURCE,
        4,
        8,
    )
    share = objects.job_demand(fleet.job_object("s", fleet.TEAMS[1], milli=250))
    assert (share.resource, share.total) == (labels.GPU_MILLI_RESOURCE, 250)
    running = objects.unsuspend({**JOB, "spec": {**JOB["spec"], "suspend": True}}, {"pool": "a"})
    pods = objects.job_pods(running, "t")
    assert [p["metadata"]["name"] for p in pods] == ["j-0", "j-1"]
    assert pods[0]["spec"]["nodeSelector"] == {"pool": "a"}
    assert len({p["metadata"]["uid"] for p in pods}) == 2


def test_affinity_terms_are_or_of_ands() -> None:
    terms: objects.Terms = (
        (("a", "In", frozenset({"1"})), ("b", "Exists", frozenset())),
        (("c", "NotIn", frozenset({"x"})),),
    )
    assert objects.matches_terms({"a": "1", "b": ""}, terms)
    assert objects.matches_terms({"c": "y"}, terms)
    assert not objects.matches_terms({"a": "1", "c": "x"}, terms)
    assert objects.matches_terms({}, ())


def test_the_fleet_has_racks_spot_taints_unhealthy_gpus_and_one_drain() -> None:
    nodes = fleet.hgx_fleet(
        fleet.FleetSpec(nodes=16), datetime(2026, 1, 1, tzinfo=UTC), random.Random(1)
    )
    assert len(nodes) == 16
    racks = {n["metadata"]["labels"][fleet.RACK_LABEL] for n in nodes}
    assert len(racks) == 16 // fleet.NODES_PER_RACK
    spot = [n for n in nodes if n["spec"].get("taints")]
    assert len(spot) == round(16 * 0.3)
    annotations = [n["metadata"]["annotations"] for n in nodes]
    assert sum(labels.UNHEALTHY_GPUS in a for a in annotations) == 3
    assert [a[labels.DRAIN_AFTER] for a in annotations if labels.DRAIN_AFTER in a] == [
        "2026-01-01T06:00:00Z"
    ]


def test_quotas_scale_but_cpu_does_not() -> None:
    cq = {
        "kind": "ClusterQueue",
        "spec": {
            "resourceGroups": [
                {
                    "flavors": [
                        {
                            "name": "f",
                            "resources": [
                                {"name": "cpu", "nominalQuota": "8"},
                                {
                                    "name": labels.GPU_RESOURCE,
                                    "nominalQuota": "4",
                                    "borrowingLimit": "2",
                                },
                            ],
                        }
                    ]
                }
            ]
        },
    }
    scaled = fleet.scale_quotas([cq], 5)[0]
    cpu, gpu = scaled["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert (cpu["nominalQuota"], gpu["nominalQuota"], gpu["borrowingLimit"]) == ("8", "20", "10")


def test_the_stream_is_mostly_single_gpu_and_includes_each_expected_denial() -> None:
    jobs = fleet.job_stream(fleet.StreamSpec(rate=50, duration_s=20), random.Random(3))
    kinds = [j.kind for j in jobs]
    assert kinds.count("1-gpu") > len(jobs) / 2
    assert {"gang", "share", "multi-gpu"} <= set(kinds)
    assert {k for k in kinds if k.startswith("bad-")} == {
        "bad-queue",
        "bad-priority",
        "bad-quota",
        "bad-product",
    }
    assert all(j.run_s <= 20.0 for j in jobs)
    assert [j.at_s for j in jobs] == sorted(j.at_s for j in jobs)


def test_the_openb_trace_becomes_flavors_queues_and_one_pod_jobs() -> None:
    nodes = [TraceNode(f"n{i}", 96000, 393216, 8, "V100M32" if i < 2 else "T4") for i in range(3)]
    policy = trace_input.trace_policy(nodes, [])
    flavors = {o["metadata"]["name"] for o in policy if o["kind"] == "ResourceFlavor"}
    assert flavors == {"gpu-v100m32", "gpu-t4"}
    nlp = next(o for o in policy if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "nlp")
    quotas = {
        f["name"]: f["resources"][0]["nominalQuota"]
        for f in nlp["spec"]["resourceGroups"][0]["flavors"]
    }
    assert quotas == {"gpu-t4": "3", "gpu-v100m32": "6"}  # 40 % of 8 and of 16 GPUs
    pods = [
        TracePod("a", 4000, 1024, 1, 1000, ("T4",), creation_time=100, deletion_time=200),
        TracePod("cpu", 4000, 1024, 0, 0, (), creation_time=150, deletion_time=160),
        TracePod("b", 4000, 1024, 1, 500, (), creation_time=300, deletion_time=1300),
        TracePod("c", 4000, 1024, 2, 1000, (), creation_time=200, deletion_time=300),
    ]
    spec = fleet.StreamSpec(rate=3, duration_s=1.0, median_run_s=2.0, max_run_s=10.0)
    jobs = trace_input.trace_jobs(pods, spec, random.Random(1))
    assert [j.kind for j in jobs] == ["1-gpu", "multi-gpu", "share"]  # creation order, no CPU pod
    assert [j.at_s for j in jobs] == pytest.approx([0.0, 0.4995, 0.999])  # span squeezed
    assert [j.run_s for j in jobs] == [2.0, 2.0, 10.0]  # median 100 s -> 2 s; 1000 s capped
    assert jobs[0].job["metadata"]["annotations"] == {labels.GPU_PRODUCT: "T4"}


@pytest.mark.parametrize(
    ("version", "decoded_once"),
    [
        pytest.param(None, False, id="filter-a-new-pod-each-request"),
        pytest.param("1", True, id="prioritize-the-pod-filtered-before"),
    ],
)
def test_bench_extender_probe_pod_is_new_or_known_as_kube_scheduler_sends_it(
    version: str | None, decoded_once: bool
) -> None:
    recent = wire.RecentPods(8)
    first = recent.decode(probe_pod(1, version=version))
    again = recent.decode(probe_pod(1, version=version))
    assert (again is first) == decoded_once
    assert again.demand.gpus == 1
