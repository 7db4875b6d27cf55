"""Nodes and pods from the API's JSON, as the cache and the webhook see them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import labels as keys
from cluster.convert.demand import DemandError, pod_demand, read_demand
from cluster.convert.grammar import (
    MAX_GPUS_PER_NODE,
    AnnotationError,
    format_indices,
    format_islands,
    format_rfc3339,
    parse_index_list,
    parse_islands,
    parse_rfc3339,
    parse_topology,
)
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.convert.raw import ConversionError
from cluster.model import (
    UNCONSTRAINED,
    GangId,
    GangSpec,
    NodeRequirement,
    NodeSelection,
    PodDemand,
    PodPhase,
    Taint,
    Toleration,
    TopologyConstraint,
    TopologyMode,
)
from tests.builders import (
    BLOCK_LABEL,
    H100,
    RACK_LABEL,
    container,
    gpu_container,
    node_json,
    pod_json,
)

GI = 2**30


# ================================================================ nodes


def _islands_of(node: dict[str, Any]) -> list[int]:
    return [gpu.island for gpu in node_from_json(node).gpus]


ISLANDS = [
    pytest.param(None, [0] * 8, id="absent-one-island"),
    pytest.param("0-3,4-7", [0, 0, 0, 0, 1, 1, 1, 1], id="two-ranges"),
    pytest.param("0-1,2-3,4-5,6-7", [0, 0, 1, 1, 2, 2, 3, 3], id="four-pairs"),
    pytest.param("4-7,0-3", [1, 1, 1, 1, 0, 0, 0, 0], id="numbered-in-listed-order"),
    pytest.param("0,2,4,6;1,3,5,7", [0, 1, 0, 1, 0, 1, 0, 1], id="semicolon-lists"),
    pytest.param("0,2;", [0, 1, 0, 2, 3, 4, 5, 6], id="one-listed-island"),
    pytest.param(" 0-3 , 4-7 ", [0, 0, 0, 0, 1, 1, 1, 1], id="spaces"),
    pytest.param("0-3", [0, 0, 0, 0, 1, 2, 3, 4], id="unnamed-gpus-alone"),
    pytest.param("", [0] * 8, id="empty-is-absent"),
]


@pytest.mark.parametrize(("annotation", "expected"), ISLANDS)
def test_nvlink_islands(annotation: str | None, expected: list[int]) -> None:
    node = node_from_json(node_json(islands=annotation))
    assert [gpu.island for gpu in node.gpus] == expected
    assert node.problems == ()


BAD_ISLANDS = [
    pytest.param("0-3,3-7", "GPU 3 is in islands 0 and 1", id="gpu-in-two-islands"),
    pytest.param("0-3,4-8", "GPU 8", id="index-beyond-node"),
    pytest.param("0-3,x", "'x'", id="not-an-index"),
    pytest.param("3-0,4-7", "runs backwards", id="backwards-range"),
    pytest.param("0-3,,4-7", "an empty item", id="empty-item"),
    pytest.param("0-3;;4-7", "names no GPU", id="empty-island"),
    pytest.param("0-3;4,4", "named twice", id="twice-in-one-island"),
    pytest.param("-1-3", "is not a GPU index", id="negative"),
]


@pytest.mark.parametrize(("annotation", "reason"), BAD_ISLANDS)
def test_malformed_islands_fall_back_to_one_island_and_say_why(
    annotation: str, reason: str
) -> None:
    node = node_from_json(node_json(islands=annotation))
    assert [gpu.island for gpu in node.gpus] == [0] * 8
    assert len(node.problems) == 1
    assert keys.NVLINK_ISLANDS in node.problems[0]
    assert reason in node.problems[0]
    assert "one island of all 8 GPUs" in node.problems[0]


UNHEALTHY = [
    pytest.param(None, set(), 0, id="absent"),
    pytest.param("5", {5}, 0, id="one"),
    pytest.param("1,5", {1, 5}, 0, id="two"),
    pytest.param("4-7", {4, 5, 6, 7}, 0, id="range"),
    pytest.param("", set(), 0, id="empty"),
    pytest.param("1,9", {1}, 1, id="beyond-node-skipped"),
    pytest.param("five", set(range(8)), 1, id="unreadable-all-unhealthy"),
    pytest.param("1,,2", set(range(8)), 1, id="empty-item-all-unhealthy"),
]


@pytest.mark.parametrize(("annotation", "unhealthy", "problems"), UNHEALTHY)
def test_unhealthy_gpus(annotation: str | None, unhealthy: set[int], problems: int) -> None:
    node = node_from_json(node_json(unhealthy=annotation))
    assert {gpu.index for gpu in node.gpus if not gpu.healthy} == unhealthy
    assert node.free_milli == 1000 * (8 - len(unhealthy))
    assert len(node.problems) == problems
    assert all(keys.UNHEALTHY_GPUS in p for p in node.problems)


def test_unreadable_unhealthy_gpus_says_all_are_kept_off() -> None:
    node = node_from_json(node_json(unhealthy="gpu5"))
    assert node.healthy_gpus == ()
    assert node.problems == (
        f"annotation {keys.UNHEALTHY_GPUS}: 'gpu5' in 'gpu5' is not a GPU index or a range "
        "of them (like 0-3); treating all 8 GPUs as unhealthy",
    )


DRAIN = [
    pytest.param("2026-12-01T02:00:00Z", datetime(2026, 12, 1, 2, tzinfo=UTC), id="utc"),
    pytest.param(
        "2026-12-01T02:00:00+02:00",
        datetime(2026, 12, 1, 2, tzinfo=timezone(timedelta(hours=2))),
        id="offset",
    ),
    pytest.param(
        "2026-12-01T02:00:00.123456789Z",
        datetime(2026, 12, 1, 2, 0, 0, 123456, tzinfo=UTC),
        id="nanoseconds",
    ),
    pytest.param("2026-12-01t02:00:00z", datetime(2026, 12, 1, 2, tzinfo=UTC), id="lower-case"),
]


@pytest.mark.parametrize(("annotation", "expected"), DRAIN)
def test_drain_after(annotation: str, expected: datetime) -> None:
    node = node_from_json(node_json(drain_after=annotation))
    assert node.drain_after == expected
    assert node.drain_after is not None
    assert node.drain_after.tzinfo is not None
    assert node.problems == ()


BAD_DRAIN = [
    pytest.param("tomorrow", id="words"),
    pytest.param("2026-12-01", id="date-only"),
    pytest.param("2026-12-01T02:00:00", id="no-zone"),
    pytest.param("2026-13-01T02:00:00Z", id="month-13"),
    pytest.param("2026-12-01T25:00:00Z", id="hour-25"),
    pytest.param("1764554400", id="unix-seconds"),
]


@pytest.mark.parametrize("annotation", BAD_DRAIN)
def test_bad_drain_after_is_ignored_and_reported(annotation: str) -> None:
    node = node_from_json(node_json(drain_after=annotation))
    assert node.drain_after is None
    assert len(node.problems) == 1
    assert keys.DRAIN_AFTER in node.problems[0]
    assert repr(annotation) in node.problems[0]


def test_real_node_shape() -> None:
    node = node_from_json(
        node_json("gpu-a", rack="r1", block="b1", islands="0-3,4-7", cpu="63500m"),
        levels=(BLOCK_LABEL, RACK_LABEL, keys.HOSTNAME),
    )
    assert node.name == "gpu-a"
    assert node.gpu_count == 8
    assert node.product == H100
    assert node.gpu_memory_mib == 81559
    assert node.cpu_milli == 63500
    assert node.memory_bytes == 512 * GI
    assert node.max_pods == 110
    assert node.domains == {BLOCK_LABEL: "b1", RACK_LABEL: "r1", keys.HOSTNAME: "gpu-a"}
    assert node.labels[RACK_LABEL] == "r1"
    assert node.whole_free == 8
    assert not node.unschedulable
    assert node.taints == ()
    assert node.problems == ()


def test_levels_the_node_has_no_label_for_are_absent() -> None:
    node = node_from_json(node_json(rack="r7"), levels=(BLOCK_LABEL, RACK_LABEL))
    assert node.domains == {RACK_LABEL: "r7"}


MINIMAL_NODES = [
    pytest.param({"metadata": {"name": "bare"}}, id="only-a-name"),
    pytest.param(
        {"metadata": {"name": "bare", "labels": None, "annotations": None}, "status": None},
        id="null-maps",
    ),
    pytest.param(
        {"metadata": {"name": "bare"}, "spec": {}, "status": {"allocatable": {}}},
        id="empty-maps",
    ),
]


@pytest.mark.parametrize("obj", MINIMAL_NODES)
def test_node_without_labels_annotations_or_status(obj: dict[str, Any]) -> None:
    node = node_from_json(obj, levels=(RACK_LABEL,))
    assert node.name == "bare"
    assert node.gpus == ()
    assert node.product == ""
    assert node.domains == {}
    assert node.max_pods == 110
    assert node.problems == ()


GPU_COUNTS = [
    pytest.param({"allocatable": {"nvidia.com/gpu": "7"}, "capacity": {"nvidia.com/gpu": "8"}}, 7,
                 0, id="allocatable-wins"),
    pytest.param({"capacity": {"nvidia.com/gpu": "4"}}, 4, 0, id="capacity-fallback"),
    pytest.param({"allocatable": {"nvidia.com/gpu": 2}}, 2, 0, id="json-number"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "eight"}}, 0, 1, id="not-a-quantity"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "-1"}}, 0, 1, id="negative"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "1e9"}}, 0, 1, id="absurd"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "1.5"}}, 0, 1, id="fractional"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "500m"}}, 0, 1, id="milli"),
    pytest.param({"allocatable": {"nvidia.com/gpu": "NaN"}}, 0, 1, id="nan-text"),
    pytest.param({"allocatable": {"nvidia.com/gpu": float("nan")}}, 0, 1, id="nan-number"),
    pytest.param({"allocatable": {"nvidia.com/gpu": float("inf")}}, 0, 1, id="inf-number"),
    pytest.param({"allocatable": {"cpu": "4"}}, 0, 0, id="no-gpus"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "gpus", "problems"), GPU_COUNTS)
def test_gpu_count(status: dict[str, Any], gpus: int, problems: int) -> None:
    node = node_from_json({"metadata": {"name": "n"}, "status": status})
    assert node.gpu_count == gpus
    assert [gpu.index for gpu in node.gpus] == list(range(gpus))
    assert len(node.problems) == problems
    if problems:
        # the line the cache logs once for the node says what it made of it
        assert node.problems[0].startswith("status.allocatable['nvidia.com/gpu'] is ")
        assert node.problems[0].endswith("; the node offers no GPUs")


def test_taints_and_cordon() -> None:
    node = node_from_json(
        node_json(
            unschedulable=True,
            taints=[
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": keys.TAINT_NOT_READY, "effect": "NoExecute"},
            ],
        )
    )
    assert node.unschedulable
    assert node.taints == (
        Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),
        Taint(key=keys.TAINT_NOT_READY, value="", effect="NoExecute"),
    )


def test_malformed_taint_is_skipped_and_reported() -> None:
    obj = node_json(taints=[{"key": "a", "effect": "NoSchedule"}, {"value": "x"}])
    node = node_from_json(obj)
    assert node.taints == (Taint(key="a", value="", effect="NoSchedule"),)
    assert len(node.problems) == 1
    assert "spec.taints[1]" in node.problems[0]


def test_unreadable_gfd_memory_label_is_reported() -> None:
    node = node_from_json(node_json(labels={keys.GFD_MEMORY: "80GB"}))
    assert node.gpu_memory_mib == 0
    assert node.problems == (
        f"label {keys.GFD_MEMORY}: '80GB' is not a positive whole number; ignored",
    )


def test_non_string_annotation_is_reported() -> None:
    obj = node_json()
    obj["metadata"]["annotations"][keys.NVLINK_ISLANDS] = 4  # unquoted in a YAML file
    node = node_from_json(obj)
    assert [gpu.island for gpu in node.gpus] == [0] * 8
    assert node.problems == (f"annotation {keys.NVLINK_ISLANDS}=4 is not a string; ignored",)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({}, id="empty"),
        pytest.param({"metadata": {}}, id="no-name"),
        pytest.param({"metadata": {"generateName": "gpu-"}}, id="generate-name"),
        pytest.param({"metadata": {"name": ""}}, id="empty-name"),
        pytest.param({"metadata": "gpu-a"}, id="metadata-not-a-map"),
    ],
)
def test_node_without_a_name_cannot_be_converted(obj: dict[str, Any]) -> None:
    with pytest.raises(ConversionError, match=r"metadata\.name"):
        node_from_json(obj)


# ================================================================ pod demand


def _demand(**kwargs: Any) -> PodDemand:
    return pod_from_json(pod_json(**kwargs)).demand


RESOURCES = [
    pytest.param(
        [container(limits={"cpu": "2", "memory": "4Gi", keys.GPU_RESOURCE: "1"})],
        (),
        (1, 2000, 4 * GI),
        id="limits-only-default-requests",
    ),
    pytest.param(
        [container(requests={"cpu": "1"}, limits={"cpu": "2", "memory": "8Gi"})],
        (),
        (0, 1000, 8 * GI),
        id="requests-win-limits-fill-the-rest",
    ),
    pytest.param(
        [gpu_container("a", gpus=2, cpu="1"), gpu_container("b", gpus=1, cpu="500m")],
        (),
        (3, 1500, 0),
        id="app-containers-add-up",
    ),
    pytest.param(
        [gpu_container(gpus=1, cpu="1", memory="1Gi")],
        [container("init", requests={"cpu": "4", "memory": "512Mi"})],
        (1, 4000, GI),
        id="init-bigger-per-resource",
    ),
    pytest.param(
        [gpu_container(gpus=1, cpu="1", memory="1Gi")],
        [container("init", requests={"cpu": "500m"})],
        (1, 1000, GI),
        id="init-smaller",
    ),
    pytest.param(
        [gpu_container(gpus=1)],
        [container("init", requests={keys.GPU_RESOURCE: "2"}, limits={keys.GPU_RESOURCE: "2"})],
        (2, 0, 0),
        id="init-needs-more-gpus",
    ),
    pytest.param(
        [gpu_container(gpus=1, cpu="2")],
        [container("proxy", requests={"cpu": "1"}, restart_policy="Always")],
        (1, 3000, 0),
        id="sidecar-adds-to-app",
    ),
    pytest.param(
        [gpu_container(gpus=1, cpu="2")],
        [
            container("proxy", requests={"cpu": "1"}, restart_policy="Always"),
            container("warmup", requests={"cpu": "3"}),
        ],
        (1, 4000, 0),
        id="init-after-sidecar-runs-beside-it",
    ),
    pytest.param(
        [gpu_container(gpus=1, cpu="2")],
        [
            container("warmup", requests={"cpu": "3"}),
            container("proxy", requests={"cpu": "1"}, restart_policy="Always"),
        ],
        (1, 3000, 0),
        id="init-before-sidecar-runs-alone",
    ),
    pytest.param(
        [container(requests={"cpu": "100m"})],
        [
            container("init", requests={"cpu": "1"}, restart_policy="OnFailure"),
        ],
        (0, 1000, 0),
        id="only-always-makes-a-sidecar",
    ),
    pytest.param([], (), (0, 0, 0), id="no-containers"),
    pytest.param([{"name": "bare", "image": "x"}], (), (0, 0, 0), id="no-resources"),
]


@pytest.mark.parametrize(("containers", "inits", "expected"), RESOURCES)
def test_requests_follow_the_kubernetes_rules(
    containers: list[dict[str, Any]],
    inits: list[dict[str, Any]],
    expected: tuple[int, int, int],
) -> None:
    pod = pod_from_json(pod_json(containers=containers, init_containers=inits))
    demand = pod.demand
    assert (demand.gpus, demand.cpu_milli, demand.memory_bytes) == expected
    assert pod.problems == ()


def test_overhead_is_added() -> None:
    demand = _demand(gpus=1, cpu="1", memory="1Gi", overhead={"cpu": "250m", "memory": "120Mi"})
    assert demand.cpu_milli == 1250
    assert demand.memory_bytes == GI + 120 * 2**20


def test_pod_level_resources_replace_the_container_sum() -> None:
    obj = pod_json(gpus=2, cpu="1", memory="1Gi")
    obj["spec"]["resources"] = {"requests": {"cpu": "8"}, "limits": {"memory": "64Gi"}}
    demand = pod_from_json(obj).demand
    assert (demand.gpus, demand.cpu_milli, demand.memory_bytes) == (2, 8000, 64 * GI)


def test_sub_milli_cpu_requests_add_up_before_rounding() -> None:
    demand = _demand(
        containers=[
            container("a", requests={"cpu": "0.5m"}),
            container("b", requests={"cpu": "0.5m"}),
        ]
    )
    assert demand.cpu_milli == 1


GPU_ASKS = [
    pytest.param({"gpus": 4}, (4, 0), 0, id="whole"),
    pytest.param({"gpu_milli": 250}, (0, 250), 0, id="share"),
    pytest.param({"gpu_milli": 999}, (0, 999), 0, id="largest-share"),
    pytest.param({"gpu_milli": 1000}, (1, 0), 1, id="share-of-1000-is-a-whole-gpu"),
    pytest.param({"gpu_milli": 1500}, (2, 0), 1, id="share-over-1000-rounds-up"),
    pytest.param({"gpus": 2, "gpu_milli": 500}, (3, 0), 1, id="both-kinds"),
]


@pytest.mark.parametrize(("ask", "expected", "problems"), GPU_ASKS)
def test_gpu_demand(ask: dict[str, Any], expected: tuple[int, int], problems: int) -> None:
    reading = read_demand(pod_json(**ask)["spec"], {}, {})
    assert (reading.demand.gpus, reading.demand.gpu_milli) == expected
    assert not (reading.demand.gpus and reading.demand.gpu_milli)  # never both
    assert len(reading.problems) == problems


def test_both_gpu_kinds_is_refused_by_the_strict_reader() -> None:
    spec = pod_json(gpus=2, gpu_milli=500)["spec"]
    with pytest.raises(DemandError) as caught:
        pod_demand(spec, {}, {})
    assert caught.value.problems == (
        f"asks for both {keys.GPU_RESOURCE} (2) and {keys.GPU_MILLI_RESOURCE} (500): a pod "
        "takes whole GPUs or one share of a GPU, not both; counted as 3 whole GPUs",
    )


def test_share_of_a_whole_gpu_or_more_is_refused_by_the_strict_reader() -> None:
    with pytest.raises(DemandError, match=r"tessera.dev/gpu-milli is 1000: a share is 1-999"):
        pod_demand(pod_json(gpu_milli=1000)["spec"], {}, {})


def test_strict_reader_lists_every_fault() -> None:
    spec = pod_json(gpus=1, active_deadline_s=0)["spec"]
    with pytest.raises(DemandError) as caught:
        pod_demand(spec, {keys.TOPOLOGY: "nearby"}, {keys.GANG: "team-nlp.job"})
    assert len(caught.value.problems) == 3
    assert str(caught.value) == "; ".join(caught.value.problems)


def test_clean_template_reads_strictly() -> None:
    spec = pod_json(gpus=8, cpu="16", active_deadline_s=7200)["spec"]
    demand = pod_demand(
        spec,
        {keys.GANG_SIZE: "4", keys.TOPOLOGY: f"required:{RACK_LABEL}", keys.GPU_PRODUCT: "H100"},
        {keys.GANG: "team-nlp.finetune"},
    )
    assert demand == PodDemand(
        gpus=8,
        cpu_milli=16000,
        gang=GangSpec(id=GangId("team-nlp.finetune"), size=4, min_count=4),
        topology=TopologyConstraint(TopologyMode.REQUIRED, RACK_LABEL),
        time_limit_s=7200,
        products=("H100",),
    )


BAD_RESOURCES = [
    pytest.param({"cpu": "1KB"}, "containers['train'].resources.requests['cpu']: '1KB' is not "
                 "a Kubernetes quantity", id="not-a-quantity"),
    pytest.param({"memory": "-1Gi"}, "containers['train'].resources.requests['memory'] is "
                 "negative", id="negative"),
    pytest.param({"cpu": True}, "containers['train'].resources.requests['cpu']: True",
                 id="json-bool"),
    pytest.param({keys.GPU_RESOURCE: "0.5"}, "nvidia.com/gpu is 0.5, not a whole number; "
                 "counted as 1", id="half-gpu"),
]  # fmt: skip


@pytest.mark.parametrize(("requests", "problem"), BAD_RESOURCES)
def test_unusable_resource_values_are_reported(requests: dict[str, Any], problem: str) -> None:
    pod = pod_from_json(pod_json(containers=[container("train", requests=requests)]))
    assert len(pod.problems) == 1
    assert pod.problems[0].startswith(problem)


_WHERE = "containers['train'].resources.requests"
_NOT_NEGATIVE = "a count cannot be negative"
_NOT_A_NUMBER = "not a number of GPUs"
_GPU_ASK = f"the pod's {keys.GPU_RESOURCE} request is unusable"
_SHARE_ASK = f"the pod's {keys.GPU_MILLI_RESOURCE} request is unusable"
BAD_GPU_REQUESTS = [
    pytest.param({keys.GPU_RESOURCE: "-1"}, f"{_GPU_ASK}: {_WHERE} is '-1': {_NOT_NEGATIVE}",
                 id="negative"),
    pytest.param({keys.GPU_RESOURCE: -2}, f"{_GPU_ASK}: {_WHERE} is -2: {_NOT_NEGATIVE}",
                 id="negative-json-number"),
    pytest.param({keys.GPU_RESOURCE: "NaN"}, f"{_GPU_ASK}: {_WHERE} is 'NaN': {_NOT_A_NUMBER}",
                 id="nan-text"),
    pytest.param({keys.GPU_RESOURCE: float("nan")},
                 f"{_GPU_ASK}: {_WHERE} is nan: {_NOT_A_NUMBER}", id="nan-number"),
    pytest.param({keys.GPU_RESOURCE: float("inf")},
                 f"{_GPU_ASK}: {_WHERE} is inf: {_NOT_A_NUMBER}", id="inf-number"),
    pytest.param({keys.GPU_RESOURCE: "0.5"},
                 f"{_GPU_ASK}: {_WHERE} is '0.5': GPUs are whole; ask for "
                 f"{keys.GPU_MILLI_RESOURCE} for a share of one", id="fractional"),
    pytest.param({keys.GPU_RESOURCE: "1500m"}, f"{_GPU_ASK}: {_WHERE} is '1500m': GPUs are whole",
                 id="fractional-milli-suffix"),
    pytest.param({keys.GPU_RESOURCE: "1025"},
                 f"{_GPU_ASK}: the pod asks for 1025 GPUs, more than a node can have (1024)",
                 id="absurd"),
    pytest.param({keys.GPU_RESOURCE: "1e9"},
                 f"{_GPU_ASK}: the pod asks for 1000000000 GPUs, more than a node can have",
                 id="absurd-exponent"),
    pytest.param({keys.GPU_MILLI_RESOURCE: "-250"},
                 f"{_SHARE_ASK}: {_WHERE} is '-250': {_NOT_NEGATIVE}", id="share-negative"),
    pytest.param({keys.GPU_MILLI_RESOURCE: "nan"},
                 f"{_SHARE_ASK}: {_WHERE} is 'nan': {_NOT_A_NUMBER}", id="share-nan"),
    pytest.param({keys.GPU_MILLI_RESOURCE: "2.5"},
                 f"{_SHARE_ASK}: {_WHERE} is '2.5': a share is a whole number of thousandths "
                 "of a GPU", id="share-fractional"),
    pytest.param({keys.GPU_MILLI_RESOURCE: "2000000"},
                 f"{_SHARE_ASK}: the pod asks for 2000000 thousandths of a GPU, more than a "
                 "node can have (1024 GPUs)", id="share-absurd"),
]  # fmt: skip


@pytest.mark.parametrize(("requests", "refusal"), BAD_GPU_REQUESTS)
def test_a_gpu_request_that_is_no_count_of_gpus_makes_the_pod_unplaceable(
    requests: dict[str, Any], refusal: str
) -> None:
    """Never read as zero GPUs (which every node fits): the pod is refused, and the
    reason says which request and why."""
    pod = pod_from_json(pod_json(containers=[container("train", requests=requests)]))
    assert pod.refusal.startswith(refusal), pod.refusal


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("init", id="init-container"),
        pytest.param("limits", id="limit-without-request"),
        pytest.param("overhead", id="overhead"),
    ],
)
def test_a_bad_gpu_request_is_refused_wherever_it_is_written(where: str) -> None:
    bad = {keys.GPU_RESOURCE: "-1"}
    if where == "init":
        obj = pod_json(gpus=1, init_containers=[container("setup", requests=bad)])
    elif where == "limits":
        obj = pod_json(containers=[container("train", limits=bad)])
    else:
        obj = pod_json(gpus=1, overhead=bad)
    pod = pod_from_json(obj)
    assert pod.refusal.startswith(f"{_GPU_ASK}: ")
    assert "'-1': a count cannot be negative" in pod.refusal


@pytest.mark.parametrize(
    "ask",
    [
        {"gpus": 0},
        {"gpus": 8},
        {"gpus": 1024},
        {"gpu_milli": 1},
        {"gpu_milli": 999},
        {"gpu_milli": 1500},  # counted as 2 whole GPUs, with a problem: not refused
        {"gpus": 2, "gpu_milli": 500},
    ],
    ids=str,
)
def test_a_usable_gpu_request_is_not_refused(ask: dict[str, Any]) -> None:
    assert pod_from_json(pod_json(**ask)).refusal == ""


def _gang(size: int, min_count: int) -> GangSpec:
    return GangSpec(id=GangId("team-nlp.j"), size=size, min_count=min_count)


J = "team-nlp.j"
"""A gang id of the namespace ``pod_json`` puts its pods in."""
GANGS = [
    pytest.param({"gang": J, "gang_size": 4}, _gang(4, 4), 0, id="min-defaults-to-all"),
    pytest.param({"gang": J, "gang_size": 4, "gang_min": 2}, _gang(4, 2), 0, id="min"),
    pytest.param({"gang": J, "gang_size": 4, "gang_min": 5}, _gang(4, 4), 1, id="min-over"),
    pytest.param({"gang": J, "gang_size": 4, "gang_min": "two"}, _gang(4, 4), 1, id="min-bad"),
    pytest.param({"gang": J, "gang_size": 4, "gang_min": 0}, _gang(4, 4), 1, id="min-zero"),
    pytest.param({"gang": J}, None, 1, id="no-size"),
    pytest.param({"gang": J, "gang_size": "four"}, None, 1, id="size-unreadable"),
    pytest.param({"gang": J, "gang_size": 0}, None, 1, id="size-zero"),
    pytest.param({"gang": J, "gang_size": "+4"}, None, 1, id="size-signed"),
    pytest.param({"gang_size": 4, "gang_min": 2}, None, 0, id="no-gang-label"),
    pytest.param({"gang": "", "gang_size": 4}, None, 0, id="empty-gang-label"),
    pytest.param({"gang": "other-team.j", "gang_size": 4}, None, 1, id="other-namespace"),
    pytest.param({"gang": "team-nlp-x.j", "gang_size": 4}, None, 1, id="namespace-prefix-only"),
]  # fmt: skip


@pytest.mark.parametrize(("ask", "gang", "problems"), GANGS)
def test_gang(ask: dict[str, Any], gang: GangSpec | None, problems: int) -> None:
    pod = pod_from_json(pod_json(gpus=1, **ask))
    assert pod.demand.gang == gang
    assert len(pod.problems) == problems


REQUIRED, PREFERRED = TopologyMode.REQUIRED, TopologyMode.PREFERRED
TOPOLOGIES = [
    pytest.param(f"required:{RACK_LABEL}", TopologyConstraint(REQUIRED, RACK_LABEL), id="required"),
    pytest.param("preferred:block", TopologyConstraint(PREFERRED, "block"), id="preferred"),
    pytest.param(" required:rack ", TopologyConstraint(REQUIRED, "rack"), id="spaces"),
    pytest.param("mandatory:rack", None, id="unknown-mode"),
    pytest.param("Required:rack", None, id="capitalised"),
    pytest.param("required:", None, id="no-level"),
    pytest.param("required", None, id="no-colon"),
    pytest.param("required:my rack", None, id="space-in-level"),
]


@pytest.mark.parametrize(("annotation", "expected"), TOPOLOGIES)
def test_topology(annotation: str, expected: TopologyConstraint | None) -> None:
    pod = pod_from_json(pod_json(gpus=1, topology=annotation))
    assert pod.demand.topology == expected
    assert len(pod.problems) == (0 if expected else 1)
    if expected is None:
        assert keys.TOPOLOGY in pod.problems[0]
        with pytest.raises(AnnotationError):
            parse_topology(annotation)


PRODUCTS = [
    pytest.param("H100|A100", ("H100", "A100"), id="two"),
    pytest.param(H100, (H100,), id="gfd-name"),
    pytest.param(" H100 | | A100|H100", ("H100", "A100"), id="spaces-empties-duplicates"),
    pytest.param("", (), id="empty-is-any"),
]


@pytest.mark.parametrize(("annotation", "expected"), PRODUCTS)
def test_products(annotation: str, expected: tuple[str, ...]) -> None:
    assert _demand(gpus=1, products=annotation).products == expected


TIME_LIMITS = [
    pytest.param(3600, 3600, 0, id="seconds"),
    pytest.param(None, None, 0, id="absent"),
    pytest.param(0, None, 1, id="zero"),
    pytest.param("3600", None, 1, id="string"),
    pytest.param(True, None, 1, id="bool"),
    pytest.param(36.5, None, 1, id="float"),
]


@pytest.mark.parametrize(("value", "expected", "problems"), TIME_LIMITS)
def test_time_limit(value: Any, expected: int | None, problems: int) -> None:
    obj = pod_json(gpus=1)
    if value is not None:
        obj["spec"]["activeDeadlineSeconds"] = value
    pod = pod_from_json(obj)
    assert pod.demand.time_limit_s == expected
    assert len(pod.problems) == problems


def test_demand_of_a_template_without_labels_or_annotations() -> None:
    template_spec = {"containers": [gpu_container(gpus=4)], "restartPolicy": "Never"}
    assert pod_demand(template_spec, {}, {}) == PodDemand(gpus=4)


# ================================================================ pods


def test_pending_pod() -> None:
    pod = pod_from_json(pod_json("train-0", "team-nlp", gpus=4))
    assert pod.key == "team-nlp/train-0"
    assert (pod.namespace, pod.name) == ("team-nlp", "train-0")
    assert pod.uid
    assert pod.node is None
    assert pod.gpu_indices == ()
    assert pod.phase is PodPhase.PENDING
    assert pod.scheduler_name == keys.DEFAULT_SCHEDULER_NAME
    assert not pod.deleting
    assert not pod.holds_resources
    assert pod.problems == ()


BOUND = [
    pytest.param({"gpus": 4, "gpu_indices": "0,1,2,3"}, (0, 1, 2, 3), 0, id="whole"),
    pytest.param({"gpus": 4, "gpu_indices": "4-7"}, (4, 5, 6, 7), 0, id="range"),
    pytest.param({"gpu_milli": 250, "gpu_indices": "5"}, (5,), 0, id="share"),
    pytest.param({"gpus": 4}, (), 0, id="no-annotation"),
    pytest.param({"gpus": 4, "gpu_indices": ""}, (), 0, id="empty"),
    pytest.param({"gpus": 4, "gpu_indices": "0,1,x,3"}, (), 1, id="malformed"),
    pytest.param({"gpus": 4, "gpu_indices": "0,1,1,2"}, (), 1, id="duplicate"),
    pytest.param({"gpus": 4, "gpu_indices": "0,1"}, (), 1, id="too-few"),
    pytest.param({"gpu_milli": 250, "gpu_indices": "0,1"}, (), 1, id="share-on-two"),
    pytest.param({"gpu_indices": "0"}, (), 1, id="no-gpu-asked"),
]


@pytest.mark.parametrize(("ask", "indices", "problems"), BOUND)
def test_bound_pod_gpu_indices(
    ask: dict[str, Any], indices: tuple[int, ...], problems: int
) -> None:
    pod = pod_from_json(pod_json(node="gpu-a", phase="Running", **ask))
    assert pod.node == "gpu-a"
    assert pod.gpu_indices == indices
    assert pod.holds_resources
    assert len(pod.problems) == problems
    assert all(keys.GPU_INDICES in p for p in pod.problems)


PHASES = [
    pytest.param("Pending", PodPhase.PENDING, True, 0, id="pending"),
    pytest.param("Running", PodPhase.RUNNING, True, 0, id="running"),
    pytest.param("Succeeded", PodPhase.SUCCEEDED, False, 0, id="succeeded"),
    pytest.param("Failed", PodPhase.FAILED, False, 0, id="failed"),
    pytest.param("Unknown", PodPhase.UNKNOWN, True, 0, id="unknown"),
    pytest.param(None, PodPhase.PENDING, True, 0, id="absent"),
    pytest.param("Evicted", PodPhase.UNKNOWN, True, 1, id="not-a-phase"),
]


@pytest.mark.parametrize(("phase", "expected", "holds", "problems"), PHASES)
def test_phase(phase: str | None, expected: PodPhase, holds: bool, problems: int) -> None:
    pod = pod_from_json(pod_json(gpus=1, node="gpu-a", gpu_indices="3", phase=phase))
    assert pod.phase is expected
    assert pod.holds_resources is holds
    assert len(pod.problems) == problems


def test_deleting_pod() -> None:
    assert pod_from_json(pod_json(gpus=1, deleting=True)).deleting


def test_pod_without_namespace_is_in_default() -> None:
    obj = pod_json("nb", gpus=1)
    del obj["metadata"]["namespace"]
    assert pod_from_json(obj).key == "default/nb"


def test_pod_with_null_maps() -> None:
    pod = pod_from_json(
        {"metadata": {"name": "p", "namespace": "ns", "labels": None, "annotations": None}}
    )
    assert pod.key == "ns/p"
    assert pod.demand == PodDemand()
    assert pod.uid == ""
    assert pod.problems == ()


def test_non_string_annotation_on_a_pod_is_reported() -> None:
    obj = pod_json(gpus=1, gang="ns.j")
    obj["metadata"]["annotations"] = {keys.GANG_SIZE: 4}  # unquoted in a YAML file
    pod = pod_from_json(obj)
    assert pod.demand.gang is None
    assert pod.problems[0] == f"annotation {keys.GANG_SIZE}=4 is not a string; ignored"


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"metadata": {"generateName": "finetune-cslh4-"}}, id="generate-name"),
        pytest.param({"spec": {}}, id="no-metadata"),
    ],
)
def test_pod_without_a_name_cannot_be_converted(obj: dict[str, Any]) -> None:
    with pytest.raises(ConversionError, match=r"metadata\.name"):
        pod_from_json(obj)


# ================================================================ annotation grammars

INDEX_LISTS = [
    pytest.param("0,1,2,3", (0, 1, 2, 3), id="list"),
    pytest.param("3,1,2", (1, 2, 3), id="sorted"),
    pytest.param("0-3,6", (0, 1, 2, 3, 6), id="range-and-index"),
    pytest.param("5", (5,), id="one"),
    pytest.param(" 1 , 5 ", (1, 5), id="spaces"),
    pytest.param("", (), id="empty"),
    pytest.param("007", (7,), id="leading-zeros"),
]


@pytest.mark.parametrize(("text", "expected"), INDEX_LISTS)
def test_parse_index_list(text: str, expected: tuple[int, ...]) -> None:
    assert parse_index_list(text) == expected


BAD_INDEX_LISTS = [
    "1,,2",
    "1,",
    "a",
    "1-",
    "-1",
    "3-1",
    "1,1",
    "0-3,2",
    "1.5",
    "+1",
    "1024",
    "0-5000",
    "\u0661",  # an Arabic-Indic digit: Python's int() reads it
]


@pytest.mark.parametrize("text", BAD_INDEX_LISTS, ids=BAD_INDEX_LISTS)
def test_parse_index_list_rejects(text: str) -> None:
    with pytest.raises(AnnotationError):
        parse_index_list(text)


def test_islands_checked_against_the_gpu_count() -> None:
    assert parse_islands("0-3,4-7", gpu_count=8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    with pytest.raises(AnnotationError, match="does not exist on a node of 4 GPUs"):
        parse_islands("0-3,4-7", gpu_count=4)


def test_rfc3339_rejects_naive_times() -> None:
    with pytest.raises(AnnotationError):
        parse_rfc3339("2026-12-01T02:00:00")


@given(
    st.datetimes(
        min_value=datetime(1970, 1, 2),  # noqa: DTZ001 - hypothesis wants naive bounds
        max_value=datetime(9999, 12, 30),  # noqa: DTZ001
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
        ),
    )
)
def test_a_formatted_drain_time_reads_back_as_the_same_instant_to_the_second(
    when: datetime,
) -> None:
    text = format_rfc3339(when)
    assert text.endswith("Z")
    assert parse_rfc3339(text) == when.replace(microsecond=0)


def test_format_rfc3339_refuses_a_naive_time() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        format_rfc3339(datetime(2026, 12, 1, 2, 0))  # noqa: DTZ001


def test_format_indices() -> None:
    assert format_indices([3, 1, 2, 0]) == "0,1,2,3"
    assert format_indices([0, 1, 2, 3, 6, 8, 9], ranges=True) == "0-3,6,8-9"
    assert format_indices([]) == ""
    with pytest.raises(ValueError, match="not negative"):
        format_indices([-1])


_INDEX_SETS = st.sets(st.integers(min_value=0, max_value=MAX_GPUS_PER_NODE - 1), max_size=64)


@given(_INDEX_SETS, st.booleans())
def test_index_lists_round_trip(indices: set[int], ranges: bool) -> None:
    assert parse_index_list(format_indices(indices, ranges=ranges)) == tuple(sorted(indices))


@given(
    st.lists(st.integers(min_value=0, max_value=63), unique=True, min_size=1).flatmap(
        lambda gpus: st.permutations(gpus).flatmap(
            lambda order: st.lists(
                st.integers(min_value=1, max_value=len(order)), min_size=1, max_size=8
            ).map(lambda cuts: _split(order, cuts))
        )
    )
)
def test_islands_round_trip(islands: list[list[int]]) -> None:
    parsed = parse_islands(format_islands(islands))
    assert parsed == tuple(tuple(sorted(island)) for island in islands)


def _split(order: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({0, len(order), *cuts})
    return [order[a:b] for a, b in itertools.pairwise(points) if order[a:b]]


_QUANTITY_TEXT = st.from_regex(
    r"[+-]?([0-9]{1,400}(\.[0-9]{0,12})?|\.[0-9]{1,12})"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,3})?",
    fullmatch=True,
)
_ANNOTATION_TEXT = st.one_of(
    st.text(alphabet="0123456789,-; :abZ+.|", max_size=20),
    st.text(max_size=12),
)


@given(
    st.dictionaries(
        st.sampled_from(
            [keys.NVLINK_ISLANDS, keys.UNHEALTHY_GPUS, keys.DRAIN_AFTER, "other.example/x"]
        ),
        _ANNOTATION_TEXT,
    ),
    st.one_of(st.integers(min_value=-2, max_value=2000).map(str), _ANNOTATION_TEXT),
)
def test_node_conversion_never_raises_on_bad_annotations(
    annotations: Mapping[str, str], gpus: str
) -> None:
    node = node_from_json(node_json(gpus=gpus, annotations=annotations))
    assert len({gpu.index for gpu in node.gpus}) == node.gpu_count <= MAX_GPUS_PER_NODE


@given(
    st.dictionaries(
        st.sampled_from(
            [keys.GANG_SIZE, keys.GANG_MIN, keys.TOPOLOGY, keys.GPU_PRODUCT, keys.GPU_INDICES]
        ),
        _ANNOTATION_TEXT,
    ),
    st.dictionaries(
        st.sampled_from(["cpu", "memory", keys.GPU_RESOURCE, keys.GPU_MILLI_RESOURCE]),
        st.one_of(_QUANTITY_TEXT, _ANNOTATION_TEXT),
    ),
)
def test_pod_conversion_never_raises_and_keeps_the_demand_invariant(
    annotations: Mapping[str, str], requests: Mapping[str, str]
) -> None:
    obj = pod_json(containers=[container(requests=requests)], gang="ns.j", annotations=annotations)
    demand = pod_from_json(obj).demand
    assert not (demand.gpus and demand.gpu_milli)
    assert 0 <= demand.gpu_milli < 1000
    if demand.gang is not None:
        assert 1 <= demand.gang.min_count <= demand.gang.size


# ---------------------------------------------------------------- node selection


def _with_spec(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


def test_a_pending_gpu_pod_says_where_it_may_go() -> None:
    obj = _with_spec(
        pod_json(gpus=8),
        nodeSelector={"flavor": "spot"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "NotIn", "values": ["x"]}
                            ]
                        },
                    ]
                }
            }
        },
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    assert pod_from_json(obj).demand.selection == NodeSelection(
        required=(NodeRequirement("flavor", "In", ("spot",)),),
        terms=(
            (NodeRequirement("pool", "In", ("a",)),),
            (NodeRequirement("metadata.name", "NotIn", ("x",), field=True),),
        ),
        tolerations=(Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),),
    )


def test_where_a_pod_may_go_is_kept_only_while_it_waits() -> None:
    assert pod_from_json(_with_spec(pod_json(gpus=1), tolerations=[])).demand.selection is (
        UNCONSTRAINED
    )
    assert pod_from_json(pod_json(gpus=1, node="n1")).demand.selection is None
    assert pod_from_json(pod_json(cpu="1")).demand.selection is None


def test_an_unreadable_affinity_is_left_to_kube_scheduler_with_a_problem() -> None:
    obj = _with_spec(
        pod_json(gpus=1),
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Near"}]}]
                }
            }
        },
    )
    pod = pod_from_json(obj)
    assert pod.demand.selection is not None
    assert pod.demand.selection.terms is None
    assert any("node affinity item" in p for p in pod.problems)


def test_a_node_selector_term_that_is_no_object_leaves_the_affinity_to_kube_scheduler() -> None:
    obj = _with_spec(
        pod_json(gpus=1),
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["zone-a"]}
            }
        },
    )
    pod = pod_from_json(obj)
    assert pod.demand.selection is not None
    assert pod.demand.selection.terms is None
    assert any("node selector term" in p for p in pod.problems)


_TERM = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("spec", "prefers"),
    [
        pytest.param({}, False, id="nothing"),
        pytest.param(
            {"affinity": {"nodeAffinity": {_PREFERRED: [{"weight": 1, "preference": {}}]}}},
            True,
            id="preferred node affinity",
        ),
        pytest.param(
            {"affinity": {"podAffinity": {_PREFERRED: [{"weight": 5, "podAffinityTerm": _TERM}]}}},
            True,
            id="preferred pod affinity",
        ),
        pytest.param(
            {"affinity": {"podAntiAffinity": {_PREFERRED: [{"weight": 5, "podAffinityTerm": {}}]}}},
            True,
            id="preferred pod anti-affinity",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]},
            True,
            id="a spread that allows skew",
        ),
        pytest.param(
            {"topologySpreadConstraints": ["unreadable"]}, True, id="an unreadable spread"
        ),
        pytest.param(
            {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]},
            False,
            id="a spread kube-scheduler filters by",
        ),
        pytest.param(
            {"affinity": {"podAffinity": {_REQUIRED: [_TERM]}, "nodeAffinity": {_PREFERRED: []}}},
            False,
            id="required pod affinity, empty preferences",
        ),
    ],
)
def test_a_pending_pod_says_whether_it_prefers_what_only_kube_scheduler_scores(
    spec: dict[str, Any], prefers: bool
) -> None:
    selection = pod_from_json(_with_spec(pod_json(gpus=1), **spec)).demand.selection
    assert selection is not None
    assert selection.prefers is prefers


# ================================================================ times (reservations)


STARTS = [
    pytest.param("2026-11-29T18:30:05Z", datetime(2026, 11, 29, 18, 30, 5, tzinfo=UTC), 0, id="z"),
    pytest.param(
        "2026-11-29T19:30:05+01:00", datetime(2026, 11, 29, 18, 30, 5, tzinfo=UTC), 0, id="offset"
    ),
    pytest.param(None, None, 0, id="not-started-yet"),
    pytest.param("yesterday", None, 1, id="not-a-time"),
    pytest.param(1764441005, None, 1, id="a-number"),
]


@pytest.mark.parametrize(("value", "expected", "problems"), STARTS)
def test_a_bound_pods_start_time_is_where_its_time_limit_runs_from(
    value: Any, expected: datetime | None, problems: int
) -> None:
    obj = pod_json(gpus=1, node="gpu-a", gpu_indices="0", phase="Running", active_deadline_s=60)
    if value is not None:
        obj["status"]["startTime"] = value
    pod = pod_from_json(obj)
    assert pod.started_at == expected
    assert len(pod.problems) == problems
    assert all("status.startTime" in p for p in pod.problems)


def test_a_pending_pod_has_no_start_time() -> None:
    obj = pod_json(gpus=1)
    obj["status"]["startTime"] = "2026-11-29T18:30:05Z"  # not bound: nothing runs yet
    assert pod_from_json(obj).started_at is None


@pytest.mark.parametrize(
    ("node", "version", "kept"),
    [
        pytest.param(None, "296", "296", id="pending-keeps-its-version"),
        pytest.param("gpu-a", "296", "", id="bound-keeps-none"),
        pytest.param(None, None, "", id="none-given"),
        pytest.param(None, 296, "", id="not-a-string"),
    ],
)
def test_a_pending_pod_keeps_its_resource_version_which_is_not_what_the_pod_is(
    node: str | None, version: Any, kept: str
) -> None:
    obj = pod_json(gpus=1, node=node, gpu_indices="0" if node else None)
    obj["metadata"].pop("resourceVersion")
    if version is not None:
        obj["metadata"]["resourceVersion"] = version
    pod = pod_from_json(obj)
    assert pod.version == kept
    assert not pod.problems
    obj["metadata"]["resourceVersion"] = "297"  # another read of the same content
    assert pod_from_json(obj) == pod


def test_members_started_in_one_second_share_one_time_object() -> None:
    objs = [pod_json(f"train-{i}", gpus=8, node=f"gpu-{i}", phase="Running") for i in range(2)]
    for obj in objs:
        obj["status"]["startTime"] = "2026-11-29T18:30:05Z"
    first, second = (pod_from_json(obj) for obj in objs)
    assert first.started_at is second.started_at


def test_a_waiting_gang_member_keeps_its_creation_time_and_priority() -> None:
    obj = pod_json(gpus=8, gang="team-nlp.train", gang_size=4)
    obj["spec"]["priority"] = 1000
    pod = pod_from_json(obj)
    assert pod.created_at == datetime(2026, 11, 29, 18, 28, 1, tzinfo=UTC)
    assert pod.priority == 1000
    assert pod.problems == ()


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod_json(gpus=8), id="no-gang"),
        pytest.param(
            pod_json(gpus=8, gang="team-nlp.train", node="gpu-a", phase="Running"), id="bound"
        ),
    ],
)
def test_creation_time_and_priority_are_kept_only_for_gang_members_waiting(
    obj: dict[str, Any],
) -> None:
    obj["spec"]["priority"] = 1000
    pod = pod_from_json(obj)
    assert (pod.created_at, pod.priority) == (None, 0)


def test_an_unreadable_priority_is_reported_and_read_as_zero() -> None:
    obj = pod_json(gpus=8, gang="team-nlp.train", gang_size=4)
    obj["spec"]["priority"] = "high"
    pod = pod_from_json(obj)
    assert pod.priority == 0
    assert pod.problems == ("spec.priority='high' is not an integer; ignored",)
