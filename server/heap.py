"""Keep the garbage collector's pauses short in a server whose heap is a large cache.

Layer: I/O (the interpreter's process-wide collector). ``serving.serve`` uses it for as
long as it serves, and the extender's benchmark while it measures, so that it measures
as the server runs; must not decide anything or be imported by decision code.

Why: CPython's collector walks, on each full collection, every object that survived the
young collections and was not frozen. The servers' caches are most of the heap, and
their objects are replaced as the cluster changes: a bind makes a new pod, allocation
and node object, and the old ones are freed by reference counting. Without help the
survivors pile up in the oldest generation, and a full pass over them grows with the
churn, towards the whole cache: about 0.6 s at 150,000 pods, every minute or so at 300
binds per second, during which no request is answered.

The policy: what survives a collection of the middle or oldest generation is frozen at
once (``gc.freeze``), so the oldest generation stays nearly empty and its passes take
milliseconds. The middle generation is collected every third collection rather than
every eleventh: each of its passes walks what survived the last few young ones,
and each object it walks costs a cache miss or two (its references point into the
cache). Measured at 300 pods/s: middle passes of 10 ms on average and up to 50 ms with
the default, at most 7 ms this way, for less collection time in all.

Frozen objects are still freed by reference counting when the last reference goes; what
the collector no longer finds is a reference cycle among them that becomes garbage
later. The servers make none in steady state: a full collection over everything,
frozen included, found nothing to free after 12,000 pods scheduled through the extender
(filter, prioritize and bind each), nor after 20,000 AdmissionReviews through the
webhook, one in fifty of them malformed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from cluster.clock import Clock, SystemClock

YOUNG_PER_MIDDLE: Final = 2
"""The middle generation is collected once more young collections than this have run
since its last (CPython's threshold, by default 10): here every third collection."""

PauseSink = Callable[[int, float], None]
"""Told each collection's generation and how long it held the process, in seconds."""


class _Policy:
    __slots__ = ("_clock", "_record", "_started")

    def __init__(self, clock: Clock, record: PauseSink | None) -> None:
        self._clock = clock
        self._record = record
        self._started = 0.0

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = self._clock.monotonic()
            return
        generation = info["generation"]
        # Generation 0 survivors are left to the next young pass: most die within a
        # request or two.
        if generation >= 1:
            gc.freeze()
        if self._record is not None:
            self._record(generation, self._clock.monotonic() - self._started)


@contextlib.contextmanager
def short_pauses(clock: Clock | None = None, record: PauseSink | None = None) -> Iterator[None]:
    """For the block: freeze what is alive now (what was loaded before serving lives as
    long as the process), then what survives each collection past the youngest, and
    collect the middle generation after ``YOUNG_PER_MIDDLE`` young collections;
    tell ``record`` how long each collection took."""
    policy = _Policy(clock or SystemClock(), record)
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], YOUNG_PER_MIDDLE, *thresholds[2:])
    gc.callbacks.append(policy)
    try:
        gc.collect()  # a full collection: what it leaves is frozen, and its pause told
        yield
    finally:
        gc.callbacks.remove(policy)
        gc.set_threshold(*thresholds)
