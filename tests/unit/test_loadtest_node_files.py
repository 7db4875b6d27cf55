"""A real node list (spot v2026, openb) as the load test's fleet: the Nodes the extender
reads, the queues Kueue and the webhook get, and the CLI that picks the list."""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import jsonio, labels
from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.feed import CacheFeed
from cluster.model import NodeName
from loadtest.__main__ import main
from loadtest.cli import parse_nodes, run_spec
from loadtest.demo import modes as demo
from loadtest.inputs import fleet, node_files
from loadtest.inputs.fleet import BLOCK_LABEL, RACK_LABEL
from loadtest.inputs.traces import DEFAULT_DATA_DIR, SPOT, TraceNode
from loadtest.sim import objects, scenario
from webhook.admit import admit
from webhook.policy_build import policy_from_objects
from webhook.review import decode_review
from webhook.rules.outcome import AdmitConfig, Allowed

LEVELS = (BLOCK_LABEL, RACK_LABEL, labels.HOSTNAME)
SPOT_FILE = DEFAULT_DATA_DIR / SPOT / "node_info_df.csv"
needs_spot = pytest.mark.skipif(
    not SPOT_FILE.is_file(), reason=f"{SPOT_FILE} is not here (the shared data folder)"
)


def node(name: str, model: str, gpus: int, cores: int = 128) -> TraceNode:
    return TraceNode(name, cores * 1000, cores * 8192, gpus, model)


MIXED = [
    node("a", "A100-SXM4-80GB", 8),
    node("b", "A10", 1),
    node("c", "H800", 8, 192),
    node("d", "GPU-series-1", 4, 192),
    node("e", "", 0, 64),
    node("f", "A100-SXM4-80GB", 8),
]


def by_name(objects: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {o["metadata"]["name"]: o for o in objects}  # type: ignore[index]


def whole_gpu_quota(policy: list[dict[str, Any]]) -> int:
    return sum(
        int(r["nominalQuota"])
        for o in policy
        if o["kind"] == "ClusterQueue"
        for g in o["spec"]["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
        if r["name"] == labels.GPU_RESOURCE
    )


def test_nodes_carry_the_files_model_gpus_and_cpu_as_the_extender_reads_them() -> None:
    cache = ClusterCache(ManualClock())
    CacheFeed(cache, levels=LEVELS).load(node_files.fleet_nodes(MIXED))
    nodes = cache.snapshot().nodes
    rows = {
        name: (n.product, len(n.gpus), len({g.island for g in n.gpus}), n.cpu_milli)
        for name, n in nodes.items()
    }
    assert rows == {
        "a": ("A100-SXM4-80GB", 8, 1, 128_000),
        "b": ("A10", 1, 1, 128_000),
        "c": ("H800", 8, 1, 192_000),
        "d": ("GPU-series-1", 4, 1, 192_000),
        "e": ("", 0, 0, 64_000),  # a CPU-only node
        "f": ("A100-SXM4-80GB", 8, 1, 128_000),
    }
    assert all(not n.problems for n in nodes.values())
    assert nodes[NodeName("b")].memory_bytes == 128 * 8 * 2**30  # the documented 8 GiB per core


def test_nvlink_islands_are_written_only_where_the_board_fixes_them() -> None:
    annotations = {
        name: obj["metadata"]["annotations"]  # type: ignore[index]
        for name, obj in by_name(node_files.fleet_nodes(MIXED)).items()
    }
    islands = {name: a.get(labels.NVLINK_ISLANDS) for name, a in annotations.items()}
    assert islands == {"a": "0-7", "b": None, "c": "0-7", "d": None, "e": None, "f": "0-7"}


def test_a_cpu_only_node_has_no_gpu_resources_or_product() -> None:
    cpu_node = by_name(node_files.fleet_nodes(MIXED))["e"]
    assert labels.GFD_PRODUCT not in cpu_node["metadata"]["labels"]  # type: ignore[index]
    assert labels.GPU_RESOURCE not in cpu_node["status"]["allocatable"]  # type: ignore[index]


@given(st.lists(st.sampled_from([("H800", 8), ("A10", 1), ("GPU-series-2", 8), ("", 0)])))
def test_synthetic_racks_hold_four_nodes_of_one_model_and_blocks_four_racks(
    models: list[tuple[str, int]],
) -> None:
    rows = [node(f"n{i}", m, g) for i, (m, g) in enumerate(models)]
    objects = node_files.fleet_nodes(rows)
    racks: dict[str, list[int]] = defaultdict(list)
    blocks: dict[str, set[str]] = defaultdict(set)
    for i, obj in enumerate(objects):
        node_labels = obj["metadata"]["labels"]
        racks[node_labels[RACK_LABEL]].append(i)
        blocks[node_labels[BLOCK_LABEL]].add(node_labels[RACK_LABEL])
        assert "synthetic" in node_labels[RACK_LABEL]
    for members in racks.values():
        assert len(members) <= 4
        assert len({models[i][0] for i in members}) == 1
        assert members == sorted(members)  # file order
    for rack_names in blocks.values():
        assert len(rack_names) <= 4
        assert len({models[racks[r][0]][0] for r in rack_names}) == 1
    # Deterministic: the same list gives the same racks.
    assert node_files.fleet_nodes(rows) == objects


def test_queues_cover_every_model_biggest_boards_first_within_the_fleet() -> None:
    policy = node_files.fleet_policy(MIXED, scenario.example_policy())
    flavors = {
        o["metadata"]["name"]: o["spec"]["nodeLabels"][labels.GFD_PRODUCT]
        for o in policy
        if o["kind"] == "ResourceFlavor"
    }
    assert sorted(flavors.values()) == ["A10", "A100-SXM4-80GB", "GPU-series-1", "H800"]
    queues = [o for o in policy if o["kind"] == "ClusterQueue"]
    order = [f["name"] for f in queues[0]["spec"]["resourceGroups"][0]["flavors"]]
    assert [flavors[f] for f in order] == ["A100-SXM4-80GB", "H800", "GPU-series-1", "A10"]
    # Each team its share of each model, rounded down: the fleet's 29 GPUs at most.
    assert 29 - len(queues) * 4 <= whole_gpu_quota(policy) <= 29
    # The examples' LocalQueues, with their rules (the bad-quota job is denied by them).
    local = [o for o in policy if o["kind"] == "LocalQueue"]
    assert {o["metadata"]["name"] for o in local} == {
        "team-nlp-queue",
        "team-cv-queue",
        "team-research-queue",
    }
    assert all(labels.MAX_GPUS_PER_JOB in o["metadata"]["annotations"] for o in local)
    assert any(o["kind"] == "WorkloadPriorityClass" for o in policy)


def test_the_cli_takes_a_count_or_a_node_list(tmp_path: Path) -> None:
    assert parse_nodes("64") == 64
    assert parse_nodes("spot-v2026") == "spot-v2026"
    for bad in ("0", "spot", "-3"):
        with pytest.raises(Exception, match="node count or one of spot-v2026, openb"):
            parse_nodes(bad)
    with pytest.raises(SystemExit, match="--trace brings its own nodes"):
        main(["latency", "--nodes", "spot-v2026", "--trace", "openb-default"])
    with pytest.raises(SystemExit, match="--node-limit N"):
        main(["latency", "--node-limit", "10"])
    absent = ["--data", str(tmp_path), "latency", "--nodes", "spot-v2026", "--out", str(tmp_path)]
    assert main([*absent, "--verb-rate", "0"]) == 2  # a clear message, no servers started


@needs_spot
def test_the_whole_spot_list_becomes_a_fleet_with_quotas_to_match() -> None:
    spec = scenario.RunSpec(node_file="spot-v2026", data_dir=DEFAULT_DATA_DIR)
    prepared = scenario.prepare(spec, datetime(2026, 1, 1, tzinfo=UTC))
    gpus = sum(int(n["status"]["allocatable"].get(labels.GPU_RESOURCE, 0)) for n in prepared.nodes)
    assert (len(prepared.nodes), gpus) == (4278, 10412)
    assert 0.99 * gpus <= whole_gpu_quota(prepared.policy) <= gpus
    cache = ClusterCache(ManualClock())
    CacheFeed(cache, levels=LEVELS).load(prepared.nodes)
    nodes = cache.snapshot().nodes
    assert sum(len(n.gpus) for n in nodes.values()) == 10412
    assert {n.product for n in nodes.values() if len(n.gpus) == 8} >= {"H800", "A100-SXM4-80GB"}
    assert not [n.problems for n in nodes.values() if n.problems]
    assert prepared.jobs  # the synthetic stream


@needs_spot
def test_node_limit_takes_the_first_nodes_of_the_file() -> None:
    args = argparse.Namespace(
        rate=5.0,
        duration=2.0,
        median_run=None,
        drain=None,
        quota_scale=None,
        extender_weight=5,
        seed=1,
        trace=None,
        nodes="spot-v2026",
        node_limit=64,
        out=Path("reports"),
        keep=None,
        webhook_url=None,
        extender_url=None,
        ca=None,
        client_cert=None,
        client_key=None,
        kubeconfig=None,
        namespace="tessera-loadtest",
        data=DEFAULT_DATA_DIR,
    )
    spec = run_spec(args, demo.demo_spec())
    prepared = scenario.prepare(spec, datetime(2026, 1, 1, tzinfo=UTC))
    assert [n["metadata"]["name"] for n in prepared.nodes[:2]] == [
        "spot-node-00000",
        "spot-node-00001",
    ]
    assert len(prepared.nodes) == 64


def test_the_webhook_admits_the_streams_rack_gangs_on_a_node_list() -> None:
    # The synthetic racks are in a Topology the flavors name, so a required:rack gang is
    # admitted, and its pods are told which models' nodes they may use.
    policy = policy_from_objects(node_files.fleet_policy(MIXED, scenario.example_policy()))
    job = fleet.job_object("gang", fleet.TEAMS[0], pods=2, gpus=4, topology="required:rack")
    request = decode_review(jsonio.dumps(objects.admission_review(job, "uid-gang")))
    decision = admit(request, policy, AdmitConfig())
    assert isinstance(decision, Allowed), decision
    template = decision.object["spec"]["template"]
    assert template["metadata"]["annotations"][labels.TOPOLOGY] == "required:rack"
