"""Reservations and backfill on the real stack (issue 24): a rack busy with short jobs,
a gang that needs the whole rack, and short jobs that may or may not start there while
the gang waits.

The rack (pool ``reserve``: two 8-GPU nodes) runs two 4-GPU jobs whose time limit
(``activeDeadlineSeconds``, copied onto their pods by the webhook) ends in 10 minutes. A
4 x 4-GPU gang needing one rack cannot start: kube-scheduler's ``/filter`` of a member
finds no fit, the extender plans and holds the rack for the gang from when those limits
end, recorded as a Lease (``tessera nodes`` shows it). A job whose limit ends after that
is refused there (``tessera why`` says so); one whose limit ends before it backfills.
When the short jobs end, the gang lands on the rack and its reservation is released.
The contrast first, with the extender restarted with ``--max-reservations 0``: the gang
waits and a job that ends an hour later takes the rack.

Nothing here places, admits or refuses anything: Kueue admits, kube-scheduler calls the
extender. The scenario plays only the kubelet: it ends the short jobs' pods
(``Succeeded``), as their containers exiting would.
"""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pytest

from cluster import jsonio, labels
from cluster.clock import SystemClock
from cluster.convert.grammar import parse_rfc3339
from console.__main__ import build_parser, run
from extender.holds import Hold, hold_of
from loadtest.stack.cluster import E2ECluster
from loadtest.stack.fleet import RESERVE_POOL
from loadtest.stack.jobs import NAMESPACE, gpu_job
from loadtest.stack.kueue import WAIT_FOR_PODS_READY_S
from loadtest.stack.placements import gpu_conflicts, true_condition
from tests.e2e.test_console_why import reasons_by_category, why_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEASES: Final = "/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases"
"""Where the extender records reservations (``--reservation-namespace``, its default)."""
RACK: Final = {labels.TOPOLOGY: "required:rack"}
SHORT_S: Final = 600
"""The busy jobs' time limit: the reservation starts when it ends."""
BACKFILL_S: Final = 300
"""Ends well before the reservation starts (the scenario takes about a minute)."""
TOO_LONG_S: Final = 3600
"""Ends well after it."""
GANG: Final = "res-gang"
GANG_ID: Final = f"{NAMESPACE}.{GANG}"
RESERVE_NODES: Final = ("reserve-1", "reserve-2")


def held(e2e: E2ECluster, gang: str = GANG_ID) -> Hold | None:
    """The gang's reservation as its Lease records it, once there is one."""
    for lease in e2e.api.items(LEASES, labelSelector=f"{labels.RESERVATION}=true"):
        if lease["spec"].get("holderIdentity") == gang:
            return hold_of(lease)
    return None


def nodes_in_process(e2e: E2ECluster) -> dict[str, Any]:
    """``tessera nodes -o json`` with the admin's kubeconfig, computed here."""
    environ = {"KUBECONFIG": str(e2e.plane.credentials.kubeconfig)}
    args = build_parser(environ).parse_args(["nodes", "-o", "json"])
    shown: dict[str, Any] = jsonio.loads(asyncio.run(run(args, environ, SystemClock())).text)
    return shown


def backfilled_pods(e2e: E2ECluster) -> float:
    """``tessera_extender_backfilled_pods_total`` on the extender's metrics listener."""
    with urllib.request.urlopen(f"{e2e.extender_metrics}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("tessera_extender_backfilled_pods_total "):
            return float(line.split()[1])
    return 0.0


def test_without_reservations_a_long_job_takes_the_rack_the_gang_waits_for(
    scheduling: E2ECluster,
) -> None:
    """Today's behaviour, the contrast: with ``--max-reservations 0`` the gang waits and
    a job that ends long after the rack would free lands on it, pushing the gang back."""
    e2e = scheduling
    extender = e2e.extender
    assert extender is not None
    shipped = list(extender.args)
    extender.stop()
    extender.args = [*shipped, "--max-reservations", "0"]
    try:
        extender.start()
        for job in ("nores-short-1", "nores-short-2"):
            e2e.create_stored(gpu_job(job, gpus=4, pool=RESERVE_POOL, time_limit=SHORT_S))
        for job in ("nores-short-1", "nores-short-2"):
            e2e.wait_bound(job, 1)
        e2e.create_stored(gpu_job("nores-gang", pods=4, gpus=4, pool=RESERVE_POOL,
                                  annotations=RACK))  # fmt: skip
        e2e.wait_admitted("nores-gang")
        e2e.wait_scheduling_failure("nores-gang")
        e2e.create_stored(gpu_job("nores-late", gpus=4, pool=RESERVE_POOL,
                                  time_limit=TOO_LONG_S))  # fmt: skip
        [late] = e2e.wait_bound("nores-late", 1)
        assert late.node in RESERVE_NODES
        assert all(not p.node for p in e2e.placements("nores-gang"))
        assert e2e.api.items(LEASES, labelSelector=f"{labels.RESERVATION}=true") == []
    finally:
        e2e.delete_jobs()
        extender.stop()
        extender.args = shipped
        extender.start()


def test_a_reserved_rack_backfills_short_jobs_and_the_gang_lands_when_it_frees(
    scheduling: E2ECluster,
) -> None:
    e2e = scheduling
    if not e2e.extender_metrics:
        pytest.skip("the extender runs without a metrics listener")
    backfilled_before = backfilled_pods(e2e)

    # the rack busy: 8 of its 16 GPUs, for at most SHORT_S
    for job in ("res-short-1", "res-short-2"):
        e2e.create_stored(gpu_job(job, gpus=4, pool=RESERVE_POOL, time_limit=SHORT_S))
    for job in ("res-short-1", "res-short-2"):
        e2e.wait_bound(job, 1)
    busy_since = datetime.now(UTC)

    # the gang needs the whole rack: it waits, and the extender holds the rack for it
    e2e.create_stored(gpu_job(GANG, pods=4, gpus=4, pool=RESERVE_POOL, annotations=RACK))
    e2e.wait_admitted(GANG)
    hold = e2e.api.wait(
        f"the extender to record a reservation for gang {GANG_ID}",
        lambda: held(e2e),
        timeout=30,
        describe=lambda: e2e.describe_pods(GANG),
    )
    assert sorted(hold.reservation.nodes) == list(RESERVE_NODES)
    assert hold.reservation.domain == "rack-r"
    start = hold.reservation.start
    assert start is not None
    # from when the short jobs' limits end (their pods started after busy_since - 1 s)
    assert busy_since - timedelta(seconds=5) + timedelta(seconds=SHORT_S) <= start
    assert start <= datetime.now(UTC) + timedelta(seconds=SHORT_S)
    # tessera nodes shows it, from the Lease
    [shown] = [r for r in nodes_in_process(e2e)["reservations"] if r["gang"] == GANG_ID]
    assert (shown["domain"], shown["nodes"]) == ("rack-r", list(hold.reservation.nodes))

    # one short job ends too late for the reservation, one in time
    e2e.create_stored(gpu_job("res-late", gpus=4, pool=RESERVE_POOL, time_limit=TOO_LONG_S))
    e2e.create_stored(gpu_job("res-backfill", gpus=4, pool=RESERVE_POOL, time_limit=BACKFILL_S))
    [backfill] = e2e.wait_bound("res-backfill", 1)
    assert backfill.node in RESERVE_NODES

    def refused() -> dict[str, Any] | None:
        answer = why_in_process(e2e, "res-late")
        groups = answer["extender"]
        # kube-scheduler offers only the nodes with 4 GPUs free by its own count (one or
        # both, as the short jobs were packed): each is refused for the reservation
        if groups and set(reasons_by_category(groups[0]["record"])) == {"reserved"}:
            return answer
        return None

    answer = e2e.api.wait(
        "tessera why to say res-late is refused on the reserved rack",
        refused,
        timeout=30,
        describe=lambda: repr(why_in_process(e2e, "res-late")["extender"]),
    )
    record = answer["extender"][0]["record"]
    offered = record["candidates"]
    assert record["fit"] == 0
    assert f"0 of {offered} nodes fit: {offered} reserved for a waiting gang" in answer["verdict"]
    texts = [r["reason"] for r in record["reasons"]]
    assert all(f"is reserved for gang {GANG_ID} from" in text for text in texts), texts
    assert all("this pod's time limit ends" in text for text in texts), texts
    assert all(not p["node"] for p in answer["pods"])
    assert backfilled_pods(e2e) >= backfilled_before + 1

    # the short jobs end: the rack frees and the gang lands there, all four together
    for job in ("res-short-1", "res-short-2", "res-backfill"):
        e2e.finish(job)
    placed = e2e.wait_bound(GANG, 4, timeout=40)
    assert sorted(p.node for p in placed) == sorted([*RESERVE_NODES, *RESERVE_NODES])
    assert gpu_conflicts(e2e.all_placements(), e2e.fleet) == []
    # started: its reservation is released (the Lease deleted at the next plan)
    e2e.api.wait(
        f"the reservation of {GANG_ID} to be released",
        lambda: True if held(e2e) is None else None,
        timeout=40,
    )
    # the job that ends too late never started there
    assert all(not p.node for p in e2e.placements("res-late"))


def test_a_gang_requeued_by_kueue_keeps_its_reservation_while_its_pods_are_gone(
    scheduling: E2ECluster,
) -> None:
    """Kueue's ``waitForPodsReady`` evicts a gang whose pods are not ready in time and
    requeues it: its pods are deleted (the extender cannot tell that from a deletion) and
    made again when Kueue admits it after its backoff. The reservation stays through it
    (``--requeue-grace``, 180 s) with the gang's place in the order (the Lease's
    ``since``), and the rack still refuses a job that ends too late. Runs last in this
    file: the Lease outlives the test by the grace."""
    e2e = scheduling
    for job in ("rq-short-1", "rq-short-2"):
        e2e.create_stored(gpu_job(job, gpus=4, pool=RESERVE_POOL, time_limit=SHORT_S))
    for job in ("rq-short-1", "rq-short-2"):
        e2e.wait_bound(job, 1)
    gang, gang_id = "rq-gang", f"{NAMESPACE}.rq-gang"
    e2e.create_stored(gpu_job(gang, pods=4, gpus=4, pool=RESERVE_POOL, annotations=RACK))
    e2e.wait_admitted(gang)
    first = e2e.api.wait(
        f"the extender to record a reservation for gang {gang_id}",
        lambda: held(e2e, gang_id),
        timeout=30,
        describe=lambda: e2e.describe_pods(gang),
    )

    evicted = e2e.api.wait(
        "Kueue to evict the gang whose pods never became ready",
        lambda: true_condition(e2e.workload(gang), "Evicted"),
        timeout=WAIT_FOR_PODS_READY_S + 60,
        describe=lambda: e2e.describe_pods(gang),
    )
    assert evicted["reason"] == "PodsReadyTimeout", evicted
    evicted_at = parse_rfc3339(evicted["lastTransitionTime"])

    def recreated() -> bool | None:
        pods = e2e.pods(gang)
        made = [parse_rfc3339(p["metadata"]["creationTimestamp"]) for p in pods]
        return True if made and min(made) >= evicted_at else None

    # Kueue deletes the pods and, after its backoff, admits the gang again: new pods
    e2e.api.wait(f"Kueue to admit {gang} again, with new pods", recreated,
                 timeout=60, describe=lambda: e2e.describe_pods(gang))  # fmt: skip

    # the rack is still held for it, from when it first waited: a hold dropped while
    # its pods were gone and made again would date from the new pods
    e2e.create_stored(gpu_job("rq-late", gpus=4, pool=RESERVE_POOL, time_limit=TOO_LONG_S))
    refused = e2e.wait_scheduling_failure("rq-late")
    assert f"is reserved for gang {gang_id}" in refused, refused
    kept = held(e2e, gang_id)
    assert kept is not None, "the reservation was released while its gang was requeued"
    assert kept.reservation.nodes == first.reservation.nodes
    assert kept.since == first.since
    assert all(not p.node for p in e2e.placements("rq-late"))
