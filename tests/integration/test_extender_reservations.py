"""Reservations in the running extender, as kube-scheduler and an admin meet them.

A rack whose GPUs are held by short jobs, a two-member gang that needs the whole rack:
once a member is filtered and fits nowhere, the rack is reserved for the gang from
when the jobs' time limits end; a pod whose time limit ends too late is refused there
with the reason (in the answer, and in ``GET /debug/reasons`` for ``tessera why``), one
that ends in time backfills (and is counted); the metrics show the reservation. With
kube-apiserver, the reservation is a Lease, which a restarted extender rebuilds before
any request, and which is deleted once the gang has started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster import jsonio
from cluster.feed import NODES_PATH, PODS_PATH
from cluster.model import GangId, NodeName
from extender.settings import ExtenderSettings
from tests.builders import node_json, pod_json
from tests.fakeapi import FakeApiServer, write_kubeconfig
from tests.integration.test_extender_server import (
    LEVELS,
    WAIT_S,
    bind_args,
    file_extender,
    filter_args,
    serving,
)

STARTED = "2026-11-29T18:18:00Z"  # ten minutes before NOW
NODES = ["a1", "a2", "b1"]
LEASES = "/apis/coordination.k8s.io/v1/leases"


def running(name: str, node: str, gpus: int, limit_s: int, indices: str) -> dict[str, Any]:
    pod = pod_json(
        name,
        "batch",
        gpus=gpus,
        node=node,
        gpu_indices=indices,
        phase="Running",
        active_deadline_s=limit_s,
    )
    pod["status"]["startTime"] = STARTED
    return pod


def member(index: int) -> dict[str, Any]:
    return pod_json(
        f"big-{index}",
        "ml",
        gpus=8,
        gang="ml.big",
        gang_size=2,
        topology="required:rack",
        active_deadline_s=7200,
    )


def cluster() -> list[dict[str, Any]]:
    """Rack r1 (a1, a2) busy with jobs ending in 30 minutes (a1 half free); rack r2 of
    one node, which can never hold the gang."""
    return [
        node_json("a1", rack="r1"),
        node_json("a2", rack="r1"),
        node_json("b1", rack="r2"),
        running("short-a1", "a1", 4, 40 * 60, "0,1,2,3"),
        running("short-a2", "a2", 8, 40 * 60, "0,1,2,3,4,5,6,7"),
        member(0),
        member(1),
    ]


async def until(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not check():  # noqa: ASYNC110 - the cache has no change signal: poll
            await asyncio.sleep(0.02)
    assert check(), what


async def test_a_reserved_rack_refuses_what_ends_too_late_and_backfills_the_rest(
    tmp_path: Path,
) -> None:
    settings, clock, cache = file_extender(tmp_path, cluster(), reservation_interval_s=0.05)
    async with serving(settings, cache=cache, clock=clock) as ext:
        status, answer = await ext.post("/filter", filter_args(member(0), NODES))
        assert status == 200
        assert answer["NodeNames"] == []
        await until(lambda: bool(cache.snapshot().promises), "a reservation for ml.big")
        held = cache.snapshot().promises
        assert sorted(held) == ["a1", "a2"]

        late = pod_json("late-0", "batch", gpus=1, active_deadline_s=4 * 3600)
        status, answer = await ext.post("/filter", filter_args(late, NODES))
        assert answer["NodeNames"] == ["b1"]
        reason = answer["FailedAndUnresolvableNodes"]["a1"]
        assert reason == (
            "node a1 is reserved for gang ml.big from 18:58:00Z: this pod's time limit "
            "ends 22:28:00Z"
        )
        short = pod_json("short-0", "batch", gpus=1, active_deadline_s=15 * 60)
        status, answer = await ext.post("/filter", filter_args(short, NODES))
        assert answer["NodeNames"] == ["a1", "b1"]
        status, answer = await ext.post("/bind", bind_args(short, "a1"))
        assert (status, answer.get("Error", "")) == (200, "")

        async with ext.session.get(
            ext.metrics_url + "/debug/reasons", params={"pod": "batch/late-0"}
        ) as response:
            record = jsonio.loads(await response.read())["pods"][0]
        assert reason in jsonio.dumps(record).decode()

        page = await ext.metrics()
        assert "tessera_extender_reservations 1.0" in page
        assert "tessera_extender_reserved_nodes 2.0" in page
        assert "tessera_extender_backfilled_pods_total 1.0" in page


async def test_a_restarted_extender_rebuilds_the_reservation_from_its_lease(
    tmp_path: Path,
) -> None:
    async with FakeApiServer(token="t") as api:
        for obj in cluster():
            api.put(NODES_PATH if obj["kind"] == "Node" else PODS_PATH, obj)
        settings = ExtenderSettings(
            kubeconfig=write_kubeconfig(tmp_path, api, "extender"),
            topology_levels=LEVELS,
            reservation_interval_s=0.05,
        )
        async with serving(settings) as ext:
            await ext.ready()
            await ext.post("/filter", filter_args(member(0), NODES))
            await until(lambda: bool(api.objects(LEASES)), "a Lease for ml.big")
        lease = next(iter(api.objects(LEASES).values()))
        assert lease["metadata"]["name"] == "tessera-reservation-ml.big"
        assert lease["metadata"]["namespace"] == "tessera-system"
        assert lease["spec"]["holderIdentity"] == "ml.big"
        assert lease["metadata"]["annotations"]["tessera.dev/reservation"] == (
            "domain=r1;start=2026-11-29T18:58:00Z;nodes=a1,a2"
        )

        async with serving(settings) as again:
            await again.ready()
            # no request yet: the reservation comes back from the Lease
            await until(lambda: bool(again.cache.snapshot().promises), "the rebuilt hold")
            assert sorted(again.cache.snapshot().promises) == [NodeName("a1"), NodeName("a2")]
            # both members land: the gang has started, the Lease goes
            for index, node in enumerate(("a1", "a2")):
                api.delete(PODS_PATH, f"batch/short-{node}")
                bound = {**member(index)}
                bound["spec"] = {**bound["spec"], "nodeName": node}
                bound["metadata"] = {
                    **bound["metadata"],
                    "annotations": {
                        **bound["metadata"]["annotations"],
                        "tessera.dev/gpu-indices": "0,1,2,3,4,5,6,7",
                    },
                }
                bound["status"] = {"phase": "Running", "startTime": "2026-11-29T18:50:00Z"}
                api.put(PODS_PATH, bound)
            await until(
                lambda: len(again.cache.snapshot().gangs.get(GangId("ml.big"), ())) == 2,
                "both members placed in the cache",
            )
            # no /filter asked of it: it is not the replica kube-scheduler calls (a
            # standby), so it leaves the Lease to the leader's extender
            await asyncio.sleep(10 * settings.reservation_interval_s)
            assert api.objects(LEASES)
            # asked, it leads: it reads the Leases again, plans, and releases the gang
            await again.post("/filter", filter_args(member(1), NODES))
            await until(lambda: not api.objects(LEASES), "the Lease deleted")
            assert not again.cache.snapshot().promises
