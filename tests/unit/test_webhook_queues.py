"""The queue policy read from Kueue objects: quota and cohort arithmetic, queue settings
with their fallbacks, default queues, topology level names, and malformed objects that
are skipped and reported rather than crashing the webhook."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import labels
from cluster.model import Taint
from tests.builders import KUEUE, Quota, cq_obj, flavor_obj, lq_obj, topology_obj, wpc_obj
from webhook.kueue_objects import policy_view
from webhook.policy_build import policy_from_objects
from webhook.queues import (
    Limit,
    PolicyError,
    QueueSettings,
    Toleration,
    format_seconds,
    parse_seconds,
)

GPU = labels.GPU_RESOURCE
MILLI = labels.GPU_MILLI_RESOURCE


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (3600, 3600),
        ("3600", 3600),
        (" 7200 ", 7200),
        ("4h", 14400),
        ("90m", 5400),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("45s", 45),
        ("2h0m10s", 7210),
        ("1500ms", 2),  # a fraction of a second rounds up: a limit is never shortened
        ("1ns", 1),
    ],
)
def test_time_limits_accept_seconds_and_go_durations(value: object, seconds: int) -> None:
    assert parse_seconds(value) == seconds


@pytest.mark.parametrize(
    "value", ["", "0", 0, "0s", "-1h", "4 h", "4x", "h", "1h-30m", "4h ", True, None, 1.5, "4H"]
)
def test_time_limits_reject_what_is_not_a_positive_duration(value: object) -> None:
    if value == "4h ":
        assert parse_seconds(value) == 14400  # surrounding space is trimmed, as for ints
        return
    with pytest.raises(PolicyError):
        parse_seconds(value)


@pytest.mark.parametrize(
    ("seconds", "text"), [(14400, "4h"), (5400, "1h30m"), (59, "59s"), (3601, "1h1s"), (60, "1m")]
)
def test_durations_print_the_way_admins_write_them(seconds: int, text: str) -> None:
    assert format_seconds(seconds) == text


# ---------------------------------------------------------------- cohort arithmetic


def _limit(objs: list[dict[str, Any]], cq: str = "mine", flavor: str = "h100") -> Limit:
    return policy_from_objects(objs).limit(cq, flavor, GPU)


@pytest.mark.parametrize(
    ("mine", "others", "cohort", "total", "borrowable"),
    [
        pytest.param((16,), [], None, 16, 0, id="no-cohort-no-borrowing"),
        pytest.param((16, 16), [(16,)], None, 16, 0, id="borrowing-limit-without-cohort"),
        pytest.param((16,), [(16,)], "c", 32, 16, id="borrows-all-the-cohort-lends"),
        pytest.param((16,), [(16, None, 4)], "c", 20, 4, id="others-lending-limit"),
        pytest.param((16,), [(16,), (8, None, 2)], "c", 34, 18, id="sums-every-other-queue"),
        pytest.param((16, 8), [(16,)], "c", 24, 8, id="own-borrowing-limit-caps"),
        pytest.param((16, 32), [(16, None, 8)], "c", 24, 8, id="cannot-borrow-more-than-lent"),
        pytest.param((16, 0), [(16,)], "c", 16, 0, id="borrowing-limit-zero"),
        pytest.param((16, None, 0), [(16,)], "c", 32, 16, id="own-lending-limit-irrelevant"),
        pytest.param(("0",), [(8,)], "c", 8, 8, id="zero-nominal-borrows"),
    ],
)
def test_the_most_a_queue_could_ever_get(
    mine: Quota, others: list[Quota], cohort: str | None, total: int, borrowable: int
) -> None:
    objs = [cq_obj("mine", {"h100": {GPU: mine}}, cohort=cohort)]
    objs += [cq_obj(f"other{i}", {"h100": {GPU: q}}, cohort="c") for i, q in enumerate(others)]
    limit = _limit(objs)
    assert (limit.total // 1000, limit.borrowable // 1000) == (total, borrowable)
    assert limit.nominal + limit.borrowable == limit.total


def test_only_the_same_flavor_and_resource_in_the_same_cohort_can_be_borrowed() -> None:
    limit = _limit(
        [
            cq_obj("mine", {"h100": {GPU: (8,)}}, cohort="c"),
            cq_obj("other-flavor", {"a100": {GPU: (100,)}}, cohort="c"),
            cq_obj("other-resource", {"h100": {MILLI: (100,)}}, cohort="c"),
            cq_obj("other-cohort", {"h100": {GPU: (100,)}}, cohort="d"),
            cq_obj("lender", {"h100": {GPU: (4,)}}, cohort="c"),
        ]
    )
    assert limit.total == 12_000


def test_a_v1beta1_cohort_is_the_same_cohort() -> None:
    limit = _limit(
        [
            cq_obj("mine", {"h100": {GPU: (8,)}}, cohort="c"),
            cq_obj("old", {"h100": {GPU: (8,)}}, cohort="c", v1beta1=True),
        ]
    )
    assert limit.total == 16_000


def test_a_queue_without_quota_for_a_flavor_gets_nothing_of_it() -> None:
    assert _limit([cq_obj("mine", {"h100": {GPU: (8,)}})], flavor="a100") == Limit()


def test_quantities_in_any_kubernetes_form() -> None:
    policy = policy_from_objects(
        [cq_obj("mine", {"h100": {GPU: ("16", "8", "4")}, "s": {MILLI: ("2.5k",)}})]
    )
    assert policy.limit("mine", "h100", GPU).nominal == 16_000
    assert policy.limit("mine", "s", MILLI).nominal == 2_500_000


# ---------------------------------------------------------------- queues and their settings


@pytest.mark.parametrize(
    ("resources", "offered"),
    [
        ((GPU,), ("spot", "plain", "any")),
        ((MILLI,), ("spot", "any")),
        ((GPU, MILLI), ("spot", "any")),
    ],
)
def test_a_queue_offers_the_gpu_flavors_it_could_get_every_asked_resource_from(
    resources: tuple[str, ...], offered: tuple[str, ...]
) -> None:
    spot = {"key": "spot", "value": "true", "effect": "NoSchedule"}
    policy = policy_from_objects(
        [
            flavor_obj("spot", {"pool": "spot"}, taints=[spot]),
            flavor_obj("plain", {"pool": "plain"}),
            flavor_obj("any"),
            flavor_obj("ghost-free", {"pool": "x"}),
            cq_obj(
                "mine",
                {
                    "spot": {GPU: (8,), MILLI: (1000,)},
                    "plain": {GPU: (8,), MILLI: (0,)},
                    "any": {GPU: (1,), MILLI: (500,)},
                    "missing": {GPU: (8,)},
                },
            ),
        ]
    )
    queue = policy.cluster_queue("mine")
    assert queue is not None
    offer = policy.offer(queue, resources)
    assert tuple(f.name for f in offer.flavors) == offered
    assert offer.terms is None  # "any" has no node labels: its pods may run anywhere
    assert [(name, taint.key) for name, taint, *_ in offer.taints] == [("spot", "spot")]
    # Worked out once per policy, and the same as working it out on demand.
    assert replace(policy, offers={}).offer(queue, resources) == offer


def test_the_node_selector_terms_of_labelled_flavors_once_each() -> None:
    policy = policy_from_objects(
        [
            flavor_obj("a", {"pool": "x", "gpu": "h100"}),
            flavor_obj("b", {"gpu": "h100", "pool": "x"}),
            flavor_obj("c", {"pool": "y"}),
            cq_obj("mine", {"a": {GPU: (1,)}, "b": {GPU: (1,)}, "c": {GPU: (1,)}}),
        ]
    )
    queue = policy.cluster_queue("mine")
    assert queue is not None
    x = [{"key": "gpu", "operator": "In", "values": ["h100"]},
         {"key": "pool", "operator": "In", "values": ["x"]}]  # fmt: skip
    y = [{"key": "pool", "operator": "In", "values": ["y"]}]
    assert policy.offer(queue, (GPU,)).terms == ({"matchExpressions": x}, {"matchExpressions": y})


def test_gpu_flavors_are_those_of_groups_covering_a_gpu_resource_in_queue_order() -> None:
    cq = cq_obj("mine", {"b": {GPU: (1,)}, "a": {GPU: (1,)}})
    cq["spec"]["resourceGroups"].insert(
        0,
        {
            "coveredResources": ["cpu"],
            "flavors": [{"name": "cpu", "resources": [{"name": "cpu", "nominalQuota": 8}]}],
        },
    )
    queue = policy_from_objects([cq]).cluster_queue("mine")
    assert queue is not None
    assert queue.flavors == ("cpu", "b", "a")
    assert queue.gpu_flavors == ("b", "a")
    assert queue.flavors_for("cpu") == ("cpu",)


def _settings(
    lq_annotations: dict[str, str] | None, cq_annotations: dict[str, str] | None = None
) -> tuple[QueueSettings, tuple[str, ...]]:
    policy = policy_from_objects(
        [
            cq_obj("cq", {"h100": {GPU: (8,)}}, annotations=cq_annotations),
            lq_obj("ns", "q", "cq", lq_annotations),
            wpc_obj("low", 1),
            wpc_obj("high", 2),
        ]
    )
    queue = policy.local_queue("ns", "q")
    assert queue is not None
    return queue.settings, policy.problems


@pytest.mark.parametrize(
    ("lq", "cq", "expected"),
    [
        pytest.param(None, None, QueueSettings(), id="none"),
        pytest.param(
            {
                labels.DEFAULT_PRIORITY_CLASS: "high",
                labels.DEFAULT_TIME_LIMIT: "4h",
                labels.MAX_TIME_LIMIT: "86400",
                labels.MAX_GPUS_PER_JOB: "16",
            },
            None,
            QueueSettings("high", 14400, 86400, 16),
            id="all-on-local-queue",
        ),
        pytest.param(
            None,
            {labels.DEFAULT_PRIORITY_CLASS: "low", labels.MAX_TIME_LIMIT: "12h"},
            QueueSettings("low", None, 43200, None),
            id="falls-back-to-cluster-queue",
        ),
        pytest.param(
            {labels.DEFAULT_PRIORITY_CLASS: "high"},
            {labels.DEFAULT_PRIORITY_CLASS: "low", labels.MAX_GPUS_PER_JOB: "8"},
            QueueSettings("high", None, None, 8),
            id="field-by-field",
        ),
        pytest.param(
            {labels.DEFAULT_TIME_LIMIT: "48h", labels.MAX_TIME_LIMIT: "24h"},
            None,
            QueueSettings(None, 86400, 86400, None),
            id="default-above-max-is-capped",
        ),
        pytest.param(
            {labels.MAX_GPUS_PER_JOB: "lots"},
            {labels.MAX_GPUS_PER_JOB: "8"},
            QueueSettings(None, None, None, 8),
            id="bad-value-ignored-falls-back",
        ),
    ],
)
def test_queue_settings_read_local_queue_then_cluster_queue(
    lq: dict[str, str] | None, cq: dict[str, str] | None, expected: QueueSettings
) -> None:
    assert _settings(lq, cq)[0] == expected


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        ({labels.MAX_GPUS_PER_JOB: "0"}, "max-gpus-per-job='0' ignored"),
        ({labels.DEFAULT_TIME_LIMIT: "soon"}, "default-time-limit='soon' ignored"),
        ({labels.DEFAULT_PRIORITY_CLASS: "urgent"}, "default priority class urgent does not"),
        ({labels.DEFAULT_TIME_LIMIT: "2h", labels.MAX_TIME_LIMIT: "1h"}, "above the maximum"),
    ],
)
def test_bad_queue_annotations_are_reported(annotations: dict[str, str], problem: str) -> None:
    _, problems = _settings(annotations)
    assert any(problem in p and "LocalQueue ns/q" in p for p in problems), problems


@pytest.mark.parametrize(
    ("queues", "default"),
    [
        pytest.param([("default", {}), ("other", {})], "default", id="named-default"),
        pytest.param(
            [("default", {}), ("gpu", {labels.DEFAULT_QUEUE: "true"})], "gpu", id="marked-wins"
        ),
        pytest.param([("gpu", {labels.DEFAULT_QUEUE: "True"})], "gpu", id="case-insensitive"),
        pytest.param([("gpu", {labels.DEFAULT_QUEUE: "false"})], None, id="marked-false"),
        pytest.param([("other", {})], None, id="none"),
    ],
)
def test_the_default_queue_of_a_namespace(
    queues: list[tuple[str, dict[str, str]]], default: str | None
) -> None:
    objs = [cq_obj("cq", {"h100": {GPU: (8,)}})]
    objs += [lq_obj("ns", name, "cq", annotations) for name, annotations in queues]
    policy = policy_from_objects(objs)
    found = policy.default_queue("ns")
    assert (found.name if found else None) == default
    assert policy.default_queue("elsewhere") is None


def test_two_marked_default_queues_pick_the_first_by_name_and_say_so() -> None:
    marked = {labels.DEFAULT_QUEUE: "true"}
    policy = policy_from_objects(
        [
            cq_obj("cq", {"h100": {GPU: (8,)}}),
            lq_obj("ns", "zeta", "cq", marked),
            lq_obj("ns", "alpha", "cq", marked),
        ]
    )
    found = policy.default_queue("ns")
    assert found is not None
    assert found.name == "alpha"
    assert any("alpha, zeta are all marked" in p for p in policy.problems)


def test_queues_are_listed_per_namespace_sorted() -> None:
    policy = policy_from_objects(
        [lq_obj("ns", "b", "cq"), lq_obj("ns", "a", "cq"), lq_obj("other", "c", "cq")]
    )
    assert policy.queues_in("ns") == ("a", "b")
    assert policy.queues_in("nowhere") == ()
    assert "LocalQueue ns/a: ClusterQueue cq does not exist" in policy.problems


# ---------------------------------------------------------------- topologies


@pytest.mark.parametrize(
    ("name", "node_label"),
    [
        ("example.com/block", "example.com/block"),
        ("block", "example.com/block"),
        ("rack", "example.com/rack"),
        ("hostname", labels.HOSTNAME),
        (labels.HOSTNAME, labels.HOSTNAME),
        ("zone", None),
        ("com/rack", None),
    ],
)
def test_a_level_is_named_by_its_node_label_or_the_name_part(
    name: str, node_label: str | None
) -> None:
    policy = policy_from_objects(
        [topology_obj("t", ["example.com/block", "example.com/rack", labels.HOSTNAME])]
    )
    topology = policy.topology("t")
    assert topology is not None
    assert topology.node_label(name) == node_label
    assert topology.level_names == ("block", "rack", "hostname")


def test_an_ambiguous_name_part_names_nothing() -> None:
    policy = policy_from_objects([topology_obj("t", ["a.example/rack", "b.example/rack"])])
    topology = policy.topology("t")
    assert topology is not None
    assert topology.node_label("rack") is None
    assert topology.node_label("b.example/rack") == "b.example/rack"
    assert topology.level_names == ("a.example/rack", "b.example/rack")
    assert any("share the name 'rack'" in p for p in policy.problems)


# ---------------------------------------------------------------- flavors and tolerations


def test_flavors_keep_labels_taints_and_topology() -> None:
    policy = policy_from_objects(
        [
            flavor_obj(
                "spot",
                {labels.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"},
                taints=[{"key": "spot", "value": "true", "effect": "NoSchedule"}],
                topology="t",
            ),
            topology_obj("t", ["rack"]),
        ]
    )
    spot = policy.flavor("spot")
    assert spot is not None
    assert spot.product == "NVIDIA-H100-80GB-HBM3"
    assert spot.node_taints == (Taint("spot", "true", "NoSchedule"),)
    assert spot.topology_name == "t"
    assert policy.problems == ()


def _annotated(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    obj["metadata"]["annotations"] = annotations
    return obj


@pytest.mark.parametrize(
    ("flavor", "topology", "kueue_places"),
    [
        pytest.param(flavor_obj("f", topology="t"), "t", True, id="spec-topologyName"),
        pytest.param(_annotated(flavor_obj("f"), {labels.FLAVOR_TOPOLOGY: "t"}), "t", False,
                     id="tessera-annotation"),
        pytest.param(_annotated(flavor_obj("f", topology="t"), {labels.FLAVOR_TOPOLOGY: "u"}),
                     "t", True, id="kueue-field-wins"),
        pytest.param(_annotated(flavor_obj("f"), {labels.FLAVOR_TOPOLOGY: ""}), None, False,
                     id="empty-annotation"),
        pytest.param(flavor_obj("f"), None, False, id="neither"),
    ],
)  # fmt: skip
def test_a_flavors_topology_and_who_places_by_it(
    flavor: dict[str, Any], topology: str | None, kueue_places: bool
) -> None:
    policy = policy_from_objects([flavor, topology_obj("t", ["rack"]), topology_obj("u", ["x"])])
    parsed = policy.flavor("f")
    assert parsed is not None
    assert (parsed.topology_name, parsed.kueue_topology) == (topology, kueue_places)


def test_the_flavor_topology_annotation_survives_the_policy_view() -> None:
    flavor = _annotated(flavor_obj("f"), {labels.FLAVOR_TOPOLOGY: "t", "other": "x"})
    assert policy_view(flavor)["metadata"]["annotations"] == {labels.FLAVOR_TOPOLOGY: "t"}


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("spot", "Equal", "true", "NoSchedule"), Taint("spot", "true", "NoSchedule"),
         True),
        (Toleration("spot", "Equal", "false", "NoSchedule"), Taint("spot", "true", "NoSchedule"),
         False),
        (Toleration("spot", "Exists"), Taint("spot", "true", "NoSchedule"), True),
        (Toleration("spot", "Exists", effect="NoExecute"), Taint("spot", "", "NoSchedule"), False),
        (Toleration("", "Exists"), Taint("anything", "x", "NoExecute"), True),
        (Toleration("other", "Exists"), Taint("spot", "", "NoSchedule"), False),
        (Toleration("spot", "Equal", "", ""), Taint("spot", "", "NoSchedule"), True),
    ],
)  # fmt: skip
def test_tolerations_follow_the_kubernetes_rule(
    toleration: Toleration, taint: Taint, tolerated: bool
) -> None:
    assert toleration.tolerates(taint) is tolerated


# ---------------------------------------------------------------- malformed objects


def _broken(kind: str, **changes: Any) -> dict[str, Any]:
    base = {
        "ResourceFlavor": flavor_obj("f", {"a": "b"}),
        "ClusterQueue": cq_obj("cq", {"h100": {GPU: (8,)}}),
        "LocalQueue": lq_obj("ns", "q", "cq"),
        "Topology": topology_obj("t", ["rack"]),
        "WorkloadPriorityClass": wpc_obj("p", 1),
    }[kind]
    for path, value in changes.items():
        node: Any = base
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[keys[-1]] = value
    return base


NOMINAL = "spec__resourceGroups__0__flavors__0__resources__0__nominalQuota"


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (_broken("ResourceFlavor", spec__nodeLabels=["a"]), "nodeLabels is not a map"),
        (_broken("ResourceFlavor", spec__nodeTaints=[{"key": "k", "effect": "Sometimes"}]),
         "not a taint effect"),
        (_broken("ResourceFlavor", spec__tolerations=[{"operator": "Maybe"}]), "operator"),
        (_broken("ResourceFlavor", metadata={}), "metadata.name is missing"),
        (_broken("ClusterQueue", spec="full"), "spec is not an object"),
        (_broken("ClusterQueue", **{NOMINAL: "lots"}), "is not a Kubernetes quantity"),
        (_broken("ClusterQueue", **{NOMINAL: None}), "nominalQuota is missing"),
        (_broken("ClusterQueue", spec__resourceGroups={"a": 1}), "resourceGroups is not a list"),
        (_broken("ClusterQueue", spec__cohortName=7), "cohortName is not a string"),
        (_broken("LocalQueue", spec={}), "spec.clusterQueue is missing"),
        (_broken("LocalQueue", metadata={"name": "q"}), "metadata.namespace is missing"),
        (_broken("Topology", spec__levels=[]), "spec.levels is empty"),
        (_broken("Topology", spec__levels=[{"nodeLabel": "a"}, {"nodeLabel": "a"}]), "twice"),
        (_broken("WorkloadPriorityClass", value="high"), "is not an integer"),
    ],
)  # fmt: skip
def test_a_malformed_object_is_skipped_and_reported(obj: dict[str, Any], problem: str) -> None:
    good = lq_obj("ns", "fine", "cq")
    policy = policy_from_objects([obj, good])
    assert any(problem in p and "skipped" in p for p in policy.problems), policy.problems
    assert policy.local_queue("ns", "fine") is not None


def test_lists_are_read_and_foreign_or_empty_documents_ignored() -> None:
    policy = policy_from_objects(
        [
            None,  # type: ignore[list-item]  # an empty YAML document
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}},
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [wpc_obj("p", 5), lq_obj("ns", "q", "c")],
            },
            "not an object",  # type: ignore[list-item]
        ]
    )
    pc = policy.priority_class("p")
    assert pc is not None
    assert pc.value == 5
    assert policy.local_queue("ns", "q") is not None
    assert any("not an object" in p for p in policy.problems)


def test_a_later_definition_wins_and_the_duplicate_is_reported() -> None:
    policy = policy_from_objects([wpc_obj("p", 1), wpc_obj("p", 2)])
    pc = policy.priority_class("p")
    assert pc is not None
    assert pc.value == 2
    assert any("defined twice" in p for p in policy.problems)


def test_missing_references_are_reported() -> None:
    policy = policy_from_objects(
        [
            cq_obj("cq", {"ghost": {GPU: (1,)}}),
            flavor_obj("f", topology="nowhere"),
        ]
    )
    assert "ClusterQueue cq: ResourceFlavor ghost does not exist" in policy.problems
    assert "ResourceFlavor f: Topology nowhere does not exist" in policy.problems


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
_field_names = st.sampled_from(
    ["spec", "metadata", "value", "name", "namespace", "annotations", "levels", "nodeLabels",
     "resourceGroups", "flavors", "resources", "nominalQuota", "clusterQueue", "cohortName",
     "coveredResources", "nodeTaints", "tolerations", "borrowingLimit", "items"]
)  # fmt: skip
_shapes = st.recursive(
    _json,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_field_names, children, max_size=5)
    ),
    max_leaves=15,
)


@settings(max_examples=100, deadline=None)
@given(
    kind=st.sampled_from(
        [
            "ResourceFlavor",
            "ClusterQueue",
            "LocalQueue",
            "Topology",
            "WorkloadPriorityClass",
            "List",
        ]
    ),
    body=st.dictionaries(_field_names, _shapes, max_size=5),
)
def test_no_object_shape_crashes_the_policy(kind: str, body: dict[str, Any]) -> None:
    policy_from_objects([{"apiVersion": KUEUE, "kind": kind, **body}])
