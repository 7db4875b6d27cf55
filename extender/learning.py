"""The config decisions read now, and learning it from the cluster's pods.

Layer: I/O (yields to the event loop between batches; no network, no files). Functions
of a snapshot and a ``LiveConfig`` handed in, so they run without an aiohttp app. Must
not decide placements nor read the environment.

Packing judges a node by the pods the cluster runs (``ExtenderConfig.pod_mix``). With
``pod_mix=learned`` the server counts the cache's pods into that mix
(``relearn_pod_mix``), a batch of pods at a time so that requests are answered in
between, and puts it in use when it moved enough to matter. A new config comes with a
new, empty decision cache (``LiveConfig.use``).

A gang's first member reads the room per topology domain for its shape, which takes
tens of milliseconds over every node the first time. For each gang shape the
cluster's pods show, it is made ahead (``prepare_gang_shapes``), and again under each
newly learned pod mix, whose cache starts with nothing kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from operator import attrgetter
from typing import Final

from cluster import logs
from cluster.model import PodDemand
from cluster.sharded import batches
from cluster.snapshot import Snapshot
from extender.config import ExtenderConfig, PodShape, count_shapes, mix_distance, mix_from_counts
from extender.gangs import prepare_gang_shape
from extender.memo import DecisionCache
from extender.metrics import ExtenderMetrics

log = logging.getLogger(__name__)

MIX_BATCH_PODS: Final = 1_000
"""Pods counted for the pod mix between two turns of the event loop: about 1 ms, where
counting 150,000 pods at once (~200 ms on a loaded core) would hold every request."""
MIX_TOLERANCE: Final = 0.01
"""The share of the mix's weight that must move before a learned mix replaces the one
in use: counts change with every pod, and each replacement makes every node score its
pods afresh (a new config has a new decision cache), for a difference in fragmentation
of at most this share of a node's free GPUs."""


class LiveConfig:
    """The ``ExtenderConfig`` decisions read now, and its decision cache. The learned
    pod mix replaces both whole (``use``): a new frozen config gets a new, empty cache,
    so nothing decided under the old one is read again. A handler takes ``memo`` once
    and decides with it and its config. A holder rather than a new value under the app
    key: aiohttp freezes an app's state when it starts."""

    __slots__ = ("memo", "mix_pods")

    def __init__(self, config: ExtenderConfig) -> None:
        self.memo = DecisionCache(config)
        self.mix_pods = 0
        """GPU pods the current pod mix was learned from (0: not learned)."""

    @property
    def current(self) -> ExtenderConfig:
        return self.memo.config

    def use(self, config: ExtenderConfig) -> None:
        """Decide with ``config`` from now on, with a cache of its own."""
        self.memo = DecisionCache(config)


_DEMAND = attrgetter("demand")


async def learn_pod_mix(snapshot: Snapshot, batch: int = MIX_BATCH_PODS) -> Counter[PodShape]:
    """How many of the snapshot's pods have each shape (``count_shapes``), counted
    ``batch`` pods at a time with a turn of the event loop in between: the snapshot never
    changes, so the count is exact however the cache moves on meanwhile."""
    counts: Counter[PodShape] = Counter()
    for pods in batches(snapshot.pods, batch):
        counts.update(count_shapes(map(_DEMAND, pods)))
        await asyncio.sleep(0)
    return counts


async def relearn_pod_mix(
    live: LiveConfig,
    snapshot: Snapshot,
    metrics: ExtenderMetrics,
    now: Callable[[], datetime],
) -> bool:
    """Count the snapshot's pods and put their mix in use when it moved by more than
    ``MIX_TOLERANCE``; whether it did. Without GPU pods the mix in use stays (the
    built-in one until pods are seen; a cluster that emptied still expects its pods).
    A new mix gets its gang shapes prepared (``prepare_gang_shapes``) at ``now()``."""
    counts = await learn_pod_mix(snapshot)
    pods = sum(n for (gpus, milli, _, _), n in counts.items() if gpus or milli)
    if not pods:
        return False
    mix = mix_from_counts(counts)
    moved = mix_distance(live.current.pod_mix, mix)
    if moved <= MIX_TOLERANCE:
        return False
    live.use(replace(live.current, pod_mix=mix))
    live.mix_pods = pods
    metrics.pod_mix(len(mix), pods)
    log.info(
        "pod mix learned",
        extra=logs.fields(sizes=len(mix), pods=pods, moved=round(moved, 4)),
    )
    # what the last config kept is gone with it
    await prepare_gang_shapes(live, snapshot, now)
    return True


_TOPOLOGY_SHAPE = attrgetter("gpus", "gpu_milli", "products", "topology")


async def gang_demands(snapshot: Snapshot, batch: int = MIX_BATCH_PODS) -> list[PodDemand]:
    """One demand per gang shape among the snapshot's pods (whole GPUs or share,
    products, topology): what a gang's first member counts rooms by. Read ``batch`` pods
    at a time, with a turn of the event loop in between."""
    found: dict[object, PodDemand] = {}
    for pods in batches(snapshot.pods, batch):
        for demand in map(_DEMAND, pods):
            if demand.gang is not None and demand.topology is not None:
                found.setdefault(_TOPOLOGY_SHAPE(demand), demand)
        await asyncio.sleep(0)
    return list(found.values())


async def prepare_gang_shapes(
    live: LiveConfig, snapshot: Snapshot, now: Callable[[], datetime]
) -> int:
    """Make ahead, in the decision cache in use, what the first member of a gang reads,
    for every gang shape the cluster's pods show (``gangs.prepare_gang_shape``), one
    shape per turn of the event loop: such a member then redoes only the nodes changed
    since, instead of every node while every request waits. How many shapes were
    prepared."""
    prepared = 0
    for demand in await gang_demands(snapshot):
        prepared += prepare_gang_shape(snapshot, demand, live.memo, now())
        await asyncio.sleep(0)
    if prepared:
        log.info("gang shapes prepared", extra=logs.fields(shapes=prepared))
    return prepared
