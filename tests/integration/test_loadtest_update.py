"""Kueue's unsuspend goes through the webhook as an UPDATE review, as in a cluster: the
simulated cluster against a recording webhook and a permissive extender on real sockets
(127.0.0.1, port 0), the extender watching nothing (its answers are fixed)."""

from __future__ import annotations

import base64
import random
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cluster import jsonio, labels
from cluster.clock import SystemClock
from loadtest.inputs import fleet
from loadtest.report import page, summary, terminal
from loadtest.sim import objects, scenario
from loadtest.sim.apiserver import MiniApiServer
from loadtest.sim.cluster_sim import ClusterSim
from loadtest.sim.targets import Target, Targets
from tests.processes import serve_app

Obj = dict[str, Any]


class Recorder:
    """The webhook's side: suspends on CREATE like ours, then allows or denies UPDATEs."""

    def __init__(self, *, deny_updates: bool) -> None:
        self.deny_updates = deny_updates
        self.requests: list[Obj] = []

    async def mutate(self, request: web.Request) -> web.Response:
        review = jsonio.loads(await request.read())["request"]
        self.requests.append(review)
        response: Obj = {"uid": review["uid"], "allowed": True}
        if review["operation"] == "CREATE":
            ops = [{"op": "add", "path": "/spec/suspend", "value": True}]
            response.update(
                patchType="JSONPatch", patch=base64.b64encode(jsonio.dumps(ops)).decode()
            )
        elif self.deny_updates:
            response.update(
                allowed=False,
                status={"code": 422, "message": "label kueue.x-k8s.io/queue-name cannot change"},
            )
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        return web.json_response({**body, "response": response})


async def filter_all(request: web.Request) -> web.Response:
    args = jsonio.loads(await request.read())
    return web.json_response({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})


async def prioritize(request: web.Request) -> web.Response:
    return web.json_response([])


async def bind(request: web.Request) -> web.Response:
    return web.json_response({"Error": ""})


async def run_one_job(recorder: Recorder) -> ClusterSim:
    hook = web.Application()
    hook.router.add_post("/mutate", recorder.mutate)
    ext = web.Application()
    ext.router.add_post("/filter", filter_all)
    ext.router.add_post("/prioritize", prioritize)
    ext.router.add_post("/bind", bind)
    nodes = fleet.hgx_fleet(
        fleet.FleetSpec(nodes=2), datetime(2026, 1, 1, tzinfo=UTC), random.Random(1)
    )
    policy = scenario.example_policy()
    job = fleet.JobSpec(0.0, fleet.job_object("j1", fleet.TEAMS[0]), 0.05, "1-gpu")
    async with (
        serve_app(hook) as hook_url,
        serve_app(ext) as ext_url,
        aiohttp.ClientSession() as hook_session,
        aiohttp.ClientSession() as ext_session,
        MiniApiServer() as api,
    ):
        targets = Targets(
            Target("webhook", hook_url, hook_session),
            Target("extender", ext_url, ext_session),
            local=False,
        )
        sim = ClusterSim(targets, api, nodes, policy, [job], clock=SystemClock(), drain_s=5.0)
        await sim.run()
        return sim


async def test_an_admitted_job_is_unsuspended_through_an_update_review() -> None:
    recorder = Recorder(deny_updates=False)
    sim = await run_one_job(recorder)
    create, update = recorder.requests
    assert (create["operation"], update["operation"]) == ("CREATE", "UPDATE")
    assert update["options"]["kind"] == "UpdateOptions"
    assert create["oldObject"] is None
    assert update["uid"] != create["uid"]
    # oldObject: the Job as stored after the CREATE patch; object: Kueue's write to it.
    assert update["oldObject"]["spec"]["suspend"] is True
    assert update["object"]["spec"]["suspend"] is False
    node_selector = update["object"]["spec"]["template"]["spec"]["nodeSelector"]
    flavor = sim.setup.flavors[sim.result.jobs["j1"].flavor]
    assert node_selector == dict(flavor.node_labels)
    assert node_selector[labels.GFD_PRODUCT]
    # Then the pod ran, and the update is its own verb in the run's numbers.
    result = sim.result
    assert result.jobs["j1"].admitted_s is not None
    assert result.jobs["j1"].finished_s is not None
    assert len(result.latencies["update"]) == 1
    assert len(result.latencies["mutate"]) == 1
    assert result.errors == {}
    data = summary.to_json(result, {}, 1000)
    assert data["latency_s"]["update"]["count"] == 1
    assert any(line.lstrip().startswith("update ") for line in terminal.summary_lines(result, data))
    assert "update" in page.html_page(result, data, "t")


async def test_a_denied_update_leaves_the_job_suspended_and_is_an_error() -> None:
    sim = await run_one_job(Recorder(deny_updates=True))
    result = sim.result
    assert list(result.errors) == [
        "update:denied 422: label kueue.x-k8s.io/queue-name cannot change"
    ]
    job = result.jobs["j1"]
    assert job.admitted_s is None
    assert job.pods == []
    assert all(used == 0 for used in sim.book.used.values())  # the quota was given back
    data = summary.to_json(result, {}, 1000)
    lines = terminal.summary_lines(result, data)
    assert any("1 refused or failed" in line for line in lines)
    assert data["errors"] == {"update:denied 422: label kueue.x-k8s.io/queue-name cannot change": 1}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_reviews_carry_the_stored_object_only_for_updates(operation: str) -> None:
    job = fleet.job_object("j", fleet.TEAMS[0])
    wrong = job if operation == "CREATE" else None
    with pytest.raises(ValueError, match="UPDATE review carries the stored object"):
        objects.admission_review(job, "u", operation=operation, old=wrong)
