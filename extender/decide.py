"""The extender's filter, prioritize and bind decisions over one snapshot (preemption's
are ``extender.preemption``'s).

Layer: PURE. Functions from (snapshot, pod, candidates, config, time) to plain results:
no I/O, no clock (``now`` is a value), no cluster cache (a ``Snapshot`` is all they read
of the cluster), no pydantic, no aiohttp. Each takes the config's decision cache
(``memo``, an ``extender.memo.DecisionCache``) beside the snapshot, and reaches it only
through the filters and scorers (and the answers kept by node name or node state for a
whole request: ``DecisionCache.by_name``, ``DecisionCache.by_state_of``,
``gangs.kept_facts``). ``verbs`` feeds them
decoded requests; the HTTP shell owns the caches, assumes what ``plan_bind`` chose, and
calls the API.

What the snapshot is to each decision:

* With ``nodeCacheCapable: true`` kube-scheduler sends node names: everything about a
  node comes from the snapshot, and a name the snapshot lacks fails, unresolvable.
* With ``nodeCacheCapable: false`` it sends whole Node objects (``request_nodes``). Who
  holds which GPU only the cache knows (kube-scheduler counts GPUs, it does not name
  them), so every GPU's use comes from the snapshot. What the node *is* (its GPUs,
  islands, labels, product) comes from the request: the node kube-scheduler will bind
  to. Where the two copies disagree about safety, the stricter wins: a GPU unhealthy in
  either is unhealthy, a node cordoned in either is cordoned, the earlier drain time
  counts. A node the cache has never seen fails, unresolvable: its pods, and so its
  free GPUs, are unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import chain
from types import MappingProxyType
from typing import Any, Final, cast

from cluster.convert.grammar import format_indices
from cluster.convert.nodes import node_from_json
from cluster.convert.raw import ConversionError
from cluster.model import (
    MILLI_PER_GPU,
    Allocation,
    GpuDevice,
    NodeName,
    NodeState,
    PodInfo,
    PodKey,
)
from cluster.snapshot import Snapshot
from extender.config import ExtenderConfig
from extender.context import FIT, PodContext, Unfit, Verdict
from extender.filters import NodeFacts, judge, judge_facts, node_facts, promised, run_filters
from extender.gangs import build_context, kept_facts
from extender.gpus import choose_gpus
from extender.memo import MISSING, DecisionCache, ScoreShape, ShapeKey, gpu_state, score_state
from extender.scores import MAX_SCORE, applied_weight, clamp_score, score_node, static_score
from extender.selection import avoided

_LOWEST: Final = -math.inf
"""Where ``choose`` ranks a node with no score (not expected: each of its nodes fits)."""


def _not_cached(name: str) -> str:
    return f"node {name} is not in the extender's cache (not seen by its watch yet, or deleted)"


# ---------------------------------------------------------------- filter


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """Which candidates fit, in the request's order, and why the others do not."""

    fits: tuple[NodeName, ...]
    failed: Mapping[NodeName, str]
    """Nodes that preemption might help."""
    unresolvable: Mapping[NodeName, str]
    """Nodes no preemption can help (``FailedAndUnresolvableNodes``)."""
    chosen: NodeName | None = None
    """The one node of ``fits`` the pod should go to, when the extender chooses in
    ``/filter`` (``choose``): the answer names it alone. None: it names every fit."""


def filter_nodes(
    snapshot: Snapshot,
    pod: PodInfo,
    node_names: Iterable[str],
    config: ExtenderConfig,
    now: datetime,
    *,
    unresolvable: Mapping[NodeName, str] | None = None,
    memo: DecisionCache | None = None,
) -> FilterOutcome:
    """Run the filters (``filters.run_filters``) for ``pod`` on each named node.

    ``unresolvable`` adds nodes already known to fail (``request_nodes``' unknown ones).
    A pod whose GPU request is no count of GPUs (``PodInfo.refusal``) fits no node, and
    no preemption can help: every candidate is unresolvable, with that reason.
    ``memo`` is the decision cache of ``config`` (None: decide afresh).
    """
    if pod.refusal:
        names = cast("Iterable[NodeName]", chain(node_names, unresolvable or ()))
        refused = dict.fromkeys(names, pod.refusal)
        return FilterOutcome((), MappingProxyType({}), MappingProxyType(refused))
    ctx = build_context(snapshot, pod, config, now, memo)
    nodes = snapshot.nodes
    # A lone pod's verdicts (also those of a gang member whose gang refuses no node) are
    # kept by node state (``_steady_verdicts``) while no reservation holds a node. Else
    # by node name, one look-up per candidate: a lone pod's verdicts, and for a promised
    # node (it drains, or a reservation holds it), whose verdict reads the time, what
    # judges it (``NodeFacts``); a member whose gang requires a level finds each node's
    # ``NodeFacts`` (``gangs.kept_facts``).
    gang = ctx.gang
    lone = gang is None or not gang.refuses_nodes
    names = cast("Sequence[NodeName]", _sequence(node_names))
    by_state = _steady_verdicts(snapshot, ctx, names) if lone else None
    table = None
    if by_state is None:
        table = ctx.memo.by_name(snapshot, ctx.shape) if lone else kept_facts(snapshot, ctx)
    known = cast("dict[NodeName, Verdict | NodeFacts]", table if table is not None else {})
    # one pass in C, not a Python step per name
    found: list[Verdict | NodeFacts | None] = (
        list(map(known.get, names)) if by_state is None else cast("list[Any]", by_state)
    )
    if not unresolvable and found.count(FIT) == len(found):
        # kube-scheduler sends the nodes its own filters passed: most often all fit
        return FilterOutcome(tuple(names), MappingProxyType({}), MappingProxyType({}))
    fits: list[NodeName] = []
    failed: dict[NodeName, str] = {}
    hopeless: dict[NodeName, str] = dict(unresolvable or {})
    for name, kept in zip(names, found, strict=True):
        if name in hopeless:
            continue  # named twice, or given as unresolvable
        verdict = kept
        if verdict is None:
            node = nodes.get(name)
            if node is None:
                hopeless[name] = _not_cached(name)
                continue
            verdict = run_filters(ctx, node)
            if table is not None:
                steady = lone and not promised(ctx, node)
                known[name] = verdict if steady else node_facts(ctx, node)
        if verdict is FIT:
            fits.append(name)
            continue
        if verdict.__class__ is not Unfit:
            # facts (FIT is told above): told after the verdicts a lone pod finds
            facts: NodeFacts = verdict  # type: ignore[assignment]
            verdict = judge(ctx, facts.value, facts.verdicts, facts.plan)
            if verdict is FIT:
                fits.append(name)
                continue
        # an Unfit here: FIT and facts were told above
        (failed if verdict.resolvable else hopeless)[name] = verdict.reason  # type: ignore[union-attr]
    return FilterOutcome(tuple(fits), MappingProxyType(failed), MappingProxyType(hopeless))


def _steady_verdicts(
    snapshot: Snapshot, ctx: PodContext, names: Sequence[NodeName]
) -> list[Verdict | None] | None:
    """The verdict on each named node of a pod whose gang (if any) refuses no node,
    by node state (``DecisionCache.by_state_of``): on a node that does not drain and that no
    reservation holds, such a pod's verdict reads only the pod's shape and the node's
    ``memo.gpu_state`` (``filters.STEADY_FILTERS``). None for a node the snapshot lacks;
    ``None`` for all when nothing can be kept by name (a snapshot from outside the
    cache), or when reservations hold nodes (their verdicts read the time and the
    gang)."""
    if ctx.promises:
        return None
    return ctx.memo.by_state_of(
        snapshot,
        names,
        (_GPU_STATES, gpu_state),
        key=_Steady(ctx.shape),
        answer=lambda node: run_filters(ctx, node),
        # a drain's verdict reads the time: judged at each request, never kept
        steady=lambda node: node.drain_after is None,
    )


@dataclass(frozen=True, slots=True)
class _Steady:
    """The key of ``_steady_verdicts``' table: the verdicts by state of one shape."""

    shape: ShapeKey


_GPU_STATES: Final = "gpu_state"
"""The ``DecisionCache.by_name`` key of each node's ``memo.gpu_state``, one table for
every pod shape."""


def _sequence(items: Iterable[str]) -> Sequence[str]:
    return items if isinstance(items, (list, tuple)) else list(items)


def choose(
    snapshot: Snapshot,
    pod: PodInfo,
    outcome: FilterOutcome,
    config: ExtenderConfig,
    now: datetime,
    *,
    memo: DecisionCache | None = None,
) -> FilterOutcome:
    """``outcome`` with the node the pod should go to ``chosen``, when the choice is the
    extender's to make (``ExtenderConfig.choose_in_filter``); else ``outcome`` as it is.

    The choice is left to kube-scheduler when fewer than two nodes fit (nothing to
    choose), or when the pod states a preference that only kube-scheduler's scoring
    weighs, or might (``NodeSelection.prefers``, or where it may go is not known).
    Otherwise, of the fitting nodes: those without a ``PreferNoSchedule`` taint the pod
    does not tolerate before those with one (kube-scheduler's ``TaintToleration`` score
    would keep the pod off them too), then the best score (``score_nodes``, what
    ``/prioritize`` answers before it is rounded onto the wire), then the first named:
    kube-scheduler names its candidates from where its last search stopped, so equal
    nodes take turns as it would.
    """
    selection = pod.demand.selection
    if (
        not config.choose_in_filter
        or len(outcome.fits) < 2
        or selection is None
        or selection.prefers
    ):
        return outcome
    fits = outcome.fits
    scored = score_nodes(snapshot, pod, fits, config, now, memo=memo, fitting=True)
    values = cast("list[float]", scored)
    if None in scored:
        values = [_LOWEST if v is None else v for v in scored]
    # the best, the first named of equals: most often the answer, and two passes in C
    # where ranking them all is a sort of every candidate
    nodes = snapshot.nodes
    best = values.index(max(values))
    node = nodes.get(fits[best])
    if node is None or not avoided(selection, node):
        return replace(outcome, chosen=fits[best])
    # best first, equal scores in the order named (a stable sort); nodes to avoid are rare,
    # so they are looked for only from the best down
    ranked = sorted(range(len(fits)), key=values.__getitem__, reverse=True)
    for i in ranked:
        node = nodes.get(fits[i])
        if node is None or not avoided(selection, node):
            return replace(outcome, chosen=fits[i])
    return replace(outcome, chosen=fits[ranked[0]])


# ---------------------------------------------------------------- prioritize


def score_nodes(
    snapshot: Snapshot,
    pod: PodInfo,
    node_names: Iterable[str],
    config: ExtenderConfig,
    now: datetime,
    *,
    memo: DecisionCache | None = None,
    fitting: bool = False,
) -> list[float | None]:
    """The combined score (0..10) of each named node, in order; None where the pod does
    not fit. ``memo`` is the decision cache of ``config`` (None: decide afresh).
    ``fitting``: the caller found on this snapshot that the pod fits every named node
    (``filter_nodes``), so the filters are not run again.

    The fine-grained answer, for callers that rank nodes themselves (the load test);
    ``prioritize`` is what goes on the wire. Scores alone, not (name, score) pairs: a
    request with every node of a large cluster would make a pair per node, and the
    collector would walk them.
    """
    if pod.refusal:
        return [None for _ in node_names]
    ctx = build_context(snapshot, pod, config, now, memo)
    plain = ctx.gang is None
    scale = applied_weight(ctx)
    if plain and fitting:
        names = cast("Sequence[NodeName]", _sequence(node_names))
        by_state = _fitting_scores(snapshot, ctx, names, scale)
        if by_state is not None:
            return by_state
        node_names = names
    nodes = snapshot.nodes
    # Outside a gang a node's score depends on the node and the pod's shape alone: kept
    # by name, so that a node unchanged since an earlier request with a pod of this
    # shape costs a look-up.
    kept = ctx.memo.by_name(snapshot, _Scored(ctx.shape, ctx.score_shape)) if plain else None
    known_scores = cast("dict[NodeName, float | None]", kept if kept is not None else {})
    facts = None if plain else kept_facts(snapshot, ctx)  # as in filter_nodes
    # a kept score may be None (the pod does not fit): one look-up tells it from no entry
    scored: list[float | None] = []
    for name in cast("Iterable[NodeName]", node_names):
        known = known_scores.get(name, MISSING)
        if known is not MISSING:
            scored.append(known)  # type: ignore[arg-type]
            continue
        node = nodes.get(name)
        if node is None:
            scored.append(None)
            continue
        fact = facts.get(name) if facts is not None else None
        if (
            not fitting
            and (run_filters(ctx, node) if fact is None else judge_facts(ctx, fact)) is not FIT
        ):
            score = None
        elif plain:
            static = static_score(ctx, node)
            score = 0.0 if static is None or not scale else clamp_score(static / scale)
        else:
            score = score_node(ctx, node)
        if kept is not None and not promised(ctx, node):
            known_scores[name] = score
        scored.append(score)
    return scored


def _fitting_scores(
    snapshot: Snapshot, ctx: PodContext, names: Sequence[NodeName], scale: float
) -> list[float | None] | None:
    """``score_nodes`` of a pod outside a gang on nodes it fits, by node state
    (``DecisionCache.by_state_of``): its score reads only the pod's score shape and the node's
    ``memo.score_state``. ``None`` where nothing can be kept by name (a snapshot from
    outside the cache)."""

    def score(node: NodeState) -> float:
        static = static_score(ctx, node)
        return 0.0 if static is None or not scale else clamp_score(static / scale)

    return ctx.memo.by_state_of(
        snapshot, names, (_SCORE_STATES, score_state), key=ctx.score_shape, answer=score
    )


_SCORE_STATES: Final = "score_state"
"""The ``DecisionCache.by_name`` key of each node's ``memo.score_state``, one table for
every pod shape: what a score outside a gang reads of a node."""


@dataclass(frozen=True, slots=True)
class _Scored:
    """The key of the scores kept by name: what the filters and the scorers read."""

    filters: ShapeKey
    scores: ScoreShape


def prioritize(
    snapshot: Snapshot,
    pod: PodInfo,
    node_names: Iterable[str],
    config: ExtenderConfig,
    now: datetime,
    *,
    memo: DecisionCache | None = None,
) -> list[int]:
    """Integer scores 0..10 for ``/prioritize``, one per name, in the request's order."""
    scored = score_nodes(snapshot, pod, node_names, config, now, memo=memo)
    return wire_scores(scored, config)


def wire_scores(scored: Sequence[float | None], config: ExtenderConfig) -> list[int]:
    """Scores as the wire carries them: integers 0..10, 0 for a node that does not fit.

    Normalized (the default), the fitting nodes spread over 1..10, best = 10, so that
    the eleven values separate candidates as well as they can and a fitting node never
    ties with one that does not fit. Otherwise each score is rounded on its own.
    """
    values = [s for s in scored if s is not None]
    if not values:
        return [0] * len(scored)
    top = int(MAX_SCORE)
    # one comprehension per case: this runs once per candidate, 5,000 of them at scale
    if not config.normalize_scores:
        return [0 if score is None else max(0, min(top, round(score))) for score in scored]
    low, high = min(values), max(values)
    span = high - low
    if span < 1e-9:
        return [0 if score is None else top for score in scored]
    # low..high onto 1..10: within bounds by construction, no clamp needed
    return [0 if score is None else 1 + round(9 * (score - low) / span) for score in scored]


# ---------------------------------------------------------------- full Node objects


@dataclass(frozen=True, slots=True)
class RequestNodes:
    """The request's Node objects merged with the cache, ready for the decisions."""

    snapshot: Snapshot
    """The snapshot with the request's nodes in place of the cache's copies."""
    names: tuple[NodeName, ...]
    """The request's nodes that can be decided on, in the request's order."""
    unresolvable: Mapping[NodeName, str]
    """Nodes that cannot be decided on, and why (unknown to the cache, no name)."""


class _Overlay(Mapping[NodeName, NodeState]):
    """``base`` with some nodes replaced, without copying 5,000 entries per request."""

    __slots__ = ("_base", "_top")

    def __init__(self, top: Mapping[NodeName, NodeState], base: Mapping[NodeName, NodeState]):
        self._top = top
        self._base = base

    def __getitem__(self, key: NodeName) -> NodeState:
        found = self._top.get(key)
        return self._base[key] if found is None else found

    def __iter__(self) -> Iterator[NodeName]:
        yield from self._top
        yield from (key for key in self._base if key not in self._top)

    def __len__(self) -> int:
        return len(self._base) + sum(1 for key in self._top if key not in self._base)


def request_nodes(
    snapshot: Snapshot, objects: Sequence[Mapping[str, Any]], config: ExtenderConfig
) -> RequestNodes:
    """The Node objects of a ``nodeCacheCapable: false`` request, merged with the cache
    (see the module's docstring for which copy wins what)."""
    merged: dict[NodeName, NodeState] = {}
    names: list[NodeName] = []
    hopeless: dict[NodeName, str] = {}
    for number, obj in enumerate(objects):
        try:
            described = node_from_json(obj, config.level_labels)
        except ConversionError as exc:
            hopeless[NodeName(f"Nodes.items[{number}]")] = f"not a usable Node: {exc}"
            continue
        cached = snapshot.nodes.get(described.name)
        if cached is None:
            hopeless[described.name] = _not_cached(described.name)
            continue
        merged[described.name] = merge_node(described, cached)
        names.append(described.name)
    # no change log: what readers keep by node name for the cache's snapshots (answers,
    # domains) describes the cache's nodes, not these
    view = replace(snapshot, nodes=_Overlay(merged, snapshot.nodes), node_log=None)
    return RequestNodes(view, tuple(names), MappingProxyType(hopeless))


def merge_node(described: NodeState, cached: NodeState) -> NodeState:
    """``described`` (the request's node, all GPUs free) with the GPU use the cache
    counts on ``cached``, and the stricter of the two on health, cordon and drain."""
    used = {gpu.index: MILLI_PER_GPU - gpu.free_milli for gpu in cached.gpus}
    sick = {gpu.index for gpu in cached.gpus if not gpu.healthy}
    gpus = tuple(
        GpuDevice(
            gpu.index,
            gpu.island,
            gpu.healthy and gpu.index not in sick,
            max(0, gpu.free_milli - used.get(gpu.index, 0)),
        )
        for gpu in described.gpus
    )
    drains = [d for d in (described.drain_after, cached.drain_after) if d is not None]
    return replace(
        described,
        gpus=gpus,
        unschedulable=described.unschedulable or cached.unschedulable,
        drain_after=min(drains) if drains else None,
    )


# ---------------------------------------------------------------- bind


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What to bind: the pod, and the GPUs it takes (None for a pod without GPUs)."""

    pod: PodInfo
    allocation: Allocation | None

    @property
    def gpu_indices(self) -> str:
        """The ``tessera.dev/gpu-indices`` value to write on the pod."""
        return "" if self.allocation is None else format_indices(self.allocation.indices)


@dataclass(frozen=True, slots=True)
class BindRefusal:
    """Why the pod cannot be bound there; goes into ``ExtenderBindingResult.Error``."""

    reason: str


def plan_bind(
    snapshot: Snapshot,
    pod: PodKey | PodInfo,
    node: str,
    config: ExtenderConfig,
    now: datetime,
    *,
    uid: str = "",
    memo: DecisionCache | None = None,
) -> BindPlan | BindRefusal:
    """The GPUs ``pod`` takes on ``node``, re-checked against every bound and assumed
    pod in ``snapshot``, or why not.

    ``pod`` is the cache's record when given a key; pass a ``PodInfo`` for a pod the
    watch has not shown yet (one seen in a ``/filter`` request). ``uid`` (the binding's
    ``PodUID``) must match the record's when both are known. A bind retried for the same
    node gets the same GPUs again; the shell re-assumes them, which only renews the TTL.
    """
    if isinstance(pod, PodInfo):
        info: PodInfo | None = pod
        key = pod.key
    else:
        key = pod
        info = snapshot.pods.get(key)
    if info is None:
        return BindRefusal(f"pod {key} is not in the extender's cache yet; retry later")
    if uid and info.uid and info.uid != uid:
        return BindRefusal(
            f"pod {key} in the extender's cache has UID {info.uid}, the binding is for UID "
            f"{uid} (deleted and re-created?)"
        )
    if info.refusal:
        return BindRefusal(f"cannot bind pod {key}: {info.refusal}")
    if info.node is not None:
        return BindRefusal(f"pod {key} is already bound to node {info.node}")
    held = snapshot.allocations.get(key)
    if held is not None and key in snapshot.assumed:
        if held.node == node:
            return BindPlan(info, held)
        return BindRefusal(f"pod {key} is already being bound to node {held.node}")
    state = snapshot.nodes.get(NodeName(node))
    if state is None:
        return BindRefusal(f"cannot bind pod {key}: {_not_cached(node)}")
    if not info.demand.uses_gpu:
        return BindPlan(info, None)
    ctx = build_context(snapshot, info, config, now, memo)
    verdict = run_filters(ctx, state)
    if isinstance(verdict, Unfit):
        return BindRefusal(f"cannot bind pod {key} to node {node}: {verdict.reason}")
    choice = choose_gpus(state, info.demand, config)
    if not choice:
        # unreachable while filter_gpus is "choose_gpus found some"; said, not assumed
        return BindRefusal(f"cannot bind pod {key} to node {node}: no GPUs could be chosen")
    return BindPlan(info, Allocation(state.name, choice, info.demand.milli_per_gpu))
