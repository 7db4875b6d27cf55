"""``tessera why``'s verdict: the first stage that holds a job back, in one sentence.

Table-driven over the stages a GPU job passes (webhook, Kueue quota, admission checks,
pods, gates, scheduler), each row the objects as the API would show them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cluster import labels
from console.why import Condition, Mark, WorkloadState, pod_state, report, verdict, webhook_marks
from extender.explain import PodReasons, ReasonGroup

NOW = datetime(2026, 1, 1, 6, 0, tzinfo=UTC)
QUEUED = (Mark(labels.QUEUE_NAME, "training", "LocalQueue"),)


def workload(*conditions: tuple[str, str, str], checks: tuple[Any, ...] = ()) -> WorkloadState:
    return WorkloadState(
        name="job-x",
        queue="training",
        cluster_queue="nlp",
        gpus=16,
        conditions=tuple(Condition(t, s, "", m, NOW) for t, s, m in conditions),
        checks=checks,
        quota=None,
    )


def pod(name: str, phase: str = "Pending", node: str = "", **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    if "gates" in status:
        spec["schedulingGates"] = [{"name": g} for g in status.pop("gates")]
    return {"kind": "Pod", "metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


ADMITTED = workload(("QuotaReserved", "True", ""), ("Admitted", "True", ""))

VERDICTS = [
    pytest.param((), None, [], "no kueue.x-k8s.io/queue-name label and no Workload", id="unqueued"),
    pytest.param(QUEUED, None, [], "no Kueue Workload for it yet", id="no-workload"),
    pytest.param(
        QUEUED,
        workload(("QuotaReserved", "False", "insufficient unused quota, 8 more needed")),
        [],
        "waiting for quota in ClusterQueue nlp: insufficient unused quota, 8 more needed",
        id="quota",
    ),
    pytest.param(
        QUEUED,
        workload(
            ("QuotaReserved", "True", ""),
            ("Admitted", "False", ""),
            checks=(("provision", "Pending", "waiting for 2 nodes"),),
        ),
        [],
        "quota reserved, waiting for admission checks: provision Pending (waiting for 2 nodes)",
        id="admission-check",
    ),
    pytest.param(QUEUED, ADMITTED, [], "admitted, but it has no pods", id="no-pods"),
    pytest.param(
        QUEUED,
        ADMITTED,
        [pod("a", gates=("kueue.x-k8s.io/topology",))],
        "1 pod(s) held by scheduling gates: kueue.x-k8s.io/topology",
        id="gated",
    ),
    pytest.param(QUEUED, ADMITTED, [pod("a")], "1 pod(s) not scheduled", id="unscheduled"),
    pytest.param(
        QUEUED,
        ADMITTED,
        [pod("a", "Running", "n1"), pod("b", "Pending", "n2")],
        "scheduled, starting",
        id="starting",
    ),
    pytest.param(QUEUED, ADMITTED, [pod("a", "Running", "n1")], "running", id="running"),
    pytest.param(
        QUEUED,
        workload(("Finished", "True", "Job finished successfully")),
        [],
        "finished: Job finished successfully",
        id="finished",
    ),
]


@pytest.mark.parametrize(("marks", "state", "pods", "expected"), VERDICTS)
def test_verdict(
    marks: tuple[Mark, ...], state: WorkloadState | None, pods: list[Any], expected: str
) -> None:
    said = verdict("Job", marks, state, [pod_state(p) for p in pods], [], [])
    assert said.startswith(expected), said


def test_an_unscheduled_gang_is_explained_by_the_extender_s_newest_record() -> None:
    record = PodReasons(
        pod="team-a/a",
        uid="u",
        first_at=NOW,
        at=NOW,
        filters=3,
        demand={"gpus": 8},
        candidates=40,
        fit=0,
        fit_examples=(),
        groups=(
            ReasonGroup("all 8 healthy GPUs are in use, pod needs 8", "gpus_in_use", True, 40),
        ),
    )
    job = {
        "kind": "Job",
        "metadata": {"name": "x", "namespace": "team-a", "labels": {labels.QUEUE_NAME: "q"}},
        "spec": {"suspend": False, "template": {"metadata": {}, "spec": {}}},
    }
    found = report(
        job,
        owners=(),
        workload=ADMITTED,
        pods=[pod("a"), pod("b")],
        events=[],
        records={"team-a/a": ("ext", record), "team-a/b": ("ext", record)},
    )
    assert found.verdict == (
        "2 pod(s) not scheduled: needs 8 GPUs: 0 of 40 nodes fit: 40 GPUs in use "
        "(preemption may help)"
    )
    (seen,) = found.reasons
    assert seen.pods == ("a", "b")


def test_the_marks_are_read_off_every_template_of_a_jobset_once() -> None:
    template = {
        "metadata": {"labels": {labels.GANG: "team-a.js"}, "annotations": {labels.GANG_SIZE: "4"}},
        "spec": {"schedulerName": "tessera-gpu"},
    }
    jobset = {
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": {labels.QUEUE_NAME: "q"}},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {"name": "a", "template": {"spec": {"template": template}}},
                {"name": "b", "template": {"spec": {"template": template}}},
            ],
        },
    }
    assert [m.key for m in webhook_marks(jobset)] == [
        labels.QUEUE_NAME,
        "spec.suspend",
        labels.GANG,
        labels.GANG_SIZE,
        "schedulerName",
    ]
