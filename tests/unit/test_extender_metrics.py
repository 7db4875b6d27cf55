"""Filter reasons are counted under a small fixed set of labels, one per kind of reason.

Each row makes a real filter say no (through ``decide.filter_nodes``, the same call the
server makes), so a change of wording in the filters that the metrics would no longer
recognise fails here rather than turning into ``other`` on a dashboard.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.model import NodeName
from extender import decide
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from extender.explain import REASON_CATEGORIES, reason_category
from tests.builders import RACK_LABEL, container, node_json, pod_json

NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
CONFIG = ExtenderConfig(levels=(TopologyLevel("rack", RACK_LABEL), HOSTNAME_LEVEL))


def reason_for(
    node: dict[str, Any], pod: dict[str, Any], bound: tuple[dict[str, Any], ...] = ()
) -> str:
    cache = ClusterCache(ManualClock(NOW))
    elsewhere = {p["spec"]["nodeName"] for p in bound} - {"gpu-x"}
    nodes = [node] + [node_json(name, rack="r1") for name in sorted(elsewhere)]
    cache.replace_nodes(node_from_json(n, CONFIG.level_labels) for n in nodes)
    cache.replace_pods(pod_from_json(p) for p in bound)
    outcome = decide.filter_nodes(cache.snapshot(), pod_from_json(pod), ["gpu-x"], CONFIG, NOW)
    reasons = {**outcome.failed, **outcome.unresolvable}
    assert list(reasons) == ["gpu-x"], outcome
    return reasons[NodeName("gpu-x")]


def x(**kwargs: Any) -> dict[str, Any]:
    return node_json("gpu-x", **kwargs)


def llm(name: str, gpus: int, topology: str, **kwargs: Any) -> dict[str, Any]:
    """A member of an 4-pod gang, all 4 needed together."""
    return pod_json(
        name, gpus=gpus, gang="team-nlp.llm", gang_size=4, gang_min=4, topology=topology, **kwargs
    )


def on_x(name: str, indices: str, **kwargs: Any) -> dict[str, Any]:
    return pod_json(name, node="gpu-x", gpu_indices=indices, **kwargs)


ROWS = [
    pytest.param(x(unschedulable=True), pod_json(gpus=1), (), "cordoned", id="cordoned"),
    pytest.param(
        x(),
        pod_json(containers=[container("c", requests={"nvidia.com/gpu": "-1"})]),
        (),
        "unusable_request",
        id="negative-gpu-request",
    ),
    pytest.param(
        x(product="NVIDIA-A100-SXM4-80GB"),
        pod_json(gpus=1, products="H100"),
        (),
        "product",
        id="other-product",
    ),
    pytest.param(x(product=None), pod_json(gpus=1, products="H100"), (), "product", id="no-label"),
    pytest.param(
        x(drain_after="2026-11-29T19:00:00Z"), pod_json(gpus=1), (), "maintenance", id="drain"
    ),
    pytest.param(x(gpus=None), pod_json(gpus=1), (), "no_gpus", id="no-gpus"),
    pytest.param(x(gpus=2), pod_json(gpus=4), (), "too_few_gpus", id="too-small"),
    pytest.param(
        x(gpus=2, unhealthy="0,1"), pod_json(gpu_milli=300), (), "too_few_gpus", id="all-sick"
    ),
    pytest.param(
        x(islands="0-3,4-7"),
        pod_json(gpus=4),
        (on_x("a-0", "0,1", gpus=2), on_x("b-0", "4,5", gpus=2)),
        "island",
        id="island",
    ),
    pytest.param(
        x(), pod_json(gpus=1), (on_x("big-0", "0,1,2,3,4,5,6,7", gpus=8),), "gpus_in_use", id="full"
    ),
    pytest.param(
        x(gpus=1),
        pod_json(gpu_milli=300),
        (on_x("share-0", "0", gpu_milli=800),),
        "gpus_in_use",
        id="share",
    ),
    pytest.param(
        x(islands="0-3,4-7"),
        pod_json(gpus=8),
        (on_x("a-0", "0,1", gpus=2),),
        "gpus_in_use",
        id="spanning-islands",
    ),
    pytest.param(
        x(rack="r2"),
        llm("llm-1", 1, "required:zone"),
        (),
        "gang_level",
        id="unknown-level",
    ),
    pytest.param(
        x(rack="r2"),
        llm("llm-1", 1, "required:rack"),
        (llm("llm-0", 1, "required:rack", node="gpu-y", gpu_indices="0"),),
        "gang_domain",
        id="other-rack",
    ),
    pytest.param(
        x(),
        llm("llm-1", 1, "required:rack"),
        (llm("llm-0", 1, "required:rack", node="gpu-y", gpu_indices="0"),),
        "gang_domain",
        id="no-rack-label",
    ),
    pytest.param(
        x(rack="r2"),
        llm("llm-0", 8, "required:rack"),
        (),
        "gang_room",
        id="rack-too-small",
    ),
]


@pytest.mark.parametrize(("node", "pod", "bound", "category"), ROWS)
def test_each_filter_reason_has_its_category(
    node: dict[str, Any], pod: dict[str, Any], bound: tuple[dict[str, Any], ...], category: str
) -> None:
    reason = reason_for(node, pod, bound)
    assert reason_category(reason) == category, reason


def test_a_node_the_cache_lacks_and_an_unknown_wording() -> None:
    outcome = decide.filter_nodes(
        ClusterCache(ManualClock(NOW)).snapshot(),
        pod_from_json(pod_json(gpus=1)),
        ["gpu-z"],
        CONFIG,
        NOW,
    )
    assert reason_category(outcome.unresolvable[NodeName("gpu-z")]) == "not_cached"
    assert reason_category("the moon is in the wrong phase") == "other"
    assert {"not_cached", "other"} <= REASON_CATEGORIES
