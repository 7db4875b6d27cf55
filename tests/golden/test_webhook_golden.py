"""Golden AdmissionReview exchanges: ``webhook/<case>.request.json`` → ``<case>.response.json``.

Every case goes through ``webhook.review_flow.review``, the whole webhook minus HTTP, with
the queue policy of ``webhook/policy.yaml`` and the owners of ``OWNERS``. The cases start
from the reviews that a real kube-apiserver sent (``../shared/captures``, copied in as
``job-capture``, ``job-update-unsuspend``, ``pod-owned-by-job`` and ``pod-notebook``) and
change one thing each, so that every rule is shown allowing and denying a Job, a JobSet
and a Pod.

A response file holds the HTTP status, the body, and the body's patch decoded
(``patchDecoded``) so that a reviewer can read what changes. A request file whose top
level is ``{"rawBody": "..."}`` stands for a body that is not JSON at all.

Regenerate after an intended change with ``TESSERA_UPDATE_GOLDENS=1 pytest
tests/golden/test_webhook_golden.py`` and read the diff; without it, any difference in a
request (the case builders below) or a response fails.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from cluster import jsonio, labels
from cluster.files import load_objects
from tests.shared import CAPTURES
from webhook.owners import JOBSET_CONTROLLER_USERNAMES, OwnerKind, OwnerView
from webhook.patch import apply_patch, clone
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy
from webhook.review_flow import ReviewOutcome, review
from webhook.rules.outcome import AdmitConfig

HERE = Path(__file__).parent / "webhook"
UPDATE = os.environ.get("TESSERA_UPDATE_GOLDENS") == "1"

CONFIG = AdmitConfig(managed_namespaces=frozenset({"team-sandbox"}))
"""team-sandbox is managed (a GPU workload there must name a queue); team-free is not."""

OWNERS = OwnerView(
    {
        OwnerKind.JOB: {("team-nlp", "finetune-cslh4"): "7c9bef66-465c-4588-b062-b3150d5253dc"},
        OwnerKind.JOBSET: {("team-nlp", "pretrain"): "0b8f7f4e-5a8e-4a70-a1b4-3e6c1d9a2f10"},
    }
)
"""The Jobs and JobSets that exist: the captured pod's Job, and the JobSet of
job-owned-by-jobset. Any other owner a case names is made up."""
FORGER = "alice"
"""Who sends the cases that claim an owner they did not make."""

CAPTURED = {
    "job-capture": "000",
    "job-update-unsuspend": "002",
    "pod-owned-by-job": "004",
    "pod-notebook": "020",
}
"""Cases that are a captured review as it arrived."""

Review = dict[str, Any]


def load_policy() -> Policy:
    policy = policy_from_objects(load_objects(HERE / "policy.yaml"))
    assert policy.problems == (
        "LocalQueue team-sandbox/retired: ClusterQueue retired-queue does not exist",
    )
    return policy


POLICY = load_policy()


# ---------------------------------------------------------------- editing reviews


def base(name: str) -> Review:
    """A captured review, from the capture when present, else from its golden copy."""
    source = CAPTURES / f"{CAPTURED[name]}-webhook-mutate-request.json"
    if source.is_file():
        captured: Review = jsonio.loads(source.read_bytes())["body"]
        return captured
    stored: Review = jsonio.loads((HERE / f"{name}.request.json").read_bytes())
    return stored


def derived(name: str, start: Review) -> Review:
    """``start`` with a uid of its own (deterministic, from the case name)."""
    out: Review = clone(start)
    out["request"]["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"tessera-golden/{name}"))
    return out


def obj(r: Review) -> dict[str, Any]:
    found: dict[str, Any] = r["request"]["object"]
    return found


def meta_map(target: dict[str, Any], key: str) -> dict[str, Any]:
    metadata = target.setdefault("metadata", {})
    found: dict[str, Any] = metadata.setdefault(key, {})
    return found


def namespace(r: Review, ns: str) -> None:
    r["request"]["namespace"] = ns
    obj(r)["metadata"]["namespace"] = ns


def job_template_spec(r: Review) -> dict[str, Any]:
    found: dict[str, Any] = obj(r)["spec"]["template"]["spec"]
    return found


def set_gpus(spec: dict[str, Any], gpus: str | None, milli: str | None = None) -> None:
    for container in spec["containers"]:
        resources = container.setdefault("resources", {})
        for part in ("limits", "requests"):
            if part not in resources:
                continue
            resources[part].pop(labels.GPU_RESOURCE, None)
            if gpus is not None:
                resources[part][labels.GPU_RESOURCE] = gpus
            if milli is not None:
                resources[part][labels.GPU_MILLI_RESOURCE] = milli
            if not resources[part]:
                del resources[part]


def decide(body: bytes) -> ReviewOutcome:
    return review(body, POLICY, CONFIG, OWNERS)


def reinvoked(name: str, first: Review) -> Review:
    """``first`` as kube-apiserver sends it again after applying the webhook's patch."""
    answer = decide(jsonio.dumps(first))
    assert answer.patch, f"{name}: the first pass must change something"
    again: Review = clone(first)
    again["request"]["object"] = apply_patch(obj(first), answer.patch)
    return again


# ---------------------------------------------------------------- Job cases


def job(name: str, edit: Callable[[Review], None] | None = None) -> Review:
    r = derived(name, base("job-capture"))
    if edit is not None:
        edit(r)
    return r


def _no_queue(r: Review) -> None:
    del obj(r)["metadata"]["labels"][labels.QUEUE_NAME]


def _queue(value: str) -> Callable[[Review], None]:
    return lambda r: meta_map(obj(r), "labels").__setitem__(labels.QUEUE_NAME, value)


def _label(key: str, value: str) -> Callable[[Review], None]:
    return lambda r: meta_map(obj(r), "labels").__setitem__(key, value)


def _annotate(key: str, value: str) -> Callable[[Review], None]:
    return lambda r: meta_map(obj(r), "annotations").__setitem__(key, value)


def _job_spec(key: str, value: Any) -> Callable[[Review], None]:
    return lambda r: obj(r)["spec"].__setitem__(key, value)


def _template(key: str, value: Any) -> Callable[[Review], None]:
    return lambda r: job_template_spec(r).__setitem__(key, value)


def _both(*edits: Callable[[Review], None]) -> Callable[[Review], None]:
    def edit(r: Review) -> None:
        for one in edits:
            one(r)

    return edit


def _in(ns: str, *edits: Callable[[Review], None]) -> Callable[[Review], None]:
    return _both(lambda r: namespace(r, ns), *edits)


def _parallel(pods: int, gpus: str) -> Callable[[Review], None]:
    def edit(r: Review) -> None:
        obj(r)["spec"]["parallelism"] = pods
        obj(r)["spec"]["completions"] = pods
        set_gpus(job_template_spec(r), gpus)

    return edit


def _named(r: Review) -> None:
    del obj(r)["metadata"]["generateName"]
    obj(r)["metadata"]["name"] = "finetune-7"
    r["request"]["name"] = "finetune-7"


def _user_affinity(r: Review) -> None:
    spec = job_template_spec(r)
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone",
                                           "operator": "In", "values": ["zone-a"]}]},
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone",
                                           "operator": "In", "values": ["zone-b"]}]},
                ]
            }
        }
    }  # fmt: skip
    spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "ml",
                            "effect": "NoSchedule"}]  # fmt: skip


def _owned_by_jobset(r: Review) -> None:
    _named(r)
    obj(r)["metadata"]["ownerReferences"] = [
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "pretrain",
         "uid": "0b8f7f4e-5a8e-4a70-a1b4-3e6c1d9a2f10", "controller": True,
         "blockOwnerDeletion": True}
    ]  # fmt: skip
    meta_map(obj(r), "labels")[labels.JOBSET_NAME] = "pretrain"
    r["request"]["userInfo"] = {"username": JOBSET_CONTROLLER_USERNAMES[0]}


def _forged_owner(api_version: str, kind: str, **extra: Any) -> Callable[[Review], None]:
    """An ownerReference the sender wrote: a made-up owner ``x`` with uid ``0``."""

    def edit(r: Review) -> None:
        ref = {"apiVersion": api_version, "kind": kind, "name": "x", "uid": "0", **extra}
        obj(r)["metadata"]["ownerReferences"] = [ref]
        r["request"]["userInfo"] = {"username": FORGER}

    return edit


def _sent_by(username: str) -> Callable[[Review], None]:
    return lambda r: r["request"]["userInfo"].__setitem__("username", username)


def update_case(name: str, edit: Callable[[Review], None] | None = None) -> Review:
    r = derived(name, base("job-update-unsuspend"))
    if edit is not None:
        edit(r)
    return r


def _move_queue_while_running(r: Review) -> None:
    meta_map(obj(r), "labels")[labels.QUEUE_NAME] = "default"


def _change_gang(r: Review) -> None:
    for target, gang_min in ((r["request"]["oldObject"], "2"), (obj(r), "1")):
        template_meta = target["spec"]["template"]["metadata"]
        template_meta["labels"][labels.GANG] = "team-nlp.finetune-4nlzs"
        template_meta["annotations"] = {labels.GANG_SIZE: "2", labels.GANG_MIN: gang_min}


# ---------------------------------------------------------------- JobSet cases


def jobset(name: str, edit: Callable[[Review], None] | None = None) -> Review:
    """The captured Job's request, carrying a JobSet: 2 replicas of 2 workers of 4
    GPUs, and a CPU-only driver."""
    r = derived(name, base("job-capture"))
    request = r["request"]
    gvk = {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"}
    gvr = {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"}
    request.update(kind=gvk, requestKind=gvk, resource=gvr, requestResource=gvr, name="pretrain")
    pod_spec = clone(obj(r)["spec"]["template"]["spec"])
    driver_spec = clone(pod_spec)
    driver_spec["containers"][0].update(name="driver", resources={"limits": {"cpu": "2"}})
    request["object"] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "pretrain",
            "namespace": "team-nlp",
            "labels": {labels.QUEUE_NAME: "team-nlp-queue"},
        },
        "spec": {
            "replicatedJobs": [
                {"name": "workers", "replicas": 2,
                 "template": {"spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                                       "template": {"spec": pod_spec}}}},
                {"name": "driver", "replicas": 1,
                 "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                                       "template": {"spec": driver_spec}}}},
            ],
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["driver"]},
        },
    }  # fmt: skip
    if edit is not None:
        edit(r)
    return r


def _workers(r: Review) -> dict[str, Any]:
    found: dict[str, Any] = obj(r)["spec"]["replicatedJobs"][0]
    return found


def _workers_replicas(count: int) -> Callable[[Review], None]:
    return lambda r: _workers(r).__setitem__("replicas", count)


def _workers_job_spec(key: str, value: Any) -> Callable[[Review], None]:
    return lambda r: _workers(r)["template"]["spec"].__setitem__(key, value)


def _workers_pod_spec(key: str, value: Any) -> Callable[[Review], None]:
    return lambda r: _workers(r)["template"]["spec"]["template"]["spec"].__setitem__(key, value)


def _jobset_running_and_moved(r: Review) -> None:
    r["request"]["operation"] = "UPDATE"
    r["request"]["options"] = {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
    old = clone(obj(r))
    old["spec"]["suspend"] = False
    r["request"]["oldObject"] = old
    obj(r)["spec"]["suspend"] = False
    meta_map(obj(r), "labels")[labels.QUEUE_NAME] = "default"


# ---------------------------------------------------------------- Pod cases


def pod(name: str, edit: Callable[[Review], None] | None = None) -> Review:
    r = derived(name, base("pod-notebook"))
    if edit is not None:
        edit(r)
    return r


def _pod_spec(key: str, value: Any) -> Callable[[Review], None]:
    return lambda r: obj(r)["spec"].__setitem__(key, value)


def _pod_gpus(gpus: str | None, milli: str | None = None) -> Callable[[Review], None]:
    return lambda r: set_gpus(obj(r)["spec"], gpus, milli)


def _pod_running_and_moved(r: Review) -> None:
    r["request"]["operation"] = "UPDATE"
    r["request"]["options"] = {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
    meta_map(obj(r), "labels")[labels.QUEUE_NAME] = "team-nlp-queue"
    old = clone(obj(r))
    old["spec"]["nodeName"] = obj(r)["spec"]["nodeName"] = "gpu-node-1"
    r["request"]["oldObject"] = old
    meta_map(obj(r), "labels")[labels.QUEUE_NAME] = "default"


# ---------------------------------------------------------------- malformed bodies


def raw(text: str) -> Review:
    return {"rawBody": text}


def _bad_api_version(r: Review) -> None:
    r["apiVersion"] = "admission.k8s.io/v1beta1"


def _bad_uid(r: Review) -> None:
    del r["request"]["uid"]


def _bad_object_kind(r: Review) -> None:
    r["request"]["object"] = clone(obj(base("pod-notebook")))


def _bad_no_object(r: Review) -> None:
    r["request"]["object"] = None


# ---------------------------------------------------------------- the cases


def build_cases() -> dict[str, Review]:  # noqa: PLR0915 - one line per case
    cases: dict[str, Review] = {name: base(name) for name in CAPTURED}
    add = cases.__setitem__
    # Job: every rule allowing and denying, starting from the captured Job.
    add("job-dry-run", job("job-dry-run", lambda r: r["request"].__setitem__("dryRun", True)))
    add("job-no-gpu", job("job-no-gpu", lambda r: set_gpus(job_template_spec(r), None)))
    add("job-queue-default", job("job-queue-default", _no_queue))
    add("job-queue-unknown", job("job-queue-unknown", _queue("team-nlp-q")))
    add(
        "job-queue-unknown-long",
        job("job-queue-unknown-long", _queue("team-nlp-" + "q" * 291)),
    )
    add("job-queue-orphaned", job("job-queue-orphaned", _in("team-sandbox", _queue("retired"))))
    add(
        "job-queue-missing-managed",
        job("job-queue-missing-managed", _in("team-sandbox", _no_queue)),
    )
    add(
        "job-queue-missing-unmanaged",
        job("job-queue-missing-unmanaged", _in("team-free", _no_queue)),
    )
    add("job-suspend", job("job-suspend", _job_spec("suspend", False)))
    add(
        "job-priority-named", job("job-priority-named", _label(labels.PRIORITY_CLASS, "batch-high"))
    )
    add(
        "job-priority-unknown", job("job-priority-unknown", _label(labels.PRIORITY_CLASS, "urgent"))
    )
    add("job-flavor-a100", job("job-flavor-a100", _annotate(labels.GPU_PRODUCT, "A100")))
    add("job-flavor-user-affinity", job("job-flavor-user-affinity", _user_affinity))
    add(
        "job-flavor-unavailable",
        job("job-flavor-unavailable", _annotate(labels.GPU_PRODUCT, "B200")),
    )
    add("job-quota-fits", job("job-quota-fits", _parallel(3, "8")))
    add("job-quota-over", job("job-quota-over", _parallel(5, "8")))
    add(
        "job-quota-max-gpus",
        job("job-quota-max-gpus", _in("team-cv", _queue("vision"), _parallel(4, "8"))),
    )
    add(
        "job-rquota-below-nominal",
        job("job-rquota-below-nominal", _in("team-quota", _queue("team-quota-queue"))),
    )
    add(
        "job-rquota-over",
        job(
            "job-rquota-over",
            _in("team-quota", _queue("team-quota-queue"), _parallel(3, "8")),
        ),
    )
    add("job-gang-min", job("job-gang-min", _annotate(labels.GANG_MIN, "1")))
    add("job-gang-min-invalid", job("job-gang-min-invalid", _annotate(labels.GANG_MIN, "3")))
    add("job-gang-named", job("job-gang-named", _named))
    add("job-topology", job("job-topology", _annotate(labels.TOPOLOGY, "required:rack")))
    add(
        "job-topology-unknown-level",
        job("job-topology-unknown-level", _annotate(labels.TOPOLOGY, "required:zone")),
    )
    add("job-topology-malformed", job("job-topology-malformed", _annotate(labels.TOPOLOGY, "rack")))
    add("job-time-limit-own", job("job-time-limit-own", _job_spec("activeDeadlineSeconds", 3600)))
    add(
        "job-time-limit-over",
        job("job-time-limit-over", _job_spec("activeDeadlineSeconds", 172800)),
    )
    add(
        "job-scheduler-default",
        job("job-scheduler-default", _template("schedulerName", "default-scheduler")),
    )
    add("job-scheduler-custom", job("job-scheduler-custom", _template("schedulerName", "volcano")))
    add("job-invalid", job("job-invalid", lambda r: set_gpus(job_template_spec(r), "1.5")))
    add("job-owned-by-jobset", job("job-owned-by-jobset", _owned_by_jobset))
    # Issue 20: an ownerReference anyone can write no longer skips every rule.
    add(
        "job-quota-over-forged-owner",
        job(
            "job-quota-over-forged-owner",
            _both(_parallel(5, "8"), _forged_owner("jobset.x-k8s.io/v1alpha2", "JobSet")),
        ),
    )
    add(
        "job-update-queue-change-forged-owner",
        update_case(
            "job-update-queue-change-forged-owner",
            _both(
                _move_queue_while_running,
                _forged_owner("batch/v1", "Job", controller=True),
            ),
        ),
    )
    add("job-reinvoked", reinvoked("job-reinvoked", job("job-reinvoked")))
    add(
        "job-update-queue-change-running",
        update_case("job-update-queue-change-running", _move_queue_while_running),
    )
    add("job-update-gang-change", update_case("job-update-gang-change", _change_gang))
    # JobSet
    add("jobset-create", jobset("jobset-create"))
    add("jobset-reinvoked", reinvoked("jobset-reinvoked", jobset("jobset-reinvoked")))
    add("jobset-queue-default", jobset("jobset-queue-default", _in("team-cv", _no_queue)))
    add("jobset-queue-unknown", jobset("jobset-queue-unknown", _queue("research")))
    add(
        "jobset-priority-unknown",
        jobset("jobset-priority-unknown", _label(labels.PRIORITY_CLASS, "urgent")),
    )
    add(
        "jobset-flavor-a100",
        jobset(
            "jobset-flavor-a100",
            _both(_annotate(labels.GPU_PRODUCT, "nvidia-a100"), _workers_replicas(1)),
        ),
    )
    add(
        "jobset-flavor-unavailable",
        jobset("jobset-flavor-unavailable", _annotate(labels.GPU_PRODUCT, "H200")),
    )
    add("jobset-quota-over", jobset("jobset-quota-over", _workers_replicas(4)))
    add("jobset-gang-min", jobset("jobset-gang-min", _annotate(labels.GANG_MIN, "4")))
    add(
        "jobset-gang-min-invalid",
        jobset("jobset-gang-min-invalid", _annotate(labels.GANG_MIN, "0")),
    )
    add(
        "jobset-topology",
        jobset("jobset-topology", _annotate(labels.TOPOLOGY, "preferred:example.com/block")),
    )
    add(
        "jobset-topology-unknown-level",
        jobset("jobset-topology-unknown-level", _annotate(labels.TOPOLOGY, "required:row")),
    )
    add(
        "jobset-time-limit-over",
        jobset("jobset-time-limit-over", _workers_job_spec("activeDeadlineSeconds", 90000)),
    )
    add(
        "jobset-scheduler-custom",
        jobset("jobset-scheduler-custom", _workers_pod_spec("schedulerName", "volcano")),
    )
    add(
        "jobset-update-queue-change-running",
        jobset("jobset-update-queue-change-running", _jobset_running_and_moved),
    )
    # Pod
    add("pod-reinvoked", reinvoked("pod-reinvoked", pod("pod-reinvoked")))
    add(
        "pod-forged-owner-64-gpus",
        pod(
            "pod-forged-owner-64-gpus",
            _both(_pod_gpus("64"), _forged_owner("batch/v1", "Job", controller=True)),
        ),
    )
    add(
        "pod-owned-by-job-wrong-sender",
        derived("pod-owned-by-job-wrong-sender", base("pod-owned-by-job")),
    )
    _sent_by(FORGER)(cases["pod-owned-by-job-wrong-sender"])
    add("pod-queue-named", pod("pod-queue-named", _queue("team-nlp-queue")))
    add("pod-queue-unknown", pod("pod-queue-unknown", _queue("notebooks")))
    add(
        "pod-queue-missing-managed",
        pod("pod-queue-missing-managed", lambda r: namespace(r, "team-sandbox")),
    )
    add(
        "pod-priority-unknown",
        pod("pod-priority-unknown", _label(labels.PRIORITY_CLASS, "interactive")),
    )
    add(
        "pod-flavor-unavailable", pod("pod-flavor-unavailable", _annotate(labels.GPU_PRODUCT, "L4"))
    )
    add(
        "pod-share",
        pod("pod-share", _in("team-sandbox", _queue("sandbox"), _pod_gpus(None, "500"))),
    )
    add(
        "pod-quota-over",
        pod("pod-quota-over", _in("team-sandbox", _queue("sandbox"), _pod_gpus("4"))),
    )
    add("pod-gang-min-invalid", pod("pod-gang-min-invalid", _annotate(labels.GANG_MIN, "2")))
    add("pod-topology", pod("pod-topology", _annotate(labels.TOPOLOGY, "required:hostname")))
    add(
        "pod-topology-unknown-level",
        pod("pod-topology-unknown-level", _annotate(labels.TOPOLOGY, "preferred:zone")),
    )
    add(
        "pod-time-limit-over", pod("pod-time-limit-over", _pod_spec("activeDeadlineSeconds", 90000))
    )
    add(
        "pod-scheduler-default",
        pod("pod-scheduler-default", _pod_spec("schedulerName", "default-scheduler")),
    )
    add(
        "pod-update-queue-change-admitted",
        pod("pod-update-queue-change-admitted", _pod_running_and_moved),
    )
    # Bodies that are not usable reviews: HTTP 400
    add("bad-not-json", raw('{"kind": "AdmissionReview", '))
    add("bad-api-version", job("bad-api-version", _bad_api_version))
    add("bad-missing-uid", job("bad-missing-uid", _bad_uid))
    add("bad-object-kind", job("bad-object-kind", _bad_object_kind))
    add("bad-missing-object", job("bad-missing-object", _bad_no_object))
    return cases


CASES = build_cases()


# ---------------------------------------------------------------- running a case


def body_of(request: Review) -> bytes:
    if set(request) == {"rawBody"}:
        return str(request["rawBody"]).encode()
    return jsonio.dumps(request)


def answer(request: Review) -> dict[str, Any]:
    outcome = decide(body_of(request))
    result: dict[str, Any] = {"httpStatus": outcome.status, "body": jsonio.loads(outcome.body)}
    response = result["body"].get("response") or {}
    if "patch" in response:
        result["patchDecoded"] = jsonio.loads(base64.b64decode(response["patch"]))
    return result


def pretty(value: Any) -> bytes:
    """Indented JSON in the value's own key order: a request file must keep the order the
    API server sent, because the order of patch operations follows it."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"


def _write_or_compare(path: Path, value: Any) -> None:
    text = pretty(value)
    if UPDATE:
        path.write_bytes(text)
        return
    assert path.is_file(), f"{path.name} is missing: run with TESSERA_UPDATE_GOLDENS=1"
    assert path.read_bytes() == text, (
        f"{path.name} differs; if the change is intended, regenerate with "
        "TESSERA_UPDATE_GOLDENS=1 and review the diff"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_exchange(case: str) -> None:
    request = CASES[case]
    _write_or_compare(HERE / f"{case}.request.json", request)
    _write_or_compare(HERE / f"{case}.response.json", answer(request))


@pytest.mark.parametrize("case", sorted(CASES))
def test_applying_the_patch_then_reviewing_again_changes_nothing(case: str) -> None:
    request = CASES[case]
    result = answer(request)
    if "patchDecoded" not in result:
        return
    again = clone(request)
    again["request"]["object"] = apply_patch(obj(request), result["patchDecoded"])
    second = answer(again)
    assert second["httpStatus"] == 200
    assert second["body"]["response"]["allowed"] is True
    assert "patchDecoded" not in second


def test_every_golden_file_belongs_to_a_case() -> None:
    names = {p.name.split(".")[0] for p in HERE.glob("*.json")}
    assert names <= set(CASES), f"stray golden files: {sorted(names - set(CASES))}"


def test_the_cases_cover_every_rule_for_every_kind() -> None:
    """Each of Job, JobSet and Pod is shown admitted and denied by the rules that deny."""
    seen: set[tuple[str, str]] = set()
    for request in CASES.values():
        if set(request) == {"rawBody"} or request.get("request") is None:
            continue
        outcome = decide(body_of(request))
        if outcome.decision in ("mutated", "denied"):
            seen.add((outcome.kind, outcome.reason))
    for kind in ("Job", "JobSet", "Pod"):
        assert (kind, "admitted") in seen
        for rule in (
            "queue",
            "priority",
            "flavor",
            "quota",
            "gang",
            "topology",
            "time-limit",
            "update",
        ):
            assert (kind, rule) in seen, (kind, rule)  # fmt: skip
