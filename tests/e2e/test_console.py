"""``tessera`` against the real API server, with the e2e suite's Kueue objects and fleet:
what it reads matches the cluster, and what it writes kube-apiserver stores and the
extender reads back.

Runs the console as an operator does, ``python -m console`` with the admin's kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio, labels
from cluster.convert.nodes import node_from_json
from loadtest.stack.cluster import E2ECluster

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
