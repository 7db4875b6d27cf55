"""RFC 6902 patches: what ``diff`` sends, that ``apply_patch`` turns the original into the
mutated object for any JSON, and that for any generated Job the webhook's patch yields a
valid Job that a second pass leaves alone (the reinvocation kube-apiserver does)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import jsonio, labels
from tests.unit.test_webhook_rules import CONFIG, POLICY, job, request
from webhook.admit import admit
from webhook.patch import (
    Draft,
    JsonPatch,
    PatchError,
    apply_patch,
    clone,
    diff,
    escape,
    pointer,
    unescape,
)
from webhook.rules.outcome import Allowed
from webhook.workload import WorkloadKind, workload_from_object


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON documents: types included (``1`` is not ``true``), key order not."""
    return jsonio.dumps_pretty(a) == jsonio.dumps_pretty(b)


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("plain", "plain"),
        ("tessera.dev/gang", "tessera.dev~1gang"),
        ("a~b", "a~0b"),
        ("~/", "~0~1"),
        ("~1", "~01"),  # escaping ~ first keeps a literal "~1" apart from "/"
        ("", ""),
        (3, "3"),
    ],
)
def test_pointer_tokens_escape_tilde_then_slash(token: str | int, escaped: str) -> None:
    assert escape(token) == escaped
    assert unescape(escaped) == str(token)


def test_a_pointer_joins_escaped_tokens() -> None:
    assert pointer(("metadata", "labels", labels.QUEUE_NAME)) == (
        "/metadata/labels/kueue.x-k8s.io~1queue-name"
    )
    assert pointer(()) == ""


@pytest.mark.parametrize(
    ("before", "after", "ops"),
    [
        pytest.param({"a": 1}, {"a": 1}, [], id="equal"),
        pytest.param(
            {"metadata": {}},
            {"metadata": {"labels": {"x/y": "1"}}},
            [{"op": "add", "path": "/metadata/labels", "value": {"x/y": "1"}}],
            id="missing-parent-map-created-with-its-children",
        ),
        pytest.param(
            {"metadata": {"labels": {"a": "1"}}},
            {"metadata": {"labels": {"a": "1", "x/y": "2"}}},
            [{"op": "add", "path": "/metadata/labels/x~1y", "value": "2"}],
            id="existing-map-gets-a-key",
        ),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, [{"op": "remove", "path": "/b"}], id="remove"),
        pytest.param(
            {"a": 1}, {"a": True}, [{"op": "replace", "path": "/a", "value": True}], id="1-vs-true"
        ),
        pytest.param(
            {"a": 1}, {"a": 1.0}, [{"op": "replace", "path": "/a", "value": 1.0}], id="1-vs-1.0"
        ),
        pytest.param(
            {"a": [1, 2]},
            {"a": [1, 2, 3, 4]},
            [{"op": "add", "path": "/a/2", "value": 3}, {"op": "add", "path": "/a/3", "value": 4}],
            id="list-append",
        ),
        pytest.param(
            {"a": [1, 2, 3]},
            {"a": [1]},
            [{"op": "replace", "path": "/a", "value": [1]}],
            id="list-shrinks-replaced-whole",
        ),
        pytest.param(
            {"a": [1, 2]},
            {"a": [0, 1, 2]},
            [{"op": "replace", "path": "/a", "value": [0, 1, 2]}],
            id="list-grows-in-front-replaced-whole",
        ),
        pytest.param(
            {"a": [{"x": 1}]},
            {"a": [{"x": 2}]},
            [{"op": "replace", "path": "/a/0/x", "value": 2}],
            id="list-elementwise",
        ),
        pytest.param(
            {"a": {"b": 1}}, {"a": [1]}, [{"op": "replace", "path": "/a", "value": [1]}], id="type"
        ),
        pytest.param(
            {"a": None}, {"a": {}}, [{"op": "replace", "path": "/a", "value": {}}], id="null"
        ),
        pytest.param([1], {"a": 1}, [{"op": "replace", "path": "", "value": {"a": 1}}], id="root"),
    ],
)
def test_diff_sends_the_smallest_sensible_operations(
    before: Any, after: Any, ops: JsonPatch
) -> None:
    assert diff(before, after) == ops
    assert same_json(apply_patch(before, ops), after)


def test_a_draft_copies_only_the_path_it_writes_and_diffs_cheaply() -> None:
    original: dict[str, Any] = {
        "metadata": {"labels": {"a": "1"}, "annotations": {"big": "x" * 100}},
        "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}, "parallelism": 2},
    }
    snapshot = clone(original)
    draft = Draft(original)
    draft.node(("metadata", "labels"))["b"] = "2"
    assert draft.set_default(("spec", "template", "metadata", "labels"), "g", "x") is True
    assert draft.set_default(("metadata", "labels"), "a", "changed") is False
    assert original == snapshot
    assert draft.root["metadata"]["annotations"] is original["metadata"]["annotations"]
    assert draft.root["spec"]["template"]["spec"] is original["spec"]["template"]["spec"]
    assert diff(original, draft.root) == [
        {"op": "add", "path": "/metadata/labels/b", "value": "2"},
        {"op": "add", "path": "/spec/template/metadata", "value": {"labels": {"g": "x"}}},
    ]


@pytest.mark.parametrize(
    "path", [("spec", "parallelism"), ("spec", "template", "spec", "containers", 0, "name")]
)
def test_a_draft_refuses_to_walk_through_a_scalar(path: tuple[str | int, ...]) -> None:
    draft = Draft(
        {"spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}}
    )
    with pytest.raises(PatchError, match="not an object"):
        draft.node((*path, "x"))


def test_apply_patch_leaves_its_input_alone() -> None:
    document = {"a": {"b": 1}}
    apply_patch(document, [{"op": "replace", "path": "/a/b", "value": 2}])
    assert document == {"a": {"b": 1}}


@pytest.mark.parametrize(
    ("ops", "result"),
    [
        ([{"op": "add", "path": "/l/-", "value": 9}], {"a": {"b": 1}, "l": [1, 2, 9]}),
        ([{"op": "add", "path": "/l/0", "value": 9}], {"a": {"b": 1}, "l": [9, 1, 2]}),
        ([{"op": "move", "from": "/a/b", "path": "/c"}], {"a": {}, "l": [1, 2], "c": 1}),
        ([{"op": "copy", "from": "/l", "path": "/m"}], {"a": {"b": 1}, "l": [1, 2], "m": [1, 2]}),
        ([{"op": "test", "path": "/a/b", "value": 1}], {"a": {"b": 1}, "l": [1, 2]}),
    ],
)
def test_apply_patch_speaks_every_rfc6902_operation(ops: JsonPatch, result: Any) -> None:
    assert apply_patch({"a": {"b": 1}, "l": [1, 2]}, ops) == result


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "add", "path": "/x/y", "value": 1}], "no member 'x'"),
        ([{"op": "remove", "path": "/missing"}], "no member 'missing' to remove"),
        ([{"op": "replace", "path": "/l/5", "value": 1}], "out of range"),
        ([{"op": "add", "path": "/l/01", "value": 1}], "not an array index"),
        ([{"op": "test", "path": "/a/b", "value": True}], "test failed"),
        ([{"op": "add", "path": "a", "value": 1}], "must be empty or start with '/'"),
        ([{"op": "add", "path": "/a"}], "missing 'value'"),
        ([{"op": "frobnicate", "path": "/a"}], "unknown op"),
        ([{"op": "move", "from": "/a", "path": "/a/b"}], "into one of its children"),
        ([{"op": "add", "path": "/a/b/c/d", "value": 1}], "cannot descend into a scalar"),
    ],
)
def test_apply_patch_names_the_operation_that_fails(ops: JsonPatch, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        apply_patch({"a": {"b": 1}, "l": [1, 2]}, ops)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_keys = st.sampled_from(["a", "b", "a/b", "~", "~1", "", "metadata", "0"])
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(before=_json, after=_json)
def test_a_diff_applied_to_its_original_gives_the_target(before: Any, after: Any) -> None:
    ops = diff(before, after)
    assert same_json(apply_patch(before, ops), after)
    assert (ops == []) == same_json(before, after)


@settings(max_examples=200, deadline=None)
@given(document=_json, data=st.data())
def test_small_edits_give_patches_that_apply(document: Any, data: st.DataObject) -> None:
    edited = (
        data.draw(_json) if not isinstance(document, dict) else {**document, "x": data.draw(_json)}
    )
    assert same_json(apply_patch(document, diff(document, edited)), edited)


# ---------------------------------------------------------------- generated Jobs through admit

_products = st.sampled_from([None, None, "H100", "A100", "h100|a100", "B200"])
_topologies = st.sampled_from([None, None, "required:rack", "preferred:block", "required:zone"])
_user_terms = st.none() | st.lists(
    st.fixed_dictionaries(
        {
            "matchExpressions": st.lists(
                st.fixed_dictionaries(
                    {"key": st.sampled_from(["zone", "pool"]), "operator": st.just("In"),
                     "values": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2)}
                ),
                min_size=1,
                max_size=2,
            )
        }
    ),
    max_size=2,
)  # fmt: skip
_tolerations = st.lists(
    st.sampled_from(
        [
            {"key": "cloud.example.com/spot", "operator": "Exists"},
            {"key": "other", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ]
    ),
    max_size=2,
)


_QUEUES: dict[str, list[str | None]] = {
    "team": ["research", "research", "vision", "open", "missing"],
    "lab": [None, "sandbox"],
    "free": [None],
}


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    for key, strategy in (
        (labels.GPU_PRODUCT, _products),
        (labels.TOPOLOGY, _topologies),
        (labels.GANG_MIN, st.none() | st.none() | st.integers(0, 5).map(str)),
    ):
        value = draw(strategy)
        if value is not None:
            annotations[key] = value
    extra_labels = {}
    if draw(st.booleans()):
        extra_labels[labels.PRIORITY_CLASS] = draw(
            st.sampled_from(["low", "high", "high", "urgent"])
        )
    share = draw(st.sampled_from([False, False, False, True]))
    template_spec: dict[str, Any] = {}
    terms = draw(_user_terms)
    if terms is not None:
        template_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    tolerations = draw(_tolerations)
    if tolerations:
        template_spec["tolerations"] = tolerations
    scheduler = draw(st.none() | st.sampled_from(["default-scheduler", "custom"]))
    if scheduler is not None:
        template_spec["schedulerName"] = scheduler
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["suspend"] = draw(st.booleans())
    deadline = draw(st.none() | st.sampled_from([60, 3600, 86400, 86401]))
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    generated = draw(st.booleans())
    namespace = draw(st.sampled_from(["team", "team", "team", "lab", "free"]))
    return job(
        gpus=None if share else draw(st.integers(1, 8)),
        milli=draw(st.integers(1, 999)) if share else None,
        parallelism=draw(st.none() | st.integers(0, 5)),
        name=None if generated else "train",
        generate_name="train-" if generated else None,
        namespace=namespace,
        queue=draw(st.sampled_from(_QUEUES[namespace])),
        extra_labels=extra_labels,
        annotations=annotations,
        template_meta=draw(st.sampled_from([None, {}, {"labels": {"app": "x"}}])),
        spec=spec,
        **template_spec,
    )


@settings(max_examples=300, deadline=None)
@given(obj=jobs())
def test_the_patched_job_is_still_a_job_and_a_second_pass_changes_nothing(
    obj: dict[str, Any],
) -> None:
    decision = admit(request(obj), POLICY, CONFIG)
    if not isinstance(decision, Allowed):
        return
    ops = diff(obj, decision.object)
    # What kube-apiserver does with the answer: apply the patch to the JSON it sent.
    patched = apply_patch(jsonio.loads(jsonio.dumps(obj)), jsonio.loads(jsonio.dumps(ops)))
    assert same_json(patched, decision.object)
    workload = workload_from_object(patched, WorkloadKind.JOB)
    assert workload.kind is WorkloadKind.JOB
    assert workload.pod_count == (obj["spec"].get("parallelism", 1))
    if ops:
        assert patched["spec"]["suspend"] is True
    again = admit(request(patched, uid="reinvoked"), POLICY, CONFIG)
    assert isinstance(again, Allowed)
    assert diff(patched, again.object) == []
