"""What the extender remembers of each pod's last /filter, and how ``tessera why`` words it.

The store must stay bounded under any stream of pods (pods, reason texts per pod, node
names), evict the least recently filtered pod first, and hand out copies a later
request cannot change. The words are checked on real filter answers (through
``decide.filter_nodes``, the call the server makes) as well as on records built by hand.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pytest

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.model import NodeName, PodDemand, PodInfo, PodKey
from extender import decide
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from extender.decide import FilterOutcome
from extender.explain import (
    GROUPS_KEPT,
    PodReasons,
    ReasonGroup,
    RecordError,
    Tallies,
    group_reasons,
    headline,
    reason_category,
    record_from_json,
)
from extender.reasons import ReasonStore
from tests.builders import RACK_LABEL, node_json, pod_json

NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
CONFIG = ExtenderConfig(levels=(TopologyLevel("rack", RACK_LABEL), HOSTNAME_LEVEL))


def pod(name: str, uid: str = "", gpus: int = 8) -> PodInfo:
    return PodInfo(PodKey(f"team-a/{name}"), uid or f"uid-{name}", PodDemand(gpus=gpus))


def outcome(fits: int = 0, **reasons: int) -> FilterOutcome:
    """``fits`` fitting nodes, then per reason text (``_`` for spaces) that many nodes;
    a text starting ``in_use`` is resolvable."""
    failed: dict[NodeName, str] = {}
    hopeless: dict[NodeName, str] = {}
    number = fits
    for text, count in reasons.items():
        for _ in range(count):
            target = failed if text.startswith("in_use") else hopeless
            target[NodeName(f"n{number}")] = text.replace("_", " ")
            number += 1
    return FilterOutcome(
        tuple(NodeName(f"n{i}") for i in range(fits)),
        MappingProxyType(failed),
        MappingProxyType(hopeless),
    )


def record(store: ReasonStore, info: PodInfo, answer: FilterOutcome) -> None:
    store.record_filter(info, answer, Tallies.of(answer.failed, answer.unresolvable))


# ---------------------------------------------------------------- the store


def test_the_store_keeps_the_most_recently_filtered_pods_and_evicts_the_oldest() -> None:
    store = ReasonStore(ManualClock(NOW), max_pods=3)
    for name in ("a", "b", "c"):
        record(store, pod(name), outcome(cordoned=1))
    record(store, pod("a"), outcome(cordoned=2))  # filtered again: now the newest
    record(store, pod("d"), outcome(cordoned=1))
    assert len(store) == 3
    assert store.get("team-a/b") is None
    assert [store.get(f"team-a/{n}") is not None for n in "acd"] == [True, True, True]
    again = store.get("team-a/a")
    assert again is not None
    assert (again.filters, again.groups[0].nodes) == (2, 2)


def test_a_stream_of_pods_never_grows_the_store_past_its_bounds() -> None:
    store = ReasonStore(ManualClock(NOW), max_pods=50, max_nodes=1000)
    for i in range(5000):
        # every pod with its own texts: the worst case for the per-pod groups
        answer = outcome(**{f"reason_{i}_{j}": 1 + j for j in range(40)})
        record(store, pod(f"p{i}"), answer)
        assert len(store) <= 50
        assert store.named_nodes <= 1000
    newest = store.get("team-a/p4999")
    assert newest is not None
    assert len(newest.groups) == GROUPS_KEPT
    assert newest.other_reasons == 40 - GROUPS_KEPT
    assert sum(g.nodes for g in newest.groups) + newest.other_nodes == sum(range(1, 41))
    assert newest.candidates == sum(range(1, 41))


def test_the_names_of_candidates_are_not_kept_past_the_bound_on_names() -> None:
    # Each /filter decodes its candidates' names afresh: a record holding on to its
    # answer would keep every candidate's name of the last max_pods pods (about 70 MB
    # after 2,000 pods of 500 candidates), whatever max_nodes says.
    store = ReasonStore(ManualClock(NOW), max_pods=64, max_nodes=100)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(64):
            record(store, pod(f"p{i}"), outcome(fits=2000, cordoned=2000))
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store) == 64
    # 64 pods x 4,000 names of about 60 bytes would be 15 MB
    assert kept < 1_000_000, f"the store kept {kept} bytes for 64 pods"
    newest = store.get("team-a/p63")
    assert newest is not None
    assert (newest.candidates, newest.fit, newest.fit_examples) == (4000, 2000, ("n0", "n1", "n2"))
    assert not newest.examples_kept  # 2,000 refused names are over the bound of 100


def test_node_names_are_kept_for_the_newest_pods_only_counts_for_the_older() -> None:
    store = ReasonStore(ManualClock(NOW), max_pods=10, max_nodes=10)
    record(store, pod("old"), outcome(cordoned=6))
    record(store, pod("new"), outcome(cordoned=6))
    old, new = store.get("team-a/old"), store.get("team-a/new")
    assert old is not None
    assert new is not None
    assert (old.examples_kept, old.groups[0].examples, old.groups[0].nodes) == (False, (), 6)
    assert new.examples_kept
    assert new.groups[0].examples == ("n0", "n1", "n2")
    assert store.named_nodes == 6


def test_a_copy_handed_out_does_not_change_with_later_requests() -> None:
    clock = ManualClock(NOW)
    store = ReasonStore(clock)
    record(store, pod("a"), outcome(cordoned=3))
    first = store.get("team-a/a")
    assert first is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.fit = 9  # type: ignore[misc]
    clock.advance(30)
    record(store, pod("a"), outcome(fits=2, cordoned=1))
    store.record_bind(PodKey("team-a/a"), "n0", "")
    assert (first.fit, first.groups[0].nodes, first.at, first.bind) == (0, 3, NOW, None)
    later = store.get("team-a/a")
    assert later is not None
    assert (later.fit, later.first_at, later.at) == (2, NOW, NOW + timedelta(seconds=30))
    assert later.bind is not None
    assert (later.bind.node, later.bind.error) == ("n0", "")


def test_a_bound_pod_lets_its_node_names_go_and_a_new_uid_starts_afresh() -> None:
    store = ReasonStore(ManualClock(NOW))
    record(store, pod("a"), outcome(in_use=4))
    store.record_bind(PodKey("team-a/a"), "n9", "cannot bind: GPUs taken")
    kept = store.get("team-a/a")
    assert kept is not None
    assert kept.bind is not None
    assert kept.bind.error == "cannot bind: GPUs taken"
    assert store.named_nodes == 4
    store.record_bind(PodKey("team-a/a"), "n9", "")
    assert store.named_nodes == 0
    record(store, pod("a", uid="recreated"), outcome(in_use=1))
    fresh = store.get("team-a/a")
    assert fresh is not None
    assert (fresh.filters, fresh.uid, fresh.bind) == (1, "recreated", None)


def test_a_store_of_no_pods_keeps_nothing() -> None:
    store = ReasonStore(ManualClock(NOW), max_pods=0)
    record(store, pod("a"), outcome(cordoned=1))
    assert (store.enabled, len(store), store.get("team-a/a")) == (False, 0, None)
    with pytest.raises(ValueError, match="negative"):
        ReasonStore(ManualClock(NOW), max_nodes=-1)


def test_groups_are_ordered_by_nodes_and_tell_what_preemption_may_help() -> None:
    answer = outcome(in_use=3, cordoned=5, draining=1)
    groups, others, other_nodes = group_reasons(
        Tallies.of(answer.failed, answer.unresolvable),
        keep=2,
        refused=(answer.unresolvable, answer.failed),
        examples=2,
    )
    assert [(g.reason, g.nodes, g.resolvable, g.examples) for g in groups] == [
        ("cordoned", 5, False, ("n3", "n4")),
        ("in use", 3, True, ("n0", "n1")),
    ]
    assert (others, other_nodes) == (1, 1)


# ---------------------------------------------------------------- words, on real filters


def filtered(
    nodes: list[dict[str, Any]], target: dict[str, Any], bound: tuple[Any, ...] = ()
) -> PodReasons:
    cache = ClusterCache(ManualClock(NOW))
    cache.replace_nodes(node_from_json(n, CONFIG.level_labels) for n in nodes)
    cache.replace_pods(pod_from_json(p) for p in bound)
    info = pod_from_json(target)
    names = [n["metadata"]["name"] for n in nodes]
    answer = decide.filter_nodes(cache.snapshot(), info, names, CONFIG, NOW)
    store = ReasonStore(ManualClock(NOW))
    record(store, info, answer)
    kept = store.get(info.key)
    assert kept is not None
    return kept


def test_a_gang_member_that_fits_nowhere_is_summed_up_in_one_line() -> None:
    nodes = [
        node_json("r1-a", rack="r1"),
        node_json("r1-b", rack="r1", unhealthy="5"),
        node_json("r2-a", rack="r2", drain_after="2026-11-29T20:00:00Z"),
        node_json("r2-b", rack="r2", unschedulable=True),
        node_json("r3-a", rack="r3"),
    ]
    member = pod_json(
        "llm-0", gpus=8, gang="team-nlp.llm", gang_size=2, gang_min=2, topology="required:rack"
    )
    busy = pod_json("other", node="r3-a", gpu_indices="0,1,2,3,4,5,6,7", gpus=8)
    kept = filtered(nodes, member, (busy,))
    assert headline(kept) == (
        "needs 8 GPUs, as one of gang team-nlp.llm (2 members, 2 together, required:rack): "
        "0 of 5 nodes fit: 2 in a rack without room for the gang; 1 cordoned; "
        "1 draining for maintenance; 1 too few healthy GPUs"
    )
    by_text = {g.reason: g for g in kept.groups}
    assert by_text["node has 7 healthy GPUs (GPU 5 unhealthy), pod needs 8"].examples == ("r1-b",)


def record_of(**overrides: Any) -> PodReasons:
    base: dict[str, Any] = {
        "pod": "team-a/p",
        "uid": "u",
        "first_at": NOW,
        "at": NOW,
        "filters": 1,
        "demand": {"gpus": 4},
        "candidates": 50,
        "fit": 0,
        "fit_examples": (),
        "groups": (),
    }
    return PodReasons(**{**base, **overrides})


def group(reason: str, nodes: int, resolvable: bool = False) -> ReasonGroup:
    return ReasonGroup(reason, reason_category(reason), resolvable, nodes)


HEADLINES = [
    pytest.param(
        record_of(fit=50, candidates=50),
        "needs 4 GPUs: 50 of 50 nodes fit",
        id="fits",
    ),
    pytest.param(
        record_of(
            groups=(
                group("2 healthy GPUs free in island 0, pod needs 4", 30, True),
                group("1 healthy GPU free in island 1, pod needs 4", 7, True),
                group("node has 3 healthy GPUs (GPU 5 unhealthy), pod needs 4", 12),
                group("node drains for maintenance at 2026-12-01T02:00:00Z; pod has no time", 1),
            )
        ),
        "needs 4 GPUs: 0 of 50 nodes fit: 37 free GPUs split across NVLink islands "
        "(preemption may help); 12 too few healthy GPUs; 1 draining for maintenance",
        id="islands-summed-across-texts",
    ),
    pytest.param(
        record_of(
            demand={"gpu_milli": 250, "products": ["H100"]},
            groups=(group("node has A100 GPUs; pod accepts H100", 9),),
            other_reasons=2,
            other_nodes=3,
        ),
        "needs 250 milli of one GPU of H100: 0 of 50 nodes fit: 9 another GPU product; "
        "3 for 2 other reasons",
        id="share-product-and-others",
    ),
    pytest.param(
        record_of(
            demand={
                "gpus": 8,
                "gang": "a.b",
                "gang_size": 4,
                "gang_min": 3,
                "topology": "required:block",
            },
            groups=(group("gang a.b has 2 members in block b1; the node is in another block", 40),),
        ),
        "needs 8 GPUs, as one of gang a.b (4 members, 3 together, required:block): 0 of 50 "
        "nodes fit: 40 outside the block of the gang's placed members",
        id="gang-domain",
    ),
]


@pytest.mark.parametrize(("kept", "expected"), HEADLINES)
def test_headline(kept: PodReasons, expected: str) -> None:
    assert headline(kept) == expected


def test_a_record_reads_back_as_written_and_a_wrong_one_is_refused() -> None:
    store = ReasonStore(ManualClock(NOW))
    record(store, pod("a"), outcome(fits=1, in_use=2, cordoned=1))
    store.record_bind(PodKey("team-a/a"), "n0", "")
    kept = store.get("team-a/a")
    assert kept is not None
    assert record_from_json(kept.to_json()) == kept
    broken: list[object] = [[], {"pod": "x"}, {**kept.to_json(), "fit": "1"}]
    for wrong in broken:
        with pytest.raises(RecordError):
            record_from_json(wrong)
