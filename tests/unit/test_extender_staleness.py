"""When the extender's cache is too old to decide with, and what each verb answers then."""

from __future__ import annotations

import pytest

from cluster import jsonio
from extender import verbs


@pytest.mark.parametrize(
    ("ages", "limit", "named"),
    [
        pytest.param({"nodes": 3.0, "pods": 29.9}, 30, [], id="both-heard-within"),
        pytest.param({"nodes": 30.0, "pods": 30.0}, 30, [], id="at-the-limit"),
        pytest.param({"nodes": 2.0, "pods": 45.2}, 30, ["pods 45"], id="one-watch"),
        pytest.param({"nodes": 61.0, "pods": 31.0}, 30, ["nodes 61", "pods 31"], id="both"),
        pytest.param({"nodes": 9999.0, "pods": 9999.0}, 0, [], id="no-limit"),
        pytest.param({}, 30, [], id="no-watches"),
    ],
)
def test_the_cache_is_stale_when_a_watch_was_not_heard_within_the_limit(
    ages: dict[str, float], limit: float, named: list[str]
) -> None:
    reason = verbs.stale_cache(ages, limit)
    assert bool(reason) is bool(named)
    for watch in named:
        resource, age = watch.split()
        assert f"the {resource} watch last heard from kube-apiserver {age} s ago" in reason
    if named:
        assert reason.startswith("the extender's cache is stale: ")
        assert f"--max-cache-age {limit:g} s" in reason


@pytest.mark.parametrize(
    ("verb", "status", "body"),
    [
        pytest.param(
            "filter",
            200,
            {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": "x"},
            id="filter-error-retried",
        ),
        pytest.param("bind", 200, {"Error": "x"}, id="bind-error-retried"),
        pytest.param("prioritize", 503, {"Error": "x"}, id="prioritize-no-scores"),
        pytest.param("preempt", 503, {"Error": "x"}, id="preempt-fails"),
    ],
)
def test_a_stale_cache_decides_nothing_and_says_why(
    verb: str, status: int, body: dict[str, object]
) -> None:
    reply = verbs.stale_reply(verb, "x")
    assert (reply.status, jsonio.loads(reply.body)) == (status, body)
    assert reply.note == "x"
