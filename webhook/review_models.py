"""AdmissionReview ``admission.k8s.io/v1``'s wire shapes as pydantic models: the validation
of a review that ``webhook.review`` cannot read as it is.

Layer: EDGE. Used by ``webhook.review`` only for reviews whose fields are not each absent
or of exactly their wire type (kube-apiserver's are), and by tests to hold the fast reading
and writing to these models. No I/O, no clock, no aiohttp. Kept apart from
``webhook.review`` because pydantic builds these classes at run time, which the compiled
review path (``tools/compile.py``) cannot contain.

The field names are upstream's (k8s.io/api/admission/v1), camelCase as on the wire.
Unknown fields are ignored, so a newer kube-apiserver's additions do not break decoding.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster import jsonio
from cluster.echo import echo

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


def validated_request(raw: dict[str, Any]) -> dict[str, Any]:
    """``{"request": ...}`` of a decoded review as the models accept it, coerced to its
    wire types; raises ``BadReview`` with the models' own words. A response in the
    review must be valid too, but only the request is given back."""
    try:
        model = AdmissionReviewModel.model_validate(raw)
    except ValidationError as exc:
        raise BadReview(_summarize(exc)) from None
    if model.request is None:
        raise BadReview("the review has no request")
    return {"request": model.request.model_dump()}


def _summarize(exc: ValidationError) -> str:
    # a location can hold a key the client chose (userInfo.extra's): cut like any echo
    parts = [
        f"{echo('.'.join(str(p) for p in error['loc']), quote=False)}: "
        f"{echo(error['msg'], quote=False)}"
        for error in exc.errors(include_input=False)[:3]
    ]
    more = exc.error_count() - len(parts)
    return "malformed review: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def decode_patch(response_body: bytes) -> list[dict[str, Any]]:
    """The JSON Patch inside an encoded response (empty when there is none): for tests."""
    review = AdmissionReviewModel.model_validate(jsonio.loads(response_body))
    if review.response is None or review.response.patch is None:
        return []
    patch = jsonio.loads(base64.b64decode(review.response.patch))
    if not isinstance(patch, list):
        raise BadReview("the patch is not a JSON array")
    return patch
