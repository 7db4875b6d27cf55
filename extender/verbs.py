"""One function per extender verb: request bytes and a snapshot in, an answer out.

Layer: PURE glue between ``wire`` (bytes ⇄ records) and ``decide`` (the decisions). No
I/O, no clock (``now`` is passed in), no cache (a ``Snapshot`` is all it reads; the
``wire.RecentPods`` it may be handed only saves decoding a pod again), no aiohttp. The
HTTP shell takes a snapshot, calls one of these with no ``await`` in between, and
writes the ``Reply``. ``memo`` is the decision cache of the config in use, passed on
to ``decide`` (None: decide afresh).

Status codes: a body that is not the verb's request is HTTP 400 with the reason (as
``{"Error": …}`` for a person with curl; kube-scheduler reads only the status). Anything
else is HTTP 200: a logical failure of filter or bind goes in ``Error``; prioritize has
no ``Error`` field and kube-scheduler ignores a failing prioritize anyway, so it answers
0 for every node; preempt's answer has no ``Error`` either, and an empty map means "no
node helps".

Bind is split because its middle is I/O: ``plan_bind`` decides the GPUs (or answers at
once), the shell assumes them in the cache, posts the Binding (which carries
``tessera.dev/gpu-indices`` onto the pod), and answers with ``bind_reply``.

A stale cache (``stale_cache``: a watch not heard from for longer than the limit) decides
nothing: filter and bind answer ``Error``, so kube-scheduler fails the attempt and
retries the pod after its backoff; prioritize and preempt have no ``Error`` field and
answer HTTP 503, which kube-scheduler takes as no scores from the extender (it scores
with its own plugins) and as a failed preemption (retried, rather than evict victims
chosen on an old view of who holds which GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from cluster import jsonio
from cluster.model import NodeName, PodInfo, PodKey
from cluster.snapshot import Snapshot
from extender import decide, preemption, wire
from extender.config import ExtenderConfig
from extender.memo import DecisionCache

OK = 200
BAD_REQUEST = 400
UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer; ``outcome`` and ``note`` are for the shell's metrics and logs."""

    status: int
    body: bytes
    outcome: decide.FilterOutcome | None = None
    note: str = ""
    pod: PodInfo | None = None
    """The pod ``/filter`` judged (with ``outcome``), for the reasons the shell keeps."""
    target: tuple[PodKey, str] | None = None
    """The pod and node of a ``/bind`` refused before anything was assumed."""


def _bad(reason: str) -> Reply:
    return Reply(BAD_REQUEST, wire.encode_bad_request(reason), note=reason)


def stale_cache(ages: Mapping[str, float], limit_s: float) -> str:
    """Why the cache is too old to decide with: each watch (by resource) whose
    kube-apiserver was last heard more than ``limit_s`` seconds ago. ``""``: every one
    was heard within it, or ``limit_s`` is 0 (no limit)."""
    if not limit_s:
        return ""
    old = [
        f"the {resource} watch last heard from kube-apiserver {age:.0f} s ago"
        for resource, age in ages.items()
        if age > limit_s
    ]
    if not old:
        return ""
    return (
        f"the extender's cache is stale: {' and '.join(old)} "
        f"(more than --max-cache-age {limit_s:g} s); retry once it has caught up"
    )


def stale_reply(verb: str, reason: str) -> Reply:
    """The answer of ``verb`` when the cache is stale (``stale_cache``)."""
    if verb == "filter":
        return Reply(OK, wire.encode_filter_error(reason), note=reason)
    if verb == "bind":
        return bind_reply(reason)
    return Reply(UNAVAILABLE, wire.encode_bad_request(reason), note=reason)


_NO_CANDIDATES = "the request names no nodes: Nodes and NodeNames are both null"
_TOO_DEEP = (
    f"a node in Nodes is nested more than {jsonio.WRITE_DEPTH_LIMIT} levels deep: "
    "the answer, which repeats the fitting nodes, cannot hold it"
)


def handle_filter(
    body: bytes,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    *,
    recent: wire.RecentPods | None = None,
    memo: DecisionCache | None = None,
) -> Reply:
    """``POST /filter``: the candidates the pod fits, in the request's spelling; only
    the one it should go to when the config chooses in filter (``decide.choose``).

    ``recent`` keeps the decoded pod, for the ``/prioritize`` and ``/bind`` that follow.
    """
    try:
        args = wire.decode_extender_args(body, recent, snapshot.pods)
    except wire.BadRequest as exc:
        return _bad(str(exc))
    if args.node_names is not None:
        outcome = decide.filter_nodes(snapshot, args.pod, args.node_names, config, now, memo=memo)
    elif args.nodes is not None:
        given = decide.request_nodes(snapshot, args.nodes.items, config)
        snapshot = given.snapshot
        outcome = decide.filter_nodes(
            snapshot,
            args.pod,
            given.names,
            config,
            now,
            unresolvable=given.unresolvable,
            memo=memo,
        )
    else:
        return Reply(OK, wire.encode_filter_error(_NO_CANDIDATES), note=_NO_CANDIDATES)
    outcome = decide.choose(snapshot, args.pod, outcome, config, now, memo=memo)
    try:
        answer = wire.encode_filter(args, outcome)
    except jsonio.JsonEncodeError:
        # the answer repeats the fitting Nodes as received: one can be read, not written
        return _bad(_TOO_DEEP)
    return Reply(OK, answer, outcome=outcome, pod=args.pod)


def handle_prioritize(
    body: bytes,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    *,
    recent: wire.RecentPods | None = None,
    memo: DecisionCache | None = None,
) -> Reply:
    """``POST /prioritize``: a score 0..10 per candidate, in the request's order."""
    try:
        args = wire.decode_extender_args(body, recent, snapshot.pods)
    except wire.BadRequest as exc:
        return _bad(str(exc))
    if args.node_names is not None:
        hosts: Sequence[str] = args.node_names
        scores = decide.prioritize(snapshot, args.pod, hosts, config, now, memo=memo)
    elif args.nodes is not None:
        given = decide.request_nodes(snapshot, args.nodes.items, config)
        scored = decide.score_nodes(given.snapshot, args.pod, given.names, config, now, memo=memo)
        by_name: dict[str, float | None] = dict(zip(given.names, scored, strict=True))
        # every node of the request gets a score, the unusable ones 0, in its order
        hosts = [name for name in map(_item_name, args.nodes.items) if name is not None]
        scores = decide.wire_scores([by_name.get(n) for n in hosts], config)
    else:
        return Reply(OK, wire.encode_priorities((), ()), note=_NO_CANDIDATES)
    return Reply(OK, wire.encode_priorities(hosts, scores))


def _item_name(item: Mapping[str, object]) -> NodeName | None:
    metadata = item.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return NodeName(name) if isinstance(name, str) and name else None


@dataclass(frozen=True, slots=True)
class BindStep:
    """A bind to carry out: the binding asked for, and the GPUs it takes."""

    args: wire.BindingArgs
    plan: decide.BindPlan


def plan_bind(
    body: bytes,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    *,
    seen: Mapping[str, PodInfo] | None = None,
    memo: DecisionCache | None = None,
) -> BindStep | Reply:
    """``POST /bind``, the deciding half: the GPUs to assume, or the answer right away.

    ``seen`` maps pod UIDs to pods from recent ``/filter`` requests, for a pod the watch
    has not shown yet (kube-scheduler binds a few milliseconds after it filters).
    """
    try:
        args = wire.decode_binding_args(body)
    except wire.BadRequest as exc:
        return _bad(str(exc))
    pod: PodKey | PodInfo = args.key
    if args.key not in snapshot.pods and seen is not None:
        recent = seen.get(args.pod_uid)
        if recent is not None and recent.key == args.key:
            pod = recent
    plan = decide.plan_bind(snapshot, pod, args.node, config, now, uid=args.pod_uid, memo=memo)
    if isinstance(plan, decide.BindRefusal):
        return Reply(
            OK,
            wire.encode_binding_result(plan.reason),
            note=plan.reason,
            target=(args.key, args.node),
        )
    return BindStep(args, plan)


def bind_reply(error: str = "") -> Reply:
    """``POST /bind``, the answer once the shell has bound the pod (or failed to)."""
    return Reply(OK, wire.encode_binding_result(error), note=error)


def handle_preempt(
    body: bytes,
    snapshot: Snapshot,
    config: ExtenderConfig,
    now: datetime,
    *,
    recent: wire.RecentPods | None = None,
    memo: DecisionCache | None = None,
) -> Reply:
    """``POST /preempt``: the proposed nodes where eviction really helps, fewest victims."""
    try:
        args = wire.decode_preemption_args(body, recent, snapshot.pods)
    except wire.BadRequest as exc:
        return _bad(str(exc))
    chosen = preemption.preempt(snapshot, args.pod, args.proposals, config, now, memo=memo)
    return Reply(OK, wire.encode_preemption_result(chosen))
