"""The load test's kube-scheduler side: in-tree fit, LeastAllocated, and how extender
scores join the in-tree ones (score x 100/10 x weight), as kube-scheduler combines them."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import labels
from loadtest.sim import objects, scheduling


def node(
    name: str = "n1",
    *,
    gpus: int = 8,
    cpu: str = "224",
    memory: str = "2048Gi",
    node_labels: dict[str, str] | None = None,
    spot: bool = False,
) -> scheduling.NodeRoom:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": node_labels or {}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, labels.GPU_RESOURCE: str(gpus)}},
    }
    if spot:
        obj["spec"]["taints"] = [{"key": "spot", "value": "true", "effect": "NoSchedule"}]
    return scheduling.node_room(obj)


def pod(
    *,
    gpus: int = 1,
    cpu: str = "8",
    memory: str = "64Gi",
    selector: dict[str, str] | None = None,
    affinity_in: tuple[str, list[str]] | None = None,
    tolerate_spot: bool = False,
) -> objects.PodNeeds:
    spec: dict[str, Any] = {
        "containers": [
            {
                "resources": {
                    "limits": {"cpu": cpu, "memory": memory, labels.GPU_RESOURCE: str(gpus)}
                }
            }
        ]
    }
    if selector:
        spec["nodeSelector"] = selector
    if affinity_in:
        key, values = affinity_in
        term = {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    if tolerate_spot:
        spec["tolerations"] = [
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ]
    return objects.pod_needs({"spec": spec})


@pytest.mark.parametrize(
    ("room", "needs", "fits"),
    [
        (node(), pod(gpus=8), True),
        (node(gpus=4), pod(gpus=8), False),
        (node(cpu="4"), pod(cpu="8"), False),
        (node(memory="32Gi"), pod(memory="64Gi"), False),
        (node(node_labels={"pool": "a"}), pod(selector={"pool": "a"}), True),
        (node(node_labels={"pool": "b"}), pod(selector={"pool": "a"}), False),
        (node(node_labels={"pool": "b"}), pod(affinity_in=("pool", ["a", "b"])), True),
        (node(), pod(affinity_in=("pool", ["a"])), False),
        (node(spot=True), pod(), False),
        (node(spot=True), pod(tolerate_spot=True), True),
    ],
)
def test_in_tree_fit(room: scheduling.NodeRoom, needs: objects.PodNeeds, fits: bool) -> None:
    assert scheduling.fits(room, needs) is fits


def test_assumed_pods_use_up_the_node_and_leave_it_again() -> None:
    room, needs = node(gpus=8), pod(gpus=4)
    room.add("ns/a", needs)
    room.add("ns/b", needs)
    assert not scheduling.fits(room, pod(gpus=1))
    room.remove("ns/a", needs)
    room.remove("ns/a", needs)  # twice: counted once
    assert scheduling.fits(room, pod(gpus=4))
    assert room.used_gpus == 4


def test_least_allocated_prefers_the_emptier_node() -> None:
    empty, busy = node("empty"), node("busy")
    busy.add("ns/x", pod(cpu="112", memory="1024Gi"))
    needs = pod(cpu="0", memory="0")
    assert scheduling.least_allocated(empty, needs) == 100
    assert scheduling.least_allocated(busy, needs) == 50


def test_extender_scores_are_scaled_by_ten_and_the_weight() -> None:
    totals = scheduling.combine_scores(
        ["a", "b", "c"],
        in_tree={"a": 90, "b": 40, "c": 70},
        extender_scores={"a": 2, "b": 4},
        weight=5,
    )
    # a: 90 + 2x10x5 = 190; b: 40 + 4x10x5 = 240; c: unscored by the extender, 70.
    assert totals == {"a": 190, "b": 240, "c": 70}
    assert scheduling.select_host(totals, lambda n: 0) == "b"


def test_with_weight_one_in_tree_spreading_can_outvote_the_extender() -> None:
    totals = scheduling.combine_scores(["a", "b"], {"a": 100, "b": 50}, {"a": 0, "b": 4}, weight=1)
    assert totals == {"a": 100, "b": 90}


def test_ties_are_broken_by_the_callers_choice() -> None:
    totals = {"a": 5, "b": 7, "c": 7}
    assert scheduling.select_host(totals, lambda n: n - 1) == "c"
    assert scheduling.select_host(totals, lambda n: 0) == "b"
    assert scheduling.select_host({}, lambda n: 0) is None


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        (64, 0, 64),  # below 100: every node
        (100, 0, 100),  # 50 % of 100 is 50, raised to the minimum of 100
        (1_000, 0, 420),  # 50 - 1000/125 = 42 %
        (4_278, 0, 684),  # 50 - 34 = 16 %
        (5_000, 0, 500),  # 50 - 40 = 10 %
        (10_000, 0, 500),  # 50 - 80 < 5: 5 %
        (20_000, 0, 1_000),
        (5_000, 30, 1_500),  # a profile's percentageOfNodesToScore
        (200, 10, 100),
    ],
)
def test_kube_scheduler_stops_after_enough_feasible_nodes(
    nodes: int, percentage: int, expected: int
) -> None:
    assert scheduling.nodes_to_find(nodes, percentage) == expected


def test_the_feasible_search_goes_round_from_its_start_and_counts_what_it_looked_at() -> None:
    rooms = [node(f"n{i}", gpus=8 if i % 2 else 0) for i in range(6)]  # odd nodes have GPUs
    assert scheduling.feasible_nodes(rooms, pod(), start=4, limit=2) == (["n5", "n1"], 4)
    assert scheduling.feasible_nodes(rooms, pod(), start=0, limit=10) == (["n1", "n3", "n5"], 6)
    assert scheduling.feasible_nodes(rooms, pod(gpus=16), start=2, limit=3) == ([], 6)
