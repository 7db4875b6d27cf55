"""Every extender verb as a request/response pair, in both node-cache modes.

Each ``extender/<case>.request.json`` (``path``, ``body`` or ``rawBody``, and optional
``assume``: binds accepted but not yet seen by the watch; ``config``: fields of the
``ExtenderConfig`` that differ from the cases' usual one) runs through
``extender.verbs`` against the cluster in ``extender/cluster.yaml``; the answer must
equal ``<case>.response.json`` (``status``, ``body``, and for a bind the
``gpuIndices`` written on the pod). ``TESSERA_UPDATE_GOLDENS=1`` rewrites the responses;
review the diff before committing it.

The cases named after a capture start from its request, and their answers are also
compared with what the recording server answered in ``../shared/captures``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.grammar import parse_index_list
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.files import load_objects
from cluster.model import Allocation, NodeName, PodKey
from extender import verbs
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from tests.builders import BLOCK_LABEL, RACK_LABEL
from tests.shared import CAPTURES

HERE = Path(__file__).parent / "extender"
UPDATE = os.environ.get("TESSERA_UPDATE_GOLDENS") == "1"
NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
CONFIG = ExtenderConfig(
    levels=(TopologyLevel("block", BLOCK_LABEL), TopologyLevel("rack", RACK_LABEL), HOSTNAME_LEVEL)
)
CASES = sorted(p.name.removesuffix(".request.json") for p in HERE.glob("*.request.json"))
HANDLERS = {
    "/filter": verbs.handle_filter,
    "/prioritize": verbs.handle_prioritize,
    "/preempt": verbs.handle_preempt,
}


def load_cache() -> ClusterCache:
    objects = load_objects(HERE / "cluster.yaml")
    cache = ClusterCache(ManualClock(NOW))
    cache.replace_nodes(
        node_from_json(o, CONFIG.level_labels) for o in objects if o["kind"] == "Node"
    )
    cache.replace_pods(pod_from_json(o) for o in objects if o["kind"] == "Pod")
    return cache


def run_case(case: str) -> dict[str, Any]:
    request = jsonio.loads((HERE / f"{case}.request.json").read_bytes())
    cache = load_cache()
    for bound in request.get("assume", []):
        pod = cache.snapshot().pods[PodKey(bound["pod"])]
        indices = parse_index_list(bound["gpus"])
        cache.assume(pod, Allocation(NodeName(bound["node"]), indices, pod.demand.milli_per_gpu))
    raw = request.get("rawBody")
    body = raw.encode() if raw is not None else jsonio.dumps(request["body"])
    snapshot = cache.snapshot()
    written = None
    if request["path"] == "/bind":
        step = verbs.plan_bind(body, snapshot, CONFIG, NOW)
        if isinstance(step, verbs.Reply):
            reply = step
        else:
            # what the shell does before its API calls: the cache must take the GPUs
            if step.plan.allocation is not None:
                cache.assume(step.plan.pod, step.plan.allocation)
            reply = verbs.bind_reply()
            written = step.plan.gpu_indices
    else:
        config = replace(CONFIG, **request.get("config", {}))
        reply = HANDLERS[request["path"]](body, snapshot, config, NOW)
    answer: dict[str, Any] = {"status": reply.status, "body": jsonio.loads(reply.body)}
    if written is not None:
        answer["gpuIndices"] = written
    return answer


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    path = HERE / f"{case}.response.json"
    answer = run_case(case)
    if UPDATE:
        path.write_bytes(jsonio.dumps_pretty(answer))
    assert path.exists(), f"no {path.name}: run with TESSERA_UPDATE_GOLDENS=1 and review it"
    assert answer == jsonio.loads(path.read_bytes())


def test_every_verb_in_both_modes_has_a_case() -> None:
    seen = set()
    for case in CASES:
        request = jsonio.loads((HERE / f"{case}.request.json").read_bytes())
        body = request.get("body")
        if request["path"] == "/bind" or not isinstance(body, dict):
            mode = "either"
        elif body.get("NodeNames") is not None or body.get("NodeNameToMetaVictims") is not None:
            mode = "names"
        else:
            mode = "nodes"
        seen.add((request["path"], mode))
    for verb in ("/filter", "/prioritize", "/preempt"):
        assert {(verb, "names"), (verb, "nodes")} <= seen, verb
    assert ("/bind", "either") in seen


# ---------------------------------------------------------------- against the captures

SAME_AS_CAPTURED = {
    "cache-filter": "009-ext-cache-filter-response.json",
    "cache-filter-while-binding": "014-ext-cache-filter-response.json",
    "cache-bind": "017-ext-cache-bind-response.json",
    "cache-bind-while-binding": "019-ext-cache-bind-response.json",
    "full-bind": "025-ext-full-bind-response.json",
}


def captured(name: str) -> Any:
    path = CAPTURES / name
    if not path.exists():
        pytest.skip(f"{CAPTURES} is not here")
    return jsonio.loads(path.read_bytes())


@pytest.mark.parametrize(("case", "capture"), sorted(SAME_AS_CAPTURED.items()))
def test_answer_is_what_the_capture_shows(case: str, capture: str) -> None:
    answer = run_case(case)
    assert (answer["status"], answer["body"]) == (200, captured(capture))


def test_full_node_filter_answers_the_captured_node_list() -> None:
    """The capture's recording server left ``NodeNames`` out; the Go type writes it as
    null, and kube-scheduler reads ``Nodes`` from an extender that is not
    nodeCacheCapable, so the two are the same answer to it."""
    body = run_case("full-filter")["body"]
    assert body.pop("NodeNames") is None
    assert body == captured("023-ext-full-filter-response.json")


@pytest.mark.parametrize(
    ("case", "capture"),
    [
        ("cache-prioritize", "011-ext-cache-prioritize-response.json"),
        ("cache-prioritize-while-binding", "016-ext-cache-prioritize-response.json"),
    ],
)
def test_priorities_have_the_captured_shape(case: str, capture: str) -> None:
    """Same hosts in the same order, same keys; the scores are ours, not the recorder's."""
    ours, theirs = run_case(case)["body"], captured(capture)
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs]
    assert [e["Host"] for e in ours] == [e["Host"] for e in theirs]
    assert all(isinstance(e["Score"], int) and 0 <= e["Score"] <= 10 for e in ours)


def test_a_second_pod_filtered_while_the_first_binds_sees_its_gpus_taken() -> None:
    """captures/013: the second pod's /filter arrives before the first /bind returns."""
    busy = run_case("cache-prioritize-while-binding")["body"]
    idle = run_case("cache-prioritize")["body"]
    assert busy != idle
    assert run_case("cache-bind-while-binding")["gpuIndices"] == "4,5,6,7"
