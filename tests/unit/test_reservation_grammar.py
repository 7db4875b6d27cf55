"""The ``tessera.dev/reservation`` value on a reservation's Lease, both ways: what is
written reads back as it was, and what breaks the grammar is refused with a reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.convert.grammar import AnnotationError, format_reservation, parse_reservation

WHEN = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
NAMES = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)


@pytest.mark.parametrize(
    ("domain", "start", "nodes", "text"),
    [
        ("r1", WHEN, ("a1", "a2"), "domain=r1;start=2026-12-01T02:00:00Z;nodes=a1,a2"),
        ("r1", None, ("a1",), "domain=r1;start=unknown;nodes=a1"),
        ("", WHEN, ("a1",), "domain=;start=2026-12-01T02:00:00Z;nodes=a1"),
    ],
)
def test_a_reservation_is_written_as_it_reads(
    domain: str, start: datetime | None, nodes: tuple[str, ...], text: str
) -> None:
    assert format_reservation(domain, start, nodes) == text
    assert parse_reservation(text) == (domain, start, nodes)


@given(
    domain=st.one_of(st.just(""), NAMES),
    minutes=st.one_of(st.none(), st.integers(-10_000, 10_000_000)),
    nodes=st.lists(NAMES, min_size=1, max_size=8),
)
def test_every_reservation_reads_back(domain: str, minutes: int | None, nodes: list[str]) -> None:
    start = None if minutes is None else WHEN + timedelta(minutes=minutes)
    assert parse_reservation(format_reservation(domain, start, nodes)) == (
        domain,
        start,
        tuple(nodes),
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("domain=r1;start=unknown", "lacks one of"),
        ("domain=r1;start=unknown;nodes=", "names no node"),
        ("domain=r1;start=tomorrow;nodes=a1", "not an RFC 3339 time"),
        ("domain=r1;domain=r2;start=unknown;nodes=a1", "is not domain="),
        ("rack=r1;start=unknown;nodes=a1", "is not domain="),
        ("r1 from now on a1", "is not domain="),
    ],
)
def test_a_broken_reservation_is_refused_with_a_reason(text: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says):
        parse_reservation(text)
