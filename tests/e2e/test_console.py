"""``tessera`` against the real API server, with the e2e suite's Kueue objects and fleet:
what it reads matches the cluster, and what it writes kube-apiserver stores and the
extender reads back.

Runs the console as an operator does, ``python -m console`` with the admin's kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from cluster.convert.grammar import format_rfc3339, parse_rfc3339
from cluster.convert.nodes import node_from_json
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import POOL, RESTART_POOL
from loadtest.stack.jobs import gpu_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def tessera(cluster: E2ECluster, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KUBECONFIG": str(cluster.plane.credentials.kubeconfig),
    }
    done = subprocess.run(
        [sys.executable, "-m", "console", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    return done


def test_nodes_count_the_fleets_gpus(scheduling: E2ECluster) -> None:
    shown: dict[str, Any] = jsonio.loads(tessera(scheduling, "nodes", "-o", "json").stdout)
    by_name = {n["name"]: n for n in shown["nodes"]}
    for name, node in scheduling.fleet.items():
        if node.gpus:
            assert by_name[name]["gpus_total"] == node.gpus
            assert by_name[name]["gpus_allocated"] + by_name[name]["gpus_free"] <= node.gpus
    assert set(shown["levels"]) >= {"block", "rack"}


def test_queues_list_the_e2e_policy(scheduling: E2ECluster) -> None:
    shown: dict[str, Any] = jsonio.loads(tessera(scheduling, "queues", "-o", "json").stdout)
    names = {q["name"]: q for q in shown["cluster_queues"]}
    assert {"e2e-training", "e2e-lender", "e2e-tas"} <= set(names)
    assert names["e2e-training"]["gpus_nominal"] == 40  # 32 reserved + 8 spot
    assert names["e2e-training"]["cohort"] == "e2e"


def test_drain_and_gpu_health_are_stored_with_an_event_and_read_by_the_extenders_parser(
    scheduling: E2ECluster,
) -> None:
    name = next(n for n, node in scheduling.fleet.items() if node.gpus and not node.unhealthy)
    try:
        tessera(scheduling, "gpu-health", name, "--unhealthy", "7", "--reason", "e2e")
        tessera(scheduling, "drain", name, "--at", "+48h", "--reason", "e2e")
        node = scheduling.get_json("node", name)
        state = node_from_json(node)
        assert [g.index for g in state.gpus if not g.healthy] == [7]
        assert state.drain_after is not None
        events = scheduling.get_json(
            "events", "-n", "default", "--field-selector", f"involvedObject.name={name}"
        )["items"]
        assert {"TesseraGpuHealth", "TesseraDrain"} <= {e["reason"] for e in events}
        tessera(scheduling, "gpu-health", name, "--unhealthy", "99", code=1)

        tessera(scheduling, "undrain", name)
        tessera(scheduling, "gpu-health", name, "--unhealthy", "")
        annotations = scheduling.get_json("node", name)["metadata"].get("annotations", {})
        assert labels.DRAIN_AFTER not in annotations
        assert labels.UNHEALTHY_GPUS not in annotations
    finally:
        # whatever failed above, the node goes back to the other scenarios as it was
        scheduling.kubectl(
            "annotate",
            "node",
            name,
            f"{labels.DRAIN_AFTER}-",
            f"{labels.UNHEALTHY_GPUS}-",
            check=False,
        )


def test_upgrade_plan_waits_for_the_time_limit_the_webhook_wrote_and_applies_wave_by_wave(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    pool = {"restart-1", "restart-2"}
    selector = f"{POOL}={RESTART_POOL}"
    # no time limit given: the webhook writes queue training's default (2 h) into the
    # Job and its pod template, so the pod carries it
    e2e.create_stored(gpu_job("upgrade-busy", gpus=8, node="restart-1"))
    e2e.wait_bound("upgrade-busy", 1)

    def started() -> dict[str, Any] | None:
        pods = [p for p in e2e.pods("upgrade-busy") if p.get("status", {}).get("startTime")]
        return pods[0] if pods else None

    pod = e2e.api.wait("the pod of upgrade-busy to start", started)
    assert pod["spec"]["activeDeadlineSeconds"] == 7200
    ends = parse_rfc3339(pod["status"]["startTime"]) + timedelta(seconds=7200)
    try:
        plan_args = ("upgrade-plan", "-l", selector, "--window", "30m", "--keep", "80%")
        plan: dict[str, Any] = jsonio.loads(tessera(e2e, *plan_args, "-o", "json").stdout)
        # the idle node goes now, the busy one when its job's time limit ends
        assert [w["nodes"] for w in plan["waves"]] == [["restart-2"], ["restart-1"]]
        assert plan["waves"][1]["start"] == format_rfc3339(ends)
        assert {n["name"]: n["jobs_end"] for n in plan["nodes"]}["restart-1"] == (
            format_rfc3339(ends)
        )
        assert {n["name"] for n in plan["nodes"]} == pool

        applied = jsonio.loads(tessera(e2e, *plan_args, "--apply", "-o", "json").stdout)
        assert applied["applied"] is True
        for wave in applied["waves"]:
            (name,) = wave["nodes"]
            node = e2e.get_json("node", name)
            assert node["metadata"]["annotations"][labels.DRAIN_AFTER] == wave["start"]
            assert node_from_json(node).drain_after == parse_rfc3339(wave["start"])
        events = e2e.get_json("events", "-n", "default", "--field-selector", "reason=TesseraDrain")
        said = {e["involvedObject"]["name"]: e["message"] for e in events["items"]}
        assert said["restart-1"].endswith("(upgrade wave 2 of 2)")
    finally:
        for name in pool:
            e2e.kubectl("annotate", "node", name, f"{labels.DRAIN_AFTER}-", check=False)
