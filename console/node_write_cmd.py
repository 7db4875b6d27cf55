"""``tessera drain``, ``undrain`` and ``gpu-health``: one node's write, and its Event.

Layer: I/O (it awaits the ``Source``). GETs the node, lets a PURE ``console.annotate``
decision make the write, PATCHes it and records the Event; ``console.upgrade_cmd`` sends
its waves' writes through the same two steps. Must not decide what is written, nor read
the environment or the clock (both arrive from ``__main__``).
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.clock import Clock
from cluster.convert.nodes import node_from_json
from cluster.convert.raw import ConversionError
from cluster.kube import JsonObject, KubeError
from cluster.model import NodeState
from console import annotate
from console.output import NAME, ConsoleError, Output, json_text
from console.source import Source


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
    write, event = await node_write(source, clock, name, decide)
    notes: list[str] = []
    if not source.writable and not dry_run:
        notes.append("note: a cluster file is read-only: nothing was written (as --dry-run)")
        dry_run = True
    if not dry_run:
        await send(source, write, event, notes)
    if output == "json":
        return Output(
            json_text({"patch": write.patch, "event": event, "dry_run": dry_run}), tuple(notes)
        )
    suffix = " (dry run)" if dry_run else ""
    return Output(f"{write.describe()}{suffix}\n", tuple(notes))


async def node_write(
    source: Source, clock: Clock, name: str, decide: Callable[[NodeState], annotate.NodeWrite]
) -> tuple[annotate.NodeWrite, JsonObject]:
    """The node's write as ``decide`` makes it from the node as read now, and its Event."""
    if NAME.fullmatch(name) is None:
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


async def send(
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
