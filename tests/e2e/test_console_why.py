"""``tessera why`` against the real stack: a job the scheduler cannot place is explained
with the reasons kube-scheduler's calls to the extender left (``GET /debug/reasons`` on
the extender's metrics listener), and a job waiting for quota with Kueue's own words.

Nothing here places, admits or refuses anything: Kueue admits, kube-scheduler calls the
extender's ``/filter``, the extender keeps its reasons; the scenarios read the console's
answer, in process while they wait for the stack to get there and as an operator runs
the command (``python -m console``) once it has.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from cluster.clock import SystemClock
from console.__main__ import build_parser, run
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import GANG_POOL, RECLAIM_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TRAINING_CQ = "e2e-training"


def why_args(e2e: E2ECluster, job: str) -> list[str]:
    return ["why", f"job/{job}", "-n", NAMESPACE, "--extender", e2e.extender_metrics, "-o", "json"]


def why_in_process(e2e: E2ECluster, job: str) -> dict[str, Any]:
    """The console's answer, computed here (cheap enough to poll)."""
    environ = {"KUBECONFIG": str(e2e.plane.credentials.kubeconfig)}
    args = build_parser(environ).parse_args(why_args(e2e, job))
    shown = asyncio.run(run(args, environ, SystemClock()))
    answer: dict[str, Any] = jsonio.loads(shown.text)
    return answer


def why_as_operator(e2e: E2ECluster, job: str) -> tuple[dict[str, Any], str]:
    """``tessera why … -o json`` as a subprocess with the admin's kubeconfig: the answer
    and what went to stderr."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KUBECONFIG": str(e2e.plane.credentials.kubeconfig),
    }
    done = subprocess.run(
        [sys.executable, "-m", "console", *why_args(e2e, job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    answer: dict[str, Any] = jsonio.loads(done.stdout)
    return answer, done.stderr


def reasons_by_category(record: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in record["reasons"]:
        counts[reason["category"]] = counts.get(reason["category"], 0) + reason["nodes"]
    return counts


def test_why_a_gang_no_rack_can_hold_names_the_scheduler_stage_and_the_extender_s_reasons(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    if not e2e.extender_metrics:
        pytest.skip("the extender runs without a metrics listener")
    # Three 8-GPU workers that must share a rack: the gang pool's racks hold one (rack-a)
    # and two (rack-b), so every node passes kube-scheduler's own filters (8 GPUs free)
    # and the extender refuses each, for want of room in its rack.
    job = "why-gang"
    rack = {labels.TOPOLOGY: "required:rack"}
    e2e.create_stored(gpu_job(job, pods=3, gpus=8, pool=GANG_POOL, annotations=rack))
    e2e.wait_admitted(job)

    def created() -> list[str] | None:
        names = [p["metadata"]["name"] for p in e2e.pods(job)]
        return names if len(names) == 3 else None

    pods = e2e.api.wait(f"the job controller to create the 3 pods of {job}", created)

    def explained() -> dict[str, Any] | None:
        answer = why_in_process(e2e, job)
        seen = {pod for group in answer["extender"] for pod in group["pods"]}
        return answer if seen == set(pods) else None

    e2e.api.wait(
        f"the extender to remember a /filter of each pod of {job}",
        explained,
        describe=lambda: repr(why_in_process(e2e, job)["extender"]),
    )
    answer, stderr = why_as_operator(e2e, job)

    assert answer["target"] == f"job {NAMESPACE}/{job}"
    # the stage: admitted by Kueue, held by the scheduler
    conditions = {c["type"]: c["status"] for c in answer["workload"]["conditions"]}
    assert (conditions["QuotaReserved"], conditions["Admitted"]) == ("True", "True")
    assert answer["workload"]["cluster_queue"] == TRAINING_CQ
    assert answer["workload"]["gpus"] == 24
    assert answer["verdict"].startswith(
        f"3 pod(s) not scheduled: needs 8 GPUs, as one of gang {NAMESPACE}.{job} "
        "(3 members, 3 together, required:rack)"
    ), answer["verdict"]
    assert "0 of 3 nodes fit: 3 in a rack without room for the gang" in answer["verdict"]
    # and what nodes would start it, counted on the nodes its pods may use
    assert re.search(r"; needs [12] more nodes? of \S+ in one rack$", answer["verdict"]), answer[
        "verdict"
    ]
    # the extender's reasons, node by node, all pods refused alike
    [group] = answer["extender"]
    assert sorted(group["pods"]) == sorted(pods)
    assert group["extender"] == e2e.extender_metrics
    record = group["record"]
    assert (record["candidates"], record["fit"]) == (3, 0)
    assert reasons_by_category(record) == {"gang_room": 3}
    named = {node for reason in record["reasons"] for node in reason["examples"]}
    assert named == {"gang-a1", "gang-b1", "gang-b2"}
    # the webhook's marks on the Job, and the pods as the API shows them
    marks = {m["key"]: m["value"] for m in answer["webhook"]}
    assert marks[labels.GANG] == f"{NAMESPACE}.{job}"
    assert marks[labels.TOPOLOGY] == "required:rack"
    assert all(not p["node"] for p in answer["pods"])
    assert "note: extender" not in stderr


def test_why_a_job_waiting_for_quota_shows_kueue_s_reason(e2e: E2ECluster) -> None:
    # 32 reserved GPUs nominal + 8 borrowable, 8 spot: the first job takes 32 of the
    # reserved, the second (16) fits in neither what is left of them nor the spot ones.
    e2e.create_stored(gpu_job("why-quota-first", pods=4, gpus=8, pool=RECLAIM_POOL))
    e2e.wait_admitted("why-quota-first")
    e2e.create_stored(gpu_job("why-quota-second", pods=2, gpus=8, pool=RECLAIM_POOL))

    def refused() -> str | None:
        workload = e2e.workload("why-quota-second")
        for condition in (workload or {}).get("status", {}).get("conditions") or []:
            if condition["type"] == "QuotaReserved" and condition["status"] == "False":
                return str(condition.get("message") or "") or None
        return None

    e2e.api.wait("Kueue to say why why-quota-second waits", refused)
    answer, stderr = why_as_operator(e2e, "why-quota-second")

    workload = answer["workload"]
    [waiting] = [c for c in workload["conditions"] if c["type"] == "QuotaReserved"]
    assert waiting["status"] == "False"
    assert "insufficient unused quota" in waiting["message"], waiting
    # the verdict is the Kueue stage, in Kueue's words
    assert (
        answer["verdict"]
        == f"waiting for quota in ClusterQueue {TRAINING_CQ}: " + (waiting["message"])
    )
    assert workload["gpus"] == 16
    quota = workload["quota"]
    assert (quota["cluster_queue"], quota["gpus_nominal"]) == (TRAINING_CQ, 40)
    # the first job's 32 (a Workload of an earlier scenario may not be collected yet)
    assert quota["gpus_used"] >= 32
    marks = {m["key"]: m["value"] for m in answer["webhook"]}
    assert (marks["spec.suspend"], marks[labels.QUEUE_NAME]) == ("true", "training")
    # a suspended Job has no pods: the extender is not asked about any
    assert answer["pods"] == answer["extender"] == []
    assert "extender" not in stderr
