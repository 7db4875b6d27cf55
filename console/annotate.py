"""``tessera drain``, ``undrain`` and ``gpu-health``: the node annotations the extender
honours, and the Event that tells people why they changed.

Layer: PURE. Values in, patches and Event objects out: no I/O, no clock (``now`` is a
value). Every value written goes back through the very parser the extender reads it
with (``cluster.convert``) before it is offered, and a value that parser would ignore,
or read differently, raises ``WriteError``: the console can never write a drain time or
a GPU list the extender would skip.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from cluster import labels
from cluster.convert.grammar import (
    AnnotationError,
    format_indices,
    format_rfc3339,
    parse_index_list,
    parse_rfc3339,
)
from cluster.model import NodeState

COMPONENT: Final = "tessera-console"
"""Who the Events say wrote the change (``source.component``, ``reportingComponent``)."""
EVENT_NAMESPACE: Final = "default"
"""Where node Events live: Nodes have no namespace, and the kubelet and ``kubectl
describe node`` use ``default``."""

REASON_DRAIN: Final = "TesseraDrain"
REASON_UNDRAIN: Final = "TesseraUndrain"
REASON_GPU_HEALTH: Final = "TesseraGpuHealth"

_RELATIVE: Final = re.compile(r"\+([0-9]+)([smhd])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class WriteError(ValueError):
    """A value the console refuses to write; the message says why and what would do."""


@dataclass(frozen=True, slots=True)
class NodeWrite:
    """One change to a node: the merge patch of its annotations and the Event saying so."""

    node: str
    patch: dict[str, Any]
    reason: str
    message: str
    warning: bool = False

    def describe(self) -> str:
        return f"node/{self.node}: {self.message}"


def drain_time(text: str, now: datetime) -> datetime:
    """``--at``: an RFC 3339 time (``2026-12-01T02:00:00Z``), ``now``, or ``+N`` with a
    unit ``s m h d`` from now (``+2h``). Cut to whole seconds, as written."""
    value = text.strip()
    if value == "now":
        when = now
    elif (match := _RELATIVE.fullmatch(value)) is not None:
        when = now + timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])
    else:
        try:
            when = parse_rfc3339(value)
        except AnnotationError as exc:
            raise WriteError(f"--at: {exc}, or now, or +2h") from None
    return when.replace(microsecond=0)


def drain(node: NodeState, when: datetime, reason: str = "") -> NodeWrite:
    """Set ``tessera.dev/drain-after``: from ``when`` on, only pods whose time limit ends
    before it start on the node."""
    value = format_rfc3339(when)
    try:
        read_back = parse_rfc3339(value)
    except AnnotationError as exc:  # pragma: no cover - format and parse are inverses
        raise WriteError(f"{value}: {exc}") from None
    if read_back != when.replace(microsecond=0):
        raise WriteError(
            f"{value} would be read as {read_back.isoformat()}, not {when.isoformat()}"
        )
    message = f"drain after {value}: only jobs whose time limit ends by then start here"
    return NodeWrite(
        node=node.name,
        patch={"metadata": {"annotations": {labels.DRAIN_AFTER: value}}},
        reason=REASON_DRAIN,
        message=_with_reason(message, reason),
    )


def undrain(node: NodeState, reason: str = "") -> NodeWrite:
    """Remove ``tessera.dev/drain-after``; ``WriteError`` when the node has no window."""
    if node.drain_after is None and not any(labels.DRAIN_AFTER in p for p in node.problems):
        raise WriteError(f"node {node.name} has no {labels.DRAIN_AFTER} to remove")
    return NodeWrite(
        node=node.name,
        patch={"metadata": {"annotations": {labels.DRAIN_AFTER: None}}},
        reason=REASON_UNDRAIN,
        message=_with_reason("maintenance window removed: the node takes any job again", reason),
    )


def gpu_health(node: NodeState, unhealthy: str, reason: str = "") -> NodeWrite:
    """Set ``tessera.dev/unhealthy-gpus`` to ``unhealthy`` (``3,5``, ``0-3``); an empty
    value removes it (every GPU healthy). Every index must be one of the node's GPUs:
    the extender skips one that is not, so writing it would mislead."""
    try:
        indices = parse_index_list(unhealthy)
    except AnnotationError as exc:
        raise WriteError(f"--unhealthy: {exc}") from None
    missing = [i for i in indices if i >= node.gpu_count]
    if missing:
        raise WriteError(
            f"--unhealthy: node {node.name} has {node.gpu_count} GPUs (0-{node.gpu_count - 1}); "
            f"it has no GPU {format_indices(missing)}"
        )
    if not indices:
        return NodeWrite(
            node=node.name,
            patch={"metadata": {"annotations": {labels.UNHEALTHY_GPUS: None}}},
            reason=REASON_GPU_HEALTH,
            message=_with_reason("every GPU marked healthy", reason),
        )
    value = format_indices(indices)
    message = f"GPU {value} marked unhealthy: no new pod is given them"
    return NodeWrite(
        node=node.name,
        patch={"metadata": {"annotations": {labels.UNHEALTHY_GPUS: value}}},
        reason=REASON_GPU_HEALTH,
        message=_with_reason(message, reason),
        warning=True,
    )


def _with_reason(message: str, reason: str) -> str:
    text = reason.strip()
    return f"{message} ({text})" if text else message


def node_event(write: NodeWrite, node_obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The core/v1 Event for ``write`` on the node, as ``kubectl describe node`` shows it."""
    meta = node_obj.get("metadata") if isinstance(node_obj.get("metadata"), Mapping) else {}
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    stamp = format_rfc3339(now)
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "name": write.node}
    if isinstance(uid, str) and uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{write.node}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": involved,
        "reason": write.reason,
        "message": write.message,
        "type": "Warning" if write.warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "action": write.reason,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
