"""Where a pending pod may go: its ``nodeSelector``, required node affinity and
tolerations → ``NodeSelection``, and whether it states preferences besides.

Layer: PURE. No I/O, no clock, no logging, no cache. Must never narrow what it cannot
read: an unreadable term or item is left out with a problem noted, so the extender
counts more nodes as possible for the pod, never fewer, and kube-scheduler still
filters them. Must not match nodes (``cluster.model`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from cluster.convert.raw import field_list, field_map
from cluster.echo import echo
from cluster.model import NodeRequirement, NodeSelection, Toleration

_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def node_selection(spec: Mapping[str, Any], problems: list[str]) -> NodeSelection:
    """A pod spec's ``nodeSelector``, required node affinity and tolerations. What cannot
    be read is left out with a problem noted: the extender then counts more nodes as
    possible for the pod, never fewer, and kube-scheduler still filters them."""
    required = tuple(
        NodeRequirement(key, "In", (value,))
        for key, value in sorted(field_map(spec, "nodeSelector").items())
        if isinstance(key, str) and isinstance(value, str)
    )
    affinity = field_map(field_map(spec, "affinity"), "nodeAffinity")
    chosen = field_map(affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[tuple[NodeRequirement, ...], ...] | None = None
    raw_terms = field_list(chosen, "nodeSelectorTerms")
    if raw_terms:
        read = [_term(term, problems) for term in raw_terms]
        terms = None if any(term is None for term in read) else tuple(filter(None, read))
    tolerations = tuple(
        Toleration(
            key=str(raw.get("key") or ""),
            operator=str(raw.get("operator") or "Equal"),
            value=str(raw.get("value") or ""),
            effect=str(raw.get("effect") or ""),
        )
        for raw in field_list(spec, "tolerations")
        if isinstance(raw, Mapping)
    )
    return NodeSelection(required, terms, tolerations, prefers=_prefers(spec, affinity))


def _prefers(spec: Mapping[str, Any], node_affinity: Mapping[str, Any]) -> bool:
    """Whether the spec states a preference kube-scheduler weighs when it scores nodes:
    a preferred node affinity, preferred pod affinity or anti-affinity, or a topology
    spread constraint that only prefers (``ScheduleAnyway``; ``DoNotSchedule`` ones are
    filters, applied before the extender is asked). Read loosely: anything there that
    is not plainly empty counts, so that no preference is dropped unread."""
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    if node_affinity.get(preferred):
        return True
    affinity = field_map(spec, "affinity")
    if any(field_map(affinity, kind).get(preferred) for kind in ("podAffinity", "podAntiAffinity")):
        return True
    return any(
        not isinstance(raw, Mapping) or raw.get("whenUnsatisfiable") == "ScheduleAnyway"
        for raw in field_list(spec, "topologySpreadConstraints")
    )


def _term(term: Any, problems: list[str]) -> tuple[NodeRequirement, ...] | None:
    """One ``nodeSelectorTerm``; None when it or an item cannot be read (the whole
    affinity is then left to kube-scheduler)."""
    if not isinstance(term, Mapping):
        problems.append(f"node selector term {echo(term)} cannot be read; ignored")
        return None
    items: list[NodeRequirement] = []
    for part, is_field in (("matchExpressions", False), ("matchFields", True)):
        for raw in field_list(term, part):
            key = raw.get("key") if isinstance(raw, Mapping) else None
            operator = raw.get("operator") if isinstance(raw, Mapping) else None
            values = raw.get("values") if isinstance(raw, Mapping) else None
            if (
                not isinstance(key, str)
                or operator not in _OPERATORS
                or not isinstance(values, list | None)
            ):
                problems.append(f"node affinity item {echo(raw)} cannot be read; ignored")
                return None
            items.append(
                NodeRequirement(key, operator, tuple(str(v) for v in values or ()), is_field)
            )
    return tuple(items)
