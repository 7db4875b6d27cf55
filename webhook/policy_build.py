"""Kueue's objects, read one by one (``webhook.kueue_objects``), tied into a
``webhook.queues.Policy``: the policy builder.

Layer: PURE. Records to a ``Policy``: no I/O, no clock, no settings, no aiohttp; must
not read raw objects itself (``webhook.kueue_objects`` does) nor decide anything about a
workload (that is ``webhook.rules``'). Must never raise on a malformed policy: what
cannot be resolved is kept in ``Policy.problems`` for the caller to log.

What it ties together: each LocalQueue's settings over its ClusterQueue's (a default
time limit above the maximum becomes the maximum); references that name nothing (a
ClusterQueue, a ResourceFlavor, a Topology, a priority class) are reported; each
cohort's lendable quota is summed once into what each of its queues may borrow; each
namespace's default queue (marked ``tessera.dev/default-queue: "true"``, or failing
that named ``default``); and the flavors a queue steers each kind of GPU request to.
When two objects have the same kind and name, the later one wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final

from cluster import labels
from webhook.kueue_objects import ParsedObject, parse_objects
from webhook.namespace_quota import NamespaceQuota, QuotaLimit
from webhook.queues import (
    DEFAULT_QUEUE_NAME,
    GPU_RESOURCES,
    ClusterQueue,
    Flavor,
    Limit,
    LocalQueue,
    Policy,
    PriorityClass,
    Steering,
    Topology,
    format_seconds,
    offer_of,
)


def policy_from_objects(objs: Iterable[Mapping[str, Any]]) -> Policy:
    """Read Kueue objects into a ``Policy``; anything malformed is skipped and reported.

    Objects of other API groups are ignored silently (a file may hold namespaces too),
    but for core ``v1`` ResourceQuotas.
    When two objects have the same kind and name, the later one wins.
    """
    return assemble_policy(parse_objects(objs))


def assemble_policy(parsed: Iterable[ParsedObject]) -> Policy:
    """The policy of objects read by ``webhook.kueue_objects``: references resolved, quota
    summed.

    When two objects have the same kind and name, the later one wins.
    """
    problems: list[str] = []
    flavors: dict[str, Flavor] = {}
    raw_cqs: dict[str, ClusterQueue] = {}
    raw_lqs: dict[tuple[str, str], LocalQueue] = {}
    topologies: dict[str, Topology] = {}
    priorities: dict[str, PriorityClass] = {}
    quotas: dict[tuple[str, str], NamespaceQuota] = {}

    for entry in parsed:
        problems.extend(entry.problems)
        record = entry.record
        if isinstance(record, LocalQueue):
            _put(raw_lqs, (record.namespace, record.name), record, "LocalQueue", problems)
        elif isinstance(record, ClusterQueue):
            _put(raw_cqs, record.name, record, "ClusterQueue", problems)
        elif isinstance(record, Flavor):
            _put(flavors, record.name, record, "ResourceFlavor", problems)
        elif isinstance(record, Topology):
            _put(topologies, record.name, record, "Topology", problems)
        elif isinstance(record, PriorityClass):
            _put(priorities, record.name, record, "WorkloadPriorityClass", problems)
        elif isinstance(record, NamespaceQuota):
            _put(quotas, (record.namespace, record.name), record, "ResourceQuota", problems)

    local_queues = _resolve_local_queues(raw_lqs, raw_cqs, priorities, problems)
    _check_references(raw_cqs, flavors, topologies, priorities, problems)
    limits = _limits(raw_cqs)
    return Policy(
        flavors=MappingProxyType(flavors),
        cluster_queues=MappingProxyType(raw_cqs),
        local_queues=MappingProxyType(local_queues),
        queue_names=MappingProxyType(_names_by_namespace(local_queues)),
        default_queues=MappingProxyType(_default_queues(local_queues, problems)),
        topologies=MappingProxyType(topologies),
        priority_classes=MappingProxyType(priorities),
        limits=MappingProxyType(limits),
        offers=MappingProxyType(_offers(raw_cqs, flavors, limits)),
        namespace_quotas=MappingProxyType(_by_namespace(quotas.values())),
        problems=tuple(problems),
    )


def _put(into: dict[Any, Any], key: Any, value: Any, kind: str, problems: list[str]) -> None:
    if key in into:
        problems.append(f"{kind} {key}: defined twice; the later definition wins")
    into[key] = value


def _resolve_local_queues(
    raw: Mapping[tuple[str, str], LocalQueue],
    cluster_queues: Mapping[str, ClusterQueue],
    priorities: Mapping[str, PriorityClass],
    problems: list[str],
) -> dict[tuple[str, str], LocalQueue]:
    resolved: dict[tuple[str, str], LocalQueue] = {}
    for key, lq in raw.items():
        cq = cluster_queues.get(lq.cluster_queue)
        settings = lq.settings
        if cq is None:
            problems.append(
                f"LocalQueue {lq.namespace}/{lq.name}: ClusterQueue {lq.cluster_queue} "
                "does not exist"
            )
        else:
            settings = settings.over(cq.settings)
        default, limit = settings.default_time_limit_s, settings.max_time_limit_s
        if default is not None and limit is not None and default > limit:
            problems.append(
                f"LocalQueue {lq.namespace}/{lq.name}: default time limit "
                f"{format_seconds(default)} is above the maximum "
                f"{format_seconds(limit)}; the maximum is used as the default"
            )
            settings = replace(settings, default_time_limit_s=limit)
        klass = settings.default_priority_class
        if klass is not None and klass not in priorities:
            problems.append(
                f"LocalQueue {lq.namespace}/{lq.name}: default priority class {klass} "
                "does not exist"
            )
        resolved[key] = (
            lq
            if settings == lq.settings
            else LocalQueue(lq.namespace, lq.name, lq.cluster_queue, settings, lq.marked_default)
        )
    return resolved


def _check_references(
    cluster_queues: Mapping[str, ClusterQueue],
    flavors: Mapping[str, Flavor],
    topologies: Mapping[str, Topology],
    priorities: Mapping[str, PriorityClass],
    problems: list[str],
) -> None:
    for cq in cluster_queues.values():
        for name in cq.flavors:
            if name not in flavors:
                problems.append(f"ClusterQueue {cq.name}: ResourceFlavor {name} does not exist")
        klass = cq.settings.default_priority_class
        if klass is not None and klass not in priorities:
            problems.append(
                f"ClusterQueue {cq.name}: default priority class {klass} does not exist"
            )
    for flavor in flavors.values():
        if flavor.topology_name is not None and flavor.topology_name not in topologies:
            problems.append(
                f"ResourceFlavor {flavor.name}: Topology {flavor.topology_name} does not exist"
            )


def _by_namespace(quotas: Iterable[NamespaceQuota]) -> dict[str, tuple[QuotaLimit, ...]]:
    grouped: dict[str, list[QuotaLimit]] = {}
    for quota in sorted(quotas, key=lambda q: (q.namespace, q.name)):
        if quota.limits:
            grouped.setdefault(quota.namespace, []).extend(quota.limits)
    return {namespace: tuple(limits) for namespace, limits in grouped.items()}


def _names_by_namespace(
    local_queues: Mapping[tuple[str, str], LocalQueue],
) -> dict[str, tuple[str, ...]]:
    grouped: dict[str, list[str]] = {}
    for namespace, name in local_queues:
        grouped.setdefault(namespace, []).append(name)
    return {namespace: tuple(sorted(names)) for namespace, names in grouped.items()}


def _default_queues(
    local_queues: Mapping[tuple[str, str], LocalQueue], problems: list[str]
) -> dict[str, LocalQueue]:
    marked: dict[str, list[LocalQueue]] = {}
    named: dict[str, LocalQueue] = {}
    for lq in local_queues.values():
        if lq.marked_default:
            marked.setdefault(lq.namespace, []).append(lq)
        if lq.name == DEFAULT_QUEUE_NAME:
            named[lq.namespace] = lq
    defaults = dict(named)
    for namespace, queues in marked.items():
        queues.sort(key=lambda q: q.name)
        if len(queues) > 1:
            problems.append(
                f"namespace {namespace}: LocalQueues {', '.join(q.name for q in queues)} are "
                f"all marked {labels.DEFAULT_QUEUE}; {queues[0].name} is used"
            )
        defaults[namespace] = queues[0]
    return defaults


def _limits(cluster_queues: Mapping[str, ClusterQueue]) -> dict[tuple[str, str, str], Limit]:
    # Sum each cohort's lendable quota once; a queue's share of it is the sum minus its own.
    pooled: dict[tuple[str, str, str], int] = {}
    for cq in cluster_queues.values():
        if cq.cohort is None:
            continue
        for (flavor, resource), quota in cq.quotas.items():
            key = (cq.cohort, flavor, resource)
            pooled[key] = pooled.get(key, 0) + quota.lendable
    limits: dict[tuple[str, str, str], Limit] = {}
    for cq in cluster_queues.values():
        for (flavor, resource), quota in cq.quotas.items():
            lendable = 0
            if cq.cohort is not None:
                lendable = pooled[(cq.cohort, flavor, resource)] - quota.lendable
            borrowable = (
                lendable if quota.borrowing_limit is None else min(quota.borrowing_limit, lendable)
            )
            limits[(cq.name, flavor, resource)] = Limit(
                nominal=quota.nominal,
                borrowable=borrowable,
                borrowing_limit=quota.borrowing_limit,
                cohort_lendable=lendable,
            )
    return limits


_RESOURCE_SETS: Final = ((), *((r,) for r in GPU_RESOURCES), GPU_RESOURCES)
"""What a GPU workload can ask for: whole GPUs, shares, or both (and, for completeness,
neither)."""


def _offers(
    cluster_queues: Mapping[str, ClusterQueue],
    flavors: Mapping[str, Flavor],
    limits: Mapping[tuple[str, str, str], Limit],
) -> dict[tuple[str, tuple[str, ...]], Steering]:
    made: dict[tuple[str, ...], Steering] = {}  # queues with the same flavors share one
    return {
        (cq.name, resources): offer_of(cq, resources, flavors, limits, made)
        for cq in cluster_queues.values()
        for resources in _RESOURCE_SETS
    }
