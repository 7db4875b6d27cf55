"""Faults on the real control plane (issue 20): the extender killed in a burst of binds,
and kube-apiserver stopped for longer than the extender's --max-cache-age.

A kill -9 of the extender while kube-scheduler binds a job's pods, ten times: no GPU is
ever given twice, and no pod is left holding ``tessera.dev/gpu-indices`` without being
bound (the Binding carries the annotation, so a pod gets both or neither). kube-apiserver
stopped and started again: meanwhile the extender's /readyz turns 503 naming its stale
watches and it refuses to bind; once kube-apiserver is back it is ready again, and a job
made after is placed with correct accounting. The times are printed (``pytest -s``).

The faults pool (``fleet.py``) is this module's own; the control plane is the session's,
so every fault here is undone in a ``finally``, also when the test fails.
"""

from __future__ import annotations

import functools
import http.client
import time
from typing import Any

import pytest

from cluster import jsonio, labels
from loadtest.stack.cluster import EXTENDER_MAX_CACHE_AGE_S, E2ECluster
from loadtest.stack.fleet import FAULTS_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_job
from loadtest.stack.placements import Placement, gpu_conflicts
from loadtest.stack.servers import ServerProcess

pytestmark = pytest.mark.e2e

ROUNDS = 10
PODS, GPUS = 8, 2
"""A burst that fills the faults pool's 16 GPUs to the last one."""
DOWN_PAST_LIMIT_S = 4.0
"""How long kube-apiserver stays down once the extender's cache is stale."""
READY_AGAIN_S = 40.0
"""Generous: the extender's watches retry with a backoff that doubles up to 30 s, so
after some 25 s of kube-apiserver gone the next try may come 16 s later."""


def _bound(pod: dict[str, Any]) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


def _half_done(placements: list[Placement]) -> list[str]:
    """Pods bound without their GPUs recorded, or recording GPUs while unbound."""
    return [
        f"{p.name} node={p.node or '-'} {labels.GPU_INDICES}={list(p.indices)}"
        for p in placements
        if bool(p.node) != bool(p.indices)
    ]


def test_an_extender_killed_in_a_burst_of_binds_never_gives_a_gpu_twice(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    extender = e2e.extender
    assert extender is not None
    clock = e2e.clock
    for number in range(1, ROUNDS + 1):
        name = f"burst-{number}"
        e2e.create_stored(gpu_job(name, pods=PODS, gpus=GPUS, pool=FAULTS_POOL))
        try:
            e2e.api.watch_until(
                f"a bound pod of job {name}",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                _bound,
                labelSelector=f"{labels.JOB_NAME}={name}",
            )
            extender.kill()
            killed = clock.monotonic()
            at_crash = e2e.placements(name)
        finally:
            if not extender.running:  # also when this fails: other scenarios need it
                extender.start()
        restarted = clock.monotonic()
        placed = e2e.wait_bound(name, PODS)
        all_bound = clock.monotonic()

        assert _half_done(at_crash) == [], f"round {number}, at the crash"
        assert _half_done(e2e.placements(name)) == [], f"round {number}, after"
        assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == [], f"round {number}"
        assert len({(p.node, i) for p in placed for i in p.indices}) == PODS * GPUS
        print(
            f"kill round {number}: {sum(1 for p in at_crash if p.node)}/{PODS} pods bound "
            f"at the kill, the extender ready {restarted - killed:.1f} s after it, all bound "
            f"{all_bound - restarted:.1f} s later; no GPU given twice, no half-bound pod"
        )
        e2e.delete_jobs()


# ---------------------------------------------------------------- kube-apiserver restart


def _extender_call(
    extender: ServerProcess, method: str, path: str, body: bytes | None = None
) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", extender.probe.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    except (OSError, http.client.HTTPException) as exc:
        return 0, str(exc)
    finally:
        conn.close()


def _names_both(reason: str) -> bool:
    return all(
        f"the {resource} watch last heard from kube-apiserver" in reason
        for resource in ("nodes", "pods")
    )


def _ready(server: ServerProcess) -> bool | None:
    return True if server.probe.status() == http.HTTPStatus.OK else None


def test_with_kube_apiserver_down_past_max_cache_age_the_extender_is_unready_and_binds_nothing(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    extender = e2e.extender
    assert extender is not None
    clock = e2e.clock
    limit = EXTENDER_MAX_CACHE_AGE_S
    assert _extender_call(extender, "GET", "/readyz") == (200, "ok")

    went_down = clock.monotonic()
    try:
        # SIGTERM: it stops listening at once, then drains (the suite kills it after 10 s)
        e2e.plane.stop_component("kube-apiserver")
        exited = clock.monotonic()

        def stale_on_both() -> str | None:
            status, text = _extender_call(extender, "GET", "/readyz")
            return text if status == 503 and _names_both(text) else None

        reason = e2e.api.wait(
            "the extender's /readyz to say 503 naming both watches", stale_on_both,
            timeout=limit + 10,
        )  # fmt: skip
        unready = clock.monotonic()
        binding = {
            "PodName": "stale-probe-0",
            "PodNamespace": NAMESPACE,
            "PodUID": "0b1c2d3e-0000-4000-8000-000000000000",
            "Node": "faults-1",
        }
        bind = _extender_call(extender, "POST", "/bind", jsonio.dumps(binding))
        time.sleep(DOWN_PAST_LIMIT_S)
        still = _extender_call(extender, "GET", "/readyz")
    finally:
        restarting = clock.monotonic()
        e2e.plane.start_apiserver()  # also when this fails: other scenarios need it
    back = clock.monotonic()
    e2e.api.wait("the extender's /readyz to say 200 again", lambda: _ready(extender),
                 timeout=READY_AGAIN_S)  # fmt: skip
    ready = clock.monotonic()
    print(
        f"kube-apiserver: exited {exited - went_down:.1f} s after its SIGTERM; the extender's "
        f"/readyz 503 naming both watches {unready - exited:.1f} s after it exited "
        f"(--max-cache-age {limit}); down {restarting - went_down:.1f} s in all; "
        f"kube-apiserver ready {back - restarting:.1f} s after its start, the extender "
        f"{ready - back:.1f} s after that"
    )

    assert f"--max-cache-age {limit}" in reason
    assert unready - exited <= limit + 2, "503 once the cache is older than the limit"
    assert still[0] == 503, "stale until kube-apiserver is heard again"
    assert _names_both(still[1]), still
    assert bind[0] == 200
    assert "stale" in jsonio.loads(bind[1])["Error"], bind
    assert ready - back <= READY_AGAIN_S

    # the cluster works again: a GPU job made now is admitted, placed and accounted for
    for server in (e2e.webhook, e2e.kueue):
        e2e.api.wait(f"{server.module} ready", functools.partial(_ready, server))
    e2e.create_stored(gpu_job("after-restart", pods=4, gpus=GPUS, pool=FAULTS_POOL))
    placed = e2e.wait_bound("after-restart", 4, timeout=90)
    assert _half_done(e2e.placements("after-restart")) == []
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
    assert len({(p.node, i) for p in placed for i in p.indices}) == 4 * GPUS
