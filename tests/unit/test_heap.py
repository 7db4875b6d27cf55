"""The servers' garbage collection policy: full collections do not walk the cache."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from datetime import datetime

import pytest

from server import heap


class Entry:
    """A cache entry as the collector sees one: a tracked object that outlives requests."""

    def __init__(self) -> None:
        self.peer: Entry | None = None


def in_oldest_generation(objects: list[Entry]) -> int:
    """How many of ``objects`` a full collection would walk."""
    oldest = {id(o) for o in gc.get_objects(2)}
    return sum(id(o) in oldest for o in objects)


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_what_survives_a_middle_collection_is_not_walked_by_full_ones() -> None:
    with heap.short_pauses():
        cache = [Entry() for _ in range(1_000)]
        gc.collect(1)
        assert in_oldest_generation(cache) == 0
    # the same without the policy (the block is over): the entries would be walked
    later = [Entry() for _ in range(1_000)]
    gc.collect(1)
    assert in_oldest_generation(later) == len(later)


def test_a_kept_object_is_still_freed_when_its_last_reference_goes() -> None:
    with heap.short_pauses():
        cache = [Entry()]
        gc.collect(1)
        gone = weakref.ref(cache[0])
        cache.clear()
        assert gone() is None


def test_a_cycle_that_dies_young_is_still_collected() -> None:
    with heap.short_pauses():
        a, b = Entry(), Entry()
        a.peer, b.peer = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect(0)
        assert gone() is None


class Ticking:
    """A clock that moves a quarter second each time its monotonic time is read."""

    def __init__(self) -> None:
        self.read = 0.0

    def now(self) -> datetime:
        raise AssertionError("the policy reads monotonic time only")

    def monotonic(self) -> float:
        self.read += 0.25
        return self.read


def test_each_collection_is_told_with_its_generation_and_pause() -> None:
    told: list[tuple[int, float]] = []
    gc.disable()  # only the collections asked for
    try:
        with heap.short_pauses(Ticking(), lambda generation, s: told.append((generation, s))):
            gc.collect(0)
            gc.collect(1)
    finally:
        gc.enable()
    # the full collection made on entry, then the two asked for
    assert told == [(2, 0.25), (0, 0.25), (1, 0.25)]


def test_the_middle_generation_is_collected_after_a_few_young_collections() -> None:
    """Each middle pass walks what survived since the last: a few young passes' worth."""
    told: list[int] = []
    kept: list[Entry] = []
    with heap.short_pauses(record=lambda generation, _: told.append(generation)):
        told.clear()  # the full collection made on entry
        while 1 not in told and len(kept) < 1_000_000:
            kept.append(Entry())  # survivors, as a cache's new objects are
    assert 1 in told
    assert told.index(1) == heap.YOUNG_PER_MIDDLE + 1


def test_the_policy_ends_with_the_block() -> None:
    callbacks, thresholds = list(gc.callbacks), gc.get_threshold()
    with heap.short_pauses():
        assert len(gc.callbacks) == len(callbacks) + 1
    assert gc.callbacks == callbacks
    assert gc.get_threshold() == thresholds
