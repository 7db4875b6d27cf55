"""Answers kept per policy (``webhook.answers``) are the answers the rules give: an object
that differs from one seen before only in name gets, byte for byte, the answer a policy
that never saw it gives, with its own gang id; denials and updates are never kept."""

from __future__ import annotations

import base64
import tracemalloc
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import jsonio, labels
from tests.unit.test_webhook_patch import jobs
from tests.unit.test_webhook_rules import CONFIG, POLICY, job, jobset
from webhook.admit import admit
from webhook.answers import ANSWER_PATCH_BYTES_KEPT, ANSWERS_KEPT
from webhook.patch import apply_patch, diff
from webhook.queues import Policy
from webhook.review import decode_review, encode_response
from webhook.review_flow import review
from webhook.rules.outcome import Allowed


def _body(obj: dict[str, Any], uid: str, operation: str = "CREATE") -> bytes:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
        "namespace": obj["metadata"].get("namespace", ""),
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": obj,
    }
    if operation == "UPDATE":
        request["oldObject"] = obj
    return jsonio.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )


def _renamed(obj: dict[str, Any], name: str | None, generate_name: str | None) -> dict[str, Any]:
    metadata = {k: v for k, v in obj["metadata"].items() if k not in ("name", "generateName")}
    if name is not None:
        metadata["name"] = name
    if generate_name is not None:
        metadata["generateName"] = generate_name
    return {**obj, "metadata": metadata}


def _fresh() -> Policy:
    return replace(POLICY)  # the same policy, with no answers kept


def _patch(body: bytes) -> list[dict[str, Any]]:
    response = jsonio.loads(body)["response"]
    return list(jsonio.loads(base64.b64decode(response["patch"]))) if "patch" in response else []


_NAMES = st.sampled_from([("train", None), ("sweep-7", None), (None, "train-"), (None, "x-")])


def _by_the_rules(body: bytes, policy: Policy) -> bytes:
    """The answer as the rules give it, with no answer kept or reused."""
    request = decode_review(body)
    decision = admit(request, policy, CONFIG)
    if isinstance(decision, Allowed):
        assert request.object is not None
        patch = diff(request.object, decision.object)
        return encode_response(request.uid, allowed=True, patch=patch, warnings=decision.warnings)
    return encode_response(
        request.uid,
        allowed=False,
        code=decision.code,
        message=decision.message,
        reason=decision.status_reason,
    )


@settings(max_examples=300, deadline=None)
@given(obj=jobs(), first=_NAMES, second=_NAMES)
def test_an_object_renamed_gets_the_answer_the_rules_give_it(
    obj: dict[str, Any], first: tuple[str | None, str | None], second: tuple[str | None, str | None]
) -> None:
    policy = _fresh()
    review(_body(_renamed(obj, *first), "uid-1"), policy, CONFIG)
    later = _body(_renamed(obj, *second), "uid-2")
    assert review(later, policy, CONFIG).body == _by_the_rules(later, _fresh())


@settings(max_examples=300, deadline=None)
@given(objects=st.lists(jobs(), min_size=2, max_size=4))
def test_objects_after_others_get_the_answers_the_rules_give_them(
    objects: list[dict[str, Any]],
) -> None:
    policy = _fresh()
    for number, obj in enumerate(objects):
        body = _body(obj, f"uid-{number}")
        assert review(body, policy, CONFIG).body == _by_the_rules(body, _fresh())


def test_each_object_gets_its_own_gang_id() -> None:
    policy = _fresh()
    objects = {
        "named": job(name="train-a"),
        "other": job(name="train-b"),
        "generated": job(name=None, generate_name="train-"),
        "again": job(name=None, generate_name="train-"),
    }
    gangs = {}
    for number, (which, obj) in enumerate(objects.items()):
        answer = review(_body(obj, f"uid-{number}"), policy, CONFIG)
        patched = apply_patch(obj, _patch(answer.body))
        gangs[which] = patched["spec"]["template"]["metadata"]["labels"][labels.GANG]
    assert gangs["named"] == "team.train-a"
    assert gangs["other"] == "team.train-b"
    assert gangs["generated"].startswith("team.train-")
    assert gangs["generated"] != gangs["again"]  # drawn from each request's uid
    assert len(policy.answers) == 1  # one template, named or generated: one answer


def _jobset_body(obj: dict[str, Any], uid: str) -> bytes:
    request = {
        "uid": uid,
        "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"},
        "resource": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"},
        "namespace": obj["metadata"].get("namespace", ""),
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": obj,
    }
    return jsonio.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )


@pytest.mark.parametrize("template_meta", [None, {"labels": {"app": "x"}}])
def test_a_kept_answer_gives_every_template_of_a_jobset_its_own_gang_id(
    template_meta: dict[str, Any] | None,
) -> None:
    """The gang id lands in one operation per template (a label added to a label map,
    or inside a map added whole): each is filled for the later request."""
    policy = _fresh()

    def made(name: str) -> dict[str, Any]:
        obj = jobset([("workers", 2, 2, 4), ("driver", 1, 1, None)], name=name)
        if template_meta is not None:
            for rjob in obj["spec"]["replicatedJobs"]:
                rjob["template"]["spec"]["template"]["metadata"] = dict(template_meta)
        return obj

    first = review(_jobset_body(made("pretrain-a"), "uid-1"), policy, CONFIG)
    later = _jobset_body(made("pretrain-b"), "uid-2")
    kept = review(later, policy, CONFIG)
    assert (first.answer, kept.answer) == ("computed", "kept")
    assert kept.body == _by_the_rules(later, _fresh())
    patched = apply_patch(made("pretrain-b"), _patch(kept.body))
    gangs = {
        rjob["template"]["spec"]["template"]["metadata"]["labels"][labels.GANG]
        for rjob in patched["spec"]["replicatedJobs"]
    }
    assert gangs == {"team.pretrain-b"}


def test_denials_are_not_kept_and_name_each_object() -> None:
    policy = _fresh()
    first = review(_body(job(name="huge-a", gpus=8, parallelism=100), "uid-1"), policy, CONFIG)
    second = review(_body(job(name="huge-b", gpus=8, parallelism=100), "uid-2"), policy, CONFIG)
    assert first.decision == second.decision == "denied"
    assert "huge-a" in first.body.decode()
    assert "huge-b" in second.body.decode()
    assert not policy.answers


def test_updates_are_never_kept() -> None:
    policy = _fresh()
    obj = job(name="train", spec={"suspend": True})
    review(_body(obj, "uid-1", "UPDATE"), policy, CONFIG)
    assert not policy.answers


def test_a_new_policy_starts_without_answers_and_the_memo_stays_bounded() -> None:
    policy = _fresh()
    for n in range(ANSWERS_KEPT + 5):
        review(
            _body(job(name="t", spec={"activeDeadlineSeconds": 60 + n}), f"u{n}"), policy, CONFIG
        )
    assert 0 < len(policy.answers) <= ANSWERS_KEPT
    assert not _fresh().answers


def test_text_that_looks_like_a_gang_id_is_left_alone() -> None:
    policy = _fresh()
    obj = job(name="train", annotations={"note": "team.train"}, extra_labels={"x": "team.train"})
    first = review(_body(obj, "uid-1"), policy, CONFIG)
    kept = review(_body(_renamed(obj, "other", None), "uid-2"), policy, CONFIG)
    assert kept.answer == "kept"
    assert kept.body == _by_the_rules(_body(_renamed(obj, "other", None), "uid-2"), _fresh())
    assert first.body.replace(b"uid-1", b"uid-2") != kept.body  # its own gang id only


def test_the_memo_keeps_a_digest_of_each_object_not_the_object() -> None:
    """Found by tests/fuzz: the memo's key held each object written as JSON, so 1,024
    distinct allowed Jobs of 1 MB (kube-apiserver lets an object be 1.5 MiB) kept more
    than a gigabyte alive for as long as the policy lasted."""
    policy = _fresh()
    review(_body(job(name="warm-up"), "uid-0"), policy, CONFIG)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(32):
            blob = [{"name": "BLOB", "value": f"{n:04d}" + "x" * 1_000_000}]
            outcome = review(_body(job(name="train", env=blob), f"uid-{n}"), policy, CONFIG)
            assert outcome.answer == "computed"
            del outcome, blob
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(policy.answers) == 33
    assert grown < 1024 * 1024, f"{grown} bytes kept for 32 answers"


def test_an_answer_whose_patch_repeats_much_of_the_object_is_given_but_not_kept() -> None:
    """The patch can carry what the user wrote (their node affinity, merged with the
    flavors'): an answer whose patch is larger than ``ANSWER_PATCH_BYTES_KEPT`` is not
    kept, so the memo holds at most that much per answer."""
    values = ["zone-" + "a" * 100_000]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": values}]}
                ]
            }
        }
    }
    body = _body(job(name="train", affinity=affinity), "uid-1")
    policy = _fresh()
    outcome = review(body, policy, CONFIG)
    assert outcome.body == _by_the_rules(body, _fresh())
    assert len(outcome.body) > ANSWER_PATCH_BYTES_KEPT
    assert not policy.answers


@pytest.mark.parametrize("field", ["name", "generateName"])
def test_an_object_whose_name_is_not_a_string_is_denied_even_after_one_like_it(
    field: str,
) -> None:
    """Found by fuzzing: the memo's key leaves the name out, so a Job named ``7`` got
    the answer kept for a Job like it, and a name nested 1,000 deep a 500 from making
    its gang id. The rules deny it; so does the memo."""
    policy = _fresh()
    first = review(_body(job(name="train"), "uid-1"), policy, CONFIG)
    assert first.decision == "mutated"
    odd = job(name=None)
    odd["metadata"][field] = 7
    outcome = review(_body(odd, "uid-2"), policy, CONFIG)
    assert outcome.decision == "denied"
    assert f"metadata.{field} is not a string" in outcome.body.decode()
