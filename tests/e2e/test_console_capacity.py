"""``tessera capacity`` against the real API server and the real Kueue: the e2e suite's
flavors counted from the nodes kube-apiserver holds, and a job Kueue keeps waiting for
quota said to need quota, not hardware.

Runs the console as an operator does (``python -m console`` with the admin's kubeconfig).
Nothing here admits anything: Kueue admits the first job and keeps the second waiting.
"""

from __future__ import annotations

from typing import Any, Final

import pytest

from cluster import jsonio
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import CAPACITY
from loadtest.stack.jobs import gpu_job
from loadtest.stack.placements import true_condition
from tests.e2e.test_console import tessera

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RESERVED: Final = "e2e-h100-reserved"
TRAINING: Final = "e2e-training"


def capacity(e2e: E2ECluster) -> dict[str, Any]:
    shown: dict[str, Any] = jsonio.loads(tessera(e2e, "capacity", "-o", "json").stdout)
    return shown


def test_capacity_counts_the_flavors_gpus_and_says_a_job_over_quota_needs_quota(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    before = capacity(e2e)
    flavors = {f["flavor"]: f for f in before["flavors"]}
    # the reserved flavor's nodes, as the fleet made them through the API
    reserved = [
        n for n in e2e.fleet.values() if n.extra_labels.get(CAPACITY, "reserved") == "reserved"
    ]
    assert flavors[RESERVED]["nodes"] == len(reserved)
    assert flavors[RESERVED]["gpus_total"] == sum(n.gpus for n in reserved)
    assert flavors[RESERVED]["gpus_nominal"] == 32 + 16  # e2e-training's and e2e-lender's

    # e2e-training holds 32 reserved GPUs (and may borrow 8): one 32-GPU job is admitted,
    # the second waits for quota however many GPUs are free
    e2e.create_stored(gpu_job("cap-first", pods=4, gpus=8))
    e2e.wait_admitted("cap-first")
    e2e.create_stored(gpu_job("cap-second", pods=4, gpus=8))

    def pending() -> dict[str, Any] | None:
        workload = e2e.workload("cap-second") or {}
        reserved_quota = true_condition(workload, "QuotaReserved")
        conditions = workload.get("status", {}).get("conditions", [])
        waiting = any(c.get("type") == "QuotaReserved" for c in conditions)
        return workload if waiting and reserved_quota is None else None

    workload = e2e.api.wait("Kueue to keep cap-second waiting for quota", pending, timeout=30)
    shown = capacity(e2e)
    waiting = {w["name"]: w for w in shown["waiting"]}  # by Workload, as Kueue names them
    second = waiting[workload["metadata"]["name"]]
    assert (second["cluster_queue"], second["admitted"], second["gpus"]) == (TRAINING, False, 32)
    assert second["blocked_by"] == "quota", second
    training = {q["name"]: q for q in shown["cluster_queues"]}[TRAINING]
    used = {f["flavor"]: f["gpus_used"] for f in training["flavors"]}
    assert sum(used.values()) >= 32, training
    assert training["gpus_blocked_by_quota"] >= 32
    first = e2e.workload("cap-first") or {}
    assert waiting.get(first["metadata"]["name"], {"admitted": True})["admitted"]
