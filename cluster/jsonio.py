"""The project's one JSON codec: orjson, with errors that say what was wrong.

Layer: PURE helper (no I/O). Every module encodes and decodes JSON through here so that
the codec, its options and its error type are chosen once.
"""

from __future__ import annotations

from typing import Any, Final

import orjson


class JsonError(ValueError):
    """The bytes were not JSON; the message says where."""


WRITE_DEPTH_LIMIT: Final = 254
"""Levels of nesting ``dumps`` writes. ``loads`` reads up to 1024, so a value read from a
request can be one that cannot be written back: whoever writes one must expect
``JsonEncodeError``."""


class JsonEncodeError(TypeError):
    """The value cannot be written as JSON (nested deeper than ``WRITE_DEPTH_LIMIT``)."""


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JsonError(f"not valid JSON: {exc}") from None


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; dataclasses, datetimes and enums are encoded natively.
    ``JsonEncodeError`` for what JSON cannot hold or orjson cannot write."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise JsonEncodeError(f"cannot be written as JSON: {exc}") from None


def dumps_pretty(value: Any) -> bytes:
    """Indented, key-sorted JSON with a trailing newline: for golden files and reports."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
