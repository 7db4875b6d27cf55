"""``sched-perf``'s pure parts: the three scheduler profiles made from the shipped one,
the pods and nodes it creates, the figures (latency, steady throughput, CPU per pod,
ratios within a repeat) and the JSON's shape, the placement read back, and the page."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import labels
from loadtest.inputs.traces import TracePod
from loadtest.report.schedperf_page import schedperf_page
from loadtest.schedperf import command, profiles
from loadtest.schedperf.results import (
    RunRecord,
    bound_per_second,
    latencies_ms,
    placement,
    report,
    steady_throughput,
)
from loadtest.schedperf.workload import (
    BACKGROUND_NAMESPACE,
    background_pods,
    hgx_nodes,
    is_gang_member,
    pod_manifest,
    shapes,
)
from loadtest.stack.fleet import RACK
from tests.unit.test_manifests import scheduler_config as shipped_config
from webhook.rules.placement import gang_affinity

URL = "http://127.0.0.1:9999"


# ---------------------------------------------------------------------- profiles


def test_the_tessera_profile_is_the_shipped_one_pointed_at_the_local_extender() -> None:
    shipped = shipped_config()
    config = profiles.scheduler_config(profiles.TESSERA, shipped, URL)
    assert config["profiles"] == shipped["profiles"]
    assert [e["urlPrefix"] for e in config["extenders"]] == [URL]
    shipped_extender = {k: v for k, v in shipped["extenders"][0].items() if k != "urlPrefix"}
    assert {k: v for k, v in config["extenders"][0].items() if k != "urlPrefix"} == (
        shipped_extender
    )


def test_the_in_tree_profiles_share_the_name_and_client_settings_and_have_no_extender() -> None:
    shipped = {
        **shipped_config(),
        "clientConnection": {"kubeconfig": "", "qps": 200, "burst": 400},
    }
    name = shipped["profiles"][0]["schedulerName"]
    packed = profiles.scheduler_config(profiles.IN_TREE, shipped, URL)
    default = profiles.scheduler_config(profiles.IN_TREE_DEFAULT, shipped, URL)
    tessera = profiles.scheduler_config(profiles.TESSERA, shipped, URL)
    for config in (packed, default, tessera):
        assert config["profiles"][0]["schedulerName"] == name
        assert config["clientConnection"] == {"qps": 200, "burst": 400}
    assert "extenders" not in packed
    assert "extenders" not in default
    assert default["profiles"] == [{"schedulerName": name}]
    (fit,) = packed["profiles"][0]["pluginConfig"]
    assert fit["name"] == "NodeResourcesFit"
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    assert {r["name"] for r in strategy["resources"]} == {
        labels.GPU_RESOURCE,
        labels.GPU_MILLI_RESOURCE,
    }


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        pytest.param(None, None, id="as-shipped-adaptive"),
        pytest.param(30, 30, id="a-share"),
        pytest.param(100, 100, id="every-node"),
        pytest.param(0, None, id="adaptive-left-out"),
    ],
)
def test_nodes_to_score_overrides_the_tessera_profile_only(
    asked: int | None, expected: int | None
) -> None:
    shipped = shipped_config()
    # the manifest as it stands: the field left out, kube-scheduler's adaptive sample
    assert profiles.nodes_to_score(shipped) == profiles.ADAPTIVE
    tessera = profiles.scheduler_config(profiles.TESSERA, shipped, URL, nodes_to_score=asked)
    assert tessera["profiles"][0].get("percentageOfNodesToScore") == expected
    unchanged = {k: v for k, v in tessera["profiles"][0].items()
                 if k != "percentageOfNodesToScore"}  # fmt: skip
    assert unchanged == {k: v for k, v in shipped["profiles"][0].items()
                         if k != "percentageOfNodesToScore"}  # fmt: skip
    assert tessera["extenders"][0]["urlPrefix"] == URL
    for other in (profiles.IN_TREE, profiles.IN_TREE_DEFAULT):
        config = profiles.scheduler_config(other, shipped, URL, nodes_to_score=asked)
        assert "percentageOfNodesToScore" not in config["profiles"][0]
    assert shipped == shipped_config()  # the shipped one is not changed


def test_nodes_to_score_is_a_percentage_recorded_with_the_shipped_one() -> None:
    parser = command.build_parser()
    assert parser.parse_args([]).nodes_to_score is None
    assert parser.parse_args(["--nodes-to-score", "0"]).nodes_to_score == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--nodes-to-score", "101"])
    with pytest.raises(ValueError, match="from 0 to 100"):
        profiles.scheduler_config(profiles.TESSERA, shipped_config(), URL, nodes_to_score=-1)
    assert profiles.nodes_to_score({"profiles": [{"schedulerName": "x"}]}) == 0
    settings = {"nodes_to_score": 0, "nodes_to_score_shipped": 100}
    runs = [_run(profiles.TESSERA, 0, 50), _run(profiles.IN_TREE, 0, 100)]
    data = report(runs, nodes=10, pods=100, settings=settings)
    assert "tessera percentageOfNodesToScore adaptive (0) (shipped 100)" in "\n".join(
        command.table(data)
    )
    assert "<td>0 (100)</td>" in schedperf_page(data, "t")


def test_the_order_alternates_between_repeats() -> None:
    assert profiles.order(0) == profiles.PROFILES
    assert profiles.order(1) == tuple(reversed(profiles.PROFILES))
    assert profiles.order(2) == profiles.PROFILES
    with pytest.raises(ValueError, match="unknown profile"):
        profiles.scheduler_config("fastest", shipped_config(), URL)


# ---------------------------------------------------------------------- workload

TRACE = [
    TracePod("a", 200_000, 900_000, 1, 1000),  # one whole GPU, CPU far over an HGX share
    TracePod("b", 4000, 8192, 1, 250),  # a quarter of a GPU
    TracePod("c", 30_000, 65_536, 4, 1000),
    TracePod("cpu-only", 4000, 8192, 0, 0),
]


def test_pods_are_the_traces_gpu_shapes_with_whole_gangs_and_capped_cpu() -> None:
    drawn = shapes(TRACE, 200, gang_share=0.1, seed=3)
    assert len(drawn) == 200
    assert len({s.name for s in drawn}) == 200
    assert {s.size for s in drawn if not s.gang} <= {"share", "1", "4"}
    gangs: dict[str, list[int]] = {}
    for position, s in enumerate(drawn):
        assert s.cpu_milli <= 12_000 * max(s.gpus, 1)
        if s.gang:
            gangs.setdefault(s.gang, []).append(position)
            assert s.gpus == 8
    assert sum(len(p) for p in gangs.values()) == 20
    assert all(is_gang_member(drawn[i].name) for p in gangs.values() for i in p)
    for members in gangs.values():
        assert 2 <= len(members) <= 4
        assert members == list(range(members[0], members[0] + len(members)))  # one after another
    assert drawn == shapes(TRACE, 200, gang_share=0.1, seed=3)


def test_a_pod_manifest_asks_for_its_gpus_as_limits_and_carries_its_gang() -> None:
    gang_pod = next(s for s in shapes(TRACE, 50, gang_share=0.1, seed=1) if s.gang)
    pod = pod_manifest(gang_pod, "tessera-gpu")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {labels.GPU_RESOURCE: "8"}
    assert resources["requests"][labels.GPU_RESOURCE] == "8"
    assert pod["spec"]["schedulerName"] == "tessera-gpu"
    assert pod["metadata"]["labels"][labels.GANG] == f"sched-perf.{gang_pod.gang}"
    assert pod["metadata"]["annotations"][labels.TOPOLOGY] == "required:rack"
    # the webhook's term for required:rack, at the label the nodes carry their rack in
    assert pod["spec"]["affinity"] == {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [gang_affinity(RACK)]}
    }
    share = next(s for s in shapes(TRACE, 50, gang_share=0, seed=1) if s.size == "share")
    alone = pod_manifest(share, "x")
    assert alone["spec"]["containers"][0]["resources"]["limits"] == {
        labels.GPU_MILLI_RESOURCE: "250"
    }
    assert "affinity" not in alone["spec"]


def test_nodes_are_hgx_boards_four_to_a_rack() -> None:
    nodes = hgx_nodes(20)
    assert [n.rack for n in nodes[:5]] == ["rack-0000"] * 4 + ["rack-0001"]
    assert nodes[16].block == "block-001"
    manifest = nodes[0].manifest(__import__("datetime").datetime(2026, 1, 1))
    assert manifest["metadata"]["annotations"][labels.NVLINK_ISLANDS] == "0-3,4-7"


def test_background_pods_are_bound_evenly_apart_from_the_measured_ones_and_ask_nothing() -> None:
    nodes = hgx_nodes(4)
    pods = background_pods(nodes, 10)
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + 1
        # in a namespace of its own: the run's watch and placement read only NAMESPACE
        assert pod["metadata"]["namespace"] == BACKGROUND_NAMESPACE
        # no request: every profile places the measured pods as it would without them
        assert all("resources" not in c for c in pod["spec"]["containers"])
    assert per_node == {"gpu-00000": 3, "gpu-00001": 3, "gpu-00002": 2, "gpu-00003": 2}
    assert len({pod["metadata"]["name"] for pod in pods}) == 10
    assert background_pods(nodes, 0) == []
    with pytest.raises(ValueError, match="need nodes"):
        background_pods([], 1)


@pytest.mark.parametrize(("given", "expected"), [([], 0), (["--background", "150000"], 150000)])
def test_the_background_is_a_count_of_pods(given: list[str], expected: int) -> None:
    assert command.build_parser().parse_args(given).background == expected


@pytest.mark.parametrize("bad", ["-1", "many"])
def test_a_background_that_is_no_count_is_refused(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        command.build_parser().parse_args(["--background", bad])
    assert "is not a count of pods" in capsys.readouterr().err


# ---------------------------------------------------------------------- figures


def test_latency_is_post_to_first_bound_event_and_throughput_the_steady_part() -> None:
    created = {"a": 0.0, "b": 0.5, "c": 1.0}
    bound = {"a": 0.25, "b": 1.0}
    assert latencies_ms(created, bound) == [250.0, 500.0]
    # 100 binds, 10 a second between a burst at the start and a long tail
    times = [0.0] * 5 + [1 + i / 10 for i in range(90)] + [60.0] * 5
    assert steady_throughput(times) == pytest.approx(10.0)
    assert steady_throughput([1.0]) == 0.0
    assert bound_per_second([0.1, 0.2, 2.5]) == [2, 0, 1]


def _run(profile: str, repeat: int, rate: float, extender: float = 0.0) -> RunRecord:
    created = {f"p{i}": i / 100 for i in range(100)}
    bound = {f"p{i}": i / rate + 0.1 for i in range(100)}
    cpu = {"scheduler": 0.2, "apiserver": 0.3, "etcd": 0.1}
    ready = None
    if extender:
        cpu["extender"] = extender
        ready = {"start": 1.0 + repeat, "restart": 3.0 + repeat}
    # every pod a POST and a binding, and the odd lease renewal (under a hundredth a pod)
    requests = {"POST pods": 100.0, "POST pods/binding": 100.0, "PUT leases": 0.4 + repeat / 2}
    attempts = {"scheduled": 100.0, "unschedulable": 10.0 * (repeat + 1)}
    return RunRecord(
        profile, repeat, created, bound, cpu, {"free_gpus": 8}, ready, requests, attempts
    )


def test_the_json_has_each_profile_the_ratios_within_repeats_and_every_run() -> None:
    runs = [
        _run(profiles.IN_TREE, 0, 100),
        _run(profiles.IN_TREE_DEFAULT, 0, 50),
        _run(profiles.TESSERA, 0, 50, extender=0.1),
        _run(profiles.TESSERA, 1, 100, extender=0.3),
        _run(profiles.IN_TREE_DEFAULT, 1, 50),
        _run(profiles.IN_TREE, 1, 200),
    ]
    data = report(runs, nodes=10, pods=100, settings={"rate": 0})
    assert data["nodes"] == 10
    assert data["pods"] == 100
    for profile in profiles.PROFILES:
        figures = data[profile]
        assert set(figures) >= {
            "pods_per_s",
            "created_per_s",
            "p50_ms",
            "p99_ms",
            "cpu_ms_per_pod",
            "placement",
        }
        assert figures["cpu_ms_per_pod"]["scheduler"] == 2.0  # 0.2 s over 100 pods
        assert figures["runs"] == 2
    assert data["in_tree"]["cpu_ms_per_pod"]["extender"] is None
    assert data["in_tree"]["gang_p99_ms"] is None  # no gang among these pods
    assert data["tessera"]["cpu_ms_per_pod"]["extender"] == 2.0  # median of 1 and 3 ms
    # both repeats: tessera binds at half the rate of in_tree -> 0.5, whatever the pace
    assert data["ratio"]["throughput"] == pytest.approx(0.5)
    assert [r["repeat"] for r in data["ratio"]["per_repeat"]] == [0, 1]
    assert data["ratio"]["p99"] > 1
    assert data["extender_cpu_over_scheduler"] == pytest.approx(1.0)
    # how long the extender took to be ready, at its start and after a crash: medians
    assert data["tessera"]["extender_ready_s"] == {"start": 1.5, "restart": 3.5}
    assert data["in_tree"]["extender_ready_s"] is None
    # what each pod cost kube-apiserver and kube-scheduler in calls: per pod, the rare
    # left out, medians over the repeats
    assert data["tessera"]["requests_per_pod"] == {"POST pods": 1.0, "POST pods/binding": 1.0}
    assert data["tessera"]["attempts_per_pod"] == {"scheduled": 1.0, "unschedulable": 0.15}
    assert len(data["runs"]) == 6
    page = schedperf_page(data, "t")
    assert page.count("<svg") == 2
    assert "tessera / in_tree" in page


# ---------------------------------------------------------------------- placement


def _pod(name: str, node: str, gpus: int, indices: str = "", gang: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "sched-perf", "labels": {}}
    if indices:
        meta["annotations"] = {labels.GPU_INDICES: indices}
    if gang:
        meta["labels"][labels.GANG] = gang
    limits = {labels.GPU_RESOURCE: str(gpus)}
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
    }


def test_placement_counts_unbound_sizes_stranded_gpus_and_double_booking() -> None:
    nodes = hgx_nodes(8)  # racks 0000 (gpu-00000..3) and 0001
    drawn = shapes(TRACE[2:3], 4, gang_share=0, seed=0)  # four 4-GPU pods
    pods = [
        _pod(drawn[0].name, "gpu-00000", 4, "0,1,2,3", gang="g"),
        _pod(drawn[1].name, "gpu-00000", 4, "2,3,4,5"),  # GPUs 2 and 3 twice, islands split
        _pod(drawn[2].name, "gpu-00004", 4, gang="g"),  # no indices: in-tree's way
    ]
    found = placement(drawn, pods, nodes)
    assert found["unschedulable_by_size"] == {"4": 1}
    assert found["gpu_conflicts"] == 2
    assert found["split_islands"] == 1
    assert found["bound_without_indices"] == 1
    assert found["gangs_split_over_racks"] == 1
    assert found["empty_nodes"] == 6
    # gpu-00000 uses 6 distinct GPUs (2 free, stranded), gpu-00004 4 (4 stranded)
    assert found["stranded_free_gpus"] == 6
    assert found["free_gpus"] == 6 + 6 * 8
