"""Rule 5b: a namespace's ResourceQuota still applies after Kueue admits a job. A user
whose job its namespace could never hold is told at submit, with the numbers and what
to change; a quota below the queue's nominal is a warning. A quota change is a new
policy, so no answer kept before it is given after it."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from cluster import jsonio
from cluster.clock import ManualClock
from tests.builders import cq_obj, flavor_obj, lq_obj
from tests.unit.test_webhook_answers import _body
from tests.unit.test_webhook_rules import CONFIG, POLICY, X, job, jobset, pod, request
from webhook.admit import admit
from webhook.namespace_quota import quota_limits
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy
from webhook.review_flow import review
from webhook.rules.outcome import Allowed, Denied
from webhook.source import PolicyStore

GPUS = "requests.nvidia.com/gpu"


def rquota(
    hard: dict[str, str], ns: str = "team", name: str = "gpus", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"hard": hard, **spec},
    }


def with_quotas(*objs: dict[str, Any]) -> Policy:
    """The rules' test policy (research: nominal 16 + 8 + 8 = 32 GPUs) with ``objs``."""
    grouped: dict[str, tuple[Any, ...]] = {}
    for obj in objs:
        for limit in quota_limits(obj):
            grouped[limit.namespace] = (*grouped.get(limit.namespace, ()), limit)
    return replace(POLICY, namespace_quotas=MappingProxyType(grouped))


BELOW = (
    "ResourceQuota team/gpus allows 16 GPUs (requests.nvidia.com/gpu), below the nominal "
    "32 GPUs of ClusterQueue research that queue research sends jobs to: Kueue may admit "
    "jobs of this namespace whose pods the quota then refuses; have an admin raise the "
    "quota to 32 or lower the ClusterQueue's nominal"
)


@pytest.mark.parametrize(
    ("obj", "quotas", "expected"),
    [
        (job(), (), None),
        (job(), (rquota({GPUS: "40"}),), None),
        (job(), (rquota({GPUS: "16"}),), BELOW),
        (job(), (rquota({GPUS: "8"}, ns="lab"),), None),
        (job(gpus=None, milli=500), (rquota({GPUS: "16"}),), BELOW),
        (job(), (rquota({"pods": "2"}),), None),
        (job(), (rquota({GPUS: "6"}, scopes=["BestEffort"]),),
         BELOW.replace("allows 16", "allows 6").replace("to 32", "to 32")),
    ],
    ids=["no-quota", "quota-above-nominal", "quota-below-nominal", "other-namespace",
         "shares-ask-no-gpus", "pods-fit", "scoped-quota-only-warns"],
)  # fmt: skip
def test_jobs_a_quota_can_hold_are_admitted_with_a_warning_below_nominal(
    obj: dict[str, Any], quotas: tuple[dict[str, Any], ...], expected: str | None
) -> None:
    decision = admit(request(obj), with_quotas(*quotas), CONFIG)
    assert isinstance(decision, Allowed), decision
    notes = [w for w in decision.warnings if "ResourceQuota" in w]
    assert notes == ([] if expected is None else [expected])


@pytest.mark.parametrize(
    ("obj", "quota", "expected"),
    [
        (job(gpus=4, parallelism=2), rquota({GPUS: "6"}),
         f"job train asks for 8 GPUs (2 pods {X} 4); ResourceQuota team/gpus allows "
         "at most 6 GPUs (requests.nvidia.com/gpu) in namespace team, so its pods could never "
         "all be created after Kueue admits it; ask for at most 6 GPUs, or "
         "have an admin raise the quota's hard requests.nvidia.com/gpu to 8"),
        (job(gpus=4, parallelism=3), rquota({"pods": "2"}, name="pods"),
         "job train asks for 3 pods; ResourceQuota team/pods allows at most 2 pods "
         "(pods) in namespace team, so its pods could never all be created after Kueue "
         "admits it; ask for at most 2 pods, or have an admin raise the quota's "
         "hard pods to 3"),
        (jobset([("workers", 2, 2, 4)]), rquota({"nvidia.com/gpu": "15"}),
         f"jobset pretrain asks for 16 GPUs (workers: 4 pods {X} 4); ResourceQuota "
         "team/gpus allows at most 15 GPUs (nvidia.com/gpu) in namespace team, so its pods "
         "could never all be created after Kueue admits it; ask for at most "
         "15 GPUs, or have an admin raise the quota's hard nvidia.com/gpu to 16"),
        (pod(gpus=1), rquota({GPUS: "0"}),
          f"pod notebook asks for 1 GPU (1 pod {X} 1); ResourceQuota team/gpus allows at most "
         "0 GPUs (requests.nvidia.com/gpu) in namespace team, so its pods could never all be "
         "created after Kueue admits it; ask for at most 0 GPUs, or have an "
         "admin raise the quota's hard requests.nvidia.com/gpu to 1"),
    ],
    ids=["gpus", "pods", "jobset-bare-gpu-key", "pod"],
)  # fmt: skip
def test_a_job_its_namespace_quota_could_never_hold_is_denied_with_the_numbers(
    obj: dict[str, Any], quota: dict[str, Any], expected: str
) -> None:
    decision = admit(request(obj), with_quotas(quota), CONFIG)
    assert isinstance(decision, Denied), decision
    assert (decision.code, decision.reason, decision.queue) == (403, "resourcequota", "research")
    assert decision.message == expected


def test_the_queue_quota_is_judged_first() -> None:
    decision = admit(request(job(gpus=8, parallelism=5)), with_quotas(rquota({GPUS: "1"})), CONFIG)
    assert isinstance(decision, Denied)
    assert decision.reason == "quota"


def test_a_policy_file_reads_resource_quotas_and_ignores_what_they_do_not_limit() -> None:
    policy = policy_from_objects(
        [
            flavor_obj("h100"),
            cq_obj("cq", {"h100": {"nvidia.com/gpu": (8,)}}),
            lq_obj("ns", "q", "cq"),
            rquota({GPUS: "4", "cpu": "10", "pods": "bad"}, ns="ns"),
            rquota({"cpu": "10"}, ns="ns", name="cpu-only"),
        ]
    )
    assert policy.problems == ()
    assert [(q.quota, q.resource, q.hard) for q in policy.quotas_in("ns")] == [("gpus", GPUS, 4)]


def test_a_quota_added_after_an_answer_was_kept_is_applied_to_the_next_review() -> None:
    objs = [flavor_obj("h100"), cq_obj("cq", {"h100": {"nvidia.com/gpu": (32,)}}),
            lq_obj("ns", "q", "cq")]  # fmt: skip
    store = PolicyStore(ManualClock())
    store.load(objs)
    obj = job(gpus=4, parallelism=2, namespace="ns", queue="q")
    for uid in ("uid-1", "uid-2"):
        first = review(_body(obj, uid), store.current(), CONFIG)
    assert (first.decision, first.answer) == ("mutated", "kept")

    store.event("resourcequotas", "ADDED", rquota({GPUS: "6"}, ns="ns"))
    after = review(_body(obj, "uid-3"), store.current(), CONFIG)
    response = jsonio.loads(after.body)["response"]
    assert (after.decision, response["allowed"]) == ("denied", False)
    assert "ResourceQuota ns/gpus allows at most 6 GPUs" in response["status"]["message"]

    store.event("resourcequotas", "MODIFIED", rquota({GPUS: "16"}, ns="ns"))
    again = review(_body(obj, "uid-4"), store.current(), CONFIG)
    assert (again.decision, again.answer) == ("mutated", "computed")
    assert any("allows 16 GPUs" in w for w in jsonio.loads(again.body)["response"]["warnings"])
