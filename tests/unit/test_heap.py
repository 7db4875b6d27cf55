"""The servers' garbage collection policy: full collections do not walk the cache."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from cluster import heap


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


def test_the_policy_ends_with_the_block() -> None:
    callbacks = list(gc.callbacks)
    with heap.short_pauses():
        assert len(gc.callbacks) == len(callbacks) + 1
    assert gc.callbacks == callbacks
