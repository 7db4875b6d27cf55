"""Namespace ResourceQuotas that fight Kueue: named by ``tessera queues``, ``capacity``
and ``why`` with their numbers."""

from __future__ import annotations

from typing import Any

import pytest

from console.queues import read_workloads
from console.rquota import conflicts, job_refusals, read_limits
from tests.builders import cq_obj, lq_obj, workload_obj
from webhook.policy_build import policy_from_objects


def rq(hard: dict[str, Any], used: dict[str, Any] | None = None, ns: str = "team-nlp") -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": ns},
        "spec": {"hard": hard},
        "status": {"hard": hard, "used": used or {}},
    }


POLICY = policy_from_objects(
    [cq_obj("nlp", {"h100": {"nvidia.com/gpu": (24,)}}), lq_obj("team-nlp", "training", "nlp")]
)
BELOW = (
    "ResourceQuota team-nlp/gpus allows 16 GPUs (requests.nvidia.com/gpu), below "
    "ClusterQueue nlp's nominal 24 that namespace team-nlp queues to: Kueue can admit jobs "
    "whose pods it refuses"
)
NEVER = (
    "workload team-nlp/w asks 32 GPUs, more than ResourceQuota team-nlp/gpus allows (16): its "
    "pods can never all be created"
)


@pytest.mark.parametrize(
    ("quota", "workload", "expected"),
    [
        (rq({"requests.nvidia.com/gpu": "32"}), workload_obj("w", gpus=8), []),
        (rq({"requests.nvidia.com/gpu": "16"}), workload_obj("w", gpus=8), [BELOW]),
        (rq({"requests.nvidia.com/gpu": "16"}), workload_obj("w", gpus=8, count=4), [BELOW, NEVER]),
        # another namespace's quota, a quota on CPU only, an unreadable one: nothing
        (rq({"requests.nvidia.com/gpu": "1"}, ns="other"), workload_obj("w", gpus=8), []),
        (rq({"requests.cpu": "1"}), workload_obj("w", gpus=8), []),
        (rq({"requests.nvidia.com/gpu": "lots"}), workload_obj("w", gpus=8), []),
        (
            rq({"pods": "2"}),
            workload_obj("w", gpus=1, count=3),
            [
                "workload team-nlp/w asks 3 pods, more than ResourceQuota team-nlp/gpus "
                "allows (2): its pods can never all be created"
            ],
        ),
    ],
)
def test_quotas_that_kueue_cannot_see_are_named(
    quota: Any, workload: Any, expected: list[str]
) -> None:
    workloads, _ = read_workloads([workload], POLICY)
    assert list(conflicts(read_limits([quota]), POLICY, workloads)) == expected


@pytest.mark.parametrize(
    ("used", "pods_found", "expected"),
    [
        ("20", 2, ["20 of 24 GPUs used (requests.nvidia.com/gpu), 8 more needed"]),
        # room for the one pod missing
        ("16", 2, []),
        ("24", 3, []),
    ],
)
def test_an_admitted_job_missing_pods_names_the_quota_that_refuses_them(
    used: str, pods_found: int, expected: list[str]
) -> None:
    admitted = workload_obj(
        "w", gpus=8, count=3, admitted_at="2026-01-01T01:00:00Z", cluster_queue="nlp"
    )
    ((mine,), _) = read_workloads([admitted], POLICY)
    limits = read_limits([rq({"requests.nvidia.com/gpu": "24"}, {"requests.nvidia.com/gpu": used})])
    found = job_refusals(limits, mine, pods_found)
    assert [f.split(": ", 1)[1].split(": the job")[0] for f in found] == expected
