"""What a user writes cannot make the webhook's answers or its metrics grow.

A mutating webhook sees an object before kube-apiserver validates it, so a label value,
an annotation or a name can be as long as the body. Issue 20: 500 denied Jobs with 60 KB
queue names grew ``/metrics`` to 62 MB for good (each name became a series), and each
denial repeated its name whole. Each case here reviews a workload carrying one 60 KB
value through ``review_flow.review`` (the whole webhook minus HTTP): the answer stays
small, and counting it adds no series named after what the user wrote.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster import jsonio, labels
from cluster.files import load_objects
from webhook.metrics import WebhookMetrics
from webhook.policy_build import policy_from_objects
from webhook.review_flow import ReviewOutcome, review
from webhook.rules.outcome import UNKNOWN_QUEUE, AdmitConfig

POLICY = policy_from_objects(
    load_objects(Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml")
)
CONFIG = AdmitConfig()
LONG = 60_000
Review = dict[str, Any]


def job_review(uid: str = "u-1", operation: str = "CREATE") -> Review:
    """A 2-pod, 4-GPU Job for queue team-nlp-queue, as kube-apiserver sends it."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "finetune",
            "namespace": "team-nlp",
            "labels": {labels.QUEUE_NAME: "team-nlp-queue"},
        },
        "spec": {
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "train", "image": "img",
                         "resources": {"limits": {labels.GPU_RESOURCE: "4"}}}
                    ],
                }
            },
        },
    }  # fmt: skip
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
        "namespace": "team-nlp",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": job,
    }
    if operation == "UPDATE":
        request["oldObject"] = copy.deepcopy(job)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def obj(r: Review) -> dict[str, Any]:
    found: dict[str, Any] = r["request"]["object"]
    return found


def container(r: Review) -> dict[str, Any]:
    found: dict[str, Any] = obj(r)["spec"]["template"]["spec"]["containers"][0]
    return found


def label(key: str, value: str) -> Callable[[Review], None]:
    return lambda r: obj(r)["metadata"]["labels"].__setitem__(key, value)


def annotate(key: str, value: str) -> Callable[[Review], None]:
    return lambda r: obj(r)["metadata"].setdefault("annotations", {}).__setitem__(key, value)


def _name(r: Review) -> None:
    obj(r)["metadata"]["name"] = "n" * LONG
    obj(r)["spec"]["parallelism"] = 10  # 40 GPUs: over quota, and the denial names the job


def _container_name(r: Review) -> None:
    container(r)["name"] = "c" * LONG
    container(r)["resources"]["limits"][labels.GPU_RESOURCE] = "-1"


def _moved_while_running(r: Review) -> None:
    r["request"]["oldObject"]["spec"]["suspend"] = False
    obj(r)["spec"]["suspend"] = False
    label(labels.QUEUE_NAME, "q" * LONG)(r)


def _update(edit: Callable[[Review], None]) -> Review:
    r = job_review(operation="UPDATE")
    edit(r)
    return r


def _create(edit: Callable[[Review], None]) -> Review:
    r = job_review()
    edit(r)
    return r


ECHOES = {
    "queue label": (_create(label(labels.QUEUE_NAME, "q" * LONG)), 403, "queue"),
    "priority class label": (_create(label(labels.PRIORITY_CLASS, "p" * LONG)), 403, "priority"),
    "gpu product annotation": (_create(annotate(labels.GPU_PRODUCT, "H" * LONG)), 403, "flavor"),
    "gang-min annotation": (_create(annotate(labels.GANG_MIN, "9" * LONG)), 422, "gang"),
    "topology annotation": (
        _create(annotate(labels.TOPOLOGY, "required:" + "r" * LONG)),
        403,
        "topology",
    ),
    "malformed topology": (_create(annotate(labels.TOPOLOGY, "t" * LONG)), 422, "topology"),
    "object name": (_create(_name), 403, "quota"),
    "parallelism": (
        _create(lambda r: obj(r)["spec"].__setitem__("parallelism", "2" * LONG)),
        422,
        "invalid",
    ),
    "gpu quantity": (
        _create(
            lambda r: container(r)["resources"]["limits"].__setitem__(
                labels.GPU_RESOURCE, "4" * LONG
            )
        ),
        422,
        "invalid",
    ),
    "container name": (_create(_container_name), 422, "invalid"),
    "queue label moved while running": (_update(_moved_while_running), 422, "update"),
}


@pytest.mark.parametrize(("r", "code", "reason"), ECHOES.values(), ids=ECHOES.keys())
def test_a_denial_repeats_a_60_kb_value_cut_to_a_sane_length(
    r: Review, code: int, reason: str
) -> None:
    outcome = review(jsonio.dumps(r), POLICY, CONFIG)

    assert outcome.decision == "denied", outcome.body[:300]
    assert outcome.reason == reason
    status = jsonio.loads(outcome.body)["response"]["status"]
    assert status["code"] == code
    assert f" ({LONG} characters)" in status["message"] or (
        f" ({LONG + len('required:')} characters)" in status["message"]
    )
    assert len(outcome.body) < 2_000
    assert outcome.queue in ("", UNKNOWN_QUEUE, "team-nlp-queue")


def series(exposition: bytes, name: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
        if sample.name == name
    ]


def test_500_denials_with_distinct_60_kb_queue_names_add_one_series_to_the_metrics() -> None:
    metrics = WebhookMetrics(lambda: 0.0)
    metrics.observe(review(jsonio.dumps(job_review()), POLICY, CONFIG), 0.001)
    before = len(metrics.exposition())

    for n in range(500):
        r = job_review(uid=f"u-{n}")
        label(labels.QUEUE_NAME, f"{n:03d}" + "q" * LONG)(r)
        outcome = review(jsonio.dumps(r), POLICY, CONFIG)
        assert outcome.decision == "denied"
        metrics.observe(outcome, 0.001)

    page = metrics.exposition()
    assert len(page) < before + 2_000
    queues = {s["queue"] for s in series(page, "tessera_webhook_reviews_total")}
    assert queues == {"team-nlp-queue", UNKNOWN_QUEUE}


def test_an_update_naming_a_queue_that_does_not_exist_is_counted_as_unknown() -> None:
    r = _update(label(labels.QUEUE_NAME, "x" * LONG))
    r["request"]["oldObject"]["metadata"]["labels"][labels.QUEUE_NAME] = "x" * LONG

    outcome = review(jsonio.dumps(r), POLICY, CONFIG)

    assert (outcome.decision, outcome.reason, outcome.queue) == ("allowed", "validated", "unknown")


def test_a_review_of_a_kind_of_the_clients_choosing_is_counted_as_other() -> None:
    metrics = WebhookMetrics(lambda: 0.0)
    for n in range(50):
        r = job_review(uid=f"u-{n}")
        kind = f"Kind{n}" + "k" * 1_000
        r["request"]["kind"] = {"group": "example.com", "version": "v1", "kind": kind}
        obj(r).update(apiVersion="example.com/v1", kind=kind)
        outcome: ReviewOutcome = review(jsonio.dumps(r), POLICY, CONFIG)
        metrics.observe(outcome, 0.001)

    kinds = {s["kind"] for s in series(metrics.exposition(), "tessera_webhook_reviews_total")}
    assert kinds == {"other"}
