"""The grammars of the values Tessera reads from annotations and labels, both ways:
GPU index lists, NVLink islands, topology constraints, topology levels, RFC 3339 times.

Layer: PURE. Text to values and back: no I/O, no clock, no logging, no Kubernetes
objects (``cluster.convert.nodes``, ``.demand`` and ``.pods`` read the fields). Must not
ignore anything silently: a value that breaks its grammar raises ``AnnotationError``,
whose message says why, and the caller decides what that means for its object.

* ``tessera.dev/nvlink-islands``: islands are numbered 0, 1, … in the order listed.
  ``0-3,4-7`` lists one island per comma-separated item (an index or a range); with a
  ``;`` in the value, islands are ``;``-separated index lists (``0,2,4,6;1,3,5,7``;
  a trailing ``;`` is allowed, so that ``0,2;`` can name one island).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from cluster.echo import echo
from cluster.model import TopologyConstraint, TopologyMode

MAX_GPUS_PER_NODE: Final = 1024
"""GPU indices run below this; a node claiming more is misreported, not a big node."""

_DIGITS: Final = re.compile(r"[0-9]+")
_INDEX_ITEM: Final = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_RFC3339: Final = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.(?P<frac>[0-9]+))?(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_NO_SPACE: Final = re.compile(r"\S+")


class AnnotationError(ValueError):
    """An annotation value that does not follow its grammar; the message says why."""


def parse_index_list(value: str) -> tuple[int, ...]:
    """GPU indices such as ``0,1,2,3``, ``0-3`` or ``1,5-7``, in ascending order.

    Items are single indices or inclusive ranges ``a-b`` (a ≤ b), separated by commas,
    with optional spaces around them. An empty value names no GPU. An index named twice
    or not below ``MAX_GPUS_PER_NODE`` is an error.
    """
    text = value.strip()
    if not text:
        return ()
    seen: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        for index in _index_item(item, value):
            if index in seen:
                raise AnnotationError(f"GPU {index} is named twice in {echo(value)}")
            seen.add(index)
    return tuple(sorted(seen))


def _index_item(item: str, value: str) -> range:
    match = _INDEX_ITEM.fullmatch(item)
    if match is None:
        what = "an empty item" if not item else echo(item)
        raise AnnotationError(
            f"{what} in {echo(value)} is not a GPU index or a range of them (like 0-3)"
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise AnnotationError(f"range {echo(item)} in {echo(value)} runs backwards")
    if last >= MAX_GPUS_PER_NODE:
        raise AnnotationError(f"GPU index {last} in {echo(value)} is not below {MAX_GPUS_PER_NODE}")
    return range(first, last + 1)


def parse_islands(value: str, gpu_count: int | None = None) -> tuple[tuple[int, ...], ...]:
    """NVLink islands, in the order listed, each a tuple of GPU indices in ascending order.

    ``0-3,4-7``: one island per comma-separated item. ``0,2,4,6;1,3,5,7``: with a ``;``
    in the value, one island per ``;``-separated index list, and a trailing ``;`` is
    allowed (``0,2;`` is one island of GPUs 0 and 2). Every island must name at least
    one GPU, no GPU may be in two islands, and with ``gpu_count`` every index must be
    below it.
    """
    text = value.strip()
    if not text:
        raise AnnotationError("names no island")
    if ";" in text:
        parts = text.split(";")
        if not parts[-1].strip():
            parts.pop()
        islands = [parse_index_list(part) for part in parts]
        if any(not island for island in islands):
            raise AnnotationError(f"an island in {echo(value)} names no GPU")
    else:
        islands = [tuple(_index_item(item.strip(), value)) for item in text.split(",")]
    owner: dict[int, int] = {}
    for number, island in enumerate(islands):
        for index in island:
            if index in owner:
                raise AnnotationError(
                    f"GPU {index} is in islands {owner[index]} and {number} of {echo(value)}"
                )
            if gpu_count is not None and index >= gpu_count:
                raise AnnotationError(
                    f"GPU {index} in {echo(value)} does not exist on a node of {gpu_count} GPUs"
                )
            owner[index] = number
    return tuple(islands)


def format_indices(indices: Iterable[int], *, ranges: bool = False) -> str:
    """``0,1,2,3`` (or ``0-3`` with ``ranges``): ascending, each index once.

    The inverse of ``parse_index_list``; ``tessera.dev/gpu-indices`` is written without
    ranges, as DESIGN.md shows it.
    """
    ordered = sorted(set(indices))
    if ordered and ordered[0] < 0:
        raise ValueError(f"GPU indices are not negative: {ordered[0]}")
    if not ranges:
        return ",".join(map(str, ordered))
    parts: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def format_islands(islands: Iterable[Iterable[int]]) -> str:
    """The ``tessera.dev/nvlink-islands`` value for these islands, the inverse of
    ``parse_islands``: ``0-3,4-7`` when every island is one run of indices, else the
    ``;`` form (``0,2;1,3``; ``0,2;`` for a single such island)."""
    parts = [format_indices(island, ranges=True) for island in islands]
    if all("," not in part for part in parts):
        return ",".join(parts)
    return ";".join(parts) + (";" if len(parts) == 1 else "")


def parse_topology(value: str) -> TopologyConstraint:
    """``required:<level>`` or ``preferred:<level>`` (spaces around the value ignored)."""
    mode_text, sep, level = value.strip().partition(":")
    try:
        mode = TopologyMode(mode_text)
    except ValueError:
        mode = None
    if not sep or mode is None or _NO_SPACE.fullmatch(level) is None:
        raise AnnotationError(
            f"{echo(value)} is not required:<level> or preferred:<level> "
            "(a topology level such as a rack or block node label)"
        )
    return TopologyConstraint(mode=mode, level=level)


def parse_topology_levels(text: str) -> tuple[tuple[str, str], ...]:
    """``block=example.com/block,rack=example.com/rack`` → ((name, node label), ...), widest
    level first: the extender's ``--topology-levels`` format, read the same way wherever
    it is taken; ``ValueError`` naming the bad item. Empty text gives no levels."""
    levels: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, label = (s.strip() for s in item.partition("="))
        if not sep or not name or not label:
            raise ValueError(f"topology level {item!r} is not <name>=<node label>")
        levels.append((name, label))
    return tuple(levels)


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 timestamp (``2026-12-01T02:00:00Z``) as a timezone-aware datetime.

    Fractions of a second beyond microseconds are dropped (Go writes up to nanoseconds).
    """
    match = _RFC3339.fullmatch(value.strip())
    if match is None:
        raise AnnotationError(f"{echo(value)} is not an RFC 3339 time like 2026-12-01T02:00:00Z")
    frac = f".{match['frac'][:6]}" if match["frac"] else ""
    zone = "+00:00" if match["zone"] in ("Z", "z") else match["zone"]
    try:
        return datetime.fromisoformat(f"{match['date']}T{match['time']}{frac}{zone}")
    except ValueError as exc:
        raise AnnotationError(f"{echo(value)} is not a valid time: {exc}") from None


def format_rfc3339(when: datetime) -> str:
    """The ``tessera.dev/drain-after`` value for ``when``: UTC, whole seconds, ``Z``
    (``2026-12-01T02:00:00Z``), the inverse of ``parse_rfc3339``. A naive time is no
    time at all (which zone?) and raises ``ValueError``; fractions of a second are cut,
    which moves a drain earlier, never later."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{when.isoformat()} has no time zone")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


UNKNOWN_START: Final = "unknown"
"""A reservation's start when it waits on pods without a time limit."""


def format_reservation(domain: str, start: datetime | None, nodes: Iterable[str]) -> str:
    """The ``tessera.dev/reservation`` annotation of a reservation's Lease:
    ``domain=r1;start=2026-12-01T02:00:00Z;nodes=n1,n2`` (``start=unknown``: it waits
    on pods without a time limit; ``domain=`` empty: a gang without a topology level),
    the inverse of ``parse_reservation``."""
    when = UNKNOWN_START if start is None else format_rfc3339(start)
    return f"domain={domain};start={when};nodes={','.join(nodes)}"


def parse_reservation(value: str) -> tuple[str, datetime | None, tuple[str, ...]]:
    """(domain, start or None, nodes) from a ``format_reservation`` value; each of the
    three fields once, in any order, at least one node."""
    fields: dict[str, str] = {}
    for item in value.split(";"):
        key, sep, text = item.strip().partition("=")
        if not sep or key not in ("domain", "start", "nodes") or key in fields:
            raise AnnotationError(
                f"{echo(value)} is not domain=<domain>;start=<time>;nodes=<node,...>"
            )
        fields[key] = text.strip()
    if len(fields) != 3:
        raise AnnotationError(f"{echo(value)} lacks one of domain=, start= and nodes=")
    nodes = tuple(n.strip() for n in fields["nodes"].split(",") if n.strip())
    if not nodes:
        raise AnnotationError(f"{echo(value)} names no node")
    start = None if fields["start"] == UNKNOWN_START else parse_rfc3339(fields["start"])
    return fields["domain"], start, nodes


def positive_int(value: str) -> int:
    """A whole number of 1 or more (``tessera.dev/gang-size``, a GPU memory label)."""
    text = value.strip()
    if _DIGITS.fullmatch(text) is None or int(text) < 1:
        raise AnnotationError(f"{echo(value)} is not a positive whole number")
    return int(text)
