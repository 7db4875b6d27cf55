"""The sharded copy-on-write map that snapshots share: the writer's side and the reader's.

Layer: PURE (data structure). No async, no I/O, no clock. ``CowMap`` is the one writer's
side (the cache's): after ``freeze`` every shard belongs to the frozen ``ShardedMap``,
and the first write to a shard copies that shard. ``ShardedMap`` is the read-only side
that snapshots hand out; nobody mutates its shards any more. Both address a shard the
same way, here and nowhere else: ``shard_of(key)`` picks one of ``SHARDS`` shards, and
shard ``i`` is ``groups[i >> GROUP_BITS][i & GROUP_MASK]``.
"""

from __future__ import annotations

import zlib
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from itertools import chain, islice
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=str)
V = TypeVar("V")
D = TypeVar("D")

SHARD_BITS = 12
SHARDS = 1 << SHARD_BITS
"""Pod-sized maps are split in 4,096 shards (about 37 entries each at 150,000 pods)."""

GROUP_BITS = 6
GROUP_SIZE = 1 << GROUP_BITS
GROUP_MASK = GROUP_SIZE - 1
"""Shards are grouped 64 to a tuple, 64 tuples to a map: freezing a map after a change
builds one 64-tuple per touched group plus the top one, not a 4,096-tuple."""

Shards = tuple[tuple[dict[K, V], ...], ...]


def shard_of(key: str) -> int:
    """The shard a key lives in.

    crc32 rather than ``hash()``: str hashes are salted per process, and a map's iteration
    order should not change from one run (or one load test) to the next.
    """
    return zlib.crc32(key.encode()) & (SHARDS - 1)


def empty_shards() -> Shards[K, V]:
    """Every shard the same empty dict: fine, because nobody writes to a frozen shard."""
    nothing: dict[K, V] = {}
    group = (nothing,) * GROUP_SIZE
    return (group,) * (SHARDS // GROUP_SIZE)


class ShardedMap(Mapping[K, V], Generic[K, V]):
    """A read-only mapping over ``SHARDS`` dicts that nobody mutates any more.

    Copying a 150,000-entry dict costs milliseconds (every key and value is touched);
    the cache instead hands out its shards and, on its next write, copies only the one
    shard it writes to. Iteration goes shard by shard, each in insertion order:
    deterministic, but not sorted.
    """

    __slots__ = ("_groups", "_len")

    def __init__(self, groups: Shards[K, V], length: int) -> None:
        if len(groups) * GROUP_SIZE != SHARDS:
            raise ValueError(f"a ShardedMap needs {SHARDS // GROUP_SIZE} groups of shards")
        self._groups = groups
        self._len = length

    @classmethod
    def empty(cls) -> ShardedMap[K, V]:
        return cls(empty_shards(), 0)

    @classmethod
    def of(cls, items: Mapping[K, V]) -> ShardedMap[K, V]:
        groups: list[list[dict[K, V]]] = [
            [{} for _ in range(GROUP_SIZE)] for _ in range(SHARDS // GROUP_SIZE)
        ]
        for key, value in items.items():
            i = shard_of(key)
            groups[i >> GROUP_BITS][i & GROUP_MASK][key] = value
        return cls(tuple(tuple(group) for group in groups), len(items))

    def _shard(self, key: str) -> dict[K, V]:
        i = shard_of(key)
        return self._groups[i >> GROUP_BITS][i & GROUP_MASK]

    def __getitem__(self, key: K) -> V:
        return self._shard(key)[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...
    def get(self, key: K, default: object = None, /) -> object:
        return self._shard(key).get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._shard(key)

    def __iter__(self) -> Iterator[K]:
        # most shards of a small map are empty: skip them before making an iterator each
        return chain.from_iterable(filter(None, chain.from_iterable(self._groups)))

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"ShardedMap({len(self)} entries)"

    def shards(self) -> Iterator[Mapping[K, V]]:
        """The non-empty shards, read-only, in iteration order: a reader that walks a
        large map in steps takes a shard's values at C speed."""
        return filter(None, chain.from_iterable(self._groups))

    def every_shard(self) -> Iterator[Mapping[K, V]]:
        """All ``SHARDS`` shards, empty ones too, in iteration order: shard ``i`` of two
        maps holds the same keys' entries, and a shard a write did not touch is the very
        object the previous snapshot's map held (what a reader carrying work from one
        snapshot to the next compares)."""
        return chain.from_iterable(self._groups)

    # Mapping's views would look every key up again (a crc32 each): walk the shards.
    def values(self) -> ValuesView[V]:
        return _ShardValues(self)

    def items(self) -> ItemsView[K, V]:
        return _ShardItems(self)


class _ShardValues(ValuesView[V], Generic[K, V]):
    def __init__(self, mapping: ShardedMap[K, V]) -> None:
        super().__init__(mapping)
        self._sharded = mapping

    def __iter__(self) -> Iterator[V]:
        return chain.from_iterable(shard.values() for shard in self._sharded.shards())


class _ShardItems(ItemsView[K, V]):
    def __init__(self, mapping: ShardedMap[K, V]) -> None:
        super().__init__(mapping)
        self._sharded = mapping

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return chain.from_iterable(shard.items() for shard in self._sharded.shards())


def batches(items: Mapping[K, V], size: int) -> Iterator[list[V]]:
    """The values of ``items`` in lists of about ``size`` (whole shards of a
    ``ShardedMap``, so a list may run past ``size`` by one shard), in iteration order:
    for a reader that lets other work run between two lists. ``items`` must not change
    meanwhile, which a snapshot's maps never do."""
    if size < 1:
        raise ValueError(f"a batch holds at least one value, not {size}")
    if not isinstance(items, ShardedMap):
        values = iter(items.values())
        while batch := list(islice(values, size)):
            yield batch
        return
    batch = []
    for shard in items.shards():
        batch.extend(shard.values())
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class CowMap(Generic[K, V]):
    """The writer's side of a ``ShardedMap``, for its one writer (the cache). After
    ``freeze`` every shard belongs to the frozen map; the first write to a shard copies
    that shard (tens of entries), and the next ``freeze`` rebuilds only the groups that
    hold a copied shard."""

    __slots__ = ("_dirty", "_frozen", "_frozen_groups", "_groups", "_len", "_owned")

    def __init__(self) -> None:
        start: Shards[K, V] = empty_shards()
        self._groups: list[list[dict[K, V]]] = [list(group) for group in start]
        self._frozen_groups: list[tuple[dict[K, V], ...]] = list(start)
        self._owned: set[int] = set()  # shards copied since the last freeze
        self._dirty: set[int] = set()  # groups whose frozen tuple is stale
        self._len = 0
        self._frozen: ShardedMap[K, V] | None = ShardedMap(start, 0)

    def __len__(self) -> int:
        return self._len

    def key_list(self) -> list[K]:
        return list(chain.from_iterable(filter(None, chain.from_iterable(self._groups))))

    # Callers pass the key's shard (``shard_of``): one pod's update touches several maps.
    def get_at(self, i: int, key: K) -> V | None:
        return self._groups[i >> GROUP_BITS][i & GROUP_MASK].get(key)

    def _writable(self, i: int) -> dict[K, V]:
        group = self._groups[i >> GROUP_BITS]
        if i not in self._owned:
            group[i & GROUP_MASK] = dict(group[i & GROUP_MASK])
            self._owned.add(i)
            self._dirty.add(i >> GROUP_BITS)
        self._frozen = None
        return group[i & GROUP_MASK]

    def set_at(self, i: int, key: K, value: V) -> None:
        shard = self._writable(i)
        if key not in shard:
            self._len += 1
        shard[key] = value

    def pop_at(self, i: int, key: K) -> None:
        if key in self._groups[i >> GROUP_BITS][i & GROUP_MASK]:
            del self._writable(i)[key]
            self._len -= 1

    def get(self, key: K) -> V | None:
        return self.get_at(shard_of(key), key)

    def set(self, key: K, value: V) -> None:
        self.set_at(shard_of(key), key, value)

    def pop(self, key: K) -> None:
        self.pop_at(shard_of(key), key)

    def __contains__(self, key: K) -> bool:
        return self.get(key) is not None

    def freeze(self) -> ShardedMap[K, V]:
        if self._frozen is None:
            for g in self._dirty:
                self._frozen_groups[g] = tuple(self._groups[g])
            self._dirty.clear()
            self._owned.clear()
            self._frozen = ShardedMap(tuple(self._frozen_groups), self._len)
        return self._frozen
