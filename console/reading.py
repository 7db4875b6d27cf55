"""Lenient reads of the API objects the console shows (Workloads, ClusterQueues, Jobs,
Pods, Events): a missing or mistyped field reads as empty, never as an error.

Layer: PURE. Plain functions over decoded JSON: no I/O, no clock. Must not decide what a
field means: the report builders (``console.why``, ``console.queues``) do.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cluster.convert.grammar import AnnotationError, parse_rfc3339


def field_map(obj: Any, *keys: str) -> Mapping[str, Any]:
    """The map at ``keys`` (one or a path of them); an empty one when absent or not a map."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def field_list(obj: Any, key: str) -> list[Any]:
    """The list at ``key``; an empty one when absent or not a list."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, list) else []


def timestamp(value: object) -> datetime | None:
    """An RFC 3339 time; ``None`` when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339(value)
    except AnnotationError:
        return None
