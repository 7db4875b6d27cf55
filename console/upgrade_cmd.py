"""``tessera upgrade-plan``: the waves of a rolling upgrade, shown or applied.

Layer: I/O (it awaits the ``Source``). Reads Nodes, Pods and Kueue's objects, lets the PURE
``console.upgrade`` plan the waves, renders the plan, and with ``--apply`` writes each
node's drain-after through ``console.node_write_cmd``. Must not plan anything itself, nor
read the environment or the clock (both arrive from ``__main__``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial

from cluster import labels
from cluster.clock import Clock
from cluster.convert.grammar import format_rfc3339
from cluster.kube import JsonObject
from console import annotate, render
from console.node_write_cmd import node_write, send
from console.output import ConsoleError, Output, json_text
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
from webhook.policy_build import policy_from_objects


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
        return Output(json_text(shown), tuple(notes))
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
            writes.append(await node_write(source, clock, node.name, decide))
    done: list[str] = []
    for write, event in writes:
        try:
            await send(source, write, event, notes)
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
