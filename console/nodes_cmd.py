"""``tessera nodes``: GPUs per product, flavor and topology domain, or one node's GPUs.

Layer: I/O (it awaits the ``Source``). Reads Nodes, Pods and Kueue's objects, lets the PURE
``console.nodes`` count them and renders the report. Must not count or decide anything
itself, nor read the environment or the clock (both arrive from ``__main__``).
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster import labels
from cluster.clock import Clock
from cluster.convert.grammar import format_rfc3339, parse_topology_levels
from cluster.kube import ApiError
from console import render
from console.nodes import (
    Level,
    NodeRow,
    NodesReport,
    node_gpus,
    nodes_report,
    policy_levels,
)
from console.output import ConsoleError, Output, json_text
from console.reserved import ReservedRow, reserved_rows
from console.source import KUEUE_KINDS, Source, build_snapshot
from webhook.policy_build import policy_from_objects

RESERVATION_NAMESPACE = "tessera-system"
"""Where the extender records reservations by default (its ``--reservation-namespace``)."""


async def nodes(
    source: Source,
    clock: Clock,
    *,
    output: str = "table",
    levels: str | None = None,
    node: str | None = None,
    gang_gpus: int = 8,
    by_node: bool = False,
    reservation_namespace: str = RESERVATION_NAMESPACE,
) -> Output:
    objects = await source.objects(("Node", "Pod", *KUEUE_KINDS))
    reserved, reserved_notes = await _reservations(source, reservation_namespace)
    policy = policy_from_objects(o for o in objects if o["kind"] in KUEUE_KINDS)
    try:
        chosen: Sequence[Level] = parse_topology_levels(levels) if levels else policy_levels(policy)
    except ValueError as exc:
        raise ConsoleError(f"--topology-levels: {exc}") from None
    snapshot, problems = build_snapshot(objects, [label for _, label in chosen], clock)
    now = clock.now()
    report = nodes_report(snapshot, policy.flavors, chosen, now, gang_gpus=gang_gpus)
    notes = (*(f"note: {p}" for p in problems), *reserved_notes)
    if node is not None:
        gpus = node_gpus(snapshot, node)
        row = next((r for r in report.nodes if r.name == node), None)
        if gpus is None or row is None:
            raise ConsoleError(f"no GPU node named {node!r}")
        if output == "json":
            return Output(
                json_text({"node": row.to_json(), "gpus": [g.to_json() for g in gpus]}), notes
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
        shown = {**report.to_json(), "reservations": [r.to_json() for r in reserved]}
        return Output(json_text(shown), notes)
    return Output(_nodes_text(report, by_node=by_node) + _reserved_text(reserved), notes)


async def _reservations(
    source: Source, namespace: str
) -> tuple[tuple[ReservedRow, ...], tuple[str, ...]]:
    """The reservations the extender recorded as Leases in ``namespace``; a console role
    that may not list them gets a note, not an error (the rest of the report stands)."""
    try:
        leases = await source.namespaced("Lease", namespace, {labels.RESERVATION: "true"})
    except ApiError as exc:
        if exc.status not in (401, 403, 404):
            raise
        return (), (
            f"note: reservations not shown: cannot list Leases in namespace {namespace} "
            f"(HTTP {exc.status}); the console's Role tessera-console-extender grants it",
        )
    rows, problems = reserved_rows(leases)
    return rows, tuple(f"note: {p}" for p in problems)


def _reserved_text(rows: Sequence[ReservedRow]) -> str:
    if not rows:
        return ""
    return "\n" + render.table(
        ("RESERVED-FOR", "DOMAIN", "FROM", "NODES"),
        [(r.gang, r.domain, r.start or "unknown", ",".join(r.nodes)) for r in rows],
    )


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
