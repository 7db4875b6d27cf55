"""A request's deadline as kube-apiserver states it: ``?timeout=`` in Go's duration
syntax (what ``time.Duration.String`` writes and ``time.ParseDuration`` reads).

Expected values follow ``time.ParseDuration`` of Go 1.26; the durations kube-apiserver
sends are ``timeout.String()`` of a whole number of seconds (``5s``, ``1m0s``).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.deadline import Deadline, asked_timeout, parse_go_duration

VALID = [
    ("0", 0.0),
    ("5s", 5.0),
    ("1m0s", 60.0),
    ("1m30s", 90.0),
    ("1h2m3.5s", 3723.5),
    ("2500ms", 2.5),
    ("1.5s", 1.5),
    (".5s", 0.5),
    ("5.s", 5.0),
    ("300us", 0.0003),
    ("300\u00b5s", 0.0003),
    ("300\u03bcs", 0.0003),
    ("10ns", 1e-8),
    ("1h1h", 7200.0),
    ("+5s", 5.0),
    ("-1.5h", -5400.0),
]

INVALID = ["", "5", "s", ".s", "5 s", "5S", "1e3s", "5sec", "--5s", "5s ", " 5s", "0.", "1d"]


@pytest.mark.parametrize(("text", "seconds"), VALID)
def test_go_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", INVALID)
def test_what_go_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def go_string(seconds: int) -> str:
    """``time.Duration(seconds * time.Second).String()``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@given(st.integers(min_value=1, max_value=10 * 86400))
def test_every_whole_second_timeout_kube_apiserver_writes_reads_back(seconds: int) -> None:
    assert parse_go_duration(go_string(seconds)) == seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, 10.0, id="absent: the default"),
        pytest.param("5s", 5.0, id="the webhook's timeoutSeconds"),
        pytest.param("1s", 1.0, id="what is left of a short API request"),
        pytest.param("1h0m0s", 30.0, id="bounded"),
        pytest.param("soon", 10.0, id="unreadable: the default"),
        pytest.param("0", 10.0, id="zero: the default"),
        pytest.param("-5s", 10.0, id="negative: the default"),
    ],
)
def test_the_timeout_a_request_asks_for_is_bounded(value: str | None, expected: float) -> None:
    assert asked_timeout(value, default_s=10.0, max_s=30.0) == expected


def test_a_deadline_is_too_late_once_less_than_its_margin_is_left() -> None:
    deadline = Deadline.after(arrived=100.0, timeout_s=5.0, margin=0.25)
    assert deadline.at == 105.0
    assert not deadline.too_late(104.0)
    assert deadline.left(104.0) == 1.0
    assert deadline.spare(104.0) == 0.75, "what a lookup may still wait"
    assert deadline.too_late(104.8)
    assert deadline.too_late(106.0)
    assert deadline.left(106.0) < 0


@given(
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0.001, max_value=60),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=120),
)
def test_too_late_is_less_than_the_margin_left(
    arrived: float, timeout: float, margin: float, after: float
) -> None:
    deadline = Deadline.after(arrived, timeout, margin)
    now = arrived + after
    assert deadline.too_late(now) == (deadline.left(now) < margin)
    # what a handler may still wait on (an API call): what is left less the margin
    assert math.isclose(deadline.spare(now), deadline.left(now) - margin, abs_tol=1e-6)
    assert math.isclose(deadline.left(now), arrived + timeout - now, abs_tol=1e-6)
