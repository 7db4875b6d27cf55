"""Hostile ExtenderArgs and ExtenderPreemptionArgs against the extender over HTTP, as
kube-scheduler reaches it: ``/filter``, ``/prioritize`` and ``/preempt``.

Every input gets an answer within the time bound: a 400 with a reason, or a 200 in the
upstream wire shape that names no node the request did not name; never a 5xx, never a
dropped connection. Afterwards every golden case still gets its golden answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Final

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cluster import jsonio, labels
from tests.fuzz import strategies as hostile
from tests.fuzz.extender_server import (
    GOLDEN,
    NODE_NAMES,
    PODS,
    Extender,
    check_answer,
    fresh_version,
    serving,
)
from tests.fuzz.harness import FUZZ_MARKS, Answer, check_memory, measured, profile, rss_mib

pytestmark = FUZZ_MARKS

BASES: Final = {
    "/filter": {
        **hostile.golden_bodies("extender", paths=["/filter"]),
        **hostile.captured_bodies("ext-cache-filter"),
        **hostile.captured_bodies("ext-full-filter"),
    },
    "/prioritize": {
        **hostile.golden_bodies("extender", paths=["/prioritize"]),
        **hostile.captured_bodies("ext-cache-prioritize"),
    },
    "/preempt": hostile.golden_bodies("extender", paths=["/preempt"]),
}
"""What kube-scheduler sent (the captures) and the golden requests built from it."""


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    with serving() as ext:
        assert ext.golden_answers() == [], "the golden answers, before any fuzzing"
        yield replace(ext, baseline_mib=rss_mib())


def _bodies(verb: str) -> st.SearchStrategy[bytes]:
    damaged = hostile.damaged(BASES[verb], then=fresh_version)
    return st.one_of(damaged, damaged, damaged, hostile.not_json)


@pytest.mark.parametrize("verb", ["/filter", "/prioritize", "/preempt"])
def test_damaged_requests(extender: Extender, verb: str) -> None:
    """The captured and golden requests with fields dropped, retyped, nested deep, given
    twice, unicode and megabytes long, their bytes cut short or spoiled; and bodies
    that are not requests at all."""
    with measured(f"{verb} damaged") as run:

        @profile()
        @given(body=_bodies(verb))
        @example(body=hostile.nested(10_000, in_lists=True))
        def one(body: bytes) -> None:
            run.send(extender.client, verb, body, lambda a: check_answer(verb, body, a))

        one()


_NAME: Final = st.one_of(
    st.sampled_from(NODE_NAMES),
    st.sampled_from(["gpu-x", "", " gpu-a", "GPU-A", "gpu-a\x00", "\u202egpu-a", "gpu-a" * 50]),
    hostile.scalars.filter(lambda v: isinstance(v, str)),
)


@st.composite
def _node_names(draw: st.DrawFn) -> list[str]:
    """Known, unknown, repeated, empty and unicode names, or thousands of them."""
    if draw(st.booleans()):
        return draw(st.lists(_NAME, max_size=20))
    many = draw(st.sampled_from([1_000, 1_000, 1_000, 1_000, 5_000, 20_000]))
    known = draw(st.booleans())
    return [NODE_NAMES[i % len(NODE_NAMES)] if known else f"node-{i}" for i in range(many)]


def test_candidate_names(extender: Extender) -> None:
    """``NodeNames`` of known and unknown nodes, each once or many times, up to 20,000
    of them, for a whole-GPU pod, a share and a gang member."""
    bodies = {
        case: jsonio.loads((GOLDEN / f"{case}.request.json").read_bytes())["body"]
        for case in ("cache-filter", "cache-filter-share", "cache-filter-gang-member")
    }
    with measured("/filter and /prioritize names") as run:

        @profile(share=0.5)
        @given(
            case=st.sampled_from(sorted(bodies)),
            verb=st.sampled_from(["/filter", "/prioritize"]),
            names=_node_names(),
        )
        def one(case: str, verb: str, names: list[str]) -> None:
            body = jsonio.dumps({**bodies[case], "NodeNames": names})

            def check(answer: Answer) -> None:
                check_answer(verb, body, answer)
                assert answer.status == 200
                if verb == "/prioritize":
                    # one score per candidate, in the request's order
                    assert [e["Host"] for e in answer.json()] == names

            run.send(extender.client, verb, body, check)

        one()


_UIDS: Final = tuple(p["metadata"]["uid"] for p in PODS)


@st.composite
def _proposals(draw: st.DrawFn) -> dict[str, Any]:
    """Victims per node as kube-scheduler proposes them (``NodeNameToMetaVictims``):
    known and unknown nodes, victims that run there, elsewhere or nowhere, repeated,
    or thousands of nodes."""
    victims = st.lists(
        st.one_of(st.sampled_from(_UIDS), st.sampled_from(["", "0", "no-such-pod"])).map(
            lambda uid: {"UID": uid}
        ),
        max_size=6,
    )
    meta = st.fixed_dictionaries(
        {"Pods": victims, "NumPDBViolations": st.sampled_from([0, 1, -1, 2**31])}
    )
    if draw(st.integers(0, 19)) == 0:
        return {f"node-{i}": {"Pods": [], "NumPDBViolations": 0} for i in range(5_000)}
    return draw(st.dictionaries(_NAME, meta, max_size=10))


def test_preemption_proposals(extender: Extender) -> None:
    """``/preempt`` for the golden pods, with proposals of nodes and victims that may
    not exist: the answer keeps only nodes proposed, and says nothing of others."""
    bodies = [
        jsonio.loads((GOLDEN / f"{case}.request.json").read_bytes())["body"]
        for case in ("cache-preempt", "cache-filter-share", "cache-filter-gang-member")
    ]
    with measured("/preempt proposals") as run:

        @profile()
        @given(pod=st.sampled_from([b["Pod"] for b in bodies]), proposals=_proposals())
        def one(pod: dict[str, Any], proposals: dict[str, Any]) -> None:
            body = jsonio.dumps({"Pod": pod, "NodeNameToMetaVictims": proposals})

            def check(answer: Answer) -> None:
                check_answer("/preempt", body, answer)
                assert answer.status == 200

            run.send(extender.client, "/preempt", body, check)

        one()


def _with_gpus(pod: dict[str, Any], resource: str, quantity: object) -> dict[str, Any]:
    pod = jsonio.loads(jsonio.dumps(pod))
    for container in pod["spec"]["containers"]:
        container["resources"] = {"requests": {resource: quantity}, "limits": {resource: quantity}}
    pod["metadata"]["resourceVersion"] = f"q-{resource}-{quantity!r}"
    return pod


def _refused(answer: Answer) -> bool:
    """Whether the answer refuses the pod with a reason: a 400, an ``Error``, or no
    node fits and each says why."""
    if answer.status != 200:
        return True
    result = answer.json()
    return bool(result["Error"]) or (
        not result["NodeNames"]
        and bool({**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]})
    )


GPU_RESOURCES: Final = (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE)


def test_gpu_quantities(extender: Extender) -> None:
    """Every quantity text and number, valid or not, as the pod's GPUs or share."""
    base = jsonio.loads((GOLDEN / "cache-filter.request.json").read_bytes())["body"]
    with measured("/filter GPU quantities") as run:

        @profile()
        @given(
            resource=st.sampled_from(GPU_RESOURCES),
            quantity=st.one_of(st.sampled_from(hostile.QUANTITIES), hostile.scalars),
        )
        def one(resource: str, quantity: object) -> None:
            body = jsonio.dumps({**base, "Pod": _with_gpus(base["Pod"], resource, quantity)})
            run.send(extender.client, "/filter", body, lambda a: check_answer("/filter", body, a))

        one()


NEGATIVE_OR_NAN: Final = ("-1", "-8", "-1000m", "NaN", "nan", -1, -8)


def test_a_negative_or_nan_gpu_quantity_is_refused_with_a_reason(extender: Extender) -> None:
    """A pod asking for -1 or NaN GPUs (or share) must not fit every node as a CPU pod
    would: it is refused, and the answer says why."""
    base = jsonio.loads((GOLDEN / "cache-filter.request.json").read_bytes())["body"]
    with measured("/filter -1 and NaN GPUs") as run:

        @profile()
        @given(
            resource=st.sampled_from(GPU_RESOURCES),
            quantity=st.sampled_from(NEGATIVE_OR_NAN),
        )
        def one(resource: str, quantity: object) -> None:
            body = jsonio.dumps({**base, "Pod": _with_gpus(base["Pod"], resource, quantity)})

            def check(answer: Answer) -> None:
                check_answer("/filter", body, answer)
                assert _refused(answer), answer.json()

            run.send(extender.client, "/filter", body, check)

        one()


def test_golden_answers_unharmed_afterwards(extender: Extender) -> None:
    assert extender.golden_answers() == []
    assert extender.client.get("/metrics").status == 404, "metrics only on their own port"
    metrics = extender.served.metrics()
    assert len(metrics) < 256 * 1024, "metrics grew with what the inputs said"
    check_memory(extender.baseline_mib)
