"""``python -m loadtest sched-perf`` at a small scale, end to end (issue 22).

The command starts its own control planes (not the session's cluster), one fresh one per
profile, and schedules the same pods with the real kube-scheduler: in-tree packing,
in-tree default, and the shipped profile with the extender. A few seconds of load: this
checks that the comparison runs and is what it says (every pod bound by the shipped
profile, every pod accounted for in the in-tree ones, no GPU given twice, the extender
recording GPUs for every pod it bound, the JSON and the page there), not the figures.

The in-tree baselines may leave a pod unbound: their scores tie, kube-scheduler breaks
ties at random, and a spread (or a gang member whose rack filled up) can leave no node
with 8 free GPUs. That is what the baselines measure, so the test counts those pods
rather than asking them to fit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster import jsonio
from loadtest.inputs.traces import DEFAULT_DATA_DIR
from tests.e2e.conftest import Assets

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("in_tree", "in_tree_default", "tessera")
NODES, PODS = 20, 40
BACKGROUND = 60
"""Pods bound before the measured ones: three a node, in a namespace of their own."""


def test_every_profile_binds_every_pod_once_and_the_report_has_its_shape(
    assets: Assets, tmp_path: Path
) -> None:
    if assets.binaries is None:
        pytest.skip(assets.missing)
    if not (DEFAULT_DATA_DIR / "alibaba-gpu-v2023").is_dir():
        pytest.skip(
            f"no openb traces in {DEFAULT_DATA_DIR} (see its README): "
            "sched-perf draws its pods from them"
        )
    report_path = tmp_path / "sched-perf.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "sched-perf", "--nodes", str(NODES),
         "--pods", str(PODS), "--repeats", "1", "--idle", "20", "--json", str(report_path),
         "--background", str(BACKGROUND)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tessera/in_tree" in done.stdout
    report = jsonio.loads(report_path.read_bytes())
    assert (report["nodes"], report["pods"]) == (NODES, PODS)
    # the background was created (bound) in every run, and is not counted as measured
    assert report["settings"]["background"] == BACKGROUND
    assert done.stdout.count(f"{BACKGROUND} background pods in") == len(PROFILES)
    for profile in PROFILES:
        figures = report[profile]
        unbound = figures["placement"]["unschedulable_by_size"]
        assert figures["bound"] + sum(unbound.values()) == PODS, (profile, figures)
        assert figures["unbound"] == sum(unbound.values()), (profile, figures)
        assert figures["pods_per_s"] > 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
        cpu = figures["cpu_ms_per_pod"]
        assert all(cpu[c] > 0 for c in ("scheduler", "apiserver", "etcd")), (profile, cpu)
        assert figures["placement"]["gpu_conflicts"] == 0
        # counted from kube-apiserver's own metrics: one Binding for every pod bound
        assert figures["requests_per_pod"]["POST pods/binding"] == 1.0, (profile, figures)
    tessera = report["tessera"]
    assert tessera["bound"] == PODS, tessera["placement"]
    # kube-scheduler's own count: each pod scheduled once, by the shipped profile
    assert tessera["attempts_per_pod"]["scheduled"] == 1.0, tessera["attempts_per_pod"]
    assert tessera["cpu_ms_per_pod"]["extender"] > 0
    assert report["in_tree"]["cpu_ms_per_pod"]["extender"] is None
    # the extender bound every pod, recording its GPUs, and kept NVLink islands whole
    assert tessera["placement"]["bound_without_indices"] == 0
    assert tessera["placement"]["split_islands"] == 0
    assert tessera["placement"]["overbooked_gpus"] == 0
    # killed after the run and started again, it was ready once its cache was rebuilt
    assert tessera["extender_ready_s"]["restart"] > 0
    assert "after a restart" in done.stdout
    assert report["ratio"]["throughput"] > 0
    assert report["ratio"]["p99"] > 0
    assert [r["profile"] for r in report["runs"]] == list(PROFILES)
    assert report_path.with_suffix(".html").read_text().count("<svg") == 2
