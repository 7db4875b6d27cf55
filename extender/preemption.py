"""Preemption: which of kube-scheduler's proposed victims really make room for a pod.

Layer: PURE. ``preempt`` is a function from (snapshot, pod, kube-scheduler's proposals,
config, time) to the proposals kept, each with its smallest sufficient set of victims:
no I/O, no clock, no cache beyond the ``Snapshot`` it is given and the config's decision
cache passed through to the filters. It must not evict anything: ``verbs`` answers
kube-scheduler with what it returns, and kube-scheduler evicts. It judges a node the way
``decide.filter_nodes`` does, through ``filters.run_filters`` on the node with the
victims' GPUs given back, so a node kept here is one ``/filter`` would pass afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import combinations
from typing import Final

from cluster.model import Allocation, NodeName, NodeState, PodInfo, PodKey
from cluster.snapshot import Snapshot, apply_allocation
from extender.config import ExtenderConfig
from extender.context import FIT, PodContext
from extender.filters import run_filters
from extender.gangs import build_context
from extender.memo import DecisionCache

SUBSETS_TRIED: Final = 4096
"""Victim subsets ``preempt`` tries for the smallest one before it settles for a
minimal one (no victim can be spared) found greedily."""


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod kube-scheduler proposes to evict: its UID, and its key when the request
    carried the whole Pod (``nodeCacheCapable: false``)."""

    uid: str
    key: PodKey | None = None


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """The victims on one node, and how many PodDisruptionBudgets evicting them breaks."""

    pods: tuple[Victim, ...]
    pdb_violations: int = 0


def preempt(
    snapshot: Snapshot,
    pod: PodInfo,
    proposals: Mapping[str, NodeVictims],
    config: ExtenderConfig,
    now: datetime,
    *,
    max_subsets: int = SUBSETS_TRIED,
    memo: DecisionCache | None = None,
) -> dict[NodeName, NodeVictims]:
    """Of kube-scheduler's proposals, the nodes where evicting the proposed victims
    really frees a valid placement for ``pod``, each with the smallest such subset.

    Only victims holding GPUs on that node are weighed; the others are kept as
    proposed: kube-scheduler chose them for what the extender does not see (CPU,
    memory, pod count), and dropping them could leave the pod unfit there anyway.
    Among subsets of equal size, the one evicting the fewest milli-GPUs wins, then the
    earliest in kube-scheduler's order. More than ``max_subsets`` subsets: a minimal
    subset (no victim in it can be spared) rather than the smallest. The PDB count
    cannot be recomputed here, so it is kube-scheduler's, capped at the victims kept.
    A pod whose GPU request is no count of GPUs fits nowhere: no eviction helps.
    """
    if pod.refusal:
        return {}
    ctx = build_context(snapshot, pod, config, now, memo)
    keys = _victim_keys(snapshot, proposals)
    answer: dict[NodeName, NodeVictims] = {}
    for raw, proposal in proposals.items():
        name = NodeName(raw)
        node = snapshot.nodes.get(name)
        if node is None:
            continue
        gpu_victims: list[tuple[int, Allocation]] = []
        for position, victim in enumerate(proposal.pods):
            key = keys.get(victim.uid)
            held = snapshot.allocations.get(key) if key is not None else None
            if held is not None and held.node == name:
                indices = tuple(i for i in held.indices if any(g.index == i for g in node.gpus))
                if indices:
                    gpu_victims.append((position, replace(held, indices=indices)))
        spared = _smallest_release(ctx, node, [alloc for _, alloc in gpu_victims], max_subsets)
        if spared is None:
            continue
        evicted = {gpu_victims[i][0] for i in spared}
        weighed = {position for position, _ in gpu_victims}
        kept = tuple(
            victim
            for position, victim in enumerate(proposal.pods)
            if position in evicted or position not in weighed
        )
        answer[name] = NodeVictims(kept, min(proposal.pdb_violations, len(kept)))
    return answer


def _victim_keys(snapshot: Snapshot, proposals: Mapping[str, NodeVictims]) -> dict[str, PodKey]:
    """The cache's key of each proposed victim, by UID (a key from the request must
    name a pod with that UID; UIDs alone need one pass over the cache's pods)."""
    found: dict[str, PodKey] = {}
    wanted: set[str] = set()
    for proposal in proposals.values():
        for victim in proposal.pods:
            if victim.key is not None:
                known = snapshot.pods.get(victim.key)
                if known is not None and known.uid in ("", victim.uid):
                    found[victim.uid] = victim.key
                    continue
            wanted.add(victim.uid)
    wanted -= found.keys()
    wanted.discard("")
    if wanted:
        for key, info in snapshot.pods.items():
            if info.uid in wanted:
                found[info.uid] = key
    return found


def _smallest_release(
    ctx: PodContext, node: NodeState, held: Sequence[Allocation], budget: int
) -> tuple[int, ...] | None:
    """Positions in ``held`` whose release makes ``node`` fit the pod, fewest first;
    None if releasing all of them is not enough."""

    def fits(subset: Iterable[int]) -> bool:
        freed = node
        for i in subset:
            freed = apply_allocation(freed, held[i], -1)
        return run_filters(ctx, freed) is FIT

    everyone = tuple(range(len(held)))
    if not fits(everyone):
        return None
    for size in range(len(held) + 1):
        if math.comb(len(held), size) > budget:
            break
        budget -= math.comb(len(held), size)
        working = [c for c in combinations(everyone, size) if fits(c)]
        if working:
            return min(working, key=lambda c: (sum(_milli(held[i]) for i in c), c))
    keep = list(everyone)
    for i in reversed(everyone):
        trial = [j for j in keep if j != i]
        if fits(trial):
            keep = trial
    return tuple(keep)


def _milli(allocation: Allocation) -> int:
    return len(allocation.indices) * allocation.milli_per_gpu
