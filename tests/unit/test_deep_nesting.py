"""Values nested as deep as orjson reads (1024 levels) get an answer, not a 500.

Found by ``tests/fuzz``: orjson reads JSON nested 1024 levels deep but writes at most
254, and Python's ``repr`` of a list nested ~1000 deep raises ``RecursionError``. So a
field of a review or an extender request given such a value raised out of a message
(``echo``, an f-string, an enum's error) or out of the answer's encoding. Each case
puts one such value where the fuzzer found it; the webhook refuses an object it could
not answer about (400), and the extender reads the value as the wrong type it is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cluster import jsonio
from cluster.echo import echo
from cluster.files import load_objects
from extender import verbs
from tests.golden.test_extender_golden import CONFIG as EXTENDER_CONFIG
from tests.golden.test_extender_golden import load_cache
from webhook.policy_build import policy_from_objects
from webhook.review_flow import review
from webhook.rules.outcome import AdmitConfig

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
POLICY = policy_from_objects(load_objects(GOLDEN / "webhook" / "policy.yaml"))
CONFIG = AdmitConfig(managed_namespaces=frozenset({"team-sandbox"}))
NOW = datetime(2026, 11, 29, 18, 28, tzinfo=UTC)
MARK = "nested-here"
Path_ = tuple[str | int, ...]


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def with_deep_value(case: Path, path: Path_, total_depth: int = 1020) -> bytes:
    """The request of ``case`` with a list nested to ``total_depth`` levels (from the
    body's root) at ``path``."""
    request = jsonio.loads(case.read_bytes())
    body = request.get("body", request)
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = MARK
    return jsonio.dumps(body).replace(jsonio.dumps(MARK), deep(total_depth - len(path)))


def test_echo_of_a_value_too_deep_for_repr_says_so() -> None:
    value = jsonio.loads(deep(1020))
    assert echo(value) == "a list nested too deeply to show"


OBJECT = ("request", "object")
TEMPLATE = (*OBJECT, "spec", "template", "spec")


@pytest.mark.parametrize(
    ("case", "path"),
    [
        ("job-capture", (*OBJECT, "spec", "parallelism")),
        ("job-capture", (*OBJECT, "metadata", "generateName")),
        ("job-gang-named", (*OBJECT, "metadata", "name")),
        ("job-capture", (*TEMPLATE, "containers", 0, "resources", "limits", "nvidia.com/gpu")),
        ("job-reinvoked", (*OBJECT, "spec", "activeDeadlineSeconds")),
        ("job-flavor-user-affinity", (*TEMPLATE, "tolerations")),
        ("job-update-unsuspend", (*OBJECT, "spec", "activeDeadlineSeconds")),
        ("job-update-unsuspend", ("request", "oldObject", "spec", "parallelism")),
    ],
)
def test_the_webhook_refuses_an_object_nested_deeper_than_it_can_answer_about(
    case: str, path: Path_
) -> None:
    for total in (300, 1020):
        body = with_deep_value(GOLDEN / "webhook" / f"{case}.request.json", path, total)
        outcome = review(body, POLICY, CONFIG)
        assert outcome.status == 400
        assert "nested more than 254 levels" in jsonio.loads(outcome.body)["message"]


def test_the_webhook_refuses_a_deep_value_where_it_reads_the_review() -> None:
    for case, path in [
        ("bad-api-version", ("apiVersion",)),
        ("bad-object-kind", (*OBJECT, "kind")),
    ]:
        body = with_deep_value(GOLDEN / "webhook" / f"{case}.request.json", path)
        assert review(body, POLICY, CONFIG).status == 400


@pytest.mark.parametrize(
    ("case", "path"),
    [
        ("cache-filter-gang-first", ("Pod", "metadata", "annotations", "tessera.dev/gang-min")),
        ("cache-filter-gang-first", ("Pod", "spec", "activeDeadlineSeconds")),
        ("cache-filter-gang-first", ("Pod", "status", "phase")),
        (
            "cache-filter-gang-first",
            ("Pod", "spec", "containers", 0, "resources", "requests", "nvidia.com/gpu"),
        ),
        (
            "full-filter-reasons",
            ("Nodes", "items", 0, "metadata", "annotations", "tessera.dev/unhealthy-gpus"),
        ),
        ("full-preempt", ("NodeNameToVictims", "gpu-c", "Pods", 0, "metadata", "namespace")),
    ],
)
def test_the_extender_answers_a_deep_value_as_the_wrong_type_it_is(case: str, path: Path_) -> None:
    request = jsonio.loads((GOLDEN / "extender" / f"{case}.request.json").read_bytes())
    handle = {
        "/filter": verbs.handle_filter,
        "/prioritize": verbs.handle_prioritize,
        "/preempt": verbs.handle_preempt,
    }[request["path"]]
    body = with_deep_value(GOLDEN / "extender" / f"{case}.request.json", path)
    reply = handle(body, load_cache().snapshot(), EXTENDER_CONFIG, NOW)
    assert reply.status in (200, 400)
    assert len(reply.body) < 16 * 1024
