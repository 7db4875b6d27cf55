"""``tessera why``: why a job, jobset or pod waits, stage by stage, as an operator reads it.

Layer: I/O (it awaits the ``Source`` and the extender's reasons). Finds the object, its
owners, pods, Workload and Events, lets the PURE ``console.why`` make the report and
renders it. Must not judge anything itself, nor read the environment or the clock (both
arrive from ``__main__``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from cluster import labels
from cluster.clock import Clock
from cluster.convert.grammar import format_rfc3339
from cluster.kube import JsonObject
from console import reasons, render
from console.capacity import flavor_nodes, pod_asks
from console.nodes import policy_levels
from console.output import NAME, ConsoleError, Output, json_text
from console.queues import queues_report, read_workloads, workload_from_json
from console.reasons import DEFAULT_EXTENDER
from console.rquota import job_refusals, read_limits, with_refusals
from console.shortfall import Missing, Nodes, place
from console.source import KUEUE_KINDS, Source, build_snapshot, resource_quotas
from console.why import (
    Quota,
    ReasonsSeen,
    WhyReport,
    WorkloadState,
    controller_of,
    owned_by,
    workload_state,
)
from console.why import report as why_report
from console.why_nodes import with_shortfall
from extender.explain import headline
from webhook.policy_build import policy_from_objects
from webhook.queues import Policy

_KINDS: Final = {
    "job": "Job",
    "jobs": "Job",
    "job.batch": "Job",
    "jobs.batch": "Job",
    "jobset": "JobSet",
    "jobsets": "JobSet",
    "pod": "Pod",
    "pods": "Pod",
}
PODS_ASKED: Final = 64
"""Pods not placed whose reasons the extender is asked for."""


async def _find(source: Source, ref: str, namespace: str) -> JsonObject:
    kind_text, _, name = ref.rpartition("/")
    kinds: tuple[str, ...] = ("Job", "JobSet", "Pod")
    if kind_text:
        kind = _KINDS.get(kind_text.lower())
        if kind is None:
            raise ConsoleError(f"{kind_text!r}: tessera why explains a job, jobset or pod")
        kinds = (kind,)
    if NAME.fullmatch(name) is None or NAME.fullmatch(namespace) is None:
        raise ConsoleError(f"{ref!r} in namespace {namespace!r} is not an object's name")
    for kind in kinds:
        found = await source.get(kind, namespace, name)
        if found is not None:
            found.setdefault("kind", kind)
            return found
    what = " or ".join(k.lower() for k in kinds)
    raise ConsoleError(f"no {what} named {name!r} in namespace {namespace!r}")


async def why(
    source: Source,
    clock: Clock,
    ref: str,
    *,
    namespace: str = "default",
    extender: str = DEFAULT_EXTENDER,
    output: str = "table",
) -> Output:
    target = await _find(source, ref, namespace)
    chain = [target]
    for _ in range(2):  # pod → Job → JobSet
        owner = controller_of(chain[-1])
        if owner is None or owner[0] not in ("Job", "JobSet"):
            break
        found = await source.get(owner[0], namespace, owner[1])
        if found is None:
            break
        found.setdefault("kind", owner[0])
        chain.append(found)
    top = chain[-1]
    kind, name = str(top["kind"]), str(top["metadata"]["name"])
    if kind == "Pod":
        pods = [top]
    else:
        selector = {labels.JOB_NAME if kind == "Job" else labels.JOBSET_NAME: name}
        pods = await source.namespaced("Pod", namespace, selector)
        pods.sort(key=lambda p: str(p.get("metadata", {}).get("name")))
    uids = [str(o.get("metadata", {}).get("uid") or "") for o in chain]
    workloads = [w for w in await source.namespaced("Workload", namespace) if owned_by(w, uids)]
    workload_obj = max(
        workloads, key=lambda w: str(w.get("metadata", {}).get("creationTimestamp")), default=None
    )
    notes: list[str] = []
    state = None
    if workload_obj is not None:
        state = await _workload(source, clock, workload_obj, notes)
    events = await source.namespaced("Event", namespace)
    unplaced = [p for p in pods if not p.get("spec", {}).get("nodeName")]
    keys = [f"{namespace}/{p['metadata']['name']}" for p in unplaced[:PODS_ASKED]]
    fetched = await reasons.fetch(extender, keys, source)
    notes += [f"note: extender: {problem}" for problem in fetched.problems]
    if keys and fetched.asked and not fetched.records:
        notes.append(
            "note: no extender remembers these pods: not filtered lately (kube-scheduler's "
            "in-tree filters refused every node, or the pods wait for quota or a gate)"
        )
    answer = why_report(
        target,
        owners=chain[1:],
        workload=state,
        pods=pods,
        events=events,
        records=fetched.records,
        workload_obj=workload_obj,
    )
    if unplaced:
        answer = with_shortfall(answer, await _shortfall(source, clock, unplaced, workload_obj))
    answer = await _quota_refusals(source, answer, workload_obj, len(pods), notes)
    if output == "json":
        return Output(json_text(answer.to_json()), tuple(notes))
    return Output(_why_text(answer, clock.now()), tuple(notes))


async def _quota_refusals(
    source: Source,
    answer: WhyReport,
    workload_obj: JsonObject | None,
    pods_found: int,
    notes: list[str],
) -> WhyReport:
    """The answer with the namespace's ResourceQuotas that refuse the admitted job's pods
    (``console.rquota``): nothing else says why its pods are missing."""
    if workload_obj is None:
        return answer
    try:
        mine = workload_from_json(workload_obj, Policy())
    except ValueError:
        return answer
    if mine is None or not mine.admitted:
        return answer
    found, unread = await resource_quotas(source, mine.namespace)
    notes += unread
    return with_refusals(answer, job_refusals(read_limits(found), mine, pods_found))


async def _shortfall(
    source: Source, clock: Clock, unplaced: list[JsonObject], workload_obj: JsonObject | None
) -> Missing | None:
    """What the unplaced pods lack in nodes of their flavor (the admitted one, else every
    GPU node), placed on the free GPUs as the extender would place them."""
    objects = await source.objects(("Node", "Pod", *KUEUE_KINDS))
    policy = policy_from_objects(o for o in objects if o["kind"] in KUEUE_KINDS)
    levels = policy_levels(policy)
    snapshot, _ = build_snapshot(objects, [label for _, label in levels], clock)
    pool: Nodes = {name: node for name, node in snapshot.nodes.items() if node.gpus}
    flavor = None
    if workload_obj is not None:
        try:
            mine = workload_from_json(workload_obj, policy)
        except ValueError:
            mine = None
        if mine is not None and mine.admitted:
            flavor = next((f for (f, r) in mine.usage if r == labels.GPU_RESOURCE), None)
    if flavor is not None and policy.flavor(flavor) is not None:
        pool = flavor_nodes(pool, policy.flavor(flavor))
    return place(pool, pod_asks(unplaced, levels)).missing


async def _workload(
    source: Source, clock: Clock, obj: JsonObject, notes: list[str]
) -> WorkloadState:
    """The Workload's state, with its ClusterQueue's quota as ``tessera queues`` counts
    it."""
    objects = await source.objects((*KUEUE_KINDS, "WorkloadPriorityClass", "Workload"))
    policy = policy_from_objects(o for o in objects if o["kind"] != "Workload")
    try:
        mine = workload_from_json(obj, policy)
    except ValueError as exc:
        notes.append(f"note: workload: {exc}")
        mine = None
    quota = None
    if mine is not None:
        workloads, _ = read_workloads(objects, policy)
        board = queues_report(policy, workloads, clock.now())
        row = next((q for q in board.cluster_queues if q.name == mine.cluster_queue), None)
        if row is not None:
            quota = Quota(
                row.name,
                row.cohort,
                row.nominal,
                row.used,
                row.borrowed,
                row.lent,
                row.waits.pending,
            )
    return workload_state(obj, mine.gpus if mine is not None else 0, quota)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _ago(when: datetime | None, now: datetime) -> str:
    return render.NONE if when is None else render.duration((now - when).total_seconds())


def _why_text(found: WhyReport, now: datetime) -> str:
    """The report as an operator reads it: the verdict, then one block per stage."""
    return "".join(
        [
            f"{found.target}: {found.verdict}\n",
            *_webhook_text(found),
            *_kueue_text(found.workload, now),
            *_pods_text(found),
            *(_reasons_text(seen, now) for seen in found.reasons),
            *_events_text(found, now),
        ]
    )


def _webhook_text(found: WhyReport) -> list[str]:
    if not found.marks:
        return ["\nWEBHOOK: no mark of Tessera's webhook on it (not mutated)\n"]
    return [
        f"\nWEBHOOK (what it wrote on {found.target})\n",
        render.table(
            ("KEY", "VALUE", "MEANING"), [(m.key, m.value, m.meaning) for m in found.marks]
        ),
    ]


def _kueue_text(w: WorkloadState | None, now: datetime) -> list[str]:
    if w is None:
        return ["\nKUEUE: no Workload owned by it\n"]
    parts = [
        f"\nKUEUE workload {w.name} (LocalQueue {w.queue or render.NONE} → ClusterQueue "
        f"{w.cluster_queue or render.NONE}), asks {w.gpus} GPUs\n",
        render.table(
            ("CONDITION", "STATUS", "REASON", "FOR", "MESSAGE"),
            [
                (c.type, c.status, c.reason or render.NONE, _ago(c.since, now), c.message)
                for c in w.conditions
            ],
        )
        if w.conditions
        else "no conditions yet\n",
    ]
    if w.checks:
        parts.append(render.table(("ADMISSION-CHECK", "STATE", "MESSAGE"), w.checks))
    q = w.quota
    if q is not None:
        cohort = f" (cohort {q.cohort})" if q.cohort else ""
        parts.append(
            f"ClusterQueue {q.cluster_queue}{cohort}: nominal {q.nominal} GPUs, {q.used} in "
            f"use ({q.borrowed} borrowed), {q.lent} lent; {q.pending} workloads pending\n"
        )
    return parts


def _pods_text(found: WhyReport) -> list[str]:
    if not found.pods:
        return []
    # pods alike (a gang's members) on one row
    alike: dict[tuple[str, str, str, str, str], list[str]] = {}
    for p in found.pods:
        key = (p.phase, p.node or render.NONE, p.scheduled, p.reason, p.message)
        alike.setdefault(key, []).append(p.name)
    return [
        "\nPODS\n",
        render.table(
            ("POD", "PHASE", "NODE", "SCHEDULED", "REASON", "MESSAGE"),
            [
                (", ".join(names), *key[:3], key[3] or render.NONE, key[4] or render.NONE)
                for key, names in alike.items()
            ],
        ),
    ]


def _reasons_text(seen: ReasonsSeen, now: datetime) -> str:
    r = seen.record
    pods = ", ".join(seen.pods[:3]) + (
        f" and {len(seen.pods) - 3} more" if len(seen.pods) > 3 else ""
    )
    parts = [
        f"\nEXTENDER {seen.source}: last /filter of {pods} {_ago(r.at, now)} ago "
        f"(filtered {_times(r.filters)} since {format_rfc3339(r.first_at)})\n{headline(r)}\n"
    ]
    rows = [
        (
            g.nodes,
            "may help" if g.resolvable else "no",
            g.reason,
            ", ".join(g.examples) or render.NONE,
        )
        for g in r.groups
    ]
    if r.other_nodes:
        rows.append((r.other_nodes, "-", f"{r.other_reasons} other reasons", render.NONE))
    if rows:
        parts.append(render.table(("NODES", "PREEMPTION", "REASON", "FOR-EXAMPLE"), rows))
    if r.bind is not None:
        outcome = f"refused: {r.bind.error}" if r.bind.error else "bound"
        parts.append(f"last /bind to {r.bind.node} {_ago(r.bind.at, now)} ago: {outcome}\n")
    return "".join(parts)


def _events_text(found: WhyReport, now: datetime) -> list[str]:
    if not found.events:
        return []
    return [
        "\nEVENTS (newest first)\n",
        render.table(
            ("AGO", "TYPE", "REASON", "OBJECT", "COUNT", "MESSAGE"),
            [
                (_ago(e.at, now), e.type, e.reason, e.about, e.count, e.message)
                for e in found.events
            ],
        ),
    ]
