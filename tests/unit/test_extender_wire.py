"""The extender's wire format: what decodes (any key spelling Go accepts, nulls), what
is refused with a reason (HTTP 400), and the exact shapes of every answer."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from cluster import jsonio
from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.convert.pods import pod_from_json
from cluster.feed import CacheFeed
from cluster.model import NodeName, PodKey
from extender import verbs, wire
from extender.decide import FilterOutcome
from extender.preemption import NodeVictims, Victim
from tests import builders
from tests.unit.test_extender_builders import CONFIG, NOW

POD = builders.pod_json("train-0", "team-nlp", gpus=4)
NODE_A = builders.node_json("gpu-a")
NODE_B = builders.node_json("gpu-b")


def body(value: Any) -> bytes:
    return jsonio.dumps(value)


# ---------------------------------------------------------------- RecentPods


def _version(pod: dict[str, Any], version: str | None) -> dict[str, Any]:
    metadata = dict(pod["metadata"])
    metadata.pop("resourceVersion")
    if version is not None:
        metadata["resourceVersion"] = version
    return pod | {"metadata": metadata}


@pytest.mark.parametrize(
    ("first", "then", "same"),
    [
        pytest.param("296", "296", True, id="same-version-is-read-back"),
        pytest.param("296", "297", False, id="new-version-is-decoded"),
        pytest.param(None, None, False, id="no-version-is-decoded-each-time"),
        pytest.param("296", None, False, id="version-dropped-is-decoded"),
    ],
)
def test_recent_pods_read_back_a_pod_only_for_the_same_uid_and_version(
    first: str | None, then: str | None, same: bool
) -> None:
    recent = wire.RecentPods(10)
    four = recent.decode(_version(POD, first))
    # the same UID with other content: only a new resourceVersion may say so
    two = recent.decode(_version(builders.pod_json("train-0", "team-nlp", gpus=2), then))
    assert (two is four) == same
    assert two.demand.gpus == (4 if same else 2)
    assert recent[two.uid] is two, "/bind finds the pod last decoded under its UID"


@pytest.mark.parametrize(
    ("change", "taken"),
    [
        pytest.param({}, True, id="same-uid-and-version-taken-from-the-watch"),
        pytest.param({"resourceVersion": "297"}, False, id="newer-version-converted"),
        pytest.param({"uid": "another"}, False, id="re-created-pod-converted"),
        pytest.param({"namespace": "team-cv"}, False, id="other-pod-converted"),
    ],
)
def test_recent_pods_take_a_pod_the_watch_read_at_the_same_version(
    change: dict[str, str], taken: bool
) -> None:
    watched = pod_from_json(POD)  # what the cache holds after the watch's event
    known = {watched.key: watched}
    sent = POD | {"metadata": POD["metadata"] | change}
    recent = wire.RecentPods(10)
    pod = recent.decode(sent, known)
    assert (pod is watched) == taken
    assert pod.demand.gpus == 4
    assert recent.decode(sent, {}) is pod, "kept for /prioritize and /bind either way"


def test_filter_takes_the_pod_the_watch_read_from_the_snapshot() -> None:
    cache = ClusterCache(ManualClock(NOW))
    feed = CacheFeed(cache)
    feed.node_event("ADDED", builders.node_json("gpu-a"))
    feed.pod_event("ADDED", POD)
    snapshot = cache.snapshot()
    request = body({"Pod": POD, "NodeNames": ["gpu-a"]})
    reply = verbs.handle_filter(request, snapshot, CONFIG, NOW, recent=wire.RecentPods(8))
    assert reply.pod is snapshot.pods[PodKey("team-nlp/train-0")]
    assert jsonio.loads(reply.body)["NodeNames"] == ["gpu-a"]


def test_recent_pods_keep_the_last_ones_by_uid() -> None:
    recent = wire.RecentPods(2)
    pods = [recent.decode(builders.pod_json(f"p-{i}", gpus=1)) for i in range(3)]
    assert list(recent) == [pods[1].uid, pods[2].uid]
    recent.decode(builders.pod_json("p-1", gpus=1))  # read again: the most recent now
    recent.decode(builders.pod_json("p-3", gpus=1))
    assert pods[1].uid in recent
    assert pods[2].uid not in recent
    recent.forget(pods[1].uid)
    assert pods[1].uid not in recent
    assert len(recent) == 1


def test_recent_pods_with_no_room_keep_nothing_but_still_decode() -> None:
    recent = wire.RecentPods(0)
    assert recent.decode(POD).demand.gpus == 4
    assert len(recent) == 0


def test_a_bad_pod_is_not_kept_and_does_not_drop_the_good_one() -> None:
    recent = wire.RecentPods(10)
    good = recent.decode(POD)
    bad = _version(POD, "297")
    bad["metadata"] = {k: v for k, v in bad["metadata"].items() if k != "name"}
    with pytest.raises(wire.BadRequest, match="Pod"):
        wire.decode_extender_args(body({"Pod": bad, "NodeNames": ["gpu-a"]}), recent)
    assert dict(recent) == {good.uid: good}


# ---------------------------------------------------------------- ExtenderArgs


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param(("Pod", "Nodes", "NodeNames"), id="go-names"),
        pytest.param(("pod", "nodes", "nodeNames"), id="camel-case"),
        pytest.param(("POD", "NODES", "nodenames"), id="any-case"),
    ],
)
def test_extender_args_decode_in_any_key_case(keys: tuple[str, str, str]) -> None:
    pod, nodes, names = keys
    args = wire.decode_extender_args(body({pod: POD, nodes: None, names: ["gpu-a", "gpu-b"]}))
    assert args.pod.key == PodKey("team-nlp/train-0")
    assert args.pod.demand.gpus == 4
    assert args.node_names == ("gpu-a", "gpu-b")
    assert args.nodes is None
    assert args.by_name


def test_the_last_of_two_spellings_wins_as_in_go() -> None:
    args = wire.decode_extender_args(
        b'{"Pod": %s, "NodeNames": ["first"], "nodenames": ["last"]}' % body(POD)
    )
    assert args.node_names == ("last",)


def test_full_nodes_are_kept_as_received() -> None:
    node_list = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}}
    args = wire.decode_extender_args(
        body({"Pod": POD, "Nodes": node_list | {"items": [NODE_A, NODE_B]}, "NodeNames": None})
    )
    assert not args.by_name
    assert args.nodes is not None
    assert args.nodes.items == (NODE_A, NODE_B)
    assert (args.nodes.kind, args.nodes.api_version) == ("NodeList", "v1")
    assert args.nodes.metadata == {"resourceVersion": "9"}


def test_neither_names_nor_nodes_decodes_for_the_caller_to_refuse() -> None:
    args = wire.decode_extender_args(body({"Pod": POD}))
    assert (args.node_names, args.nodes) == (None, None)


def test_unknown_keys_are_ignored() -> None:
    args = wire.decode_extender_args(body({"Pod": POD, "NodeNames": [], "Extra": {"x": 1}}))
    assert args.node_names == ()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b"", "the body is not valid JSON", id="empty"),
        pytest.param(b'{"Pod": ', "the body is not valid JSON", id="truncated"),
        pytest.param(b"[]", "the body is a JSON array, not an ExtenderArgs object", id="array"),
        pytest.param(b'"Pod"', "the body is a JSON string, not an ExtenderArgs object", id="str"),
        pytest.param(b"null", "the body is a JSON null, not an ExtenderArgs object", id="null"),
        pytest.param(
            b'{"NodeNames": ["a"]}',
            "the body is not an ExtenderArgs: Pod is missing or null",
            id="no-pod",
        ),
        pytest.param(
            b'{"Pod": null, "NodeNames": ["a"]}',
            "the body is not an ExtenderArgs: Pod is missing or null",
            id="null-pod",
        ),
        pytest.param(
            b'{"Pod": [], "NodeNames": ["a"]}',
            "the body is not an ExtenderArgs: Pod: Input should be a valid dictionary",
            id="pod-not-an-object",
        ),
        pytest.param(
            b'{"Pod": {"metadata": {}}, "NodeNames": ["a"]}',
            "the body is not an ExtenderArgs: Pod: a Pod without metadata.name",
            id="pod-without-name",
        ),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "gpu-a"}',
            "the body is not an ExtenderArgs: NodeNames: Input should be a valid list",
            id="names-not-a-list",
        ),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}',
            "the body is not an ExtenderArgs: NodeNames.0: Input should be a valid string",
            id="name-not-a-string",
        ),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": {}}}',
            "the body is not an ExtenderArgs: Nodes.items: Input should be a valid list",
            id="items-not-a-list",
        ),
    ],
)
def test_bad_extender_args_say_why(raw: bytes, reason: str) -> None:
    with pytest.raises(wire.BadRequest) as caught:
        wire.decode_extender_args(raw)
    assert str(caught.value).startswith(reason)


def test_a_bad_request_repeats_a_long_node_name_cut_short() -> None:
    """Found by fuzzing: a node name is a key of the victims' map, and the reason
    named where the error was, so a 60 KB name made a 60 KB answer (and log line)."""
    name = "gpu-" + "x" * 60_000
    raw = body({"Pod": POD, "NodeNameToMetaVictims": {name: "not victims"}})
    with pytest.raises(wire.BadRequest) as caught:
        wire.decode_preemption_args(raw)
    reason = str(caught.value)
    assert reason.startswith("the body is not an ExtenderPreemptionArgs: NodeNameToMetaVictims.")
    assert "(60026 characters)" in reason
    assert len(reason) < 400


def test_an_oversized_body_is_refused_before_parsing() -> None:
    with pytest.raises(wire.BadRequest, match="more than the"):
        wire.decode_extender_args(b" " * (wire.MAX_BODY_BYTES + 1))


# ---------------------------------------------------------------- filter answers


def outcome(fits: tuple[str, ...] = (), **failed: str) -> FilterOutcome:
    return FilterOutcome(
        tuple(NodeName(n) for n in fits),
        MappingProxyType({NodeName(k): v for k, v in failed.items() if not v.startswith("!")}),
        MappingProxyType({NodeName(k): v[1:] for k, v in failed.items() if v.startswith("!")}),
    )


def test_filter_by_name_answers_names_and_never_null() -> None:
    args = wire.decode_extender_args(body({"Pod": POD, "NodeNames": ["gpu-a"]}))
    empty = jsonio.loads(wire.encode_filter(args, outcome(gpu_a="busy")))
    assert empty == {
        "NodeNames": [],
        "FailedNodes": {"gpu_a": "busy"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    assert "Nodes" not in empty


def test_filter_with_nodes_answers_the_fitting_items_untouched() -> None:
    node_list = {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [NODE_A, NODE_B]}
    args = wire.decode_extender_args(body({"Pod": POD, "Nodes": node_list}))
    answer = jsonio.loads(wire.encode_filter(args, outcome(("gpu-b",), gpu_a="!cordoned")))
    assert answer == {
        "Nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [NODE_B]},
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {"gpu_a": "cordoned"},
        "Error": "",
    }


def test_filter_with_nodes_keeps_the_captured_envelope() -> None:
    """captures/022 sends ``{"metadata": {}, "items": [...]}``: no kind, no apiVersion."""
    args = wire.decode_extender_args(
        body({"Pod": POD, "Nodes": {"metadata": {}, "items": [NODE_A]}, "NodeNames": None})
    )
    answer = jsonio.loads(wire.encode_filter(args, outcome()))
    assert answer["Nodes"] == {"metadata": {}, "items": []}


@pytest.mark.parametrize(
    ("by_name", "expected"),
    [
        (True, {"NodeNames": []}),
        (False, {"Nodes": None, "NodeNames": None}),
    ],
)
def test_filter_error_answer(by_name: bool, expected: dict[str, Any]) -> None:
    answer = jsonio.loads(wire.encode_filter_error("it broke", by_name=by_name))
    assert answer == expected | {
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "it broke",
    }


# ---------------------------------------------------------------- the other verbs


def test_priorities_are_a_host_priority_list() -> None:
    raw = wire.encode_priorities(["gpu-a", "gpu-b"], [0, 10])
    assert raw == b'[{"Host":"gpu-a","Score":0},{"Host":"gpu-b","Score":10}]'
    assert wire.decode_priorities(raw) == [("gpu-a", 0), ("gpu-b", 10)]
    assert wire.encode_priorities([], []) == b"[]"
    with pytest.raises(ValueError, match="2 hosts and 1 scores"):
        wire.encode_priorities(["gpu-a", "gpu-b"], [10])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}',
        b'{"podname": "p", "podnamespace": "ns", "poduid": "u", "node": "n"}',
    ],
)
def test_binding_args_decode_in_any_case(raw: bytes) -> None:
    args = wire.decode_binding_args(raw)
    assert (args.key, args.pod_uid, args.node) == (PodKey("ns/p"), "u", "n")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b'{"PodName": "p", "PodNamespace": "ns"}', "no Node", id="no-node"),
        pytest.param(b'{"Node": "n", "PodUID": null}', "no PodName, PodNamespace", id="no-pod"),
        pytest.param(
            b'{"PodName": 3, "PodNamespace": "ns", "Node": "n"}',
            "PodName: Input should be a valid string",
            id="name-not-a-string",
        ),
    ],
)
def test_bad_binding_args_say_why(raw: bytes, reason: str) -> None:
    with pytest.raises(wire.BadRequest, match=reason):
        wire.decode_binding_args(raw)


def test_a_null_pod_uid_is_empty_as_in_go() -> None:
    args = wire.decode_binding_args(b'{"PodName":"p","PodNamespace":"ns","PodUID":null,"Node":"n"}')
    assert args.pod_uid == ""


def test_binding_result() -> None:
    assert wire.encode_binding_result() == b'{"Error":""}'
    assert wire.decode_binding_result(wire.encode_binding_result("no room")) == "no room"


def test_preemption_args_from_meta_victims() -> None:
    raw = body(
        {
            "Pod": POD,
            "NodeNameToMetaVictims": {
                "gpu-a": {"Pods": [{"UID": "u1"}, {"uid": "u2"}], "NumPDBViolations": 1},
                "gpu-b": None,
                "gpu-c": {"Pods": None},
            },
        }
    )
    args = wire.decode_preemption_args(raw)
    assert dict(args.proposals) == {
        "gpu-a": NodeVictims((Victim("u1"), Victim("u2")), 1),
        "gpu-b": NodeVictims((), 0),
        "gpu-c": NodeVictims((), 0),
    }


def test_preemption_args_from_whole_victim_pods() -> None:
    victim = builders.pod_json("old-0", "team-cv", gpus=2, node="gpu-a", gpu_indices="0,1")
    args = wire.decode_preemption_args(
        body({"Pod": POD, "NodeNameToVictims": {"gpu-a": {"Pods": [victim]}}})
    )
    uid = victim["metadata"]["uid"]
    assert dict(args.proposals) == {
        "gpu-a": NodeVictims((Victim(uid, PodKey("team-cv/old-0")),), 0)
    }


def test_meta_victims_win_when_both_maps_come() -> None:
    args = wire.decode_preemption_args(
        body(
            {
                "Pod": POD,
                "NodeNameToVictims": {"gpu-a": {"Pods": [POD]}},
                "NodeNameToMetaVictims": {"gpu-b": {"Pods": [{"UID": "u"}]}},
            }
        )
    )
    assert list(args.proposals) == ["gpu-b"]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b'{"NodeNameToMetaVictims": {}}', "Pod is missing or null", id="no-pod"),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": '
            b'{"n": {"NumPDBViolations": "1"}}}',
            "NodeNameToMetaVictims.n.NumPDBViolations: Input should be a valid integer",
            id="pdb-count-not-a-number",
        ),
        pytest.param(
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": {"n": {"Pods": [{}]}}}',
            "a victim on n has no metadata",
            id="victim-without-metadata",
        ),
    ],
)
def test_bad_preemption_args_say_why(raw: bytes, reason: str) -> None:
    with pytest.raises(wire.BadRequest) as caught:
        wire.decode_preemption_args(raw)
    assert reason in str(caught.value)


def test_preemption_result_names_victims_by_uid() -> None:
    chosen = {
        NodeName("gpu-a"): NodeVictims((Victim("u1", PodKey("ns/a")),), 1),
        NodeName("gpu-b"): NodeVictims((), 0),
    }
    raw = wire.encode_preemption_result(chosen)
    assert jsonio.loads(raw) == {
        "NodeNameToMetaVictims": {
            "gpu-a": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1},
            "gpu-b": {"Pods": [], "NumPDBViolations": 0},
        }
    }
    assert wire.decode_preemption_result(raw) == {
        "gpu-a": NodeVictims((Victim("u1"),), 1),
        "gpu-b": NodeVictims((), 0),
    }


def test_kube_schedulers_side_round_trips() -> None:
    raw = wire.encode_extender_args(POD, node_names=["gpu-a"])
    assert wire.decode_extender_args(raw).node_names == ("gpu-a",)
    raw = wire.encode_extender_args(POD, nodes=[NODE_A])
    decoded = wire.decode_extender_args(raw)
    assert decoded.nodes is not None
    assert decoded.nodes.items == (NODE_A,)
    bound = wire.decode_binding_args(wire.encode_binding_args("ns", "p", "u", "n"))
    assert (bound.key, bound.pod_uid, bound.node) == ("ns/p", "u", "n")
    result = wire.decode_filter_result(
        b'{"NodeNames": ["a"], "FailedNodes": null, "FailedAndUnresolvableNodes": {"b": "x"}}'
    )
    assert (result.node_names, dict(result.failed), dict(result.unresolvable), result.error) == (
        ("a",),
        {},
        {"b": "x"},
        "",
    )


def test_bad_request_body_is_json_a_person_can_read() -> None:
    assert jsonio.loads(wire.encode_bad_request("why")) == {"Error": "why"}
