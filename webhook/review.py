"""AdmissionReview ``admission.k8s.io/v1`` on the wire: decode a request, encode a response.

Layer: EDGE. Bytes are decoded once (orjson, through ``cluster.jsonio``), validated, and
turned at once into the frozen ``webhook.workload.ReviewRequest`` that the PURE core
reads. No I/O, no clock, no aiohttp: the HTTP handler hands bytes in and gets bytes out.
No pydantic class either: this module is part of the compiled review path
(``tools/compile.py``); the wire models are ``webhook.review_models``.

Unknown fields are ignored, so a newer kube-apiserver's additions do not break decoding.
Anything that is not a well-formed v1 review raises ``BadReview`` with a reason, which the
server answers with HTTP 400.

One reading: ``_read`` turns a review whose fields are each absent or of exactly their wire
type (what kube-apiserver sends) into the ``ReviewRequest``. The pydantic models are the
validation at the edge: a review ``_read`` cannot vouch for goes through them, which
refuse it with their own words (HTTP 400) or give it back normalized (coerced to the
wire types), and is then read the same way. Answers are written as the dict the response
model would dump. Tests hold both to the models' reading and writing.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, cast

from cluster import jsonio
from cluster.echo import echo
from webhook.patch import JsonPatch
from webhook.review_models import BadReview, validated_request
from webhook.workload import GroupVersionKind, GroupVersionResource, ReviewRequest, UserInfo

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
MAX_REVIEW_BYTES: Final = 4 * 1024 * 1024
"""Largest body decoded: an object and its old version at etcd's 1.5 MiB limit each, and
the review around them, fit; a 10 MB body is refused before it is parsed."""

# ---------------------------------------------------------------- decoding


def decode_review(body: bytes, *, max_bytes: int = MAX_REVIEW_BYTES) -> ReviewRequest:
    """The request of an AdmissionReview v1 body; raises ``BadReview`` with a reason.

    A review that is plainly well-formed (every field absent or of exactly its wire
    type, as kube-apiserver sends them) is read at once; anything else is validated by
    the pydantic models first (``validate_review``), which refuse it or normalize it.
    """
    raw = _parse(body, max_bytes)
    request = _read(raw)
    if request is not None:
        return request
    return validate_review(raw)


def _parse(body: bytes, max_bytes: int) -> dict[str, Any]:
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
            f"apiVersion is {echo(raw.get('apiVersion'))}; only {API_VERSION} is served "
            "(set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    if raw.get("kind") != KIND:
        raise BadReview(f"kind is {echo(raw.get('kind'))}, not {KIND}")
    request = raw.get("request")
    if not isinstance(request, dict):
        raise BadReview("the review has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("request.uid is missing")
    return raw


def validate_review(raw: dict[str, Any]) -> ReviewRequest:
    """The request of a decoded review, validated by the pydantic wire models
    (``webhook.review_models``): what they accept, coerced to its wire types, is read as
    any review is (``_read``)."""
    request = _read(validated_request(raw))
    if request is None:
        raise AssertionError("a validated review is plainly well-formed")
    return request


def _check_kind(obj: Mapping[str, Any] | None, field: str, kind: GroupVersionKind) -> None:
    if obj is None:
        return
    api_version, obj_kind = obj.get("apiVersion"), obj.get("kind")
    if (api_version is not None and api_version != kind.api_version) or (
        obj_kind is not None and obj_kind != kind.kind
    ):
        raise BadReview(
            f"request.{field} is {echo(obj_kind)} {echo(api_version)}, not the "
            f"{kind.kind} {kind.api_version} that request.kind declares"
        )


def _to_request(
    *,
    uid: str,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    operation: str,
    namespace: str | None,
    name: str | None,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
    sub_resource: str | None,
    dry_run: bool | None,
    user: UserInfo,
) -> ReviewRequest:
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise BadReview(f"request.object is missing for {operation}")
    if operation == "UPDATE" and old is None:
        raise BadReview("request.oldObject is missing for UPDATE")
    _check_kind(obj, "object", kind)
    _check_kind(old, "oldObject", kind)
    return ReviewRequest(
        uid=uid,
        kind=kind,
        resource=resource,
        operation=operation,
        namespace=namespace or "",
        name=name or "",
        object=obj,
        old_object=old,
        sub_resource=sub_resource or "",
        dry_run=bool(dry_run),
        user=user,
    )


# ---------------------------------------------------------------- the reading
#
# Every check raises _Unsure when a value is not exactly what the models accept without
# coercion; the review then goes to the models, which decide and word the error, or give
# it back normalized. So nothing is read that the models would refuse.


class _Unsure(Exception):
    """Not plainly well-formed: the models must judge."""


_OPERATIONS: Final = frozenset(("CREATE", "UPDATE", "DELETE", "CONNECT"))
_OPTIONAL_TEXT: Final = ("subResource", "requestSubResource", "name", "namespace")
_OPTIONAL_MAPS: Final = ("object", "oldObject", "options")
_KNOWN_KINDS: Final = (("batch", "v1", "Job", "jobs"), ("", "v1", "Pod", "pods"),
                       ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"))  # fmt: skip
# The kinds reviewed all day, made once: frozen records are immutable, so sharing is safe.
_GVKS: Final = MappingProxyType(
    {(g, v, k): GroupVersionKind(g, v, k) for g, v, k, _ in _KNOWN_KINDS}
)
_GVRS: Final = MappingProxyType(
    {(g, v, r): GroupVersionResource(g, v, r) for g, v, _, r in _KNOWN_KINDS}
)
_ABSENT: Final = cast(Any, object())


def _gv_strings(value: object, last: str) -> tuple[str, str, str]:
    """``(group, version, kind|resource)`` of a GroupVersionKind/Resource map."""
    if type(value) is not dict:
        raise _Unsure
    group, version, name = value.get("group", ""), value.get("version"), value.get(last)
    if type(group) is not str or type(version) is not str or type(name) is not str:
        raise _Unsure
    return group, version, name


def _user(value: object) -> UserInfo:
    if value is _ABSENT:
        return UserInfo()
    if type(value) is not dict:
        raise _Unsure
    username, uid = value.get("username", ""), value.get("uid", "")
    groups, extra = value.get("groups", []), value.get("extra", {})
    if type(username) is not str or type(uid) is not str or type(groups) is not list:
        raise _Unsure
    for group in groups:
        if type(group) is not str:
            raise _Unsure
    if type(extra) is not dict:
        raise _Unsure
    for values in extra.values():
        if type(values) is not list:
            raise _Unsure
        for item in values:
            if type(item) is not str:
                raise _Unsure
    return UserInfo(username=username, uid=uid, groups=tuple(groups))


def _read(raw: dict[str, Any]) -> ReviewRequest | None:
    """The request of a plainly well-formed review, or ``None`` to leave it to the models."""
    if raw.get("response") is not None:
        return None
    request: dict[str, Any] = raw["request"]
    get = request.get
    try:
        operation = get("operation")
        if type(operation) is not str or operation not in _OPERATIONS:
            raise _Unsure
        gvk = _gv_strings(get("kind"), "kind")
        gvr = _gv_strings(get("resource"), "resource")
        for optional, last in (("requestKind", "kind"), ("requestResource", "resource")):
            if get(optional) is not None:
                _gv_strings(get(optional), last)
        for key in _OPTIONAL_TEXT:
            value = get(key)
            if value is not None and type(value) is not str:
                raise _Unsure
        for key in _OPTIONAL_MAPS:
            value = get(key)
            if value is not None and type(value) is not dict:
                raise _Unsure
        dry_run = get("dryRun")
        if dry_run is not None and type(dry_run) is not bool:
            raise _Unsure
        user = _user(get("userInfo", _ABSENT))
    except _Unsure:
        return None
    return _to_request(
        uid=request["uid"],
        kind=_GVKS.get(gvk) or GroupVersionKind(*gvk),
        resource=_GVRS.get(gvr) or GroupVersionResource(*gvr),
        operation=operation,
        namespace=get("namespace"),
        name=get("name"),
        obj=get("object"),
        old=get("oldObject"),
        sub_resource=get("subResource"),
        dry_run=dry_run,
        user=user,
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
    patch_json: bytes | None = None,
) -> bytes:
    """The AdmissionReview v1 answer to request ``uid``.

    A patch is sent only when it has operations (and only with ``allowed``);
    ``patch_json``, when given, is ``patch`` written already (``jsonio.dumps``). A denial
    carries ``status`` with ``code`` (403 or 422), ``message`` and ``reason``. Built as the
    dict that ``AdmissionReviewModel(...).model_dump(exclude_none=True)`` would give (same
    keys, same order), without building the models for every answer.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if allowed and patch:
        response["patchType"] = "JSONPatch"
        written = jsonio.dumps(patch) if patch_json is None else patch_json
        response["patch"] = binascii.b2a_base64(written, newline=False).decode()
    if not allowed or code is not None:
        status: dict[str, Any] = {"status": "Success" if allowed else "Failure"}
        if message is not None:
            status["message"] = message
        if reason is not None:
            status["reason"] = reason
        if code is not None:
            status["code"] = code
        response["status"] = status
    if warnings:
        response["warnings"] = list(warnings)
    return jsonio.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response})


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
