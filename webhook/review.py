"""AdmissionReview ``admission.k8s.io/v1`` on the wire: decode a request, encode a response.

Layer: EDGE. Pydantic models of the wire shapes, used only here: bytes are decoded once
(orjson, through ``cluster.jsonio``), validated, and turned at once into the frozen
``webhook.workload.ReviewRequest`` that the PURE core reads. No I/O, no clock, no
aiohttp: the HTTP handler hands bytes in and gets bytes out.

The field names are upstream's (k8s.io/api/admission/v1), camelCase as on the wire.
Unknown fields are ignored, so a newer kube-apiserver's additions do not break decoding.
Anything that is not a well-formed v1 review raises ``BadReview`` with a reason, which the
server answers with HTTP 400.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster import jsonio
from webhook.patch import JsonPatch
from webhook.workload import GroupVersionKind, GroupVersionResource, ReviewRequest, UserInfo

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
MAX_REVIEW_BYTES: Final = 4 * 1024 * 1024
"""Largest body decoded: an object and its old version at etcd's 1.5 MiB limit each, and
the review around them, fit; a 10 MB body is refused before it is parsed."""

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class BadReview(ValueError):
    """The body is not a usable AdmissionReview v1 request; the message says why."""


# ---------------------------------------------------------------- wire models


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GroupVersionKindModel(_Wire):
    group: str = ""
    version: str
    kind: str


class GroupVersionResourceModel(_Wire):
    group: str = ""
    version: str
    resource: str


class UserInfoModel(_Wire):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class AdmissionRequestModel(_Wire):
    uid: str = Field(min_length=1)
    kind: GroupVersionKindModel
    resource: GroupVersionResourceModel
    subResource: str | None = None
    requestKind: GroupVersionKindModel | None = None
    requestResource: GroupVersionResourceModel | None = None
    requestSubResource: str | None = None
    name: str | None = None
    namespace: str | None = None
    operation: Operation
    userInfo: UserInfoModel = Field(default_factory=UserInfoModel)
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None
    dryRun: bool | None = None
    options: dict[str, Any] | None = None


class StatusModel(_Wire):
    """The parts of ``metav1.Status`` a webhook answers with."""

    status: Literal["Success", "Failure"] | None = None
    message: str | None = None
    reason: str | None = None
    code: int | None = None


class AdmissionResponseModel(_Wire):
    uid: str
    allowed: bool
    patchType: Literal["JSONPatch"] | None = None
    patch: str | None = None
    """Base64 of the RFC 6902 JSON Patch."""
    status: StatusModel | None = None
    warnings: list[str] | None = None
    auditAnnotations: dict[str, str] | None = None


class AdmissionReviewModel(_Wire):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequestModel | None = None
    response: AdmissionResponseModel | None = None


# ---------------------------------------------------------------- decoding


def decode_review(body: bytes, *, max_bytes: int = MAX_REVIEW_BYTES) -> ReviewRequest:
    """The request of an AdmissionReview v1 body; raises ``BadReview`` with a reason."""
    if len(body) > max_bytes:
        raise BadReview(f"the body is {len(body)} bytes, more than the {max_bytes} accepted")
    try:
        raw = jsonio.loads(body)
    except jsonio.JsonError as exc:
        raise BadReview(f"the body is {exc}") from None
    if not isinstance(raw, dict):
        raise BadReview("the body is not a JSON object")
    # The common mistakes first, with a message better than a validation dump.
    if raw.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"apiVersion is {raw.get('apiVersion')!r}; only {API_VERSION} is served "
            "(set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    if raw.get("kind") != KIND:
        raise BadReview(f"kind is {raw.get('kind')!r}, not {KIND}")
    request = raw.get("request")
    if not isinstance(request, dict):
        raise BadReview("the review has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("request.uid is missing")
    try:
        model = AdmissionReviewModel.model_validate(raw)
    except ValidationError as exc:
        raise BadReview(_summarize(exc)) from None
    assert model.request is not None  # checked above
    return _to_request(model.request)


def _summarize(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()[:3]
    ]
    more = exc.error_count() - len(parts)
    return "malformed review: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _check_kind(obj: Mapping[str, Any] | None, field: str, kind: GroupVersionKind) -> None:
    if obj is None:
        return
    api_version, obj_kind = obj.get("apiVersion"), obj.get("kind")
    if (api_version is not None and api_version != kind.api_version) or (
        obj_kind is not None and obj_kind != kind.kind
    ):
        raise BadReview(
            f"request.{field} is {obj_kind!r} {api_version!r}, not the "
            f"{kind.kind} {kind.api_version} that request.kind declares"
        )


def _to_request(model: AdmissionRequestModel) -> ReviewRequest:
    kind = GroupVersionKind(model.kind.group, model.kind.version, model.kind.kind)
    if model.operation in ("CREATE", "UPDATE") and model.object is None:
        raise BadReview(f"request.object is missing for {model.operation}")
    if model.operation == "UPDATE" and model.oldObject is None:
        raise BadReview("request.oldObject is missing for UPDATE")
    _check_kind(model.object, "object", kind)
    _check_kind(model.oldObject, "oldObject", kind)
    user = model.userInfo
    return ReviewRequest(
        uid=model.uid,
        kind=kind,
        resource=GroupVersionResource(
            model.resource.group, model.resource.version, model.resource.resource
        ),
        operation=model.operation,
        namespace=model.namespace or "",
        name=model.name or "",
        object=model.object,
        old_object=model.oldObject,
        sub_resource=model.subResource or "",
        dry_run=bool(model.dryRun),
        user=UserInfo(username=user.username, uid=user.uid, groups=tuple(user.groups)),
    )


# ---------------------------------------------------------------- encoding


def encode_response(
    uid: str,
    *,
    allowed: bool,
    patch: JsonPatch | None = None,
    warnings: Sequence[str] = (),
    code: int | None = None,
    message: str | None = None,
    reason: str | None = None,
) -> bytes:
    """The AdmissionReview v1 answer to request ``uid``.

    A patch is sent only when it has operations (and only with ``allowed``); a denial
    carries ``status`` with ``code`` (403 or 422), ``message`` and ``reason``.
    """
    status = None
    if not allowed or code is not None:
        status = StatusModel(
            status="Success" if allowed else "Failure", message=message, reason=reason, code=code
        )
    encoded = None
    if allowed and patch:
        encoded = base64.b64encode(jsonio.dumps(patch)).decode("ascii")
    response = AdmissionResponseModel(
        uid=uid,
        allowed=allowed,
        patchType="JSONPatch" if encoded else None,
        patch=encoded,
        status=status,
        warnings=list(warnings) or None,
    )
    review = AdmissionReviewModel(apiVersion=API_VERSION, kind=KIND, response=response)
    return jsonio.dumps(review.model_dump(exclude_none=True))


def encode_status(code: int, reason: str, message: str) -> bytes:
    """A ``metav1.Status`` body for answers that are not reviews (HTTP 400, 503)."""
    return jsonio.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


def decode_patch(response_body: bytes) -> JsonPatch:
    """The JSON Patch inside an encoded response (empty when there is none): for tests."""
    review = AdmissionReviewModel.model_validate(jsonio.loads(response_body))
    if review.response is None or review.response.patch is None:
        return []
    patch = jsonio.loads(base64.b64decode(review.response.patch))
    if not isinstance(patch, list):
        raise BadReview("the patch is not a JSON array")
    return patch
