"""The example queues and jobs in ``manifests/examples`` do what their comments say.

The queue objects are read exactly as the webhook reads them in standalone mode
(``cluster.files`` then ``webhook.policy_build.policy_from_objects``): they must parse without a
single problem and give the quotas, limits and queue settings that the comments in
``cluster-queues.yaml`` and ``local-queues.yaml`` promise. Each example job then goes through
the whole webhook minus HTTP (``webhook.review_flow.review``) as a CREATE AdmissionReview
like kube-apiserver sends: the ones meant to run are mutated, the over-quota one is denied
with a message that names the limit it broke.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from cluster.files import load_objects
from webhook.patch import apply_patch
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy, QueueSettings
from webhook.review_flow import ReviewOutcome, review
from webhook.rules.outcome import AdmitConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
JOBS = EXAMPLES / "jobs"
GPU = 1000
"""Limits are kept in milli-units of the quantity: one GPU is 1000."""
CONFIG = AdmitConfig()
"""The webhook as the install runs it: default scheduler name, no managed namespaces."""


def load_policy() -> Policy:
    return policy_from_objects(
        obj for path in sorted(EXAMPLES.glob("*.yaml")) for obj in load_objects(path)
    )


POLICY = load_policy()


# ---------------------------------------------------------------- the queue objects


def test_the_example_queue_objects_parse_without_problems() -> None:
    assert POLICY.problems == ()


def test_every_team_namespace_has_its_queue_as_default() -> None:
    assert dict(POLICY.queue_names) == {
        "team-nlp": ("team-nlp-queue",),
        "team-cv": ("team-cv-queue",),
        "team-research": ("team-research-queue",),
    }
    assert {ns: q.name for ns, q in POLICY.default_queues.items()} == {
        "team-nlp": "team-nlp-queue",
        "team-cv": "team-cv-queue",
        "team-research": "team-research-queue",
    }


@pytest.mark.parametrize(
    ("namespace", "queue", "cluster_queue", "settings"),
    [
        ("team-nlp", "team-nlp-queue", "nlp", QueueSettings("research", 8 * 3600, 72 * 3600, 32)),
        ("team-cv", "team-cv-queue", "cv", QueueSettings("research", 4 * 3600, 24 * 3600, 16)),
        (
            "team-research",
            "team-research-queue",
            "research",
            QueueSettings("best-effort", 2 * 3600, 12 * 3600, 16),
        ),
    ],
)
def test_local_queue_settings_come_from_the_annotations(
    namespace: str, queue: str, cluster_queue: str, settings: QueueSettings
) -> None:
    local = POLICY.local_queue(namespace, queue)
    assert local is not None
    assert local.cluster_queue == cluster_queue
    assert local.settings == settings
    assert local.marked_default


def test_the_cluster_queues_share_one_cohort_and_their_flavors() -> None:
    assert {name: (cq.cohort, cq.flavors) for name, cq in POLICY.cluster_queues.items()} == {
        "nlp": ("gpu-pool", ("h100-reserved", "h100-spot")),
        "cv": ("gpu-pool", ("h100-reserved", "a100")),
        "research": ("gpu-pool", ("h100-spot", "a100")),
    }
    assert set(POLICY.priority_classes) == {"production-retraining", "research", "best-effort"}
    assert POLICY.topologies["gpu-topology"].level_names == ("block", "rack", "hostname")


# The table in cluster-queues.yaml: (queue, flavor, resource) -> nominal, borrowable, most.
LIMITS = {
    ("nlp", "h100-reserved", labels.GPU_RESOURCE): (32, 8, 40),
    ("nlp", "h100-spot", labels.GPU_RESOURCE): (16, 16, 32),
    ("cv", "h100-reserved", labels.GPU_RESOURCE): (16, 8, 24),
    ("cv", "a100", labels.GPU_RESOURCE): (8, 8, 16),
    ("cv", "a100", labels.GPU_MILLI_RESOURCE): (8000, 0, 8000),
    ("research", "h100-spot", labels.GPU_RESOURCE): (16, 8, 24),
    ("research", "a100", labels.GPU_RESOURCE): (8, 8, 16),
    ("research", "a100", labels.GPU_MILLI_RESOURCE): (4000, 2000, 6000),
}


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_gpu_limits_match_the_table_in_the_comments(key: tuple[str, str, str]) -> None:
    nominal, borrowable, most = LIMITS[key]
    limit = POLICY.limit(*key)
    assert (limit.nominal, limit.borrowable, limit.total) == (
        nominal * GPU,
        borrowable * GPU,
        most * GPU,
    )


def test_the_flavors_carry_the_gpu_products_and_the_spot_taint() -> None:
    products = {name: flavor.product for name, flavor in POLICY.flavors.items()}
    assert products == {
        "h100-reserved": "NVIDIA-H100-80GB-HBM3",
        "h100-spot": "NVIDIA-H100-80GB-HBM3",
        "a100": "NVIDIA-A100-SXM4-80GB",
    }
    spot = POLICY.flavors["h100-spot"]
    assert [(t.key, t.value, t.effect) for t in spot.node_taints] == [
        ("cloud.example.com/spot", "true", "NoSchedule")
    ]
    assert all(tol.tolerates(spot.node_taints[0]) for tol in spot.tolerations)
    assert spot.tolerations


# ---------------------------------------------------------------- the example jobs

_RESOURCES = {
    "Job": ("batch", "v1", "jobs"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    "Pod": ("", "v1", "pods"),
}


def create_review(obj: Mapping[str, Any], case: str) -> dict[str, Any]:
    """A CREATE AdmissionReview of ``obj`` as kube-apiserver sends it: no ``name`` for a
    ``generateName`` object, the request's namespace from the object."""
    group, version, resource = _RESOURCES[obj["kind"]]
    metadata = obj["metadata"]
    request: dict[str, Any] = {
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"tessera-examples/{case}")),
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": obj["kind"]},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "namespace": metadata["namespace"],
        "operation": "CREATE",
        "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if "name" in metadata:
        request["name"] = metadata["name"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@dataclass(frozen=True, slots=True)
class Reviewed:
    outcome: ReviewOutcome
    response: dict[str, Any]
    mutated: dict[str, Any] | None


def run_example(file_name: str) -> tuple[dict[str, Any], Reviewed]:
    (obj,) = load_objects(JOBS / file_name)
    outcome = review(jsonio.dumps(create_review(obj, file_name)), POLICY, CONFIG)
    response: dict[str, Any] = jsonio.loads(outcome.body)["response"]
    mutated = None
    if "patch" in response:
        mutated = apply_patch(obj, jsonio.loads(base64.b64decode(response["patch"])))
    return obj, Reviewed(outcome, response, mutated)


def test_every_example_job_file_is_a_case_here() -> None:
    assert {p.name for p in JOBS.glob("*.yaml")} == set(ALLOWED) | {"over-quota.yaml"}


def pod_templates(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod template(s) the webhook writes into: a Job's template, the Pod itself."""
    if obj["kind"] == "Pod":
        return [obj]
    return [obj["spec"]["template"]]


def gpu_flavor_products(template: Mapping[str, Any]) -> set[str]:
    terms = template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return {
        value
        for term in terms
        for expr in term["matchExpressions"]
        if expr["key"] == labels.GFD_PRODUCT
        for value in expr["values"]
    }


@dataclass(frozen=True, slots=True)
class Expected:
    queue: str
    priority: str
    products: frozenset[str]
    spot_toleration: bool
    gang_size: int | None
    time_limit_s: int


H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"

ALLOWED = {
    "finetune.yaml": Expected("team-nlp-queue", "research", frozenset({H100}), True, 2, 8 * 3600),
    "finetune-1gpu.yaml": Expected(
        "team-research-queue", "best-effort", frozenset({A100}), False, None, 2 * 3600
    ),
    "gang-rack.yaml": Expected(
        "team-nlp-queue", "production-retraining", frozenset({H100}), True, 4, 86400
    ),
    "notebook.yaml": Expected(
        "team-cv-queue", "research", frozenset({A100}), False, None, 4 * 3600
    ),
}


@pytest.mark.parametrize("file_name", sorted(ALLOWED))
def test_example_jobs_meant_to_run_are_admitted_and_mutated(file_name: str) -> None:
    original, reviewed = run_example(file_name)
    expected = ALLOWED[file_name]
    assert reviewed.outcome.status == 200
    assert reviewed.response["allowed"] is True, reviewed.response
    assert reviewed.outcome.decision == "mutated"
    assert reviewed.outcome.queue == expected.queue
    obj = reviewed.mutated
    assert obj is not None
    metadata = obj["metadata"]
    assert metadata["labels"][labels.QUEUE_NAME] == expected.queue
    assert metadata["labels"][labels.PRIORITY_CLASS] == expected.priority
    if obj["kind"] == "Pod":
        assert {"name": labels.KUEUE_ADMISSION_GATE} in obj["spec"]["schedulingGates"]
        assert obj["spec"]["activeDeadlineSeconds"] == expected.time_limit_s
    else:
        assert obj["spec"]["suspend"] is True
        assert obj["spec"]["activeDeadlineSeconds"] == expected.time_limit_s
    for template in pod_templates(obj):
        spec = template["spec"]
        assert spec["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
        assert gpu_flavor_products(template) == expected.products
        tolerated = any(
            t.get("key") == "cloud.example.com/spot" for t in spec.get("tolerations", [])
        )
        assert tolerated == expected.spot_toleration
        template_metadata = template.get("metadata", {})
        template_labels = template_metadata.get("labels", {})
        template_annotations = template_metadata.get("annotations", {})
        if expected.gang_size is None:
            assert labels.GANG not in template_labels
        else:
            assert template_labels[labels.GANG].startswith(f"{original['metadata']['namespace']}.")
            assert template_annotations[labels.GANG_SIZE] == str(expected.gang_size)
            assert template_annotations[labels.GANG_MIN] == str(expected.gang_size)
    # What the user wrote is kept.
    assert metadata.get("annotations") == original["metadata"].get("annotations")


def test_the_gang_example_carries_its_rack_constraint_to_the_pods() -> None:
    _, reviewed = run_example("gang-rack.yaml")
    assert reviewed.mutated is not None
    template = reviewed.mutated["spec"]["template"]
    assert template["metadata"]["annotations"][labels.TOPOLOGY] == "required:rack"


def test_the_over_quota_example_is_denied_naming_the_limit() -> None:
    _, reviewed = run_example("over-quota.yaml")
    assert reviewed.outcome.status == 200
    assert reviewed.response["allowed"] is False
    assert reviewed.outcome.reason == "quota"
    status = reviewed.response["status"]
    assert status["code"] == 403
    message = status["message"]
    assert "asks for 64 GPUs" in message
    assert "team-research-queue" in message
    assert "at most 24 GPUs in flavor h100-spot" in message
    assert "nominal 16 + borrowable 8 (its borrowingLimit)" in message
