"""The AdmissionReview wire edge: real captured requests decode, malformed bodies are
refused with a reason, and answers have exactly the shape kube-apiserver reads."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import jsonio
from tests.unit.test_webhook_rules import CONFIG, POLICY
from webhook.owners import OwnerKind, OwnerRef, OwnerView
from webhook.review import decode_review, encode_response, encode_status, validate_review
from webhook.review_flow import handle_review, review
from webhook.review_models import AdmissionReviewModel, BadReview
from webhook.workload import WorkloadKind, workload_from_object

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "captures"
CAPTURED_JOB_UID = "7c9bef66-465c-4588-b062-b3150d5253dc"
"""The Job of the captured pods (004, 006)."""


def captured(number: str) -> dict[str, Any]:
    body: dict[str, Any] = jsonio.loads(
        (CAPTURES / f"{number}-webhook-mutate-request.json").read_bytes()
    )["body"]
    return body


needs_captures = pytest.mark.skipif(not CAPTURES.is_dir(), reason="captures not present")


@needs_captures
@pytest.mark.parametrize("number", ["000", "002", "004", "006", "020"])
def test_every_captured_review_decodes(number: str) -> None:
    body = captured(number)
    request = decode_review(jsonio.dumps(body))
    assert request.uid == body["request"]["uid"]
    assert request.operation == body["request"]["operation"]
    assert request.namespace == "team-nlp"
    assert request.object == body["request"]["object"]
    assert request.dry_run is False


@needs_captures
def test_a_generated_name_arrives_without_a_name() -> None:
    request = decode_review(jsonio.dumps(captured("000")))
    assert request.name == ""
    assert request.kind.api_version == "batch/v1"
    assert request.user.groups == ("system:masters", "system:authenticated")


def _review(**request: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "team",
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}},
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"", "not valid JSON", id="empty"),
        pytest.param(b"{not json", "not valid JSON", id="not-json"),
        pytest.param(b"[1, 2]", "not a JSON object", id="array"),
        pytest.param(jsonio.dumps({**_review(), "apiVersion": "admission.k8s.io/v1beta1"}),
                     "only admission.k8s.io/v1 is served", id="v1beta1"),
        pytest.param(jsonio.dumps({**_review(), "kind": "Review"}), "kind is 'Review'", id="kind"),
        pytest.param(jsonio.dumps({**_review(), "request": None}), "no request", id="no-request"),
        pytest.param(jsonio.dumps(_review(uid="")), "request.uid is missing", id="empty-uid"),
        pytest.param(jsonio.dumps(_review(uid=7)), "request.uid is missing", id="uid-number"),
        pytest.param(jsonio.dumps(_review(operation="PATCH")), "request.operation", id="operation"),
        pytest.param(jsonio.dumps(_review(kind="Pod")), "request.kind", id="kind-not-an-object"),
        pytest.param(jsonio.dumps(_review(object=None)), "request.object is missing for CREATE",
                     id="no-object"),
        pytest.param(jsonio.dumps(_review(operation="UPDATE")),
                     "request.oldObject is missing for UPDATE", id="no-old-object"),
        pytest.param(jsonio.dumps(_review(object={"apiVersion": "batch/v1", "kind": "Job"})),
                     "request.object is 'Job' 'batch/v1', not the Pod v1 that request.kind "
                     "declares",
                     id="object-of-another-kind"),
        pytest.param(jsonio.dumps(_review(object=[])), "request.object", id="object-a-list"),
        pytest.param(b" " * (5 * 1024 * 1024), "more than the 4194304 accepted", id="too-big"),
    ],
)  # fmt: skip
def test_malformed_reviews_are_refused_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(BadReview) as caught:
        decode_review(body)
    assert reason in str(caught.value)


def test_unknown_fields_from_a_newer_apiserver_are_ignored() -> None:
    body = _review(brandNewField={"x": 1})
    body["future"] = True
    assert decode_review(jsonio.dumps(body)).uid == "u-1"


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.sampled_from(
        ["", "v1", "Pod", "pods", "CREATE", "UPDATE", "DELETE", "true", "status", "x"]
    )
)
_plausible = st.sampled_from(
    [{"group": "", "version": "v1", "kind": "Pod"}, {"version": "v1", "resource": "pods"},
     {"username": "x", "groups": []}, {"apiVersion": "v1", "kind": "Pod"}, {}]
)  # fmt: skip
_values = _plausible | st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(
        st.sampled_from(["group", "version", "kind", "resource", "username", "uid", "groups",
                         "extra", "apiVersion", "metadata", "spec", "a"]),
        children,
        max_size=4,
    ),
    max_leaves=10,
)  # fmt: skip
_request_fields = st.sampled_from(
    ["kind", "resource", "subResource", "requestKind", "requestResource", "requestSubResource",
     "name", "namespace", "operation", "userInfo", "object", "oldObject", "dryRun", "options"]
)  # fmt: skip


def _outcome(decode: Any) -> object:
    try:
        return decode()
    except BadReview as exc:
        return f"BadReview: {exc}"


@settings(max_examples=300, deadline=None)
@given(
    changes=st.dictionaries(_request_fields, _values, max_size=4),
    removed=st.sets(_request_fields, max_size=3),
    response=st.sampled_from([None, {}, {"uid": "u", "allowed": True}, 7]),
)
def test_the_fast_reading_of_a_review_is_the_models_reading(
    changes: dict[str, Any], removed: set[str], response: Any
) -> None:
    """Whatever a review holds, it reads as the pydantic models read it, or fails with
    the same reason: the hand-checked path only takes what it can vouch for."""
    full = {
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "userInfo": {"username": "u", "groups": ["g"], "extra": {"k": ["v"]}},
        "dryRun": False,
        "options": {"kind": "CreateOptions"},
    }
    body = _review(**{**full, **changes})
    for field in removed:
        body["request"].pop(field, None)
    if response is not None:
        body["response"] = response
    fast = _outcome(lambda: decode_review(jsonio.dumps(body)))
    assert fast == _outcome(lambda: validate_review(body))


def test_an_allowed_answer_with_a_patch() -> None:
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    answer = jsonio.loads(encode_response("u-1", allowed=True, patch=patch, warnings=["w"]))
    response = answer.pop("response")
    assert answer == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    assert jsonio.loads(base64.b64decode(response.pop("patch"))) == patch
    assert response == {"uid": "u-1", "allowed": True, "patchType": "JSONPatch", "warnings": ["w"]}


def test_no_patch_no_patch_type() -> None:
    answer = jsonio.loads(encode_response("u-1", allowed=True, patch=[]))
    assert answer["response"] == {"uid": "u-1", "allowed": True}


def test_a_denial_carries_code_reason_and_message() -> None:
    answer = jsonio.loads(
        encode_response("u-1", allowed=False, code=403, message="no", reason="Forbidden")
    )
    assert answer["response"] == {
        "uid": "u-1",
        "allowed": False,
        "status": {"status": "Failure", "message": "no", "reason": "Forbidden", "code": 403},
    }


@pytest.mark.parametrize(
    "answer",
    [
        {"allowed": True},
        {"allowed": True, "patch": [{"op": "add", "path": "/a", "value": 1}], "warnings": ["w"]},
        {"allowed": True, "patch": [], "warnings": ["w", "x"]},
        {"allowed": False, "code": 403, "message": "no", "reason": "Forbidden"},
        {"allowed": False, "code": 422, "message": "bad", "reason": "Invalid", "warnings": ["w"]},
        {"allowed": False, "patch": [{"op": "remove", "path": "/a"}]},
        {"allowed": True, "code": 200, "message": "fine"},
    ],
)  # fmt: skip
def test_answers_are_exactly_what_the_wire_model_writes(answer: dict[str, Any]) -> None:
    encoded = encode_response("u-1", **answer)
    model = AdmissionReviewModel.model_validate(jsonio.loads(encoded))
    assert jsonio.dumps(model.model_dump(exclude_none=True)) == encoded


def test_status_bodies_for_non_review_answers() -> None:
    assert jsonio.loads(encode_status(400, "BadRequest", "why")) == {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "why",
        "reason": "BadRequest",
        "code": 400,
    }


def test_handle_review_answers_400_for_garbage_and_503_without_a_policy() -> None:
    status, body = handle_review(b"garbage", POLICY, CONFIG)
    assert status == 400
    assert "malformed AdmissionReview" in jsonio.loads(body)["message"]
    status, body = handle_review(jsonio.dumps(_review()), None, CONFIG)
    assert status == 503
    assert jsonio.loads(body)["reason"] == "ServiceUnavailable"


@needs_captures
def test_dry_run_gets_the_same_answer() -> None:
    body = captured("000")
    wet = review(jsonio.dumps(body), POLICY, CONFIG)
    body["request"]["dryRun"] = True
    dry = review(jsonio.dumps(body), POLICY, CONFIG)
    assert (dry.status, dry.body, dry.decision) == (wet.status, wet.body, wet.decision)


@needs_captures
def test_a_pod_of_a_job_arrives_with_its_controller_reference_and_sender() -> None:
    request = decode_review(jsonio.dumps(captured("004")))
    assert request.user.username == "system:serviceaccount:kube-system:job-controller"
    workload = workload_from_object(request.object or {}, WorkloadKind.POD, request.namespace)
    assert workload.owners == (
        OwnerRef("batch/v1", "Job", "finetune-cslh4", CAPTURED_JOB_UID, controller=True),
    )


@needs_captures
def test_review_reports_what_metrics_count() -> None:
    job = OwnerView({OwnerKind.JOB: {("team-nlp", "finetune-cslh4"): CAPTURED_JOB_UID}})
    outcome = review(jsonio.dumps(captured("004")), POLICY, CONFIG, job)
    assert (outcome.status, outcome.kind, outcome.decision, outcome.reason) == (
        200,
        "Pod",
        "allowed",
        "owned",
    )
