"""Aligned text tables and the small formats the console prints.

Layer: PURE. Strings from values: no I/O, no clock (times arrive as values), no settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from cluster.convert.grammar import format_rfc3339

NONE = "-"
"""What a cell shows for a value that does not apply."""


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, two spaces apart, with a trailing newline.
    A column whose values are all numbers (or absent) is right-aligned."""
    values = [list(row) for row in rows]
    right = [
        bool(values)
        and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in (row[i] for row in values)
        )
        for i in range(len(headers))
    ]
    cells = [[_cell(v) for v in row] for row in values]
    return _layout(headers, cells, right)


def _cell(value: object) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return format_rfc3339(value)
    return str(value)


def _layout(headers: Sequence[str], cells: list[list[str]], right: list[bool]) -> str:
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            text.rjust(widths[i]) if right[i] else text.ljust(widths[i])
            for i, text in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def duration(seconds: float | None) -> str:
    """``5400`` → ``1h30m``, ``90061`` → ``1d1h1m``, ``42`` → ``42s``; None → ``-``."""
    if seconds is None:
        return NONE
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if not days and not hours and not minutes:
        return f"{secs}s"
    text = (f"{days}d" if days else "") + (f"{hours}h" if hours else "")
    return text + (f"{minutes}m" if minutes else "")
