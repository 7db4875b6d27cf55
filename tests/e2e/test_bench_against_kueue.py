"""``python -m loadtest bench-webhook --against kueue``, briefly, end to end (issue 19).

The command starts its own control plane and the real Kueue (not the session's cluster),
sends the same Job reviews to Kueue's webhook and to Tessera's, and reports both. A few
seconds of load only: this checks that the comparison runs and is what it says (both
servers answer every review, with the patch each should write), not the figures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from tests.e2e.conftest import Assets

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"same", "renamed", "distinct", "unsuspended"}


def _suspends(patch: list[dict[str, Any]]) -> bool:
    return any(op["path"] == "/spec/suspend" and op.get("value") is True for op in patch)


def test_the_benchmark_reports_both_webhooks_in_every_variant(
    assets: Assets, tmp_path: Path
) -> None:
    if assets.binaries is None:
        pytest.skip(assets.missing)
    report_path = tmp_path / "against-kueue.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "bench-webhook", "--against", "kueue",
         "--duration", "1", "--slice", "1", "--warmup", "0.5", "--queues", "8",
         "--json", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Tessera/Kueue" in done.stdout
    report = jsonio.loads(report_path.read_bytes())
    assert set(report["servers"]) == {"tessera", "kueue"}
    assert report["servers"]["kueue"]["path"].startswith("/mutate-batch-v1-job")
    # the first phase waited for Kueue's startup reconciling to end (one window at least)
    assert report["settled"]["waited_s"] >= 2.0
    assert "first phase after" in done.stdout
    assert set(report["variants"]) == VARIANTS
    for name, variant in report["variants"].items():
        phases = [variant["saturation"], *variant["fixed"]]
        assert len(variant["fixed"]) == 2, name
        for phase in phases:
            for server in ("tessera", "kueue"):
                assert phase[server]["ok"] > 0, (name, server)
                assert phase[server]["errors"] == {}, (name, server, phase[server]["errors"])
                assert phase[server]["server_cpu_per_review_s"] > 0, (name, server)
        ratios = variant["ratios"]
        assert ratios["throughput"] > 0
        assert ratios["cpu_per_review"] > 0
        assert all(r["ratio"] > 0 for r in ratios["p99"])
        patches = variant["patches"]
        assert patches["tessera"], name  # Tessera always has something to write
        if name == "unsuspended":
            # a Job created without suspend: both webhooks suspend it
            assert _suspends(patches["kueue"])
            assert _suspends(patches["tessera"])
        else:
            assert patches["kueue"] == [], name  # already suspended: nothing to write
