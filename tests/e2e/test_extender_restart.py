"""Scenario 5: the extender crashes while a job's pods are being bound, and comes back.

The restart pool has 16 GPUs, and the two jobs below ask for exactly 16: after the restart
the extender knows which GPUs are taken only from the bound pods' ``tessera.dev/gpu-indices``,
so any allocation it lost or counted twice shows up as a pod that cannot bind or as two
pods on one GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import labels
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import RESTART_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_job
from loadtest.stack.placements import gpu_conflicts

pytestmark = pytest.mark.e2e

FIRST, SECOND = "sweep-first", "sweep-second"


def _bound(pod: dict[str, Any]) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


def test_pods_bind_without_double_allocation_across_an_extender_restart(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    assert e2e.extender is not None
    e2e.create_stored(gpu_job(FIRST, pods=6, gpus=2, pool=RESTART_POOL))
    try:
        # crash it the moment the first pod is bound (a watch reacts within milliseconds)
        e2e.api.watch_until(
            f"a bound pod of job {FIRST}",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            _bound,
            labelSelector=f"{labels.JOB_NAME}={FIRST}",
        )
        e2e.extender.kill()
        e2e.create_stored(gpu_job(SECOND, pods=2, gpus=2, pool=RESTART_POOL))
        # kube-scheduler keeps trying while the extender is down; the pods wait, none is
        # placed without it
        down = e2e.wait_scheduling_failure(SECOND)
        assert all(not p.node for p in e2e.placements(SECOND)), e2e.describe_pods(SECOND)
    finally:
        if not e2e.extender.running:  # also when this test fails: other scenarios need it
            e2e.extender.start()
    first = e2e.wait_bound(FIRST, 6)
    second = e2e.wait_bound(SECOND, 2)

    # `kubectl describe pod` shows why the pod waited
    assert "/filter" in down
    assert "connection refused" in down
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
    # the pool is full to the last GPU
    taken = {(p.node, i) for p in [*first, *second] for i in p.indices}
    assert len(taken) == 16
