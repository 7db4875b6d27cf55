"""Scenarios 1 and 2: what kube-apiserver stores, or refuses, once the webhook is installed.

Each job goes in through ``kubectl create -f -`` and is read back with ``kubectl get``, so
the assertions are what a user sees: the stored object, kubectl's warnings, and kubectl's
error text for a denial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from cluster import jsonio, labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.jobs import NAMESPACE, QUEUE, gpu_job, to_yaml

pytestmark = pytest.mark.e2e

PRODUCT = "NVIDIA-H100-80GB-HBM3"
DEFAULT_TIME_LIMIT = 7200  # e2e-training's tessera.dev/default-time-limit: 2h


def _term(capacity: str) -> frozenset[tuple[str, str, tuple[str, ...]]]:
    return frozenset(
        {
            (labels.GFD_PRODUCT, "In", (PRODUCT,)),
            ("example.com/capacity", "In", (capacity,)),
        }
    )


def _terms(spec: dict[str, Any]) -> set[frozenset[tuple[str, str, tuple[str, ...]]]]:
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {
        frozenset(
            (e["key"], e["operator"], tuple(e.get("values") or ()))
            for e in term["matchExpressions"]
        )
        for term in required["nodeSelectorTerms"]
    }


def test_a_queued_job_is_stored_suspended_with_what_its_queue_implies(e2e: E2ECluster) -> None:
    job = gpu_job("finetune-llama", pods=4, gpus=4, annotations={labels.TOPOLOGY: "required:rack"})

    # -o json prints the object as it was stored: Kueue admits (and unsuspends) it within
    # a second, so a later `kubectl get` would race Kueue
    created = e2e.kubectl("create", "-f", "-", "-o", "json", stdin=to_yaml(job), check=False)

    assert created.returncode == 0, created.stderr
    # kubectl prints the webhook's warnings: the user learns what was added for them
    assert "Warning: priority class set to e2e-research" in created.stderr
    assert "Warning: activeDeadlineSeconds set to 7200" in created.stderr
    stored = jsonio.loads(created.stdout)
    assert stored["metadata"]["name"] == "finetune-llama"
    meta, spec = stored["metadata"], stored["spec"]
    template_meta, pod = spec["template"]["metadata"], spec["template"]["spec"]
    assert spec["suspend"] is True
    assert meta["labels"][labels.QUEUE_NAME] == QUEUE
    assert meta["labels"][labels.PRIORITY_CLASS] == "e2e-research"
    # either H100 flavor of the queue: reserved, or spot (whose taint is tolerated)
    assert _terms(pod) == {_term("reserved"), _term("spot")}
    assert {
        "key": "example.com/spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    assert template_meta["labels"][labels.GANG] == f"{NAMESPACE}.finetune-llama"
    assert template_meta["annotations"][labels.GANG_SIZE] == "4"
    assert template_meta["annotations"][labels.GANG_MIN] == "4"
    assert template_meta["annotations"][labels.TOPOLOGY] == "required:rack"
    assert spec["activeDeadlineSeconds"] == DEFAULT_TIME_LIMIT
    assert pod["activeDeadlineSeconds"] == DEFAULT_TIME_LIMIT
    assert pod["schedulerName"] == labels.DEFAULT_SCHEDULER_NAME
    # what the user wrote is still there
    assert pod["containers"][0]["resources"]["limits"][labels.GPU_RESOURCE] == "4"


FORBIDDEN = 'Error from server (Forbidden): error when creating "STDIN": '
INVALID = 'The request is invalid: error when creating "STDIN": '


@dataclass(frozen=True, slots=True)
class Refusal:
    job: dict[str, Any]
    kubectl: str
    """How kubectl opens the error: the webhook's 403 or 422, as the user sees it."""
    says: tuple[str, ...]
    """Fragments of the webhook's message, in order."""


def owned_by(job: dict[str, Any], **reference: Any) -> dict[str, Any]:
    """``job`` naming an owner its creator made up (issue 20): a JobSet ``x``, uid ``0``."""
    job["metadata"]["ownerReferences"] = [
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "x", "uid": "0",
         **reference}
    ]  # fmt: skip
    return job


OVER_QUOTA = (
    "asks for 48 GPUs (6 pods × 8)",  # noqa: RUF001 - as the webhook says
    "can get at most 40 GPUs in flavor e2e-h100-reserved",
)

REFUSALS = {
    "unknown queue": Refusal(
        gpu_job("typo-queue", gpus=1, queue="trainng"),
        FORBIDDEN,
        (
            f"LocalQueue 'trainng' (label {labels.QUEUE_NAME}) does not exist in namespace "
            f"{NAMESPACE}",
            f"queues in namespace {NAMESPACE}: lender, tas, {QUEUE}",
        ),
    ),
    "over quota": Refusal(
        gpu_job("too-big", pods=6, gpus=8),
        FORBIDDEN,
        (
            "job too-big asks for 48 GPUs (6 pods × 8)",  # noqa: RUF001 - as the webhook says
            "can get at most 40 GPUs in flavor e2e-h100-reserved",
        ),
    ),
    # Issue 20: a forged owner used to skip every rule (and the webhook call itself).
    "over quota with a forged owner": Refusal(
        owned_by(gpu_job("forged-owner", pods=6, gpus=8)), FORBIDDEN, OVER_QUOTA
    ),
    "impossible gang": Refusal(
        gpu_job("gang-min-too-high", pods=4, gpus=4, annotations={labels.GANG_MIN: "5"}),
        INVALID,
        (
            f"annotation {labels.GANG_MIN}='5' must be a whole number from 1 to the 4 pods "
            "of job gang-min-too-high",
        ),
    ),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_jobs_that_can_never_run_are_refused_with_tesseras_message(
    e2e: E2ECluster, case: Refusal
) -> None:
    name = case.job["metadata"]["name"]

    created = e2e.create(to_yaml(case.job))

    assert created.returncode != 0
    prefixes = [
        f'{case.kubectl}admission webhook "{w}" denied the request: '
        for w in e2e.install.webhook_names
    ]
    prefix = next((p for p in prefixes if created.stderr.startswith(p)), None)
    assert prefix is not None, f"{created.stderr!r} does not start with one of {prefixes}"
    message = created.stderr.removeprefix(prefix)
    position = 0
    for fragment in case.says:
        found = message.find(fragment, position)
        assert found >= 0, f"{fragment!r} not in {message!r}"
        position = found + len(fragment)
    missing = e2e.kubectl("get", "job", name, "-n", NAMESPACE, check=False)
    assert "NotFound" in missing.stderr


def _jobset(name: str) -> dict[str, Any]:
    """A JobSet of one CPU-only Job, as a user would create it (the JobSet controller may
    run it; the scenario needs only that it exists)."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {labels.QUEUE_NAME: QUEUE}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "driver",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "driver", "image": "busybox"}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }


def test_a_job_claiming_a_real_jobset_as_controller_is_judged_unless_the_controller_sent_it(
    e2e: E2ECluster,
) -> None:
    # Issue 20: anyone who can read a JobSet in their namespace knows its uid. With the
    # owner real and the uid right, only the sender tells a forged child from the JobSet
    # controller's own: the Job is judged as a workload of its own, and is over quota.
    made = e2e.kubectl("create", "-f", "-", "-o", "json", stdin=to_yaml(_jobset("real-set")))
    jobset = jsonio.loads(made.stdout)
    try:
        job = gpu_job("forged-child", pods=6, gpus=8)
        job["metadata"]["ownerReferences"] = [
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "real-set",
             "uid": jobset["metadata"]["uid"], "controller": True}
        ]  # fmt: skip

        created = e2e.create(to_yaml(job))

        assert created.returncode != 0
        assert created.stderr.startswith(FORBIDDEN), created.stderr
        assert "gpu-workloads.tessera.dev" in created.stderr
        for fragment in OVER_QUOTA:
            assert fragment in created.stderr
    finally:
        e2e.kubectl("delete", "jobset", "real-set", "-n", NAMESPACE, "--wait=false")
