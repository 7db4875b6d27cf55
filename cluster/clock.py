"""Time as an injected dependency.

Layer: I/O (it reads the system clock). The only module allowed to call ``time.time``
and ``time.monotonic`` (ruff bans them elsewhere). Decisions take times as values;
roots pass a ``Clock`` down, tests pass a ``ManualClock``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC: for comparing with API timestamps."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back: for TTLs and latency."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time(), tz=UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: for tests and compressed-time simulation."""

    def __init__(self, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = monotonic_start

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._mono += seconds
        self._now = datetime.fromtimestamp(self._now.timestamp() + seconds, tz=UTC)
