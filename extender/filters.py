"""The filters of one node for one pod, and the one pipeline that runs them in order.

Layer: PURE. Functions of (``PodContext``, ``NodeState``): no I/O, no clock (the request
time arrives in the context), no settings, no aiohttp. Must not score, choose GPUs
(``gpus.choose_gpus`` does; the GPU filter is "it found some") or reach into the
decision cache but through the context's tables and ``memo.gpu_state``.

``FILTERS`` is the pipeline, and ``judge`` is the only code that runs it: each filter
in order, the first unresolvable reason wins (it tells kube-scheduler not to try
preemption there), else the first resolvable one. The filters in ``NODE_FILTERS`` read
only the node and the pod's shape: they are judged as one group (``node_verdicts``),
kept in the decision cache by node and by node state.

``judge`` takes a node as the parts of a ``NodeFacts``: the node itself and its
``NODE_FILTERS`` verdicts (``run_filters``), or what is kept of it by name in the
decision cache (``node_facts``): for a node with no promise, its domain at the
gang's level and the verdict of each run of ``STEADY_FILTERS``, the other filters being
functions of the domain (``BY_DOMAIN``). That is how a gang member's thousands of
candidates are judged without reading them. A node's promises changing (a reservation
made or released) is a change of the node in the cache's change log, so nothing kept
by its name outlives them.

Adding a filter is adding it to ``FILTERS``; to ``NODE_FILTERS`` when it reads only
the node and the pod's shape (``memo.ShapeKey``); to ``STEADY_FILTERS`` when it reads
no more than that of a node with no promise (``promised``); to ``BY_DOMAIN`` when it
reads only the domain. A filter in none of them is judged on the node itself (``KEPT_JUDGES``
turns False: slower, never wrong). A property test holds judging kept facts to judging
the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from cluster.labels import GPU_RESOURCE
from cluster.model import NodeState, Promise, product_matches
from extender.config import TopologyLevel
from extender.context import FIT, GangView, PodContext, Unfit, Verdict
from extender.gpus import islands, one_island, pod_fits
from extender.memo import MISSING, FactsKey, gpu_state
from extender.promises import backfill_verdict, promise_verdict
from extender.selection import selection_refusal

Filter: TypeAlias = Callable[[PodContext, NodeState], Verdict]


# ---------------------------------------------------------------- the node as a whole


def filter_schedulable(ctx: PodContext, node: NodeState) -> Verdict:
    """A cordoned node takes nothing new."""
    if node.unschedulable:
        return Unfit("node is cordoned (spec.unschedulable)", resolvable=False)
    return FIT


def filter_node_selection(ctx: PodContext, node: NodeState) -> Verdict:
    """The node's labels and taints let the pod in, as kube-scheduler's in-tree filters
    judge them (``nodeSelector``, required node affinity, tolerations). Not one of
    ``FILTERS``: kube-scheduler sends only nodes that pass these. It is one of the
    ``ROOM_FILTERS``: a gang's room is counted only on nodes its members may use, not on
    a rack's nodes of another flavor (or pool, or taint)."""
    selection = ctx.demand.selection
    if selection is None:
        return FIT
    refused = selection_refusal(selection, node)
    return FIT if refused is None else Unfit(refused, resolvable=False)


def filter_product(ctx: PodContext, node: NodeState) -> Verdict:
    """The node's GPU model is one the pod accepts (``tessera.dev/gpu-product``)."""
    accepted = ctx.demand.products
    if not accepted or not ctx.demand.uses_gpu:
        return FIT
    wanted = " or ".join(accepted)
    if not node.product:
        return Unfit(f"node has no GPU product label; pod accepts {wanted}", resolvable=False)
    if any(product_matches(a, node.product) for a in accepted):
        return FIT
    return Unfit(f"node has {node.product} GPUs; pod accepts {wanted}", resolvable=False)


def filter_maintenance(ctx: PodContext, node: NodeState) -> Verdict:
    """A node that drains at ``tessera.dev/drain-after`` is promised to maintenance from
    then on: it takes only pods whose time limit (``activeDeadlineSeconds``) ends by
    then, counted from now (``extender.promises``, the rule reservations keep too)."""
    drain = node.drain_after
    if drain is None:
        return FIT
    verdict = ctx.drains.get(drain)
    if verdict is None:
        verdict = ctx.drains[drain] = promise_verdict(
            Promise(drain), node.name, ctx.ends, ctx.demand.time_limit_s, ctx.now
        )
    return verdict


def filter_reserved(ctx: PodContext, node: NodeState) -> Verdict:
    """A node held by a gang's reservation (``extender.reservations``, promises in the
    snapshot) takes the gang's own members, and another pod only if its time limit ends
    before the reservation starts (backfill): the rule of maintenance windows
    (``extender.promises``), so the GPUs that free up there stay free for the gang."""
    held = ctx.promises.get(node.name)
    if held is None:
        return FIT
    gang = ctx.demand.gang
    return backfill_verdict(
        node.name,
        held,
        pod_gang=None if gang is None else gang.id,
        ends=ctx.ends,
        limit_s=ctx.demand.time_limit_s,
        now=ctx.now,
    )


def filter_gpus(ctx: PodContext, node: NodeState) -> Verdict:
    """Enough free healthy GPUs, in one NVLink island when the pod fits in one; for a
    share, one healthy GPU with enough milli free."""
    demand = ctx.demand
    if not demand.uses_gpu:
        return FIT
    if not node.gpus:
        return Unfit(f"node has no GPUs ({GPU_RESOURCE} allocatable is 0)", resolvable=False)
    if demand.gpus > 0:
        return _whole_verdict(node, demand.gpus, ctx.config.islands_required)
    return _share_verdict(node, demand.gpu_milli)


def _whole_verdict(node: NodeState, k: int, islands_required: bool) -> Verdict:
    free, healthy = islands(node)
    total_healthy = sum(healthy.values())
    if total_healthy < k:
        return Unfit(
            f"node has {_gpus(total_healthy, 'healthy ')}{_unhealthy_note(node)}, pod needs {k}",
            resolvable=False,
        )
    total_free = sum(map(len, free.values()))
    if total_free == 0:
        return Unfit(f"all {_gpus(total_healthy, 'healthy ')} are in use, pod needs {k}", True)
    if one_island(k, healthy, islands_required):
        best = min(healthy, key=lambda island: (-len(free.get(island, ())), island))
        best_free = len(free.get(best, ()))
        if best_free >= k:
            return FIT
        reason = f"{_gpus(best_free, 'healthy ')} free in island {best}, pod needs {k}"
        if total_free >= k:
            reason += f" ({total_free} free on the node, but {k} must share one NVLink island)"
        return Unfit(reason, resolvable=True)
    if total_free >= k:
        return FIT
    return Unfit(f"{_gpus(total_free, 'healthy ')} free, pod needs {k}", resolvable=True)


def _share_verdict(node: NodeState, milli: int) -> Verdict:
    healthy = [gpu for gpu in node.gpus if gpu.healthy]
    if not healthy:
        return Unfit(f"all {_gpus(len(node.gpus))} of the node are unhealthy", resolvable=False)
    best = max(healthy, key=lambda gpu: (gpu.free_milli, -gpu.index))
    if best.free_milli >= milli:
        return FIT
    if best.free_milli == 0:
        return Unfit(
            f"all {_gpus(len(healthy), 'healthy ')} are in use, pod needs {milli} milli of one GPU",
            resolvable=True,
        )
    return Unfit(
        f"at most {best.free_milli} milli-GPU free on one healthy GPU (GPU {best.index}), "
        f"pod needs {milli} milli of one GPU",
        resolvable=True,
    )


# ---------------------------------------------------------------- gangs


def filter_gang_domain(ctx: PodContext, node: NodeState) -> Verdict:
    """``required:<level>``: once a member is placed or assumed, only its domain. Every
    reason it gives is unresolvable: evicting pods moves no gang member."""
    return gang_domain_verdict(ctx, _domain(ctx, node))


def _domain(ctx: PodContext, node: NodeState) -> str | None:
    """The node's domain at the level the pod's gang requires (None: no such level, or
    the node has no label there): all the gang filters read of a node."""
    gang = ctx.gang
    level = None if gang is None else gang.required
    return None if level is None else node.domains.get(level.node_label)


def gang_domain_verdict(ctx: PodContext, value: str | None) -> Verdict:
    """``filter_gang_domain`` on a node whose domain at the required level is ``value``."""
    gang = ctx.gang
    if gang is None:
        return FIT
    allowed = gang.allowed_domains
    if allowed is not None and value is not None:
        # the common case once a member is placed, answered first: thousands of nodes
        # (allowed domains come only with a known required level)
        if value in allowed:
            return FIT
        return gang.reasons.get(_OUTSIDE) or _outside(gang, gang.required, allowed)  # type: ignore[arg-type]
    if gang.unknown_level is not None:
        known = ", ".join(level.name for level in ctx.config.levels)
        return Unfit(
            f"gang {gang.spec.id} requires topology level {gang.unknown_level!r}, which is not "
            f"one of the extender's levels ({known})",
            resolvable=False,
        )
    level = gang.required
    if level is None:
        return FIT
    if value is None:
        return Unfit(
            f"node has no {level.node_label} label; gang {gang.spec.id} must stay in one "
            f"{level.name}",
            resolvable=False,
        )
    allowed = gang.allowed_domains
    if allowed is None or value in allowed:
        return FIT
    return _outside(gang, level, allowed)


_OUTSIDE: Final = "outside"


def _outside(gang: GangView, level: TopologyLevel, allowed: frozenset[str]) -> Unfit:
    """The verdict on every node outside the gang's domain at ``level``: one text for
    all, so that kube-scheduler's event counts them as one reason (``4990 node(s) ...``)
    rather than listing each other domain by name."""
    verdict = gang.reasons.get(_OUTSIDE)
    if verdict is None:
        where = " or ".join(sorted(allowed))
        placed = gang.member_domains.get(level.node_label, {}).get(min(allowed), 0)
        verdict = gang.reasons[_OUTSIDE] = Unfit(
            f"gang {gang.spec.id} has {_members(placed)} in {level.name} {where}; "
            f"the node is in another {level.name}",
            resolvable=False,
        )
    return verdict


def filter_gang_room(ctx: PodContext, node: NodeState) -> Verdict:
    """``required:<level>``: the first member goes only to a domain with room for the
    gang's ``min`` members (counted as whole pods that fit, node by node)."""
    return gang_room_verdict(ctx, _domain(ctx, node), node)


def gang_room_verdict(ctx: PodContext, value: str | None, node: NodeState | None = None) -> Verdict:
    """``filter_gang_room`` on a node whose domain at the required level is ``value``:
    ``node`` as given (it may differ from the snapshot's: ``domain_room``), or None for
    the node as the snapshot counts it, whose room is its domain's as counted."""
    gang = ctx.gang
    if gang is None or gang.required is None or gang.rooms is None:
        return FIT
    if value is None:
        return FIT  # filter_gang_domain reports the missing label
    if node is None:
        free, total = gang.rooms.free.get(value, 0), gang.rooms.total.get(value, 0)
    else:
        free, total = domain_room(ctx, gang, value, node)
    return room_verdict(gang, gang.required, free, total)


def room_verdict(gang: GangView, level: TopologyLevel, free: int, total: int) -> Verdict:
    """A first member's verdict on a node whose domain at ``level`` holds ``free``
    members now and ``total`` with every GPU free."""
    need = gang.spec.min_count
    if free >= need:
        return FIT
    # the domain unnamed, as in filter_gang_domain: one text per room size
    key = (free, total >= need)
    verdict = gang.reasons.get(key)
    if verdict is None:
        verdict = gang.reasons[key] = Unfit(
            f"the node's {level.name} has room for {_members(free)} of gang {gang.spec.id} "
            f"now, it needs {need} together",
            resolvable=key[1],
        )
    return verdict


def domain_room(ctx: PodContext, gang: GangView, value: str, node: NodeState) -> tuple[int, int]:
    """(free, total) room for members in domain ``value``, with ``node`` counted as it is
    given (it may differ from the snapshot's: victims evicted, or the request's copy)."""
    rooms = gang.rooms
    if rooms is None:
        return 0, 0
    free, total = rooms.free.get(value, 0), rooms.total.get(value, 0)
    before = rooms.node_fits(node.name)
    if before is None:
        return free, total
    now, _ = member_fits(ctx, node)
    return free - before + now, total


def member_fits(ctx: PodContext, node: NodeState) -> tuple[int, int]:
    """``pod_fits`` of the pod on ``node``, now and empty, kept in the decision cache."""
    found = ctx.fits.get(node)
    if found is MISSING:
        memo = ctx.memo
        state = gpu_state(memo, node)
        found = memo.by_state(ctx.fit_shape, state)
        if found is MISSING:
            demand, islands_required = ctx.demand, ctx.config.islands_required
            found = (
                pod_fits(node, demand, islands_required),
                pod_fits(node, demand, islands_required, empty=True),
            )
            memo.keep_by_state(ctx.fit_shape, state, found)
        ctx.fits.put(node, found)
    return found  # type: ignore[return-value]


# ---------------------------------------------------------------- the pipeline


NODE_FILTERS: Final[tuple[Filter, ...]] = (filter_schedulable, filter_product, filter_gpus)
"""Filters that read only the node and the pod's shape (``memo.ShapeKey``), never the
time or a gang: judged as one group, kept by node and by node state."""

ROOM_FILTERS: Final[tuple[Filter, ...]] = (
    filter_schedulable,
    filter_product,
    filter_node_selection,
)
"""The filters a node must pass to count towards a gang's room at all: the room counts
what its GPUs hold, so the GPU filter is the count itself; and, since the room counts
nodes kube-scheduler has not filtered, the node selection it would apply."""

GANG_FILTERS: Final[tuple[Filter, ...]] = (filter_gang_domain, filter_gang_room)
"""Filters that pass every node unless the pod's gang refuses nodes
(``GangView.refuses_nodes``)."""

FILTERS: Final[tuple[Filter, ...]] = (
    filter_gang_domain,
    filter_schedulable,
    filter_product,
    filter_maintenance,
    filter_reserved,
    filter_gpus,
    filter_gang_room,
)
"""In the order their reasons win (the first unresolvable, else the first). A gang's
domain comes first: outside it nothing else about a node matters to the member, every
reason it gives is unresolvable, and so most nodes are answered by it alone once a
member is placed."""

DomainForm: TypeAlias = Callable[[PodContext, str | None], Verdict]

BY_DOMAIN: Final[Mapping[Filter, DomainForm]] = MappingProxyType(
    {filter_gang_domain: gang_domain_verdict, filter_gang_room: gang_room_verdict}
)
"""The filters that read of a node of the cache's snapshot only its domain at the level
the pod's gang requires, each as a function of that domain."""

STEADY_FILTERS: Final[frozenset[Filter]] = frozenset(
    (*NODE_FILTERS, filter_maintenance, filter_reserved)
)
"""The filters that read only the node and the pod's shape (``memo.ShapeKey``) of a
node with no promise (``promised``: it does not drain and no reservation holds it; the
maintenance and reservation filters read the time, and the latter the pod's gang, only
of one that has): where they follow one another in ``FILTERS``, ``NodeFacts`` of such
a node keep their verdict together."""

Plan: TypeAlias = tuple[tuple[Callable[[PodContext, Any], Verdict] | None, int], ...]
"""Steps of the pipeline, in order: ``(check, -1)``, a function of the context and of
what is judged; or ``(None, at)``, the verdict at ``at`` among those kept."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """A node as the pipeline judges it (``judge``): the steps of ``plan``, each a
    check given ``value`` or the verdict at its place in ``verdicts``. Either

    * the node itself, its ``NODE_FILTERS`` verdicts and ``FILTERS``, as
      ``run_filters`` judges any node (kept so of a promised node: its maintenance or
      reservation verdict reads the time);
    * or, for a node of the cache's snapshot with no promise, its domain at the
      level the pod's gang requires, the verdict of each run of ``STEADY_FILTERS``, and
      ``FILTERS`` with a run as one step and the other filters in their form on the
      domain (``BY_DOMAIN``): all a gang member's verdict reads of the node.

    Kept by node name for the cache's snapshots (``node_facts``, ``gangs.kept_facts``),
    they judge a gang member's candidates, thousands of them, at a look-up each."""

    value: Any
    verdicts: tuple[Verdict, ...]
    plan: Plan


def judge(ctx: PodContext, value: Any, verdicts: tuple[Verdict, ...], plan: Plan) -> Verdict:
    """The pipeline: each step of ``plan`` in order, on ``value`` or from ``verdicts``
    (``NodeFacts``), the first unresolvable reason, else the first resolvable one, else
    ``FIT``. Applied to a run of steps, then to the run's verdict among the others, the
    rule gives what it gives applied to them all: so a run can be judged once and kept.
    Given the parts rather than a ``NodeFacts``: ``run_filters`` makes none."""
    first: Verdict = FIT
    for check, at in plan:
        verdict = verdicts[at] if check is None else check(ctx, value)
        if verdict is FIT:
            continue
        if not verdict.resolvable:  # type: ignore[union-attr]  # FIT is the only Fit
            return verdict
        if first is FIT:
            first = verdict
    return first


def judge_facts(ctx: PodContext, facts: NodeFacts) -> Verdict:
    """``judge`` on kept facts: ``run_filters`` on the node they were kept of."""
    return judge(ctx, facts.value, facts.verdicts, facts.plan)


_IN_GROUP: Final = {check: at for at, check in enumerate(NODE_FILTERS)}


def _node_plan(checks: Iterable[Filter]) -> Plan:
    """``checks`` on a node, the ``NODE_FILTERS`` among them from ``node_verdicts``."""
    return tuple((None, _IN_GROUP[c]) if c in _IN_GROUP else (c, -1) for c in checks)


_PLAN: Final = _node_plan(FILTERS)
_LONE_PLAN: Final = _node_plan(c for c in FILTERS if c not in GANG_FILTERS)


def _steady_plans() -> tuple[tuple[Plan, ...], Plan]:
    """``FILTERS`` on a node with no promise, as ``NodeFacts`` keep it: the node plan
    of each run of ``STEADY_FILTERS``, and the plan where a run is its kept verdict and
    each other filter judges the domain (``BY_DOMAIN``). None if another filter reads
    more of a node."""
    runs: list[Plan] = []
    steps: list[tuple[DomainForm | None, int]] = []
    run: list[Filter] = []
    for check in (*FILTERS, None):
        if check in STEADY_FILTERS:
            run.append(check)
            continue
        if run:
            steps.append((None, len(runs)))
            runs.append(_node_plan(run))
            run = []
        if check is None:
            break
        form = BY_DOMAIN.get(check)
        if form is None:
            return (), ()
        steps.append((form, -1))
    return tuple(runs), tuple(steps)


_RUN_PLANS, _STEADY_PLAN = _steady_plans()

KEPT_JUDGES: Final = bool(_STEADY_PLAN)
"""Whether ``NodeFacts`` kept of a node with no promise judge it without reading
it: every filter is in ``STEADY_FILTERS`` or ``BY_DOMAIN``. Otherwise they keep the
node itself."""


def run_filters(ctx: PodContext, node: NodeState) -> Verdict:
    """``FILTERS`` on ``node`` (``judge``), the ``NODE_FILTERS`` from ``node_verdicts``;
    the ``GANG_FILTERS`` are left out for a pod whose gang refuses no node, since they
    pass every node then."""
    return judge(ctx, node, node_verdicts(ctx, node), _plan(ctx))


def _plan(ctx: PodContext) -> Plan:
    gang = ctx.gang
    return _PLAN if gang is not None and gang.refuses_nodes else _LONE_PLAN


def promised(ctx: PodContext, node: NodeState) -> bool:
    """Whether ``node`` is promised from a time on (it drains, or a reservation holds
    it): its verdicts read the time, and are kept of the node itself, never by name."""
    return node.drain_after is not None or node.name in ctx.promises


def node_facts(ctx: PodContext, node: NodeState) -> NodeFacts:
    """What to keep by name of ``node``, of the cache's snapshot, for ``ctx``'s shape and
    gang level. Of a node with no promise, its domain and the verdicts of the runs:
    one object for all nodes with these facts, kept in the decision cache by them, so
    that a request reads a few hundred objects, not one per candidate."""
    own = node_verdicts(ctx, node)
    if promised(ctx, node) or not _STEADY_PLAN:
        return NodeFacts(node, own, _plan(ctx))  # a promise's verdict reads the time
    domain = _domain(ctx, node)
    runs = tuple(judge(ctx, node, own, plan) for plan in _RUN_PLANS)
    gang = ctx.gang
    level = None if gang is None else gang.required
    key = FactsKey(ctx.shape, "" if level is None else level.node_label)
    memo = ctx.memo
    found = memo.by_state(key, (domain, runs))
    if found is MISSING:
        found = NodeFacts(domain, runs, _STEADY_PLAN)
        memo.keep_by_state(key, (domain, runs), found)
    return found  # type: ignore[return-value]


def node_verdicts(ctx: PodContext, node: NodeState) -> tuple[Verdict, ...]:
    """The verdicts of ``NODE_FILTERS`` on ``node``, in their order: kept by node object
    and by node state (``memo.gpu_state``) in the decision cache."""
    found = ctx.verdicts.get(node)
    if found is MISSING:
        memo = ctx.memo
        state = gpu_state(memo, node)
        found = memo.by_state(ctx.shape, state)
        if found is MISSING:
            found = tuple(check(ctx, node) for check in NODE_FILTERS)
            memo.keep_by_state(ctx.shape, state, found)
        ctx.verdicts.put(node, found)
    return found  # type: ignore[return-value]


def passes(ctx: PodContext, node: NodeState, checks: tuple[Filter, ...]) -> bool:
    """Whether ``node`` passes every one of ``checks``: the ``NODE_FILTERS`` among them
    from ``node_verdicts``, any other run on its own."""
    own = node_verdicts(ctx, node)
    return all(
        (own[_IN_GROUP[check]] if check in _IN_GROUP else check(ctx, node)) is FIT
        for check in checks
    )


# ---------------------------------------------------------------- words


def _gpus(count: int, kind: str = "") -> str:
    return f"{count} {kind}GPU{'' if count == 1 else 's'}"


def _members(count: int) -> str:
    return f"{count} member{'' if count == 1 else 's'}"


def _unhealthy_note(node: NodeState) -> str:
    bad = [str(gpu.index) for gpu in node.gpus if not gpu.healthy]
    if not bad:
        return ""
    return f" (GPU {','.join(bad)} unhealthy)"
