"""A request's deadline: the timeout its client asked for, from when it arrived.

Layer: PURE. Arithmetic on numbers the I/O layer measured: no clock, no asyncio, no
aiohttp. The servers' shell stamps when a request's first byte arrived (``server.guard``)
and asks here whether an answer could still be on time.

kube-apiserver tells a webhook how long it will wait: ``POST /mutate?timeout=5s``, the
webhook's ``timeoutSeconds`` (or what is left of the API request's own deadline, rounded
up to whole seconds) written as a Go ``time.Duration`` (``5s``, ``1m0s``, ``2500ms``).
kube-scheduler says nothing on the wire: its extender client gives up after the
configured ``httpTimeout``, which the extender is told by a setting. An answer after
that is worthless: the client has already applied its failure policy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # µ, MICRO SIGN: Go accepts both spellings
    "\u03bcs": 1e-6,  # μ, GREEK SMALL LETTER MU
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# "ms" before "m" and "s": alternation takes the first unit that matches.
_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go ``time.Duration`` string, as ``time.ParseDuration`` reads it:
    ``5s``, ``1m0s``, ``1h2m3.5s``, ``2500ms``, ``-1.5h``, or a bare ``0``.
    ``ValueError`` for anything else."""
    body = text[1:] if text[:1] in ("+", "-") else text
    sign = -1.0 if text[:1] == "-" else 1.0
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total, pos = 0.0, 0
    while pos < len(body):
        part = _PART.match(body, pos)
        if part is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(part.group(1)) * _UNITS[part.group(2)]
        pos = part.end()
    return sign * total


def asked_timeout(value: str | None, *, default_s: float, max_s: float) -> float:
    """The seconds a request's ``timeout`` parameter asks for, within ``(0, max_s]``;
    ``default_s`` when it is absent, unreadable or not positive (kube-apiserver only
    sends a positive one)."""
    if value is None:
        return default_s
    try:
        seconds = parse_go_duration(value)
    except ValueError:
        return default_s
    if not (seconds > 0 and math.isfinite(seconds)):
        return default_s
    return min(seconds, max_s)


@dataclass(frozen=True, slots=True)
class Deadline:
    """When the client stops waiting (``at``, on the monotonic clock the request's
    arrival was stamped with), and how long before that an answer is already too late
    to be worth starting (``margin``: the work, the write and the network)."""

    at: float
    margin: float = 0.0

    @classmethod
    def after(cls, arrived: float, timeout_s: float, margin: float = 0.0) -> Deadline:
        return cls(arrived + timeout_s, margin)

    def left(self, now: float) -> float:
        """Seconds until the client gives up (negative: it has)."""
        return self.at - now

    def spare(self, now: float) -> float:
        """Seconds an answer may still wait before it is too late to start (the time
        left less the margin; not positive: none)."""
        return self.at - self.margin - now

    def too_late(self, now: float) -> bool:
        """Whether an answer started now would reach the client after it gave up."""
        return self.at - now < self.margin
