"""One coroutine per ``tessera`` subcommand: read, decide (PURE modules), write, render.

Layer: I/O (it awaits the ``Source``). Each command returns what to print and raises
``ConsoleError`` with a one-line message for anything the user must fix; it never reads
the environment or the clock itself (both arrive from ``__main__``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from cluster import jsonio
from cluster.clock import Clock
from cluster.convert.grammar import format_rfc3339, parse_topology_levels
from cluster.convert.nodes import node_from_json
from cluster.convert.raw import ConversionError
from cluster.kube import KubeError
from cluster.model import NodeState
from console import annotate, render
from console.nodes import (
    Level,
    NodeRow,
    NodesReport,
    node_gpus,
    nodes_report,
    policy_levels,
)
from console.queues import queues_report, read_workloads
from console.sbatch import SbatchError, job_from_script, parse_queue_map, summary
from console.source import KUEUE_KINDS, Source, build_snapshot
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
    event = annotate.node_event(write, obj, clock.now())
    notes: list[str] = []
    if not source.writable and not dry_run:
        notes.append("note: a cluster file is read-only: nothing was written (as --dry-run)")
        dry_run = True
    if not dry_run:
        try:
            await source.patch_node(name, write.patch)
        except KubeError as exc:
            raise ConsoleError(f"node/{name} not changed: {exc}") from None
        try:
            await source.create(f"/api/v1/namespaces/{annotate.EVENT_NAMESPACE}/events", event)
        except KubeError as exc:
            notes.append(f"warning: node/{name} changed, but its Event was not recorded: {exc}")
    if output == "json":
        return Output(
            _json({"patch": write.patch, "event": event, "dry_run": dry_run}), tuple(notes)
        )
    suffix = " (dry run)" if dry_run else ""
    return Output(f"{write.describe()}{suffix}\n", tuple(notes))


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
