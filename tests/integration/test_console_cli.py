"""``tessera`` as an operator runs it: against a cluster file, and against a (fake)
kube-apiserver over real sockets, where its writes land as a node annotation and an Event.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from cluster import jsonio, labels
from cluster.clock import ManualClock
from cluster.convert.nodes import node_from_json
from cluster.model import GangId, NodeName
from console import annotate
from console.__main__ import build_parser, main, run
from console.output import ConsoleError, Output
from extender.app import create_app
from extender.holds import Hold, lease_of
from extender.reservations import Reservation
from extender.settings import ExtenderSettings, parse_levels
from server.serving import DEBUG_ROUTES, EXPOSITION, metrics_app, running
from tests.builders import BLOCK_LABEL, RACK_LABEL, pod_json
from tests.console_cluster import NOW, example_objects, why_objects, write_cluster_file
from tests.fakeapi import FakeApiServer, write_kubeconfig

TOKEN = "console-token"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
PLURAL = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
    "ResourceFlavor": f"{KUEUE}/resourceflavors",
    "Topology": f"{KUEUE}/topologies",
    "ClusterQueue": f"{KUEUE}/clusterqueues",
    "LocalQueue": f"{KUEUE}/localqueues",
    "Workload": f"{KUEUE}/workloads",
    "Job": "/apis/batch/v1/jobs",
    "Event": "/api/v1/events",
}
SCRIPT = """#!/bin/bash
#SBATCH -J pretrain
#SBATCH -p gpu
#SBATCH -N 2
#SBATCH --gres=gpu:8
#SBATCH -t 2:00:00
srun python train.py
"""


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cluster_file(tmp_path_factory.mktemp("console") / "cluster.json")


def tessera(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    assert main(list(args), environ={}, clock=ManualClock(NOW)) == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out, captured.err


# ---------------------------------------------------------------- a cluster file


def test_nodes_json_has_the_shape_scripts_rely_on(
    cluster_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = tessera(capsys, "nodes", "--cluster-file", str(cluster_file), "-o", "json")
    shown = jsonio.loads(out)
    by_name = {n["name"]: n for n in shown["nodes"]}
    assert len(by_name) == 7
    assert {
        k: by_name["gpu-r1-1"][k]
        for k in ("gpus_total", "gpus_allocated", "gpus_free", "gpus_unhealthy")
    } == {"gpus_total": 8, "gpus_allocated": 4, "gpus_free": 4, "gpus_unhealthy": 0}
    assert by_name["gpu-r1-2"]["gpus_unhealthy"] == 1
    assert by_name["gpu-r3-0"]["flavors"] == ["h100-spot"]
    assert shown["totals"]["gpus_free"] == sum(n["gpus_free"] for n in shown["nodes"]) == 40
    assert shown["draining"][0]["node"] == "gpu-r2-1"
    assert shown["draining"][0]["in_s"] == 7200
    assert by_name["gpu-r2-1"]["drain_after"] == "2026-01-01T08:00:00Z"


def test_nodes_table_groups_by_product_flavor_block_and_rack(
    cluster_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = tessera(capsys, "nodes", "--cluster-file", str(cluster_file))
    lines = out.splitlines()
    assert lines[0].split() == [
        "PRODUCT",
        "FLAVOR",
        "TOPOLOGY-BLOCK",
        "TOPOLOGY-RACK",
        "NODES",
        "GPUS",
        "ALLOC",
        "FREE",
        "UNHEALTHY",
        "ISLANDS-FREE",
        "GANG8",
        "DRAINING",
    ]
    assert lines[1].split() == [
        "NVIDIA-H100-80GB-HBM3",
        "h100-reserved",
        "b1",
        "r1",
        "3",
        "24",
        "12",
        "11",
        "1",
        "2",
        "0",
        "0",
    ]
    assert "gpu-r2-1  2026-01-01T08:00:00Z  2h" in out


def test_one_node_gpu_by_gpu(cluster_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = tessera(capsys, "nodes", "--cluster-file", str(cluster_file), "--node", "gpu-r3-0")
    assert "team-cv/notebook-0    500" in out
    _, err = tessera(capsys, "nodes", "--cluster-file", str(cluster_file), "--node", "nope", code=1)
    assert err == "tessera: no GPU node named 'nope'\n"


def test_queues_from_a_file(cluster_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = tessera(capsys, "queues", "--cluster-file", str(cluster_file), "-o", "json")
    shown = jsonio.loads(out)
    nlp = {q["name"]: q for q in shown["cluster_queues"]}["nlp"]
    assert (nlp["pending"], nlp["admitted"], nlp["gpus_pending"]) == (2, 1, 24)
    assert (nlp["gpus_nominal"], nlp["gpus_borrowed"], nlp["oldest_pending_wait_s"]) == (
        24,
        8,
        3 * 3600,
    )
    table, _ = tessera(capsys, "queues", "--cluster-file", str(cluster_file))
    assert table.splitlines()[0].startswith("CLUSTERQUEUE  COHORT")


def test_writes_against_a_file_are_checked_and_printed_but_write_nothing(
    cluster_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = cluster_file.read_bytes()
    out, err = tessera(
        capsys, "gpu-health", "gpu-r1-0", "--unhealthy", "2", "--cluster-file", str(cluster_file)
    )
    assert out == "node/gpu-r1-0: GPU 2 marked unhealthy: no new pod is given them (dry run)\n"
    assert "read-only" in err
    _, err = tessera(
        capsys,
        "gpu-health",
        "gpu-r1-0",
        "--unhealthy",
        "8",
        "--cluster-file",
        str(cluster_file),
        code=1,
    )
    assert "has no GPU 8" in err
    _, err = tessera(capsys, "undrain", "gpu-r1-0", "--cluster-file", str(cluster_file), code=1)
    assert "has no tessera.dev/drain-after" in err
    assert cluster_file.read_bytes() == before


def test_sbatch_dry_run_prints_the_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text(SCRIPT)
    out, _ = tessera(
        capsys,
        "sbatch",
        str(script),
        "--dry-run",
        "-o",
        "yaml",
        "--image",
        "img:1",
        "--queue-map",
        "gpu=training",
        "-n",
        "team-nlp",
    )
    job = yaml.safe_load(out)
    assert job["metadata"]["labels"] == {labels.QUEUE_NAME: "training"}
    assert job["spec"]["completionMode"] == "Indexed"
    # the script reads back exactly as written, kept as a literal block
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][2] == SCRIPT
    assert "- |\n" in out
    script.write_text("#SBATCH --exclusive\n")
    _, err = tessera(capsys, "sbatch", str(script), "--dry-run", "--image", "i", code=1)
    assert "#SBATCH --exclusive is not supported" in err


def test_a_missing_cluster_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    _, err = tessera(capsys, "nodes", "--cluster-file", "/nonexistent.yaml", code=1)
    assert err.startswith("tessera: /nonexistent.yaml: cannot read")


# ---------------------------------------------------------------- a kube-apiserver


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        for obj in example_objects():
            stored: dict[str, Any] = dict(obj)
            # the API leaves kind and apiVersion off a list's items
            stored.pop("kind")
            stored.pop("apiVersion")
            server.put(PLURAL[obj["kind"]], stored)
        yield server


async def console(api: FakeApiServer, folder: Path, *args: str) -> Output:
    kubeconfig = write_kubeconfig(folder, api, "operator")
    env = {"KUBECONFIG": str(kubeconfig)}
    parsed = build_parser(env).parse_args(list(args))
    return await run(parsed, env, ManualClock(NOW))


async def test_nodes_and_queues_read_the_live_cluster(api: FakeApiServer, tmp_path: Path) -> None:
    nodes = jsonio.loads((await console(api, tmp_path, "nodes", "-o", "json")).text)
    assert sum(n["gpus_allocated"] for n in nodes["nodes"]) == 15
    assert nodes["levels"] == ["topology-block", "topology-rack"]
    queues = jsonio.loads((await console(api, tmp_path, "queues", "-o", "json")).text)
    assert [q["name"] for q in queues["cluster_queues"]] == ["cv", "nlp"]
    lists = {r.path for r in api.requests_of("list")}
    assert "/api/v1/pods" in lists
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in api.requests)


async def test_drain_writes_the_annotation_the_extender_reads_and_an_event(
    api: FakeApiServer, tmp_path: Path
) -> None:
    shown = await console(
        api, tmp_path, "drain", "gpu-r1-0", "--at", "+2h", "--reason", "driver 570"
    )
    assert shown.text.startswith("node/gpu-r1-0: drain after 2026-01-01T08:00:00Z")
    node = api.objects("/api/v1/nodes")["gpu-r1-0"]
    assert node["metadata"]["annotations"][labels.DRAIN_AFTER] == "2026-01-01T08:00:00Z"
    assert node_from_json(node).drain_after == NOW.replace(hour=8)
    (event,) = api.objects("/api/v1/events").values()
    assert event["involvedObject"]["name"] == "gpu-r1-0"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert (event["reason"], event["type"]) == (annotate.REASON_DRAIN, "Normal")
    assert "driver 570" in event["message"]
    (patch,) = api.requests_of("patch")
    assert patch.headers["Content-Type"] == "application/merge-patch+json"

    await console(api, tmp_path, "undrain", "gpu-r1-0")
    node = api.objects("/api/v1/nodes")["gpu-r1-0"]
    assert labels.DRAIN_AFTER not in node["metadata"]["annotations"]
    assert sorted(e["reason"] for e in api.objects("/api/v1/events").values()) == [
        annotate.REASON_DRAIN,
        annotate.REASON_UNDRAIN,
    ]


async def test_gpu_health_marks_gpus_and_refuses_ones_the_node_lacks(
    api: FakeApiServer, tmp_path: Path
) -> None:
    await console(
        api, tmp_path, "gpu-health", "gpu-r2-0", "--unhealthy", "3,5", "--reason", "XID 79"
    )
    node = api.objects("/api/v1/nodes")["gpu-r2-0"]
    assert node["metadata"]["annotations"][labels.UNHEALTHY_GPUS] == "3,5"
    assert [g.index for g in node_from_json(node).gpus if not g.healthy] == [3, 5]
    (event,) = api.objects("/api/v1/events").values()
    assert (event["reason"], event["type"]) == (annotate.REASON_GPU_HEALTH, "Warning")

    with pytest.raises(ConsoleError, match="has no GPU 9"):
        await console(api, tmp_path, "gpu-health", "gpu-r2-0", "--unhealthy", "9")
    with pytest.raises(ConsoleError, match="no node named 'gone'"):
        await console(api, tmp_path, "drain", "gone", "--at", "now")
    assert len(api.requests_of("patch")) == 1


async def test_dry_run_writes_nothing(api: FakeApiServer, tmp_path: Path) -> None:
    shown = await console(
        api, tmp_path, "drain", "gpu-r1-0", "--at", "now", "--dry-run", "-o", "json"
    )
    assert jsonio.loads(shown.text)["dry_run"] is True
    assert api.requests_of("patch") == api.requests_of("post") == []


async def test_sbatch_creates_the_job_through_the_api(api: FakeApiServer, tmp_path: Path) -> None:
    script = tmp_path / "pretrain.sbatch"
    script.write_text(SCRIPT)
    shown = await console(
        api,
        tmp_path,
        "sbatch",
        str(script),
        "--image",
        "img:1",
        "--queue-map",
        "gpu=training",
        "-n",
        "team-nlp",
    )
    assert shown.text.splitlines()[0] == "job.batch/pretrain created"
    job = api.objects("/apis/batch/v1/jobs")["team-nlp/pretrain"]
    assert job["metadata"]["labels"][labels.QUEUE_NAME] == "training"
    assert (job["spec"]["parallelism"], job["spec"]["activeDeadlineSeconds"]) == (2, 7200)


# ---------------------------------------------------------------- tessera why


LEVELS = f"topology-block={BLOCK_LABEL},topology-rack={RACK_LABEL},hostname=kubernetes.io/hostname"


@pytest.fixture
async def why_api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(token=TOKEN) as server:
        for obj in [*example_objects(), *why_objects()]:
            stored: dict[str, Any] = dict(obj)
            stored.pop("kind")
            stored.pop("apiVersion")
            server.put(PLURAL[obj["kind"]], stored)
        yield server


@contextlib.asynccontextmanager
async def extender_of(folder: Path) -> AsyncIterator[tuple[str, str]]:
    """An extender on the same cluster (a file of it), serving and with its metrics
    listener: (serving URL, metrics URL)."""
    path = folder / "extender-cluster.json"
    items = [*example_objects(), *why_objects()]
    path.write_bytes(jsonio.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    settings = ExtenderSettings(cluster_file=path, topology_levels=parse_levels(LEVELS))
    clock = ManualClock(NOW.replace(minute=0, hour=6) - dt.timedelta(seconds=20))
    app = create_app(settings, clock=clock)
    async with (
        running(app, "127.0.0.1", 0) as port,
        running(
            metrics_app(app[EXPOSITION], clock, app.get(DEBUG_ROUTES)), "127.0.0.1", 0
        ) as mport,
    ):
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}"


async def filter_llm(url: str, index: int) -> None:
    """kube-scheduler's /filter of pod llm-INDEX over every node, as it sends it."""
    (pod,) = [o for o in why_objects() if o["metadata"]["name"] == f"llm-{index}"]
    nodes = [o["metadata"]["name"] for o in example_objects() if o["kind"] == "Node"]
    body = jsonio.dumps({"Pod": pod, "NodeNames": nodes})
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
        ) as got,
    ):
        assert got.status == 200
        assert jsonio.loads(await got.read())["NodeNames"] == []


async def test_why_a_gang_waits_names_the_scheduler_s_reasons_node_by_node(
    why_api: FakeApiServer, tmp_path: Path
) -> None:
    async with extender_of(tmp_path) as (url, metrics):
        for index in range(3):
            await filter_llm(url, index)
        shown = await console(
            why_api,
            tmp_path,
            "why",
            "job/llm",
            "-n",
            "team-nlp",
            "--extender",
            metrics,
            "-o",
            "json",
        )
        text = await console(
            why_api, tmp_path, "why", "llm", "-n", "team-nlp", "--extender", metrics
        )
    answer = jsonio.loads(shown.text)
    assert answer["verdict"].startswith(
        "3 pod(s) not scheduled: needs 8 GPUs, as one of gang team-nlp.llm"
    )
    assert answer["workload"]["name"] == "job-llm-5c2d1"
    assert [c["type"] for c in answer["workload"]["conditions"]] == ["QuotaReserved", "Admitted"]
    assert {m["key"]: m["value"] for m in answer["webhook"]}["tessera.dev/gang"] == "team-nlp.llm"
    (seen,) = answer["extender"]
    assert seen["pods"] == ["llm-0", "llm-1", "llm-2"]
    record = seen["record"]
    assert (record["candidates"], record["fit"]) == (7, 0)
    by_category: dict[str, int] = {}
    for reason in record["reasons"]:
        by_category[reason["category"]] = by_category.get(reason["category"], 0) + reason["nodes"]
    assert by_category == {"gang_room": 5, "maintenance": 1, "too_few_gpus": 1}
    assert answer["events"][0]["reason"] == "FailedScheduling"
    lines = text.text.splitlines()
    assert lines[0].startswith("job team-nlp/llm: 3 pod(s) not scheduled: needs 8 GPUs")
    assert "0 of 7 nodes fit: 5 in a topology-rack without room for the gang" in lines[0]
    assert any(line.startswith("NODES  PREEMPTION  REASON") for line in lines)


async def test_why_a_job_waiting_for_quota_says_so_and_asks_no_extender(
    why_api: FakeApiServer, tmp_path: Path
) -> None:
    shown = await console(why_api, tmp_path, "why", "job/wait", "-n", "team-nlp", "-o", "json")
    answer = jsonio.loads(shown.text)
    assert answer["verdict"] == (
        "waiting for quota in ClusterQueue nlp: couldn't assign flavors to pod set main: "
        "insufficient unused quota for nvidia.com/gpu in flavor h100-reserved, 16 more needed"
    )
    assert answer["workload"]["quota"]["cluster_queue"] == "nlp"
    assert answer["workload"]["quota"]["gpus_nominal"] == 24
    assert {m["key"]: m["value"] for m in answer["webhook"]}["spec.suspend"] == "true"
    assert answer["pods"] == answer["extender"] == []
    # no pods to ask about: the extender pods are not even listed
    assert not [r for r in why_api.requests if "proxy" in r.path]
    with pytest.raises(ConsoleError, match="no job named 'nope'"):
        await console(why_api, tmp_path, "why", "job/nope", "-n", "team-nlp")


async def test_why_asks_every_extender_replica_through_the_api_server(
    why_api: FakeApiServer, tmp_path: Path
) -> None:
    """The default --extender: the scheduler pods in tessera-system, through the pod
    proxy; an unreachable one is a note, the rest of the answer stands."""
    replica = pod_json("tessera-scheduler-a", "tessera-system", phase="Running")
    replica["metadata"]["labels"] = {"app.kubernetes.io/name": "tessera-scheduler"}
    stored = {k: v for k, v in replica.items() if k not in ("kind", "apiVersion")}
    why_api.put("/api/v1/pods", stored)
    shown = await console(why_api, tmp_path, "why", "pod/llm-0", "-n", "team-nlp")
    (asked,) = [r for r in why_api.requests if "proxy" in r.path]
    assert asked.path == (
        "/api/v1/namespaces/tessera-system/pods/tessera-scheduler-a:8889/proxy/debug/reasons"
    )
    # a pod of a Job is explained with its Job: every pod of it not placed is asked for
    assert asked.query["pod"] == "team-nlp/llm-0,team-nlp/llm-1,team-nlp/llm-2"
    assert any("pod tessera-system/tessera-scheduler-a" in note for note in shown.notes)
    assert shown.text.startswith("pod team-nlp/llm-0: 3 pod(s) not scheduled: 0/7 nodes")


# ---------------------------------------------------------------- tessera upgrade-plan

H100 = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"


def test_upgrade_plan_of_a_file_orders_nodes_by_when_their_jobs_end(
    cluster_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_args = ("upgrade-plan", "--cluster-file", str(cluster_file), "-l", H100, "--keep", "50%")
    out, err = tessera(capsys, *plan_args, "-o", "json")
    plan = jsonio.loads(out)
    assert [(w["start"], w["nodes"]) for w in plan["waves"]] == [
        ("2026-01-01T06:00:00Z", ["gpu-r1-2", "gpu-r2-0", "gpu-r3-1"]),
        # small-0 ends at 07:00 and train-0 at 08:00: their nodes wait
        ("2026-01-01T08:00:00Z", ["gpu-r2-1", "gpu-r1-1"]),
        ("2026-01-01T10:00:00Z", ["gpu-r1-0"]),
        # the notebook on gpu-r3-0 has no time limit: last, and said so
        ("2026-01-01T12:00:00Z", ["gpu-r3-0"]),
    ]
    assert [w["start_known"] for w in plan["waves"]] == [True, True, True, False]
    first = plan["waves"][0]
    assert first["gpus_out"] == 24
    assert [(k["pool"], k["gpus_kept"], k["gpus_total"]) for k in first["kept"]] == [
        ("flavor h100-reserved", 24, 40),
        ("flavor h100-spot", 8, 16),
    ]
    nodes = {n["name"]: n for n in plan["nodes"]}
    assert nodes["gpu-r1-0"]["jobs_end"] == "2026-01-01T08:00:00Z"
    assert nodes["gpu-r3-0"]["jobs_end"] is None
    assert nodes["gpu-r3-0"]["pods_without_time_limit"] == ["team-cv/notebook-0"]
    assert plan["done_by"] is None
    assert (plan["applied"], plan["writes"]) == (False, [])
    assert "team-cv/notebook-0 has no time limit" in err

    table, _ = tessera(capsys, *plan_args)
    lines = table.splitlines()
    assert lines[0] == (
        f"upgrade plan for {H100}: 7 nodes in 4 waves of 2h, each keeping at least 50% of "
        "every pool's GPUs schedulable; the last wave waits for jobs without a time limit"
    )
    assert lines[2].split()[:6] == ["WAVE", "START", "IN", "NODES", "GPUS-OUT", "KEPT"]
    assert lines[3].split()[:6] == [
        "1",
        "2026-01-01T06:00:00Z",
        "now",
        "gpu-r1-2,",
        "gpu-r2-0,",
        "gpu-r3-1",
    ]
    assert "flavor h100-reserved 60% (24/40), flavor h100-spot 50% (8/16)" in lines[3]
    assert lines[6].split()[:4] == ["4", "2026-01-01T12:00:00Z", "6h", "*"]
    assert "gpu-r1-0  flavor h100-reserved     8         1  2026-01-01T08:00:00Z" in table
    assert lines[-1].startswith("nothing written: --apply sets each node's")


def test_upgrade_plan_of_a_file_writes_nothing_and_refuses_what_cannot_keep_the_share(
    cluster_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = cluster_file.read_bytes()
    out, err = tessera(
        capsys,
        "upgrade-plan",
        "--cluster-file",
        str(cluster_file),
        "-l",
        "example.com/capacity=reserved,!example.com/none",
        "--keep",
        "0.5",
        "--apply",
        "-o",
        "json",
    )
    assert jsonio.loads(out)["applied"] is False
    assert "read-only" in err
    assert cluster_file.read_bytes() == before
    # a spot node holds half of its flavor's GPUs: 80% cannot be kept with it out
    _, err = tessera(
        capsys, "upgrade-plan", "--cluster-file", str(cluster_file), "-l", H100, code=1
    )
    assert err == (
        "tessera: node gpu-r1-0 cannot go out even alone: flavor h100-reserved would keep 31 "
        "of its 40 GPUs schedulable (77.5%), below --keep 80% (1 of them unhealthy or cordoned "
        "already); 5 more nodes the same: lower --keep or upgrade them by hand "
        f"(--selector {H100})\n"
    )
    _, err = tessera(
        capsys, "upgrade-plan", "--cluster-file", str(cluster_file), "-l", "a=b", code=1
    )
    assert err == "tessera: no GPU node matches the selector (--selector a=b)\n"
    _, err = tessera(
        capsys,
        "upgrade-plan",
        "--cluster-file",
        str(cluster_file),
        "-l",
        H100,
        "--keep",
        "100%",
        code=1,
    )
    assert "leaves none to upgrade" in err


async def test_upgrade_plan_applied_sets_each_wave_s_drain_after_with_an_event(
    api: FakeApiServer, tmp_path: Path
) -> None:
    shown = await console(
        api,
        tmp_path,
        "upgrade-plan",
        "--selector",
        "example.com/capacity=reserved",
        "--window",
        "90m",
        "--keep",
        "50%",
        "--not-before",
        "+1h",
        "--reason",
        "driver 570",
        "--apply",
        "-o",
        "json",
    )
    plan = jsonio.loads(shown.text)
    assert plan["applied"] is True
    starts = {n: w["start"] for w in plan["waves"] for n in w["nodes"]}
    assert starts == {
        "gpu-r1-2": "2026-01-01T07:00:00Z",
        "gpu-r2-0": "2026-01-01T07:00:00Z",
        "gpu-r1-1": "2026-01-01T08:30:00Z",
        "gpu-r2-1": "2026-01-01T08:30:00Z",
        "gpu-r1-0": "2026-01-01T10:00:00Z",
    }
    stored = api.objects("/api/v1/nodes")
    for name, start in starts.items():
        assert stored[name]["metadata"]["annotations"][labels.DRAIN_AFTER] == start
        # read back by the extender's own parser
        assert node_from_json(stored[name]).drain_after == dt.datetime.fromisoformat(start)
    assert labels.DRAIN_AFTER not in stored["gpu-r3-0"]["metadata"].get("annotations", {})
    events = {e["involvedObject"]["name"]: e for e in api.objects("/api/v1/events").values()}
    assert set(events) == set(starts)
    assert events["gpu-r1-0"]["reason"] == annotate.REASON_DRAIN
    assert events["gpu-r1-0"]["message"].endswith("(upgrade wave 3 of 3: driver 570)")
    # written wave by wave
    patched = [r.path.rsplit("/", 1)[-1] for r in api.requests_of("patch")]
    assert patched == [n for w in plan["waves"] for n in w["nodes"]]

    # without --apply: the plan alone, nothing written
    before = len(api.requests_of("patch"))
    text = await console(
        api, tmp_path, "upgrade-plan", "-l", "example.com/capacity=reserved", "--keep", "50%"
    )
    assert "nothing written" in text.text
    assert len(api.requests_of("patch")) == before


async def test_nodes_shows_the_reservations_the_extender_recorded(
    api: FakeApiServer, tmp_path: Path
) -> None:
    # as the extender writes it (extender.holds.lease_of), in its namespace
    start = NOW + dt.timedelta(minutes=20)
    reservation = Reservation(
        GangId("nlp.pretrain"), "r1", (NodeName("gpu-r1-1"), NodeName("gpu-r1-2")), start
    )
    lease = lease_of(Hold(reservation, NOW - dt.timedelta(minutes=5), NOW), "tessera-system")
    api.put("/apis/coordination.k8s.io/v1/leases", lease)
    # a Lease of someone else's in the namespace is not a reservation
    api.put(
        "/apis/coordination.k8s.io/v1/leases",
        {"metadata": {"name": "tessera-scheduler", "namespace": "tessera-system"}, "spec": {}},
    )

    shown = jsonio.loads((await console(api, tmp_path, "nodes", "-o", "json")).text)
    assert shown["reservations"] == [
        {
            "gang": "nlp.pretrain",
            "domain": "r1",
            "start": "2026-01-01T06:20:00Z",
            "nodes": ["gpu-r1-1", "gpu-r1-2"],
            "waiting_since": "2026-01-01T05:55:00Z",
        }
    ]
    text = (await console(api, tmp_path, "nodes")).text
    assert text.splitlines()[-2].split() == ["RESERVED-FOR", "DOMAIN", "FROM", "NODES"]
    assert text.splitlines()[-1].split() == [
        "nlp.pretrain",
        "r1",
        "2026-01-01T06:20:00Z",
        "gpu-r1-1,gpu-r1-2",
    ]
    # elsewhere (--reservation-namespace) there are none
    other = await console(
        api, tmp_path, "nodes", "-o", "json", "--reservation-namespace", "elsewhere"
    )
    assert jsonio.loads(other.text)["reservations"] == []
