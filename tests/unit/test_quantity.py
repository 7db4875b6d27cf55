"""Quantities read exactly as kube-apiserver reads them.

Expected values were checked against ``resource.ParseQuantity``, ``MilliValue`` and
``Value`` of k8s.io/apimachinery v0.37 (a differential run over ~200,000 generated
strings agreed on every value; the only intended differences are listed in
cluster/quantity.py's docstring and covered by the invalid table below).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.quantity import (
    QuantityError,
    parse_quantity,
    to_milli,
    to_nanos,
    to_units,
)

KI, MI, GI = 2**10, 2**20, 2**30

VALID = [
    # text, exact value
    ("0", Fraction(0)),
    ("2", Fraction(2)),
    ("500m", Fraction(1, 2)),
    ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)),
    ("1.", Fraction(1)),
    ("+1", Fraction(1)),
    ("-1", Fraction(-1)),
    ("007", Fraction(7)),
    ("1Ki", Fraction(KI)),
    ("0.5Ki", Fraction(512)),
    ("1Mi", Fraction(MI)),
    ("1Gi", Fraction(GI)),
    ("1.5Gi", Fraction(3 * GI, 2)),
    ("1Ti", Fraction(2**40)),
    ("1Pi", Fraction(2**50)),
    ("1Ei", Fraction(2**60)),
    ("5n", Fraction(5, 10**9)),
    ("4u", Fraction(4, 10**6)),
    ("1k", Fraction(1000)),
    ("1M", Fraction(10**6)),
    ("1G", Fraction(10**9)),
    ("1T", Fraction(10**12)),
    ("2P", Fraction(2 * 10**15)),
    ("1E", Fraction(10**18)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("1e+3", Fraction(1000)),
    ("1e03", Fraction(1000)),
    ("1.2e3", Fraction(1200)),
    ("1E-3", Fraction(1, 1000)),
    ("0.5e-1", Fraction(1, 20)),
    ("1.G", Fraction(10**9)),
    ("100.035k", Fraction(100035)),
    (" 2 ", Fraction(2)),  # the API's JSON decoder trims before parsing
    # ParseQuantity rounds below a nano-unit away from zero, and caps binary values
    ("3.001n", Fraction(4, 10**9)),
    ("0.0000000001", Fraction(1, 10**9)),
    ("0.5e-9", Fraction(1, 10**9)),
    ("1e-300", Fraction(1, 10**9)),
    ("-3.001n", Fraction(-4, 10**9)),
    ("9Ei", Fraction(2**63 - 1)),
    ("1e21", Fraction(10**21)),  # decimal values are not capped
    # JSON numbers, as orjson hands them over
    (3, Fraction(3)),
    (0, Fraction(0)),
    (0.5, Fraction(1, 2)),
    (0.1, Fraction(1, 10)),
    (1e-05, Fraction(1, 10**5)),
    (1e20, Fraction(10**20)),
    (-2.5, Fraction(-5, 2)),
]


@pytest.mark.parametrize(("value", "expected"), VALID, ids=[repr(v) for v, _ in VALID])
def test_parses_what_the_api_accepts(value: str | float, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


INVALID = [
    "",
    "   ",
    "1.2.3",
    "1.1.M",
    "1+1.0M",
    "Ki",  # Go's scanner reads a number without digits as zero; the grammar does not
    "m",
    "e3",
    "+",
    "-",
    ".",
    "-.",
    "1KB",
    "1 Gi",
    "1ki",
    "1K",
    "1i",
    ".5i",
    "0.1mi",
    "0.1am",
    "--1",
    "+-1",
    "1-1",
    "1e",
    "1e+",
    "-3.01e-",
    "1.5e1.5",
    "1e3e",
    "1Mi3",
    "0x10",
    "1_000",
    "1,5",
    "\u0661",  # an Arabic-Indic digit: Python's int() would take it, the API does not
    "nan",
    "NaN",
    "inf",
    "Infinity",
    "aoeu",
    "1e4294967296",  # Go wraps this exponent to 0 and stores 1; we refuse
    "1e1000",  # 10**1000 and up is out of range
    "1" * 1001,
]


@pytest.mark.parametrize("text", INVALID, ids=[repr(t) for t in INVALID])
def test_rejects_what_the_api_rejects(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert repr(text)[:40] in str(caught.value)


NOT_QUANTITIES = [float("nan"), float("inf"), float("-inf"), True, False, None, [1], {"a": 1}]


@pytest.mark.parametrize("value", NOT_QUANTITIES, ids=[repr(v) for v in NOT_QUANTITIES])
def test_rejects_json_values_that_are_not_quantities(value: object) -> None:
    with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
        parse_quantity(value)


def test_error_is_a_value_error_naming_the_value() -> None:
    with pytest.raises(ValueError, match=r"'1KB' is not a Kubernetes quantity"):
        to_units("1KB")


MILLI = [
    ("500m", 500),
    ("2", 2000),
    ("0.1", 100),
    ("100m", 100),
    ("1.5m", 2),  # rounded up, as MilliValue
    ("0.1m", 1),
    ("1n", 1),
    ("1u", 1),
    ("1001u", 2),
    ("1e-3", 1),
    ("0", 0),
    (4, 4000),
    (0.25, 250),
    ("-1.5m", -2),  # away from zero, as Quantity documents (the API rejects it in requests)
]


@pytest.mark.parametrize(("value", "expected"), MILLI, ids=[repr(v) for v, _ in MILLI])
def test_to_milli_rounds_up_like_milli_value(value: str | int, expected: int) -> None:
    assert to_milli(value) == expected


UNITS = [
    ("1Gi", GI),
    ("512Mi", 512 * MI),
    ("1G", 10**9),
    ("1.5", 2),  # rounded up, as Value
    ("500m", 1),
    ("1n", 1),
    ("1001m", 2),
    ("8", 8),
    ("110", 110),
    ("1e3", 1000),
    ("0.5Ki", 512),
    ("9Ei", 2**63 - 1),
    ("1e20", 10**20),  # exact, where Go's int64 Value would overflow
    (8, 8),
    ("-1.5", -2),
]


@pytest.mark.parametrize(("value", "expected"), UNITS, ids=[repr(v) for v, _ in UNITS])
def test_to_units_rounds_up_like_value(value: str | int, expected: int) -> None:
    assert to_units(value) == expected


@given(
    st.integers(min_value=0, max_value=10**30),
    st.integers(min_value=0, max_value=3),
    st.sampled_from(["", " ", "\t"]),
)
def test_plain_whole_numbers_of_any_length_are_their_value(
    number: int, zeros: int, space: str
) -> None:
    assert to_nanos(f"{space}{'0' * zeros}{number}{space}") == number * 10**9


@given(st.integers(min_value=0, max_value=10**15))
def test_milli_suffix_round_trips(milli: int) -> None:
    assert to_milli(f"{milli}m") == milli
    assert to_nanos(f"{milli}m") == milli * 10**6


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi"]),
)
def test_units_are_never_below_the_exact_value(number: int, suffix: str) -> None:
    text = f"{number}.5{suffix}"
    assert to_units(text) >= parse_quantity(text)
    assert to_units(text) - parse_quantity(text) < 1


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=9, allow_nan=False))
def test_nine_decimal_places_are_exact(value: object) -> None:
    text = format(value, "f")
    assert parse_quantity(text) == Fraction(text)


QUANTITY_TEXT = st.from_regex(
    r"[+-]?([0-9]{1,40}(\.[0-9]{0,40})?|\.[0-9]{1,40})"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,2})?",
    fullmatch=True,
)


@given(QUANTITY_TEXT)
def test_every_string_of_the_grammar_parses_to_whole_nano_units(text: str) -> None:
    value = parse_quantity(text)
    assert (value * 10**9).denominator == 1
    assert to_nanos(text) == value * 10**9
    assert abs(to_units(text)) >= abs(value)
    assert abs(to_milli(text)) >= abs(value * 1000)
    assert abs(to_milli(text)) - abs(value * 1000) < 1
