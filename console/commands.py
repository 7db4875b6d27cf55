"""One coroutine per ``tessera`` subcommand: read, decide (PURE modules), write, render.

Layer: I/O (it awaits the ``Source``). Each command returns what to print and raises
``ConsoleError`` with a one-line message for anything the user must fix; it never reads
the environment or the clock itself (both arrive from ``__main__``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Final

import yaml

from cluster import jsonio, labels
from cluster.clock import Clock
from cluster.convert.grammar import format_rfc3339, parse_topology_levels
from cluster.convert.nodes import node_from_json
from cluster.convert.raw import ConversionError
from cluster.kube import JsonObject, KubeError
from cluster.model import NodeState
from console import annotate, reasons, render
from console.nodes import (
    Level,
    NodeRow,
    NodesReport,
    node_gpus,
    nodes_report,
    policy_levels,
)
from console.queues import queues_report, read_workloads, workload_from_json
from console.reasons import DEFAULT_EXTENDER
from console.sbatch import SbatchError, job_from_script, parse_queue_map, summary
from console.source import KUEUE_KINDS, Source, build_snapshot
from console.upgrade import (
    PlanError,
    UpgradeNode,
    UpgradePlan,
    parse_keep,
    parse_selector,
    parse_window,
    percent,
    plan_upgrade,
    selected,
    upgrade_nodes,
)
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
from extender.explain import headline
from webhook.policy_build import policy_from_objects

_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class ConsoleError(Exception):
    """What the user must fix, in one line."""


@dataclass(frozen=True, slots=True)
class Output:
    """What a command prints: ``text`` on stdout, ``notes`` on stderr."""

    text: str
    notes: tuple[str, ...] = ()


def _json(value: Any) -> str:
    return jsonio.dumps_pretty(value).decode()


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a Job's script) as YAML literal blocks, readable as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def _yaml(value: Any) -> str:
    return yaml.dump(value, Dumper=_BlockDumper, sort_keys=False)


# ---------------------------------------------------------------- tessera nodes


async def nodes(
    source: Source,
    clock: Clock,
    *,
    output: str = "table",
    levels: str | None = None,
    node: str | None = None,
    gang_gpus: int = 8,
    by_node: bool = False,
) -> Output:
    objects = await source.objects(("Node", "Pod", *KUEUE_KINDS))
    policy = policy_from_objects(o for o in objects if o["kind"] in KUEUE_KINDS)
    try:
        chosen: Sequence[Level] = parse_topology_levels(levels) if levels else policy_levels(policy)
    except ValueError as exc:
        raise ConsoleError(f"--topology-levels: {exc}") from None
    snapshot, problems = build_snapshot(objects, [label for _, label in chosen], clock)
    now = clock.now()
    report = nodes_report(snapshot, policy.flavors, chosen, now, gang_gpus=gang_gpus)
    notes = tuple(f"note: {p}" for p in problems)
    if node is not None:
        gpus = node_gpus(snapshot, node)
        row = next((r for r in report.nodes if r.name == node), None)
        if gpus is None or row is None:
            raise ConsoleError(f"no GPU node named {node!r}")
        if output == "json":
            return Output(
                _json({"node": row.to_json(), "gpus": [g.to_json() for g in gpus]}), notes
            )
        head = _node_head(row)
        rows = [
            (
                g.index,
                g.island,
                "ok" if g.healthy else "UNHEALTHY",
                ",".join(g.pods) or None,
                g.milli_used,
            )
            for g in gpus
        ]
        return Output(head + render.table(("GPU", "ISLAND", "HEALTH", "POD", "MILLI"), rows), notes)
    if output == "json":
        return Output(_json(report.to_json()), notes)
    return Output(_nodes_text(report, by_node=by_node), notes)


def _node_head(row: NodeRow) -> str:
    domains = " ".join(f"{k}={v}" for k, v in row.domains)
    lines = [
        f"node {row.name}: {row.product or 'no product label'}, flavor {row.flavor or render.NONE}"
        + (f", {domains}" if domains else ""),
        f"GPUs {row.gpus_total}: {row.gpus_allocated} allocated, {row.gpus_free} free, "
        f"{row.gpus_unhealthy} unhealthy; islands free {row.islands_free}/{row.islands_total}"
        + (", cordoned" if row.cordoned else ""),
    ]
    if row.drain_after is not None:
        lines.append(f"drains after {format_rfc3339(row.drain_after)}")
    return "\n".join(lines) + "\n\n"


def _nodes_text(report: NodesReport, *, by_node: bool) -> str:
    levels = [name.upper() for name in report.levels]
    gang = f"GANG{report.gang_gpus}"
    if by_node:
        headers = (
            "NODE",
            "PRODUCT",
            "FLAVOR",
            *levels,
            "GPUS",
            "ALLOC",
            "FREE",
            "UNHEALTHY",
            "ISLANDS-FREE",
            gang,
            "DRAIN-AFTER",
        )
        rows = [
            (
                r.name,
                r.product or None,
                r.flavor or None,
                *(dict(r.domains).get(level) for level in report.levels),
                r.gpus_total,
                r.gpus_allocated,
                r.gpus_free,
                r.gpus_unhealthy,
                f"{r.islands_free}/{r.islands_total}",
                r.gang_pods,
                r.drain_after,
            )
            for r in report.nodes
        ]
    else:
        headers = (
            "PRODUCT",
            "FLAVOR",
            *levels,
            "NODES",
            "GPUS",
            "ALLOC",
            "FREE",
            "UNHEALTHY",
            "ISLANDS-FREE",
            gang,
            "DRAINING",
        )
        rows = [
            (
                g.product or None,
                g.flavor or None,
                *(dict(g.domains).get(level) for level in report.levels),
                g.nodes,
                g.gpus_total,
                g.gpus_allocated,
                g.gpus_free,
                g.gpus_unhealthy,
                g.islands_free,
                g.largest_gang,
                g.draining,
            )
            for g in report.groups
        ]
    parts = [render.table(headers, rows)]
    totals = report.totals()
    parts.append(
        f"\n{totals['nodes']} nodes, {totals['gpus_total']} GPUs: {totals['gpus_allocated']} "
        f"allocated, {totals['gpus_free']} free, {totals['gpus_unhealthy']} unhealthy; "
        f"{totals['islands_free']} NVLink islands fully free\n"
    )
    gangs = ", ".join(
        f"one {level} {count}" if level != "cluster" else f"whole cluster {count}"
        for level, count in report.largest_gang
    )
    parts.append(f"largest gang of {report.gang_gpus}-GPU pods that could start now: {gangs}\n")
    if report.drains:
        parts.append(
            "\n"
            + render.table(
                ("DRAINING", "DRAIN-AFTER", "IN", "GPUS-ALLOC"),
                [
                    (
                        d.node,
                        d.at,
                        render.duration(d.in_s) if d.in_s > 0 else "now",
                        d.gpus_allocated,
                    )
                    for d in report.drains
                ],
            )
        )
    return "".join(parts)


# ---------------------------------------------------------------- tessera queues


async def queues(source: Source, clock: Clock, *, output: str = "table") -> Output:
    objects = await source.objects((*KUEUE_KINDS, "WorkloadPriorityClass", "Workload"))
    policy = policy_from_objects(o for o in objects if o["kind"] != "Workload")
    workloads, problems = read_workloads(objects, policy)
    report = queues_report(policy, workloads, clock.now(), problems)
    notes = tuple(f"note: {p}" for p in report.problems)
    if output == "json":
        return Output(_json(report.to_json()), notes)
    d = render.duration
    cq = render.table(
        (
            "CLUSTERQUEUE",
            "COHORT",
            "PENDING",
            "ADMITTED",
            "GPUS-PENDING",
            "GPUS-ADMITTED",
            "NOMINAL",
            "BORROWED",
            "LENT",
            "OLDEST-WAIT",
            "P90-WAIT",
        ),
        [
            (
                q.name,
                q.cohort or None,
                q.waits.pending,
                q.waits.admitted,
                q.waits.gpus_pending,
                q.waits.gpus_admitted,
                q.nominal,
                q.borrowed,
                q.lent,
                d(q.waits.oldest_pending_s),
                d(q.waits.p90_wait_s),
            )
            for q in report.cluster_queues
        ],
    )
    lq = render.table(
        (
            "NAMESPACE",
            "LOCALQUEUE",
            "CLUSTERQUEUE",
            "PENDING",
            "ADMITTED",
            "GPUS-PENDING",
            "GPUS-ADMITTED",
            "OLDEST-WAIT",
            "P90-WAIT",
        ),
        [
            (
                q.namespace,
                q.name,
                q.cluster_queue or None,
                q.waits.pending,
                q.waits.admitted,
                q.waits.gpus_pending,
                q.waits.gpus_admitted,
                d(q.waits.oldest_pending_s),
                d(q.waits.p90_wait_s),
            )
            for q in report.local_queues
        ],
    )
    return Output(cq + "\n" + lq, notes)


# ---------------------------------------------------------------- node writes


async def write_node(
    source: Source,
    clock: Clock,
    name: str,
    decide: Callable[[NodeState], annotate.NodeWrite],
    *,
    output: str = "table",
    dry_run: bool = False,
) -> Output:
    """GET the node, let ``decide(NodeState)`` make the write (it raises ``WriteError``
    for a value the extender would ignore), then PATCH it and record the Event."""
    write, event = await _node_write(source, clock, name, decide)
    notes: list[str] = []
    if not source.writable and not dry_run:
        notes.append("note: a cluster file is read-only: nothing was written (as --dry-run)")
        dry_run = True
    if not dry_run:
        await _send(source, write, event, notes)
    if output == "json":
        return Output(
            _json({"patch": write.patch, "event": event, "dry_run": dry_run}), tuple(notes)
        )
    suffix = " (dry run)" if dry_run else ""
    return Output(f"{write.describe()}{suffix}\n", tuple(notes))


async def _node_write(
    source: Source, clock: Clock, name: str, decide: Callable[[NodeState], annotate.NodeWrite]
) -> tuple[annotate.NodeWrite, JsonObject]:
    """The node's write as ``decide`` makes it from the node as read now, and its Event."""
    if _NAME.fullmatch(name) is None:
        raise ConsoleError(f"{name!r} is not a node name")
    obj = await source.node(name)
    if obj is None:
        raise ConsoleError(f"no node named {name!r}")
    try:
        state = node_from_json(obj)
        write = decide(state)
    except (ConversionError, annotate.WriteError, ValueError) as exc:
        raise ConsoleError(str(exc)) from None
    return write, annotate.node_event(write, obj, clock.now())


async def _send(
    source: Source, write: annotate.NodeWrite, event: JsonObject, notes: list[str]
) -> None:
    """PATCH the node, then record the Event (a failure of the Event alone is a note)."""
    try:
        await source.patch_node(write.node, write.patch)
    except KubeError as exc:
        raise ConsoleError(f"node/{write.node} not changed: {exc}") from None
    try:
        await source.create(f"/api/v1/namespaces/{annotate.EVENT_NAMESPACE}/events", event)
    except KubeError as exc:
        notes.append(f"warning: node/{write.node} changed, but its Event was not recorded: {exc}")


# ---------------------------------------------------------------- tessera sbatch


async def sbatch(
    source: Source | None,
    script: str,
    script_name: str,
    *,
    namespace: str,
    image: str | None,
    queue_map: str = "",
    output: str = "table",
    dry_run: bool = False,
) -> Output:
    """Translate the script; create the Job unless ``dry_run`` (``source`` None: only a
    dry run is possible)."""
    if not image:
        raise ConsoleError("--image is needed: a Slurm script names no container image")
    try:
        job = job_from_script(
            script,
            script_name=script_name,
            namespace=namespace,
            image=image,
            queue_map=parse_queue_map(queue_map),
        )
    except (SbatchError, ValueError) as exc:
        raise ConsoleError(f"{script_name}: {exc}") from None
    notes: list[str] = []
    if source is not None and not source.writable and not dry_run:
        notes.append("note: a cluster file is read-only: the Job was not created (as --dry-run)")
        dry_run = True
    if not dry_run:
        assert source is not None
        try:
            job = await source.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
        except KubeError as exc:
            raise ConsoleError(
                f"job {namespace}/{job['metadata']['name']} not created: {exc}"
            ) from None
    if output == "json":
        return Output(_json(job), tuple(notes))
    if output == "yaml":
        return Output(_yaml(job), tuple(notes))
    verb = "would be created (dry run)" if dry_run else "created"
    lines = [f"job.batch/{job['metadata']['name']} {verb}", *(f"  {s}" for s in summary(job))]
    return Output("\n".join(lines) + "\n", tuple(notes))


# ---------------------------------------------------------------- tessera why

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
    if _NAME.fullmatch(name) is None or _NAME.fullmatch(namespace) is None:
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
    if output == "json":
        return Output(_json(answer.to_json()), tuple(notes))
    return Output(_why_text(answer, clock.now()), tuple(notes))


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


# ---------------------------------------------------------------- tessera upgrade-plan


async def upgrade_plan(
    source: Source,
    clock: Clock,
    *,
    selector: str,
    window: str,
    keep: str,
    not_before: str | None = None,
    reason: str = "",
    apply: bool = False,
    output: str = "table",
) -> Output:
    """Plan the waves of an upgrade of the nodes ``selector`` picks (``console.upgrade``);
    with ``apply``, set each node's drain-after to its wave's start, wave by wave."""
    now = clock.now()
    try:
        terms = parse_selector(selector)
        span, share = parse_window(window), parse_keep(keep)
        earliest = annotate.drain_time(not_before, now) if not_before else None
    except (PlanError, annotate.WriteError) as exc:
        raise ConsoleError(str(exc).replace("--at", "--not-before")) from None
    objects = await source.objects(("Node", "Pod", *KUEUE_KINDS))
    policy = policy_from_objects(o for o in objects if o["kind"] in KUEUE_KINDS)
    snapshot, problems = build_snapshot(objects, (), clock)
    nodes = upgrade_nodes(
        snapshot, (o for o in objects if o["kind"] == "Pod"), policy.flavors.values(), now
    )
    matching = {n.name for n in snapshot.nodes.values() if selected(n.labels, terms)}
    try:
        plan = plan_upgrade(nodes, matching, now=now, window=span, keep=share, not_before=earliest)
    except PlanError as exc:
        raise ConsoleError(f"{exc} (--selector {selector})") from None
    notes = [f"note: {p}" for p in problems]
    gpu_nodes = {n.name for n in nodes}
    notes += [f"note: {name} has no GPUs: left out" for name in sorted(matching - gpu_nodes)]
    notes += [f"note: {note}" for note in plan.notes]
    writes: list[tuple[annotate.NodeWrite, JsonObject]] = []
    applied = False
    if apply and not source.writable:
        notes.append("note: a cluster file is read-only: nothing was written (as without --apply)")
    elif apply:
        writes = await _apply_plan(source, clock, plan, reason, notes)
        applied = True
    if output == "json":
        shown = {
            "selector": selector,
            **plan.to_json(),
            "applied": applied,
            "writes": [{"patch": w.patch, "event": e} for w, e in writes],
        }
        return Output(_json(shown), tuple(notes))
    return Output(_plan_text(plan, selector, writes, applied=applied), tuple(notes))


async def _apply_plan(
    source: Source, clock: Clock, plan: UpgradePlan, reason: str, notes: list[str]
) -> list[tuple[annotate.NodeWrite, JsonObject]]:
    """Every node's write is made (and checked) before the first is sent, then they are
    sent wave by wave; a failure stops the rest and says what was written."""
    writes = []
    for wave in plan.waves:
        why = f"upgrade wave {wave.number} of {len(plan.waves)}" + (
            f": {reason.strip()}" if reason.strip() else ""
        )
        decide = partial(annotate.drain, when=wave.start, reason=why)
        for node in wave.nodes:
            writes.append(await _node_write(source, clock, node.name, decide))
    done: list[str] = []
    for write, event in writes:
        try:
            await _send(source, write, event, notes)
        except ConsoleError as exc:
            written = ", ".join(done) if done else "none"
            raise ConsoleError(f"{exc}; drain-after was written on: {written}") from None
        done.append(write.node)
    return writes


def _plan_text(
    plan: UpgradePlan,
    selector: str,
    writes: Sequence[tuple[annotate.NodeWrite, JsonObject]],
    *,
    applied: bool,
) -> str:
    done = plan.done
    ending = (
        f"done by {format_rfc3339(done)}"
        if done is not None
        else "the last wave waits for jobs without a time limit"
    )
    parts = [
        f"upgrade plan for {selector}: {len(plan.nodes)} nodes in {len(plan.waves)} waves of "
        f"{render.duration(plan.window.total_seconds())}, each keeping at least "
        f"{percent(plan.keep)} of every pool's GPUs schedulable; {ending}\n\n",
        render.table(
            ("WAVE", "START", "IN", "NODES", "GPUS-OUT", "KEPT"),
            [
                (
                    w.number,
                    w.start,
                    _in(w.start, plan.now) + ("" if w.start_known else " *"),
                    ", ".join(n.name for n in w.nodes),
                    w.gpus_out,
                    ", ".join(
                        f"{k.pool} {percent(k.share)} ({k.gpus_kept}/{k.gpus_total})"
                        for k in w.kept
                    ),
                )
                for w in plan.waves
            ],
        ),
    ]
    if not all(w.start_known for w in plan.waves):
        parts.append("* not before then, and only once the jobs without a time limit end\n")
    parts.append("\n")
    parts.append(
        render.table(
            ("NODE", "POOLS", "GPUS", "GPU-PODS", "JOBS-END", "WAVE", "DRAIN-AFTER-NOW"),
            [
                (
                    n.name,
                    ", ".join(n.pools),
                    n.gpus,
                    len(n.pods),
                    _jobs_end(n, plan.now),
                    plan.wave_of(n.name).number,
                    n.drain_after,
                )
                for n in plan.nodes
            ],
        )
    )
    if applied:
        parts.append("\n" + "".join(f"{w.describe()}\n" for w, _ in writes))
    else:
        parts.append(
            "\nnothing written: --apply sets each node's "
            f"{labels.DRAIN_AFTER} to its wave's start, with an Event\n"
        )
    return "".join(parts)


def _jobs_end(node: UpgradeNode, now: datetime) -> str:
    if node.free_at is None:
        return "unknown"
    if not node.pods:
        return "idle"
    return format_rfc3339(node.free_at) if node.free_at > now else "now"


def _in(when: datetime, now: datetime) -> str:
    ahead = (when - now).total_seconds()
    return render.duration(ahead) if ahead >= 1 else "now"
