"""Lenient readers of raw Kubernetes objects (dicts as orjson returns them).

Layer: PURE. Field access that never raises on a field of the wrong type: no I/O, no
clock, no logging. Must not decide what a field means (the converters do); a value
that cannot be used goes into the caller's ``problems`` and reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from cluster.echo import echo
from cluster.quantity import QuantityError, to_nanos

NOT_NEGATIVE: Final = "a count cannot be negative"
NOT_A_NUMBER: Final = "not a number of GPUs"
"""Why a GPU count is no count: the same words for a node's and a pod's."""
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


class ConversionError(ValueError):
    """The object cannot be a node or a pod at all (it has no ``metadata.name``)."""


def field_map(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The map at ``key``; an empty one when absent or not a map."""
    value = obj.get(key)
    # orjson gives dicts, and absent keys are common: both spare an ABC check
    if type(value) is dict:
        return value
    if value is not None and isinstance(value, Mapping):
        return value
    return _EMPTY


def field_list(obj: Mapping[str, Any], key: str) -> Sequence[Any]:
    """The list at ``key``; an empty one when absent or not a list."""
    value = obj.get(key)
    return value if isinstance(value, list | tuple) else ()


def field_text(values: Mapping[str, Any], key: str, problems: list[str], what: str) -> str | None:
    """A label or annotation value; a non-string one (YAML ``4`` unquoted) is a problem."""
    value = values.get(key)
    if value is None or isinstance(value, str):
        return value
    problems.append(f"{what} {key}={echo(value)} is not a string; ignored")
    return None


def read_nanos(value: Any, what: str, problems: list[str]) -> int | None:
    """A quantity in nano-units, or None (and a problem) when unusable."""
    try:
        amount = to_nanos(value)
    except QuantityError as exc:
        problems.append(f"{what}: {exc}; ignored")
        return None
    if amount < 0:
        problems.append(f"{what} is negative ({echo(value)}); ignored")
        return None
    return amount
