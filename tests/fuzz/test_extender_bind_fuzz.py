"""Hostile ExtenderBindingArgs against the extender over HTTP, on a server of their own:
binds change what the cache holds, so the golden answers of the other verbs are checked
on another one (``test_extender_fuzz.py``).

Every bind gets an answer within the time bound: a 400 with a reason, or a 200 whose
``Error`` is empty or says why; pods that do not exist, in namespaces that do not
exist, with uids that are not theirs, on nodes that are not there, are refused. After
every bind, no GPU is given out twice and none that its node does not have.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import jsonio
from extender import wire
from tests.builders import pod_json
from tests.fuzz import strategies as hostile
from tests.fuzz.extender_server import (
    NODE_NAMES,
    PODS,
    Extender,
    check_answer,
    double_booked,
    serving,
)
from tests.fuzz.harness import FUZZ_MARKS, Answer, check_memory, measured, profile, rss_mib

pytestmark = FUZZ_MARKS

BASES: Final = {
    **hostile.golden_bodies("extender", paths=["/bind"]),
    **hostile.captured_bodies("ext-cache-bind"),
    **hostile.captured_bodies("ext-full-bind"),
}


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    with serving() as ext:
        yield replace(ext, baseline_mib=rss_mib())


def _no_gpu_twice(extender: Extender) -> None:
    problems = double_booked(extender.snapshot())
    assert not problems, problems


def test_damaged_binds(extender: Extender) -> None:
    """The captured and golden binds with fields dropped, retyped, nested deep, given
    twice, unicode and megabytes long, their bytes cut short or spoiled."""
    with measured("/bind damaged") as run:

        @profile()
        @given(body=st.one_of(hostile.damaged(BASES), hostile.not_json))
        def one(body: bytes) -> None:
            def check(answer: Answer) -> None:
                check_answer("/bind", body, answer)
                _no_gpu_twice(extender)

            run.send(extender.client, "/bind", body, check)

        one()


_TEXT: Final = st.one_of(
    st.sampled_from(["", " ", "\x00", "\u202e", "x" * 70_000]), hostile.scalars.map(str)
)
_POD: Final = st.one_of(
    st.sampled_from(PODS).map(
        lambda p: (p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"])
    ),
    st.tuples(st.sampled_from(["team-nlp", "team-cv", "default"]), _TEXT, _TEXT),
)


@st.composite
def _binding(draw: st.DrawFn) -> dict[str, Any]:
    """A pod of the cluster (or one that does not exist), its uid (or another), a node
    of the cluster (or one that does not exist); each field sometimes missing or not a
    string."""
    namespace, name, uid = draw(_POD)
    if draw(st.booleans()):
        uid = draw(st.sampled_from(["", "0", uid.upper(), draw(_TEXT)]))
    fields: dict[str, Any] = {
        "PodNamespace": namespace,
        "PodName": name,
        "PodUID": uid,
        "Node": draw(st.one_of(st.sampled_from(NODE_NAMES), _TEXT)),
    }
    for key in list(fields):
        change = draw(st.sampled_from(["keep"] * 8 + ["drop", "retype", "lower"]))
        if change == "drop":
            del fields[key]
        elif change == "retype":
            fields[key] = draw(hostile.values)
        elif change == "lower":
            fields[key.lower()] = fields.pop(key)
    return fields


def test_binds_of_pods_and_nodes_that_may_not_exist(extender: Extender) -> None:
    with measured("/bind names") as run:

        @profile()
        @given(binding=_binding())
        def one(binding: dict[str, Any]) -> None:
            body = jsonio.dumps(binding)

            def check(answer: Answer) -> None:
                check_answer("/bind", body, answer)
                if answer.status == 200 and not answer.json()["Error"]:
                    # bound: the pod and node exist, and the uid, if given, was the pod's
                    pod = next(
                        p
                        for p in PODS
                        if (p["metadata"]["namespace"], p["metadata"]["name"])
                        == (binding.get("PodNamespace"), binding.get("PodName"))
                    )
                    assert binding.get("Node") in NODE_NAMES
                    assert binding.get("PodUID") in ("", None, pod["metadata"]["uid"])
                _no_gpu_twice(extender)

            run.send(extender.client, "/bind", body, check)

        one()


_GPUS: Final = st.one_of(
    st.sampled_from([1, 2, 3, 4, 5, 8, 9, 16]).map(lambda n: {"gpus": n}),
    st.sampled_from([1, 250, 500, 999]).map(lambda m: {"gpu_milli": m}),
)


def test_filter_then_bind_never_gives_a_gpu_twice(extender: Extender) -> None:
    """New pods of every size, filtered and then bound to a node (the one /filter chose,
    or another), until the cluster is full: binds that fit are taken, the rest refused,
    and no GPU ever has two owners."""
    with measured("/filter then /bind") as run:

        @profile()
        @given(
            n=st.integers(0, 10**9),
            size=_GPUS,
            node=st.one_of(st.none(), st.sampled_from(NODE_NAMES)),
        )
        def one(n: int, size: dict[str, Any], node: str | None) -> None:
            pod = pod_json(f"fuzz-{n}", namespace="team-fuzz", **size)
            filtered = wire.encode_extender_args(pod, node_names=NODE_NAMES)
            answer = run.send(
                extender.client,
                "/filter",
                filtered,
                lambda a: check_answer("/filter", filtered, a),
            )
            fits = answer.json()["NodeNames"]
            target = node or (fits[0] if fits else NODE_NAMES[0])
            meta = pod["metadata"]
            body = wire.encode_binding_args(meta["namespace"], meta["name"], meta["uid"], target)

            def check(answer: Answer) -> None:
                check_answer("/bind", body, answer)
                assert answer.status == 200
                if target not in fits:
                    assert answer.json()["Error"], f"bound to {target}, where it did not fit"
                _no_gpu_twice(extender)

            run.send(extender.client, "/bind", body, check)

        one()


def test_memory_bounded_afterwards(extender: Extender) -> None:
    _no_gpu_twice(extender)
    check_memory(extender.baseline_mib)
