"""Hostile AdmissionReviews against the webhook over TLS, as kube-apiserver reaches it.

Every input gets an answer within the time bound: a 200 that is a valid AdmissionReview
response echoing the request's uid (a denial with a code and a message of bounded
length), or a 4xx that is a Kubernetes Status with a reason; never a 5xx, never a
dropped connection. A forged owner never spares a workload the rules deny. Afterwards
every golden review still gets its golden answer, the metrics' labels have not grown
with what the inputs said, and the process's memory has not grown past what the
webhook's bounded memo may hold.
"""

from __future__ import annotations

import base64
import functools
import gc
import gzip
import tracemalloc
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cluster import jsonio
from cluster.clock import ManualClock
from server.tls import CertReloader, client_context
from tests.certfiles import make_material
from tests.fuzz import strategies as hostile
from tests.fuzz.harness import (
    FUZZ_MARKS,
    Answer,
    Client,
    ServedApp,
    check_memory,
    measured,
    profile,
    rss_mib,
)
from webhook.answers import ANSWERS_KEPT
from webhook.app import create_app
from webhook.owners import JOB_CONTROLLER_USERNAMES, JOBSET_CONTROLLER_USERNAMES, OwnerKind
from webhook.review_flow import MESSAGE_LIMIT
from webhook.review_models import AdmissionReviewModel
from webhook.settings import WebhookSettings
from webhook.source import OwnerSource, PolicyStore

pytestmark = FUZZ_MARKS

GOLDEN: Final = hostile.GOLDEN / "webhook"
NAMESPACE: Final = "team-nlp"
OWNERS: Final = {
    OwnerKind.JOB: ("finetune-cslh4", "7c9bef66-465c-4588-b062-b3150d5253dc"),
    OwnerKind.JOBSET: ("pretrain", "0b8f7f4e-5a8e-4a70-a1b4-3e6c1d9a2f10"),
}
"""The Jobs and JobSets that exist, as in the golden cases (tests/golden/webhook/README.md)."""
OWNER_API: Final = {OwnerKind.JOB: "batch/v1", OwnerKind.JOBSET: "jobset.x-k8s.io/v1alpha2"}
SENDERS: Final = {
    OwnerKind.JOB: JOB_CONTROLLER_USERNAMES,
    OwnerKind.JOBSET: JOBSET_CONTROLLER_USERNAMES,
}
ERROR_BODY_LIMIT: Final = 16 * 1024
"""An error repeats what it was sent cut short: its body stays small whatever came in."""

UNDER_THE_LIMIT: Final = 2 * 1024 * 1024
"""Below the webhook's body limit (3 MiB by default)."""
BASES: Final = {**hostile.golden_bodies("webhook"), **hostile.captured_bodies("webhook-mutate")}


@dataclass(frozen=True, slots=True)
class Webhook:
    served: ServedApp
    client: Client
    baseline_mib: float = 0.0
    """Resident memory once the server has answered every golden review."""

    def golden_answers(self) -> list[str]:
        """The golden cases whose answer over the wire is not the golden one."""
        wrong = []
        for request in sorted(GOLDEN.glob("*.request.json")):
            case = request.name.removesuffix(".request.json")
            sent = jsonio.loads(request.read_bytes())
            raw = sent.get("rawBody")
            body = raw.encode() if raw is not None else request.read_bytes()
            expected = jsonio.loads((GOLDEN / f"{case}.response.json").read_bytes())
            answer = self.client.post("/mutate?timeout=5s", body)
            if (answer.status, answer.json()) != (expected["httpStatus"], expected["body"]):
                wrong.append(case)
        return wrong


def _owner(kind: OwnerKind) -> dict[str, Any]:
    name, uid = OWNERS[kind]
    return {"metadata": {"namespace": NAMESPACE, "name": name, "uid": uid}}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    material = make_material(tmp_path_factory.mktemp("certs"))

    def make_app() -> Any:
        store = PolicyStore(ManualClock())
        store.load_file(str(GOLDEN / "policy.yaml"))
        owners = OwnerSource()
        for kind in OwnerKind:
            owners.store.replace(kind, [_owner(kind)])
        # the golden cases' settings: team-sandbox is managed, default controller users
        settings = WebhookSettings(managed_namespaces=frozenset({"team-sandbox"}))
        return create_app(settings, store=store, owners=owners, clock=ManualClock())

    reloader = CertReloader(material["webhook.crt"], material["webhook.key"])
    with ServedApp(make_app, reloader.context) as served:
        client = Client("localhost", served.port, client_context(material["ca.crt"]))
        hook = Webhook(served, client)
        assert hook.golden_answers() == [], "the golden answers, before any fuzzing"
        hook = replace(hook, baseline_mib=rss_mib())
        try:
            yield hook
        finally:
            client.close()


# ---------------------------------------------------------------- what every answer is


def _request_uid(body: bytes) -> str | None:
    """The uid the request carries, when it is JSON with one (the last of duplicates)."""
    try:
        review = jsonio.loads(body)
    except jsonio.JsonError:
        return None
    request = review.get("request") if isinstance(review, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and uid else None


def check_answer(body: bytes, answer: Answer) -> None:
    """A 200 is an AdmissionReview response to this request; a 4xx a Status."""
    if answer.status != 200:
        assert len(answer.body) <= ERROR_BODY_LIMIT, f"{len(answer.body)} bytes of error"
        status = answer.json()
        assert status["kind"] == "Status"
        assert status["apiVersion"] == "v1"
        assert status["status"] == "Failure"
        assert status["code"] == answer.status
        assert isinstance(status["reason"], str)
        assert status["reason"]
        assert isinstance(status["message"], str)
        assert status["message"]
        return
    review = AdmissionReviewModel.model_validate(answer.json())
    response = review.response
    assert response is not None
    assert review.request is None
    uid = _request_uid(body)
    assert uid is not None, "a review was answered that named no uid"
    assert response.uid == uid
    if response.allowed:
        if response.patch is not None:
            assert response.patchType == "JSONPatch"
            patch = jsonio.loads(base64.b64decode(response.patch, validate=True))
            assert isinstance(patch, list)
            assert all(isinstance(op, dict) and {"op", "path"} <= op.keys() for op in patch)
    else:
        assert response.status is not None
        assert response.status.code in (403, 422)
        assert response.status.message
        assert len(response.status.message) <= MESSAGE_LIMIT


# ---------------------------------------------------------------- the properties


def test_damaged_reviews(webhook: Webhook) -> None:
    """The golden and captured reviews with fields dropped, retyped, nested deep, given
    twice, unicode and megabytes long, and their bytes cut short or spoiled."""
    with measured("/mutate damaged reviews") as run:

        @profile()
        @given(body=hostile.damaged(BASES))
        def one(body: bytes) -> None:
            run.send(webhook.client, "/mutate?timeout=5s", body, lambda a: check_answer(body, a))

        one()


def test_bodies_that_are_not_reviews(webhook: Webhook) -> None:
    """Empty, scalar, broken, 10,000 levels deep, invalid UTF-8, megabytes of nothing."""
    with measured("/mutate not reviews") as run:

        @profile()
        @given(body=hostile.not_json)
        @example(body=hostile.nested(10_000, in_lists=False))
        @example(body=b"[" + b"0," * 1_600_000 + b"0]")  # over the 3 MiB limit
        def one(body: bytes) -> None:
            def check(answer: Answer) -> None:
                check_answer(body, answer)
                assert answer.status == 400

            run.send(webhook.client, "/mutate", body, check)

        one()


def _compressed(how: str, data: bytes) -> bytes:
    if how == "gzip":
        return gzip.compress(data)
    if how == "deflate":
        return zlib.compress(data)
    return data


@st.composite
def _encoded_bodies(draw: st.DrawFn) -> tuple[bytes, str, bytes]:
    """A review (or something else) in a content encoding: ``(plain, encoding, sent)``.

    Compressed bodies are whole streams: one that ends unfinished can leave the handler
    waiting (``tests/integration/test_extender_server.py``, issue 20's read deadlines)."""
    if draw(st.booleans()):
        # a bomb: a small body that inflates past the limit
        size = draw(st.sampled_from([100_000, 4_000_000, 8_000_000]))
        encoding = draw(st.sampled_from(["gzip", "deflate"]))
        return b"", encoding, _bomb(size, encoding)
    plain = draw(st.one_of(hostile.damaged(BASES, max_mutations=1), hostile.not_json))
    encoding = draw(st.sampled_from(["gzip", "deflate", "br", "identity", "x-made-up"]))
    # aiohttp refuses br (no Brotli here) on the headers and closes at once: a client
    # still sending a large body then sees the connection reset before the answer. Over
    # the limit, likewise after the server has answered and drains the rest.
    plain = plain[: 32 * 1024 if encoding == "br" else UNDER_THE_LIMIT]
    return plain, encoding, _compressed(encoding, plain)


@functools.cache
def _bomb(size: int, encoding: str) -> bytes:
    return _compressed(encoding, b'{"a":"' + b"x" * size + b'"}')


def test_bodies_in_a_content_encoding(webhook: Webhook) -> None:
    """aiohttp inflates a gzip or deflate body before the handler reads it: a small body
    that inflates to 8 MB, a damaged review, an encoding it cannot or need not undo."""
    with measured("/mutate content-encoded") as run:

        @profile(share=0.5)
        @given(encoded=_encoded_bodies())
        def one(encoded: tuple[bytes, str, bytes]) -> None:
            plain, encoding, sent = encoded

            def check(answer: Answer) -> None:
                if answer.status == 200:
                    check_answer(plain, answer)
                else:
                    assert answer.status in (400, 413, 415), answer.status

            headers = {"Content-Encoding": encoding}
            run.send(webhook.client, "/mutate", sent, check, headers)

        one()


@st.composite
def _owner_reference(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*OwnerKind, None]))
    real_name, real_uid = OWNERS[kind] if kind is not None else ("x", "0")
    reference: dict[str, Any] = {
        "apiVersion": draw(
            st.sampled_from(
                [*OWNER_API.values(), "batch/v2", "v1", "", "jobset.x-k8s.io/v1", "Batch/V1"]
            )
        ),
        "kind": draw(st.sampled_from(["Job", "JobSet", "job", "ReplicaSet", "", "Pod"])),
        "name": draw(st.sampled_from([real_name, "finetune-cslh4", "pretrain", "x", " pretrain"])),
        "uid": draw(st.sampled_from([real_uid, real_uid.upper(), "0", "", real_uid + " "])),
    }
    controller = draw(st.sampled_from([True, False, None, "true", 1]))
    if controller is not None:
        reference["controller"] = controller
    return reference


def _genuine(references: object, username: object) -> bool:
    """Whether one of ``references`` is the controller reference of an owner that
    exists, sent by that owner's controller: the one claim the webhook may believe."""
    if not isinstance(references, list):
        return False
    for ref in references:
        for kind, (name, uid) in OWNERS.items():
            if (
                isinstance(ref, dict)
                and ref.get("controller") is True
                and ref.get("apiVersion") == OWNER_API[kind]
                and ref.get("kind") == kind.value
                and (ref.get("name"), ref.get("uid")) == (name, uid)
                and username in SENDERS[kind]
            ):
                return True
    return False


OVER_QUOTA: Final = ("job-quota-over", "pod-forged-owner-64-gpus", "jobset-quota-over")
"""Golden reviews the rules deny (over quota), in the namespace where the owners exist."""


def test_forged_owners_never_spare_a_workload_the_rules_deny(webhook: Webhook) -> None:
    """Issue 20: a workload over quota that names an owner, in any form, from any
    sender, is denied unless the owner exists, is its controller and sent it."""
    with measured("/mutate forged owners") as run:

        @profile()
        @given(
            case=st.sampled_from(OVER_QUOTA),
            references=st.one_of(
                st.lists(_owner_reference(), min_size=1, max_size=3), hostile.values
            ),
            username=st.sampled_from(
                [*JOB_CONTROLLER_USERNAMES, *JOBSET_CONTROLLER_USERNAMES, "alice", "", None]
            ),
        )
        def one(case: str, references: object, username: object) -> None:
            review = jsonio.loads((GOLDEN / f"{case}.request.json").read_bytes())
            review["request"]["object"]["metadata"]["ownerReferences"] = references
            review["request"]["userInfo"] = {"username": username}
            body = jsonio.dumps(review)

            def check(answer: Answer) -> None:
                check_answer(body, answer)
                if not _genuine(references, username):
                    assert answer.status == 400 or answer.json()["response"]["allowed"] is False

            run.send(webhook.client, "/mutate", body, check)

        one()


def test_distinct_large_jobs_do_not_grow_memory_past_the_memo(webhook: Webhook) -> None:
    """A stream of allowed Jobs, each different and each as large as kube-apiserver
    lets an object be, fills the memo of kept answers: what it keeps must stay small."""
    review = jsonio.loads((GOLDEN / "job-capture.request.json").read_bytes())
    container = review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]
    jobs = ANSWERS_KEPT // 8
    with measured("/mutate 1 MB jobs") as run:
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for n in range(jobs):
                # an environment variable of 1 MB: the object stays under etcd's 1.5 MiB
                container["env"] = [{"name": "BLOB", "value": f"{n:08d}" + "x" * 1_000_000}]
                body = jsonio.dumps(review)
                answer = run.send(
                    webhook.client, "/mutate", body, functools.partial(check_answer, body)
                )
                assert answer.json()["response"]["allowed"] is True
            gc.collect()
            grown = (tracemalloc.get_traced_memory()[0] - before) / (1024 * 1024)
        finally:
            tracemalloc.stop()
    # a memo that kept each object whole would hold 128 MB
    assert grown < 16, f"{grown:.0f} MiB more after {jobs} distinct 1 MB Jobs"


# ---------------------------------------------------------------- afterwards


def test_golden_answers_and_metrics_unharmed_afterwards(webhook: Webhook) -> None:
    assert webhook.golden_answers() == []
    assert webhook.client.get("/metrics").status == 404, "metrics only on their own port"
    metrics = webhook.served.metrics()
    series = [
        line
        for line in metrics.decode().splitlines()
        if line.startswith("tessera_webhook_reviews_total{")
    ]
    # labels are the policy's queues, the rules and four kinds: nothing the inputs chose
    assert len(series) < 200, series[:20]
    assert all(len(line) < 300 for line in series)
    check_memory(webhook.baseline_mib)
