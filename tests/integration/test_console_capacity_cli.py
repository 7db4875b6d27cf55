"""``tessera capacity`` as an operator runs it: on a cluster file and against a (fake)
kube-apiserver over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from tests.console_cluster import example_objects, why_objects, write_cluster_file
from tests.fakeapi import FakeApiServer
from tests.integration.test_console_cli import PLURAL, TOKEN, console, tessera

H100 = "NVIDIA-H100-80GB-HBM3"


def test_capacity_of_a_file_says_what_each_queue_s_waiting_work_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_cluster_file(tmp_path / "cluster.json")
    out, _ = tessera(capsys, "capacity", "--cluster-file", str(path), "-o", "json")
    shown = jsonio.loads(out)
    flavors = {f["flavor"]: f for f in shown["flavors"]}
    assert {
        k: flavors["h100-reserved"][k]
        for k in ("nodes", "gpus_total", "gpus_healthy", "gpus_free", "gpus_nominal")
    } == {"nodes": 5, "gpus_total": 40, "gpus_healthy": 39, "gpus_free": 27, "gpus_nominal": 40}
    nlp = {q["name"]: q for q in shown["cluster_queues"]}["nlp"]
    assert nlp["flavors"] == [
        {
            "flavor": "h100-reserved",
            "gpus_nominal": 24,
            "gpus_used": 32,
            "gpus_borrowed": 8,
            "gpus_quota_room": 8,
        }
    ]
    assert (nlp["needs"], nlp["gpus_blocked_by_fragmentation"], nlp["gpus_waiting_turn"]) == (
        "nodes",
        16,
        8,
    )
    # job-big (2 x 8 GPUs): one 8-GPU slot is open (gpu-r2-1 drains, gpu-r1-2 has a bad
    # GPU, gpu-r1-1 has four free): one node more, and 8 GPUs more quota than nlp has room
    big = {w["name"]: w for w in shown["waiting"]}["job-big"]
    assert (big["blocked_by"], big["quota_short_gpus"]) == ("fragmentation", 8)
    assert big["needs"]["nodes_needed"] == 1
    assert big["needs"]["summary"] == f"needs 1 more node of {H100}"
    assert shown["recommendations"][0].startswith(
        "ClusterQueue nlp: 1 workload(s) asking 16 GPUs do not fit the free GPUs of "
        f"h100-reserved: needs 1 more node of {H100}"
    )

    table, _ = tessera(capsys, "capacity", "--cluster-file", str(path))
    lines = table.splitlines()
    assert lines[0].split() == [
        "FLAVOR",
        "PRODUCT",
        "NODES",
        "GPUS",
        "HEALTHY",
        "FREE",
        "NOMINAL",
        "QUEUES",
    ]
    assert lines[1].split() == ["h100-reserved", H100, "5", "40", "39", "27", "40", "cv,nlp"]
    row = next(line for line in lines if line.startswith("nlp "))
    assert row.split() == [
        "nlp",
        "research",
        "h100-reserved",
        "24",
        "32",
        "8",
        "8",
        "2",
        "24",
        "0",
        "16",
        "nodes",
    ]
    assert any(line.startswith("team-nlp/job-big ") and "fragmentation" in line for line in lines)
    assert lines[-2].startswith("* ClusterQueue nlp: 1 workload(s) asking 16 GPUs")


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        for obj in example_objects():
            stored: dict[str, Any] = {
                k: v for k, v in obj.items() if k not in ("kind", "apiVersion")
            }
            server.put(PLURAL[obj["kind"]], stored)
        yield server


async def test_capacity_reads_the_live_cluster(api: FakeApiServer, tmp_path: Path) -> None:
    shown = jsonio.loads((await console(api, tmp_path, "capacity", "-o", "json")).text)
    assert [q["name"] for q in shown["cluster_queues"]] == ["cv", "nlp"]
    assert {w["name"]: w["blocked_by"] for w in shown["waiting"]} == {
        "job-big": "fragmentation",
        "job-next": "turn",
    }
    lists = {r.path for r in api.requests_of("list")}
    assert {"/api/v1/nodes", "/api/v1/pods", "/apis/kueue.x-k8s.io/v1beta2/workloads"} <= lists
    assert not api.requests_of("patch")
    assert not api.requests_of("post")


QUOTA = {
    "metadata": {"name": "gpus", "namespace": "team-nlp"},
    "spec": {"hard": {"requests.nvidia.com/gpu": "16"}},
    "status": {
        "hard": {"requests.nvidia.com/gpu": "16"},
        "used": {"requests.nvidia.com/gpu": "16"},
    },
}


async def test_queues_and_capacity_name_a_namespace_quota_below_the_queue(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("/api/v1/resourcequotas", QUOTA)
    queues = jsonio.loads((await console(api, tmp_path, "queues", "-o", "json")).text)
    assert queues["resource_quotas"] == [
        {
            "namespace": "team-nlp",
            "name": "gpus",
            "resource": "requests.nvidia.com/gpu",
            "hard": 16,
            "used": 16,
        }
    ]
    # nlp's nominal is 24; job-train (32 GPUs) could never have its pods created
    assert queues["resource_quota_conflicts"][0].startswith(
        "ResourceQuota team-nlp/gpus allows 16 GPUs (requests.nvidia.com/gpu), below "
        "ClusterQueue nlp's nominal 24"
    )
    assert any(
        c.startswith("workload team-nlp/job-train asks 32 GPUs")
        for c in queues["resource_quota_conflicts"]
    )
    table = (await console(api, tmp_path, "queues")).text
    assert "\nRESOURCEQUOTA CONFLICTS\n* ResourceQuota team-nlp/gpus allows 16 GPUs" in table
    capacity = (await console(api, tmp_path, "capacity")).text
    assert "\nRESOURCEQUOTA CONFLICTS\n* ResourceQuota team-nlp/gpus allows 16 GPUs" in capacity


async def test_why_says_when_a_namespace_quota_refuses_an_admitted_job_s_pods(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.put("/api/v1/resourcequotas", QUOTA)
    for obj in why_objects():
        # the job controller made two of llm's three pods before the quota refused it
        if obj["metadata"]["name"] != "llm-2":
            api.put(
                PLURAL[obj["kind"]],
                {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")},
            )
    shown = await console(
        api, tmp_path, "why", "job/llm", "-n", "team-nlp", "--extender", "none", "-o", "json"
    )
    verdict = jsonio.loads(shown.text)["verdict"]
    assert verdict.endswith(
        "; ResourceQuota team-nlp/gpus: 16 of 16 GPUs used (requests.nvidia.com/gpu), 8 more "
        "needed: the job controller cannot create the rest of its pods"
    )
    # a Job waiting for Kueue's quota is not blamed on the namespace's
    waiting = await console(
        api, tmp_path, "why", "job/wait", "-n", "team-nlp", "--extender", "none"
    )
    assert "ResourceQuota" not in waiting.text.splitlines()[0]


async def test_why_a_gang_no_rack_can_hold_says_how_many_nodes_it_needs(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """llm's three 8-GPU pods must share a rack: rack r2 of its flavor holds one now
    (gpu-r2-1 drains), so two more nodes there would start it."""
    for obj in why_objects():
        api.put(
            PLURAL[obj["kind"]], {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        )
    shown = await console(api, tmp_path, "why", "job/llm", "-n", "team-nlp", "--extender", "none")
    first = shown.text.splitlines()[0]
    assert first.startswith("job team-nlp/llm: 3 pod(s) not scheduled: 0/7 nodes")
    assert first.endswith(f"; needs 2 more nodes of {H100} in one topology-rack")
    # a job waiting for Kueue's quota is not told to buy nodes
    waiting = await console(
        api, tmp_path, "why", "job/wait", "-n", "team-nlp", "--extender", "none"
    )
    assert "more node" not in waiting.text.splitlines()[0]
