"""The reservations the extender holds, as ``tessera nodes`` shows them.

Layer: PURE. Leases (plain dicts, as listed) in, rows out: no I/O, no clock. Must not
decide or change any reservation: the extender plans them (``extender.holds``) and
records each as a Lease ``tessera-reservation-<gang>`` in its namespace; this reads
those records back with the extender's own reader (``holds.hold_of``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cluster.convert.grammar import AnnotationError, format_rfc3339
from extender.holds import hold_of


@dataclass(frozen=True, slots=True)
class ReservedRow:
    """``nodes`` of ``domain`` held for ``gang`` from ``start`` (None: not known yet,
    it waits on pods without a time limit), waiting since ``since``."""

    gang: str
    domain: str
    start: datetime | None
    nodes: tuple[str, ...]
    since: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "gang": self.gang,
            "domain": self.domain,
            "start": None if self.start is None else format_rfc3339(self.start),
            "nodes": list(self.nodes),
            "waiting_since": format_rfc3339(self.since),
        }


def reserved_rows(
    leases: Iterable[Mapping[str, Any]],
) -> tuple[tuple[ReservedRow, ...], tuple[str, ...]]:
    """The reservations the Leases record, soonest start first (unknown last), and what
    could not be read of them."""
    rows: list[ReservedRow] = []
    problems: list[str] = []
    for lease in leases:
        try:
            hold = hold_of(lease)
        except AnnotationError as exc:
            problems.append(str(exc))
            continue
        r = hold.reservation
        rows.append(ReservedRow(r.gang, r.domain, r.start, tuple(r.nodes), hold.since))
    rows.sort(key=lambda row: (row.start is None, row.start or row.since, row.gang))
    return tuple(rows), tuple(problems)
