"""One AdmissionReview from body bytes to answer bytes: the whole webhook minus HTTP.

Layer: PURE glue. Composes the EDGE codec (``webhook.review``) with the PURE decision
(``webhook.admit``) and the patch (``webhook.patch.diff``). No async, no I/O, no
clock, no aiohttp, no settings: the HTTP handler passes the body, the current policy
snapshot, the view of the Jobs and JobSets that exist (``webhook.owners``) and the
``AdmitConfig`` it built at start-up, and writes back what it gets. An outcome whose
``unconfirmed`` names an owner the view lacked may be reviewed again with that owner
fetched; the first answer is already safe to send (the object judged as its own).

An allowed CREATE is remembered under the policy (``webhook.answers``): the next object
that differs from it only in name gets the same patch, with its own gang id, without the
rules running again. Not one that names a Job or JobSet owner: its answer also depends on
who sent it and on what exists.

HTTP statuses: 200 for every review that was decided (allowed or denied: a denial is
``allowed: false`` inside a 200); 400 for a body that is not a usable review; 503 while
there is no policy yet (the cache has not synced), so that the webhook configuration's
``failurePolicy`` decides. A ``dryRun`` request gets the same answer as any other: the
webhook has no side effects to skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cluster import jsonio
from cluster.echo import echo
from webhook.admit import decide
from webhook.answers import Answer, answer_key, gang_holes, keep
from webhook.owners import NO_OWNERS, OwnerKey, OwnerView, claims_job_owner
from webhook.patch import JsonPatch, diff
from webhook.queues import Policy
from webhook.review import decode_review, encode_response, encode_status
from webhook.review_models import BadReview
from webhook.rules.gang import name_gang, request_gang_id
from webhook.rules.outcome import AdmitConfig, Allowed
from webhook.workload import ReviewRequest

MESSAGE_LIMIT: Final = 2000
"""Characters of a denial message. Each value a rule repeats is cut already
(``cluster.echo``); this bounds what they add up to, such as a problem per container."""


@dataclass(frozen=True, slots=True)
class ReviewOutcome:
    """The answer, and the labels the server's metrics count it by."""

    status: int
    body: bytes
    kind: str = ""
    """``Job``, ``JobSet``, ``Pod``, or ``other`` for anything else (a client chose it)."""
    decision: str = ""
    """``mutated``, ``allowed``, ``denied``, ``malformed`` or ``unavailable``."""
    reason: str = ""
    """Why: the denying rule, ``admitted``, ``no-gpu``, ``owned``, …"""
    queue: str = ""
    patch: JsonPatch | None = None
    answer: str = ""
    """For an allowed CREATE: ``kept`` when the answer kept for an object like it was
    given (``webhook.answers``), ``computed`` when the rules ran; else empty."""
    unconfirmed: OwnerKey | None = None
    """The controller the object claims, which the owner view lacked: the caller may GET
    it and review again with the view ``with_fetched`` it (``webhook.admit.admit``)."""


def review(
    body: bytes, policy: Policy | None, config: AdmitConfig, owners: OwnerView = NO_OWNERS
) -> ReviewOutcome:
    """Decode, decide, encode. Never raises for anything a client can send. ``owners``:
    the Jobs and JobSets known to exist (``webhook.owners``)."""
    if policy is None:
        message = "the webhook has not loaded its queue policy yet; retry shortly"
        return ReviewOutcome(
            503,
            encode_status(503, "ServiceUnavailable", message),
            decision="unavailable",
            reason="not-synced",
        )
    try:
        request = decode_review(body)
    except BadReview as exc:
        return _malformed(str(exc))
    try:
        return _decide(request, policy, config, owners)
    except jsonio.JsonEncodeError:
        return _malformed(_TOO_DEEP)


_TOO_DEEP: Final = (
    f"the object is nested more than {jsonio.WRITE_DEPTH_LIMIT} levels deep: no Kubernetes "
    "object is, and the answer could not repeat its parts"
)


def _malformed(reason: str) -> ReviewOutcome:
    return ReviewOutcome(
        400,
        encode_status(400, "BadRequest", f"malformed AdmissionReview: {reason}"),
        decision="malformed",
        reason="bad-review",
    )


def _decide(
    request: ReviewRequest, policy: Policy, config: AdmitConfig, owners: OwnerView
) -> ReviewOutcome:
    """The answer to a decoded review; ``jsonio.JsonEncodeError`` for an object nested
    deeper than JSON can be written, which no rule may read: its values would be too deep
    for Python's ``repr`` in a message (about 1000 levels; orjson reads 1024)."""
    key = _memo_key(request, config)
    if key is None:
        # the memo key writes the object already; anything else is written here once
        for obj in (request.object, request.old_object):
            if obj is not None:
                jsonio.dumps(obj)
    if key is not None:
        kept = policy.answers.get(key)
        if kept is not None:
            return _answer(request, kept, "kept")
    decision = decide(request, policy, config, owners=owners)
    kind = _kind_label(request)
    if isinstance(decision, Allowed):
        # the last step: the gang id made from the name, outside what is kept
        named = name_gang(decision, request_gang_id(request)) if decision.gang_slots else decision
        patch = diff(request.object, named.object) if request.object is not None else []
        written = jsonio.dumps(patch)
        holes = gang_holes(patch, decision.gang_slots)
        if key is not None and holes is not None:
            keep(
                policy.answers,
                key,
                patch,
                holes,
                patch_bytes=len(written),
                warnings=decision.warnings,
                decision="mutated" if patch else "allowed",
                reason=decision.reason,
                queue=decision.queue,
            )
        return ReviewOutcome(
            200,
            encode_response(
                request.uid,
                allowed=True,
                patch=patch,
                warnings=decision.warnings,
                patch_json=written,
            ),
            kind=kind,
            decision="mutated" if patch else "allowed",
            reason=decision.reason,
            queue=decision.queue,
            patch=patch,
            answer="" if key is None else "computed",
            unconfirmed=decision.unconfirmed,
        )
    return ReviewOutcome(
        200,
        encode_response(
            request.uid,
            allowed=False,
            code=decision.code,
            message=echo(decision.message, quote=False, limit=MESSAGE_LIMIT),
            reason=decision.status_reason,
        ),
        kind=kind,
        decision="denied",
        reason=decision.reason,
        queue=decision.queue,
        unconfirmed=decision.unconfirmed,
    )


def _kind_label(request: ReviewRequest) -> str:
    """The kind metrics count a review by: one of the three workload kinds, or ``other``
    (anyone who reaches the port may POST a review of a kind of their own)."""
    kind = request.workload_kind
    return "other" if kind is None else kind.value


def _memo_key(request: ReviewRequest, config: AdmitConfig) -> tuple[object, ...] | None:
    """The ``webhook.answers`` key of a CREATE of a workload; ``None`` for anything else,
    for an object that names a Job or JobSet owner (its answer also depends on who sent
    it and on what exists, which the key does not hold), and for one whose name is not
    a string (the key leaves names out; the rules deny it)."""
    obj = request.object
    if (
        request.operation != "CREATE"
        or obj is None
        or request.sub_resource
        or request.workload_kind is None
        or claims_job_owner(obj)
        or not _names_are_strings(obj)
    ):
        return None
    kind = request.kind
    return answer_key((kind.group, kind.version, kind.kind), request.namespace, obj, config)


def _names_are_strings(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return True
    return all(isinstance(metadata.get(field) or "", str) for field in ("name", "generateName"))


def _answer(request: ReviewRequest, answer: Answer, source: str) -> ReviewOutcome:
    """A kept answer, given to ``request`` with its own gang id."""
    patch = answer.fill(request_gang_id(request)) if answer.holes else answer.patch
    return ReviewOutcome(
        200,
        encode_response(request.uid, allowed=True, patch=patch, warnings=answer.warnings),
        kind=_kind_label(request),
        decision=answer.decision,
        reason=answer.reason,
        queue=answer.queue,
        patch=patch,
        answer=source,
    )


def handle_review(
    body: bytes, policy: Policy | None, config: AdmitConfig, owners: OwnerView = NO_OWNERS
) -> tuple[int, bytes]:
    """``(http_status, body)`` for one POST /mutate; see ``review`` for the metrics view."""
    outcome = review(body, policy, config, owners)
    return outcome.status, outcome.body
