"""``cluster.echo``: a message repeats a short value as ``repr`` would, a long one cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.echo import ECHO_LIMIT, echo


@pytest.mark.parametrize(
    ("value", "quote", "shown"),
    [
        pytest.param("team-nlp-queue", True, "'team-nlp-queue'", id="short-quoted"),
        pytest.param("team-nlp-queue", False, "team-nlp-queue", id="short-bare"),
        pytest.param(4, True, "4", id="number"),
        pytest.param(["a"], True, "['a']", id="list"),
        pytest.param("q" * 60_000, True, f"'{'q' * 100}…' (60000 characters)", id="long-quoted"),
        pytest.param("q" * 60_000, False, f"{'q' * 100}… (60000 characters)", id="long-bare"),
        pytest.param(
            list(range(50)),
            True,
            f"{repr(list(range(50)))[:100]}… (190 characters)",
            id="long-list",
        ),
        pytest.param("q" * 100, True, f"'{'q' * 100}'", id="exactly-the-limit"),
    ],
)
def test_echo_repeats_short_values_and_cuts_long_ones(
    value: object, quote: bool, shown: str
) -> None:
    assert echo(value, quote=quote) == shown


@given(st.text(max_size=400), st.booleans())
def test_an_echo_is_repr_when_short_and_never_long(text: str, quote: bool) -> None:
    shown = echo(text, quote=quote)
    if len(text) <= ECHO_LIMIT:
        assert shown == (repr(text) if quote else text)
    else:
        assert "…" in shown
        assert shown.endswith(f" ({len(text)} characters)")
    # repr escapes a character in at most 10 (\U0001f600): bounded whatever the text
    assert len(shown) <= 10 * ECHO_LIMIT + 40
