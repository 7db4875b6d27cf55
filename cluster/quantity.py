"""Kubernetes resource quantities (``500m``, ``1.5Gi``, ``1e3``) as exact numbers.

Layer: PURE. Plain functions from a value to a number: no I/O, no clock, no logging.
Must not import anything beyond the standard library.

The grammar is the one documented for k8s.io/apimachinery ``resource.Quantity``::

    quantity ::= [+-] number suffix
    number   ::= digits | digits "." | digits "." digits | "." digits
    suffix   ::= Ki | Mi | Gi | Ti | Pi | Ei            (powers of 1024)
               | n | u | m | "" | k | M | G | T | P | E (powers of 1000)
               | (e | E) [+-] digits                   (a power of ten)

and a parsed value is the one the API server stores: rounded away from zero to a whole
nano-unit, binary-suffixed values capped at 2**63 - 1, as ``ParseQuantity`` does.
Surrounding whitespace is ignored because the API's JSON decoder trims it before parsing.

Where the Go scanner is looser than its own grammar, we keep to the grammar (each case
checked against ParseQuantity from apimachinery v0.37):

* a number with no digits (``Ki``, ``m``, ``e3``, ``+``, ``.``) is zero to the Go
  scanner; nobody means that, so it is an error here;
* an exponent outside int32 is silently wrapped by Go (``1e4294967296`` is 1); here it
  is an error, as is any value of 10**1000 or more, so that a hostile ``1e999999999``
  cannot cost memory;
* ``MilliValue``/``Value`` overflow int64 silently; ``to_milli``/``to_units`` return
  exact Python ints instead.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

from cluster.echo import echo

_NUMBER: Final = re.compile(
    r"(?P<sign>[+-]?)"
    r"(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<bin>[KMGTPE]i)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))"
)
_BINARY_POWER: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_POWER: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip

NANO_PER_UNIT: Final = 10**9
_BINARY_CAP_NANOS: Final = (2**63 - 1) * NANO_PER_UNIT
"""ParseQuantity caps binary-suffixed values here (``9Ei`` is 9223372036854775807)."""
_INT32: Final = 2**31
_PLAIN_DIGITS: Final = 18
"""Longest plain whole number read without the regex (any length would parse the same)."""
_MAX_DIGITS: Final = 1000
"""Largest decimal magnitude accepted (10**1000), and longest numeric part read."""


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message names the value."""

    def __init__(self, value: object, reason: str = "") -> None:
        hint = "a number with an optional suffix, such as 500m, 2, 1.5Gi, 1G or 1e3"
        detail = f": {reason}" if reason else f": expected {hint}"
        super().__init__(f"{echo(value)} is not a Kubernetes quantity{detail}")
        self.value = value


def parse_quantity(value: object) -> Fraction:
    """The exact value of a quantity, as the API server would store it.

    ``value`` is a string in the quantity grammar, or a JSON number (orjson gives an
    ``int`` or a ``float``; the API accepts unquoted numbers too). Raises
    ``QuantityError`` for anything else: what the grammar does not allow, and any other
    JSON value (``true``, ``null``, a list or a map), which is why ``value`` is typed as
    anything, not as what it should be.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    return Fraction(to_nanos(value), NANO_PER_UNIT)


def to_nanos(value: object) -> int:
    """The quantity in nano-units (``parse_quantity(value) * 10**9``), always whole.

    Every stored quantity is a whole number of nano-units, so sums of requests can be
    kept as ints: exact, and much cheaper than fractions on a 150,000-pod cache load.
    """
    if isinstance(value, bool):
        # bool is an int subclass, but ``true`` is not a quantity in JSON
        raise QuantityError(value)
    if isinstance(value, int):
        return value * NANO_PER_UNIT
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(value)
        # repr is the shortest text that reads back as this float: the number the
        # JSON carried, not its binary approximation
        return _parse_text(repr(value), value)
    if isinstance(value, str):
        text = value.strip()
        # A plain whole number ("4", "16") is most of what pods ask: no regex for it.
        if text.isdigit() and text.isascii() and len(text) <= _PLAIN_DIGITS:
            return int(text) * NANO_PER_UNIT
        return _parse_text(text, value)
    raise QuantityError(value, f"expected a string or a number, got {type(value).__name__}")


def to_milli(value: object) -> int:
    """Thousandths of the quantity, rounded away from zero (``Quantity.MilliValue``).

    For CPU: ``500m`` → 500, ``2`` → 2000, ``0.1m`` → 1.
    """
    return nanos_to(to_nanos(value), 1000)


def to_units(value: object) -> int:
    """The quantity as a whole number, rounded away from zero (``Quantity.Value``).

    For bytes and counts: ``1Gi`` → 1073741824, ``1.5`` → 2, ``500m`` → 1.
    """
    return nanos_to(to_nanos(value), 1)


def nanos_to(nanos: int, per_unit: int) -> int:
    """``nanos`` nano-units counted in 1/``per_unit`` units, rounded away from zero.

    ``nanos_to(n, 1000)`` is milli-units, ``nanos_to(n, 1)`` whole units.
    """
    step = NANO_PER_UNIT // per_unit
    if nanos >= 0:
        return -(-nanos // step)
    return nanos // step


def _parse_text(text: str, original: object) -> int:
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise QuantityError(original)
    int_digits = match["int"]
    frac_digits = match["frac"] or ""
    if not int_digits and not frac_digits:
        raise QuantityError(original, "the number has no digits")
    significant = (int_digits + frac_digits).lstrip("0")
    if len(significant) > _MAX_DIGITS:
        raise QuantityError(original, f"more than {_MAX_DIGITS} digits")
    if not significant:
        return 0

    binary_power = 0
    if match["bin"] is not None:
        binary_power = _BINARY_POWER[match["bin"]]
        power10 = 0
    elif match["exp"] is not None:
        power10 = int(match["exp"])
        if not -_INT32 <= power10 < _INT32:
            raise QuantityError(original, "the exponent is out of range")
    else:
        power10 = _DECIMAL_POWER[match["dec"]]

    # value = significant * 2**binary_power * 10**scale
    scale = power10 - len(frac_digits)
    if len(significant) + scale + binary_power * 0.302 > _MAX_DIGITS:
        raise QuantityError(original, f"the value is 10**{_MAX_DIGITS} or more")
    nanos = _round_to_nanos(int(significant) << binary_power, scale)
    if binary_power:
        nanos = min(nanos, _BINARY_CAP_NANOS)
    return -nanos if match["sign"] == "-" else nanos


def _round_to_nanos(mantissa: int, scale: int) -> int:
    """``mantissa * 10**scale`` in nano-units, a fraction of a nano rounded up to one."""
    shift = scale + 9
    if shift >= 0:
        factor: int = 10**shift
        return mantissa * factor
    if -shift > len(str(mantissa)):
        # smaller than one nano-unit (and not zero): ParseQuantity makes it 1n
        return 1
    divisor: int = 10**-shift
    return -(-mantissa // divisor)
