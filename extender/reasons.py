"""The recent reasons per pod: what ``/filter`` last said of each pod, for ``tessera why``.

Layer: STATE (the extender's shell). One writer, the handlers, after the decision and
outside it: ``record_filter`` and ``record_bind`` take what a verb decided and the time
from the injected ``Clock``; readers get frozen ``explain.PodReasons`` copies. Must not
decide anything, nor change what a verb answers; recording is O(1) per request, so that
it costs kube-scheduler nothing it waits on.

Bounded under any stream of pods:

* at most ``max_pods`` pods, least recently filtered out first (an LRU by
  ``namespace/name``);
* per pod, one record: the last ``/filter`` (the counts of each reason text, at most
  ``explain.GROUPS_KEPT`` texts, the rest summed) and the last ``/bind``;
* the node names behind the counts (a few per reason, for the reader) come from the
  ``/filter`` answer's own maps, which are kept only for the most recent pods, up to
  ``max_nodes`` refused nodes in all; an older record keeps its counts and loses its
  names. A pod that is bound lets its maps go at once: nobody asks why it waits.

Grouping the texts costs what the metrics already pay (``explain.Tallies``, counted once
per request for both); naming nodes is left to the reader, who asks rarely.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from cluster.clock import Clock
from cluster.model import NodeName, PodInfo, PodKey
from extender.decide import FilterOutcome
from extender.explain import (
    EXAMPLES_KEPT,
    BindNote,
    PodReasons,
    Tallies,
    demand_json,
    group_reasons,
)

MAX_PODS: Final = 2048
MAX_NODES: Final = 100_000
"""Refused nodes whose names are kept: twenty pods' worth at 5,000 nodes, about 5 MB of
the ``/filter`` answers' own maps (nothing is copied)."""
PODS_PER_QUERY: Final = 32
"""Pods one ``GET /debug/reasons`` may ask for: its answer stays below a megabyte."""


@dataclass(slots=True)
class _Entry:
    """One pod's last ``/filter`` and ``/bind``: the counts and a few fitting names, and
    the answer's maps of refused nodes while they are kept (nothing copied)."""

    pod: PodInfo
    first_at: datetime
    at: datetime
    filters: int
    fit: int
    fit_examples: tuple[NodeName, ...]
    refused: int
    tallies: Tallies
    # Held only while named: the outcome itself is not kept, since its names (every
    # candidate's, decoded afresh for each request) would outlive the bound on names.
    maps: tuple[Mapping[NodeName, str], ...] | None
    bind: BindNote | None = None


class ReasonStore:
    """The last ``/filter`` (and ``/bind``) of the most recently filtered pods."""

    def __init__(self, clock: Clock, *, max_pods: int = MAX_PODS, max_nodes: int = MAX_NODES):
        if max_pods < 0 or max_nodes < 0:
            raise ValueError("the bounds of the reason store cannot be negative")
        self._clock = clock
        self._max_pods = max_pods
        self._max_nodes = max_nodes
        self._entries: OrderedDict[PodKey, _Entry] = OrderedDict()
        # pods whose outcome maps are kept, oldest first, and the refused nodes they hold
        self._named: OrderedDict[PodKey, int] = OrderedDict()
        self._named_nodes = 0

    @property
    def enabled(self) -> bool:
        return self._max_pods > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def named_nodes(self) -> int:
        """Refused nodes whose names are kept now (at most ``max_nodes``)."""
        return self._named_nodes

    def record_filter(self, pod: PodInfo, outcome: FilterOutcome, tallies: Tallies) -> None:
        """``/filter`` judged ``pod``'s candidates so: kept as its latest record."""
        if not self._max_pods:
            return
        now = self._clock.now()
        key = pod.key
        old = self._entries.pop(key, None)
        self._unname(key)
        first, filters = now, 1
        if old is not None and (old.pod.uid == pod.uid or not pod.uid):
            first, filters = old.first_at, old.filters + 1
        refused = len(outcome.failed) + len(outcome.unresolvable)
        fits = outcome.fits
        entry = _Entry(
            pod=pod,
            first_at=first,
            at=now,
            filters=filters,
            fit=len(fits),
            fit_examples=fits[:EXAMPLES_KEPT],
            refused=refused,
            tallies=tallies,
            maps=None,
        )
        self._entries[key] = entry
        while len(self._entries) > self._max_pods:
            gone, _ = self._entries.popitem(last=False)
            self._unname(gone)
        if refused and refused <= self._max_nodes:
            entry.maps = (outcome.unresolvable, outcome.failed)
            self._named[key] = refused
            self._named_nodes += refused
            while self._named_nodes > self._max_nodes:
                oldest, _ = next(iter(self._named.items()))
                self._unname(oldest)

    def record_bind(self, key: PodKey, node: str, error: str) -> None:
        """``/bind`` of the pod ended so (``error`` ``""``: bound)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.bind = BindNote(self._clock.now(), node, error)
        if not error:
            self._unname(key)

    def _unname(self, key: PodKey) -> None:
        count = self._named.pop(key, None)
        if count is None:
            return
        self._named_nodes -= count
        entry = self._entries.get(key)
        if entry is not None:
            entry.maps = None

    def get(self, key: str) -> PodReasons | None:
        """The pod's record as a frozen copy (``None``: not filtered lately)."""
        entry = self._entries.get(PodKey(key))
        if entry is None:
            return None
        groups, other_reasons, other_nodes = group_reasons(entry.tallies, refused=entry.maps or ())
        return PodReasons(
            pod=entry.pod.key,
            uid=entry.pod.uid,
            first_at=entry.first_at,
            at=entry.at,
            filters=entry.filters,
            demand=demand_json(entry.pod.demand),
            candidates=entry.fit + entry.refused,
            fit=entry.fit,
            fit_examples=entry.fit_examples,
            groups=groups,
            other_reasons=other_reasons,
            other_nodes=other_nodes,
            examples_kept=entry.maps is not None or not entry.refused,
            bind=entry.bind,
        )
