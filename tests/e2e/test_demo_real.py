"""``python -m loadtest demo --real``, short, on the suite's stack (issue 19).

The demo's job stream (a dozen jobs, one a 2-pod gang, one the webhook must deny) goes
through the real kube-apiserver, both webhooks, the real Kueue and kube-scheduler with the
extender, onto the demo's own fake HGX nodes, whose kubelet ends each pod after its drawn
run time. The test reads the report as a user would: every job completed, no GPU given
twice, each gang in one rack. It shares the session's control plane (no second start-up)
and leaves it as it found it: no demo job, pod or node remains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import jsonio
from loadtest.demo import modes as demo
from loadtest.demo import real as real_demo
from loadtest.inputs.fleet import TEAMS
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import POOL

pytestmark = pytest.mark.e2e

SEED_WITH_A_GANG = 4
"""The short stream of seed 1 draws no gang; seed 4's draws a 2 x 4-GPU one."""


def test_demo_real_short_completes_every_job_without_double_booking_gangs_in_one_rack(
    scheduling: E2ECluster, tmp_path: Path
) -> None:
    e2e = scheduling
    said: list[str] = []
    spec = real_demo.real_spec(short=True, seed=SEED_WITH_A_GANG)

    outcome = demo.run_real_on(e2e, spec, tmp_path, clock=e2e.clock, say=said.append)

    data = jsonio.loads(outcome.json_path.read_bytes())
    assert outcome.html_path.read_text().startswith("<!doctype html>")
    jobs, place = data["jobs"], data["placement"]
    assert jobs["completed"] == jobs["submitted"] > 0, said
    assert jobs["denied"] == 1  # the stream's one bad job
    assert data["double_booked"] == []
    assert place["gangs_placed"] >= 1
    assert place["gangs_in_one_rack"] == place["gangs_placed"], place["gangs_split"]
    assert place["pods_in_one_island"] == place["pods_2_to_4_gpus"]
    assert data["checks"]["ok"], data["checks"]
    summary = "\n".join(said)
    assert f"jobs: {jobs['submitted']} of {jobs['submitted']} completed" in summary
    assert "GPUs double-booked: 0" in summary
    assert "checks: all passed" in summary
    # the shared stack is left as found
    assert e2e.api.items("/api/v1/nodes", labelSelector=f"{POOL}={real_demo.DEMO_POOL}") == []
    for team in TEAMS:
        assert e2e.api.items(f"/api/v1/namespaces/{team.namespace}/pods") == []
