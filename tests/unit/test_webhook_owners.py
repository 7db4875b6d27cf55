"""Only what the Job and JobSet controllers really made is let through unjudged.

Issue 20: any ownerReference to a Job or JobSet skipped every rule, so a user could write
one and create a Job over quota, a pod asking for 64 GPUs, or move a running Job to
another queue. Now the claim counts only with ``controller: true``, from the
controller's own identity, for an owner that exists with that uid. Each row is a review
a user or a controller could send, through ``admit`` with the golden policy; the owner
view says which Jobs and JobSets exist.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from cluster.files import load_objects
from webhook.admit import admit
from webhook.owners import (
    JOB_CONTROLLER_USERNAMES,
    JOBSET_CONTROLLER_USERNAMES,
    NO_OWNERS,
    ControllerUsers,
    OwnerKey,
    OwnerKind,
    OwnerRef,
    OwnerView,
    claims_job_owner,
    judge_owner,
)
from webhook.policy_build import policy_from_objects
from webhook.review import decode_review
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig, Allowed, Decision, Denied
from webhook.workload import ReviewRequest

POLICY = policy_from_objects(
    load_objects(Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml")
)
CONFIG = AdmitConfig()
NS = "team-nlp"
JOB_UID = "7c9bef66-465c-4588-b062-b3150d5253dc"
JOBSET_UID = "0b8f7f4e-5a8e-4a70-a1b4-3e6c1d9a2f10"
JOB_CONTROLLER = JOB_CONTROLLER_USERNAMES[0]
JOBSET_CONTROLLER = JOBSET_CONTROLLER_USERNAMES[0]
ALICE = "alice"

EXISTING = OwnerView(
    {
        OwnerKind.JOB: {(NS, "finetune"): JOB_UID},
        OwnerKind.JOBSET: {(NS, "pretrain"): JOBSET_UID},
    }
)
"""Job finetune and JobSet pretrain exist in team-nlp."""

Obj = dict[str, Any]


def gpu_spec(gpus: int) -> Obj:
    return {
        "restartPolicy": "Never",
        "containers": [
            {"name": "c", "image": "img", "resources": {"limits": {labels.GPU_RESOURCE: str(gpus)}}}
        ],
    }


def job_ref(name: str = "finetune", uid: str = JOB_UID, **extra: Any) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, **extra}


def jobset_ref(name: str = "pretrain", uid: str = JOBSET_UID, **extra: Any) -> Obj:
    ref = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "uid": uid}
    return {**ref, **extra}


def pod(gpus: int = 4, owners: list[Obj] | None = None, queue: str | None = None) -> Obj:
    """A pod as the Job controller makes it (no queue label), or a user's."""
    metadata: Obj = {"name": "finetune-abcde", "namespace": NS}
    if owners is not None:
        metadata["ownerReferences"] = owners
    if queue is not None:
        metadata["labels"] = {labels.QUEUE_NAME: queue}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": gpu_spec(gpus)}


def job(pods: int = 2, gpus: int = 4, owners: list[Obj] | None = None, **spec: Any) -> Obj:
    metadata: Obj = {"name": "pretrain-workers-0", "namespace": NS,
                     "labels": {labels.QUEUE_NAME: "team-nlp-queue"}}  # fmt: skip
    if owners is not None:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"parallelism": pods, "template": {"spec": gpu_spec(gpus)}, **spec},
    }


_GVK = {
    "Pod": ({"group": "", "version": "v1", "kind": "Pod"}, "pods"),
    "Job": ({"group": "batch", "version": "v1", "kind": "Job"}, "jobs"),
}


def review_body(obj: Obj, sender: str, old: Obj | None = None, uid: str = "u-1") -> bytes:
    gvk, resource = _GVK[obj["kind"]]
    request: Obj = {
        "uid": uid,
        "kind": gvk,
        "resource": {"group": gvk["group"], "version": gvk["version"], "resource": resource},
        "namespace": NS,
        "operation": "CREATE" if old is None else "UPDATE",
        "userInfo": {"username": sender},
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return jsonio.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )


def request_of(obj: Obj, sender: str, old: Obj | None = None) -> ReviewRequest:
    return decode_review(review_body(obj, sender, old))


def moved_while_running(owners: list[Obj]) -> tuple[Obj, Obj]:
    """(new, old) of a running Job whose queue label is changed."""
    old = job(owners=owners, suspend=False)
    new = copy.deepcopy(old)
    new["metadata"]["labels"][labels.QUEUE_NAME] = "default"
    return new, old


@dataclass(frozen=True, slots=True)
class Row:
    obj: Obj
    sender: str
    old: Obj | None = None
    view: OwnerView = EXISTING
    config: AdmitConfig = CONFIG


FORGED_JOBSET = [jobset_ref(name="x", uid="0")]
"""The issue's reference: no controller flag, an owner that does not exist."""
FORGED_JOB = [job_ref(name="x", uid="0", controller=True)]

# (what the decision must be: reason for an unchanged allow, else the denying rule)
JUDGED = {
    # the three reproductions
    "issue: over-quota Job with a forged JobSet owner": (
        Row(job(pods=5, gpus=8, owners=FORGED_JOBSET), ALICE), "quota", None),
    "issue: bare pod asking 64 GPUs with a forged Job owner": (
        Row(pod(gpus=64, owners=FORGED_JOB, queue="team-nlp-queue"), ALICE), "quota", None),
    "issue: queue label moved on a running Job with a forged owner": (
        Row(*moved_while_running(FORGED_JOB)[:1], ALICE, moved_while_running(FORGED_JOB)[1]),
        "update", None),
    # one missing piece each
    "controller flag false": (
        Row(pod(64, [job_ref(controller=False)]), JOB_CONTROLLER), "quota", None),
    "controller flag absent": (Row(pod(64, [job_ref()]), JOB_CONTROLLER), "quota", None),
    "uid does not match": (
        Row(pod(64, [job_ref(uid="1111", controller=True)]), JOB_CONTROLLER), "quota",
        OwnerKey(OwnerKind.JOB, NS, "finetune")),
    "owner unknown": (
        Row(pod(64, [job_ref(name="gone", controller=True)]), JOB_CONTROLLER), "quota",
        OwnerKey(OwnerKind.JOB, NS, "gone")),
    "owner the API says does not exist": (
        Row(pod(64, [job_ref(name="gone", controller=True)]), JOB_CONTROLLER,
            view=EXISTING.with_fetched(OwnerKey(OwnerKind.JOB, NS, "gone"), None)),
        "quota", None),
    "owner the API has with another uid": (
        Row(pod(64, [job_ref(controller=True)]), JOB_CONTROLLER,
            view=EXISTING.with_fetched(OwnerKey(OwnerKind.JOB, NS, "finetune"), "2222")),
        "quota", None),
    "sent by someone else": (Row(pod(64, [job_ref(controller=True)]), ALICE), "quota", None),
    "sent by the other controller": (
        Row(pod(64, [job_ref(controller=True)]), JOBSET_CONTROLLER), "quota", None),
    "a name no object can have": (
        Row(pod(64, [job_ref(name="../../other/jobs/finetune", controller=True)]),
            JOB_CONTROLLER), "quota", None),
    "policy file: no owner known": (
        Row(pod(64, [job_ref(controller=True)]), JOB_CONTROLLER, view=NO_OWNERS), "quota",
        OwnerKey(OwnerKind.JOB, NS, "finetune")),
    "Job of a forged JobSet": (
        Row(job(pods=5, gpus=8, owners=[jobset_ref(name="x", uid="0", controller=True)]),
            JOBSET_CONTROLLER), "quota", OwnerKey(OwnerKind.JOBSET, NS, "x")),
    "a pod's own answer that needs no owner": (
        Row(pod(0, [job_ref(name="gone", controller=True)]), JOB_CONTROLLER), "no-gpu", None),
    "a ReplicaSet's pod is its own": (
        Row(pod(64, [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "9",
                      "controller": True}]), ALICE), "quota", None),
}  # fmt: skip

OWNED = {
    "a pod the Job controller made": Row(pod(64, [job_ref(controller=True)]), JOB_CONTROLLER),
    "the same, through kube-controller-manager's own identity": Row(
        pod(64, [job_ref(controller=True)]), "system:kube-controller-manager"
    ),
    "a Job the JobSet controller made": Row(
        job(pods=5, gpus=8, owners=[jobset_ref(controller=True)]), JOBSET_CONTROLLER
    ),
    "a JobSet of another served version": Row(
        job(pods=5, gpus=8, owners=[jobset_ref(controller=True, apiVersion="jobset.x-k8s.io/v1")]),
        JOBSET_CONTROLLER,
    ),
    "its UPDATE, queue label and all": Row(
        *moved_while_running([job_ref(controller=True)])[:1],
        JOB_CONTROLLER,
        moved_while_running([job_ref(controller=True)])[1],
    ),
    "a pod the cache lacked, found by a GET": Row(
        pod(64, [job_ref(name="new", uid="3333", controller=True)]),
        JOB_CONTROLLER,
        view=EXISTING.with_fetched(OwnerKey(OwnerKind.JOB, NS, "new"), "3333"),
    ),
    "any sender, when the sender is not checked": Row(
        pod(64, [job_ref(controller=True)]), ALICE, config=AdmitConfig(controllers=ControllerUsers(
            job=frozenset(), jobset=frozenset()))
    ),
    "a non-controller reference next to the controller": Row(
        pod(64, [job_ref(name="x", uid="0"), job_ref(controller=True)]), JOB_CONTROLLER
    ),
}  # fmt: skip


def decide(row: Row) -> Decision:
    return admit(request_of(row.obj, row.sender, row.old), POLICY, row.config, owners=row.view)


@pytest.mark.parametrize(("row", "rule", "unconfirmed"), JUDGED.values(), ids=JUDGED.keys())
def test_an_object_not_made_by_its_controller_is_judged_as_its_own(
    row: Row, rule: str, unconfirmed: OwnerKey | None
) -> None:
    decision = decide(row)

    assert decision.reason == rule, decision
    assert isinstance(decision, Denied) or decision.object == row.obj
    # the owner one GET could still find, only where it would change the answer
    assert decision.unconfirmed == unconfirmed


@pytest.mark.parametrize("row", OWNED.values(), ids=OWNED.keys())
def test_an_object_its_controller_made_is_let_through_unchanged(row: Row) -> None:
    decision = decide(row)

    assert isinstance(decision, Allowed)
    assert (decision.reason, decision.object, decision.warnings) == ("owned", row.obj, ())
    assert decision.unconfirmed is None


def test_a_changed_object_says_why_it_was_not_taken_as_its_controllers() -> None:
    decision = decide(Row(pod(4, [job_ref(controller=True)], queue="team-nlp-queue"), ALICE))

    assert isinstance(decision, Allowed)
    assert decision.reason == "admitted"
    assert decision.warnings[-1] == (
        "pod finetune-abcde is judged as a pod of its own, not as made by its controller: "
        "the request comes from 'alice', not the Job controller"
    )


@pytest.mark.parametrize(
    ("view", "why"),
    [
        pytest.param(NO_OWNERS, "Job team-nlp/finetune is not known to the webhook", id="unknown"),
        pytest.param(
            NO_OWNERS.with_fetched(OwnerKey(OwnerKind.JOB, NS, "finetune"), None),
            "Job team-nlp/finetune does not exist",
            id="gone",
        ),
        pytest.param(
            OwnerView({OwnerKind.JOB: {(NS, "finetune"): "2222"}}),
            f"Job team-nlp/finetune has uid 2222, not '{JOB_UID}'",
            id="other-uid",
        ),
    ],
)
def test_the_verdict_says_what_was_missing(view: OwnerView, why: str) -> None:
    ref = OwnerRef("batch/v1", "Job", "finetune", JOB_UID, controller=True)

    verdict = judge_owner((ref,), NS, JOB_CONTROLLER, view, ControllerUsers())

    assert (verdict.owned, verdict.refused) == (False, why)


def pod_review(name: str, sender: str, uid: str) -> bytes:
    obj = pod(4, [job_ref(controller=True)], queue="team-nlp-queue")
    obj["metadata"]["name"] = name
    return review_body(obj, sender, uid=uid)


@pytest.mark.parametrize(
    ("first", "second", "second_decision"),
    [
        pytest.param(ALICE, JOB_CONTROLLER, "allowed", id="forged-then-genuine"),
        pytest.param(JOB_CONTROLLER, ALICE, "mutated", id="genuine-then-forged"),
    ],
)
def test_an_answer_to_an_object_naming_a_job_is_never_reused_for_another_sender(
    first: str, second: str, second_decision: str
) -> None:
    """Answers to objects that differ only in name are kept (``webhook.answers``); one
    naming an owner depends on who sends it, which the kept answer does not know."""
    policy = policy_from_objects(
        load_objects(Path(__file__).resolve().parents[1] / "golden" / "webhook" / "policy.yaml")
    )
    review(pod_review("a", first, "u-1"), policy, CONFIG, EXISTING)

    again = review(pod_review("b", second, "u-2"), policy, CONFIG, EXISTING)

    assert again.decision == second_decision
    assert again.answer == ""
    assert not policy.answers


@pytest.mark.parametrize(
    ("obj", "claims"),
    [
        pytest.param(pod(owners=[job_ref()]), True, id="job"),
        pytest.param(job(owners=[jobset_ref()]), True, id="jobset"),
        pytest.param(pod(owners=[{"apiVersion": "apps/v1", "kind": "ReplicaSet"}]), False,
                     id="replicaset"),
        pytest.param(pod(owners=[]), False, id="none"),
        pytest.param(pod(), False, id="absent"),
        pytest.param({**pod(), "metadata": {"ownerReferences": "Job"}}, False, id="malformed"),
    ],
)  # fmt: skip
def test_which_objects_name_a_job_owner(obj: Obj, claims: bool) -> None:
    assert claims_job_owner(obj) is claims


def _kinds(edit: Callable[[Obj], None]) -> Obj:
    obj = pod(owners=[job_ref(controller=True)])
    edit(obj["metadata"]["ownerReferences"][0])
    return obj


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(_kinds(lambda r: r.__setitem__("controller", "true")), id="controller-text"),
        pytest.param(_kinds(lambda r: r.__setitem__("uid", 7)), id="uid-number"),
        pytest.param(_kinds(lambda r: r.__setitem__("apiVersion", "batch/v2")), id="other-version"),
        pytest.param(_kinds(lambda r: r.__setitem__("name", ["finetune"])), id="name-list"),
    ],
)
def test_an_owner_reference_of_the_wrong_shape_claims_nothing(obj: Obj) -> None:
    obj["spec"] = gpu_spec(64)
    decision = decide(Row(obj, JOB_CONTROLLER))
    assert decision.reason == "quota"
