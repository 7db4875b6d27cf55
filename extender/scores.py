"""The scorers of one node for one pod, and the combined score kube-scheduler ranks by.

Layer: PURE. Functions of (``PodContext``, ``NodeState``): no I/O, no clock, no
settings, no aiohttp. Must not filter: they are meant for nodes that passed
``extender.filters.run_filters``, and judge the GPUs ``gpus.choose_gpus`` picks there,
the ones bind will take.

A scorer answers a float in 0..10 (10 is best). Floats rather than the wire's
integers: fragmentation differences between nodes are often a fraction of a GPU, and
rounding each scorer before combining them would erase exactly those differences.
``decide.prioritize`` turns the combined score into the wire's integers. The part of
the score that reads only the node and the pod's shape (packing, island fit) is kept
in the decision cache by node and by node state (``static_score``); gang locality
reads the gang and is scored every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

from cluster.labels import HOSTNAME
from cluster.model import Allocation, NodeState
from cluster.snapshot import apply_allocation
from extender.context import GangView, PodContext
from extender.filters import domain_room, member_fits
from extender.gpus import choose_gpus, fragmentation, islands, one_island
from extender.memo import MISSING, score_state

MAX_SCORE: Final = 10.0
NEUTRAL_SCORE: Final = 5.0
"""What a scorer answers when it has no opinion (a pod without GPUs): it ranks no node
above another."""

_FRAG_SCALE_MILLI: Final = 1000.0
"""How much added fragmentation halves the packing score's distance to 0 (one GPU)."""


def score_packing(ctx: PodContext, node: NodeState) -> float:
    """10 for the placement that leaves the node least fragmented for the expected pod
    mix, 5 when it changes nothing, towards 0 as it strands more free GPU capacity."""
    return _packing(ctx, node, choose_gpus(node, ctx.demand, ctx.config))


def _packing(ctx: PodContext, node: NodeState, choice: tuple[int, ...] | None) -> float:
    if choice is None:
        return 0.0
    # CPU counts where the node reports some: what its pods leave of it
    cpu = node.cpu_free_milli if node.cpu_milli > 0 else None
    if not choice and (cpu is None or not ctx.demand.cpu_milli):
        return NEUTRAL_SCORE
    config = ctx.config
    mix, islands_required = config.pod_mix, config.islands_required
    stranding = config.cpu_stranding
    after = node
    if choice:
        after = apply_allocation(node, Allocation(node.name, choice, ctx.demand.milli_per_gpu), 1)
    cpu_after = None if cpu is None else max(0, cpu - ctx.demand.cpu_milli)
    # the node's own fragmentation is the same for every pod shape scored on it
    kept = ctx.memo.fragmentation
    before = kept.get(node)
    if before is MISSING:
        before = fragmentation(node, mix, islands_required, cpu, stranding)
        kept.put(node, before)
    delta = fragmentation(after, mix, islands_required, cpu_after, stranding) - before  # type: ignore[operator]
    # a logistic curve: monotonic everywhere, so no two deltas collapse at a clamp
    exponent = max(-50.0, min(50.0, delta / _FRAG_SCALE_MILLI))
    return MAX_SCORE / (1.0 + math.exp(exponent))


def score_island_fit(ctx: PodContext, node: NodeState) -> float:
    """Best fit inside the node: 10 when the pod fills exactly what is free in the
    islands it uses (or the free part of its shared GPU); less the more it leaves."""
    return _island_fit(ctx, node, choose_gpus(node, ctx.demand, ctx.config))


def _island_fit(ctx: PodContext, node: NodeState, choice: tuple[int, ...] | None) -> float:
    if choice is None:
        return 0.0
    if not choice:
        return NEUTRAL_SCORE
    demand = ctx.demand
    by_index = {gpu.index: gpu for gpu in node.gpus}
    if demand.is_share:
        return MAX_SCORE * demand.gpu_milli / max(demand.gpu_milli, by_index[choice[0]].free_milli)
    free, healthy = islands(node)
    used = {by_index[i].island for i in choice}
    left_open = sum(len(free.get(island, ())) for island in used)
    score = MAX_SCORE * demand.gpus / max(demand.gpus, left_open)
    if len(used) > 1 and one_island(demand.gpus, healthy, True):
        # only when islands are a preference: it fits one island but spans several
        score /= len(used)
    return score


def score_gang_locality(ctx: PodContext, node: NodeState) -> float:
    """Members of a gang close together.

    With members placed: the share of them in this node's domain, at the
    ``preferred:<level>`` when there is one (three quarters of the score), and averaged
    over every level down to the node itself. For the first member: room for the gang's
    ``min`` members in this node's domain at its level (or on the node, without one).
    Not a gang: 0 everywhere, so it ranks no node above another.
    """
    gang = ctx.gang
    if gang is None:
        return 0.0
    if gang.members_located:
        affinity = _affinity(gang, node)
        if gang.preferred is not None:
            near = _share_in(gang, gang.preferred.node_label, node)
            return MAX_SCORE * (0.75 * near + 0.25 * affinity)
        return MAX_SCORE * affinity
    need = max(1, gang.spec.min_count)
    level = gang.level
    if level is not None and gang.rooms is not None:
        value = node.domains.get(level.node_label)
        if value is None:
            return 0.0
        free, _ = domain_room(ctx, gang, value, node)
        return MAX_SCORE * min(1.0, free / need)
    fits, _ = member_fits(ctx, node)
    return MAX_SCORE * min(1.0, fits / need)


def _share_in(gang: GangView, label: str, node: NodeState) -> float:
    value = node.name if label == "" else node.domains.get(label)
    if value is None or not gang.members_located:
        return 0.0
    return gang.member_domains.get(label, {}).get(value, 0) / gang.members_located


def _affinity(gang: GangView, node: NodeState) -> float:
    # the hostname level and the node itself are one level: count it once
    labels = [label for label in gang.member_domains if label != HOSTNAME]
    return sum(_share_in(gang, label, node) for label in labels) / len(labels)


Scorer: TypeAlias = Callable[[PodContext, NodeState], float]

SCORERS: Final[Mapping[str, Scorer]] = MappingProxyType(
    {
        "packing": score_packing,
        "island_fit": score_island_fit,
        "gang_locality": score_gang_locality,
    }
)
"""Each scorer by the name of its weight in ``ScoringWeights``."""


def score_node(ctx: PodContext, node: NodeState) -> float:
    """The weighted mean of the scorers that judge the pod (``applied_weight``), 0..10;
    0 where the pod has no GPUs to take.

    Meant for nodes that passed the filters; the GPUs are chosen once and every scorer
    judges that same choice, the one bind will make.
    """
    total = static_score(ctx, node)
    if total is None:
        return 0.0
    weights = ctx.config.weights
    if weights.gang_locality and ctx.gang is not None:
        total += weights.gang_locality * score_gang_locality(ctx, node)
    scale = applied_weight(ctx)
    return clamp_score(total / scale) if scale else 0.0


def static_score(ctx: PodContext, node: NodeState) -> float | None:
    """Packing and island fit, weighted and summed (None: no GPUs can be chosen): kept
    by node object and by node state (``memo.score_state``) in the decision cache."""
    found = ctx.scores.get(node)
    if found is not MISSING:
        return found  # type: ignore[return-value]
    memo = ctx.memo
    state = score_state(memo, node)
    total = memo.by_state(ctx.score_shape, state)
    if total is MISSING:
        choice = choose_gpus(node, ctx.demand, ctx.config)
        total = None
        if choice is not None:
            weights = ctx.config.weights
            total = 0.0
            if weights.packing:
                total += weights.packing * _packing(ctx, node, choice)
            if weights.island_fit:
                total += weights.island_fit * _island_fit(ctx, node, choice)
        memo.keep_by_state(ctx.score_shape, state, total)
    ctx.scores.put(node, total)
    return total  # type: ignore[return-value]


def applied_weight(ctx: PodContext) -> float:
    """The weights of the scorers that judge this pod: gang locality only judges gang
    members. A weighted mean over these alone keeps the full 0..10 for every pod (a
    scorer that answers 0 everywhere would squeeze the others into a part of it)."""
    weights = ctx.config.weights
    return weights.total if ctx.gang is not None else weights.packing + weights.island_fit


def clamp_score(score: float) -> float:
    """Within 0..10 whatever happened upstream (NaN counts as 0)."""
    if not score >= 0.0:
        return 0.0
    return min(MAX_SCORE, score)
