"""Kueue's own objects, each read on its own into a record of ``webhook.queues``: the
first half of building a ``Policy`` (``webhook.policy_build`` ties the records together).

Layer: PURE. Raw Kueue objects (dicts, as a watch or a ``kubectl apply -f`` file gives
them) to frozen records: no I/O, no clock, no settings, no aiohttp. Must not look at
more than one object at a time (references between objects, quota sums and defaults
are ``webhook.policy_build``'s) and must not decide anything about a workload (that is
``webhook.rules``'). Must never raise on a malformed object: it gives no record, and
the reason is kept in its ``problems``.

Objects read (API group ``kueue.x-k8s.io``, any version; ``v1beta2`` is current):

* ``ResourceFlavor``: ``spec.nodeLabels``, ``spec.nodeTaints``, ``spec.tolerations``,
  ``spec.topologyName`` (Kueue places by that Topology itself), or instead the annotation
  ``tessera.dev/topology-name`` (Tessera places by it, and Kueue's topology-aware
  scheduling stays off).
* ``ClusterQueue``: ``spec.cohortName`` (``spec.cohort`` in v1beta1),
  ``spec.resourceGroups[].coveredResources`` and ``.flavors[].resources[]`` with
  ``nominalQuota``, ``borrowingLimit``, ``lendingLimit``.
* ``LocalQueue``: ``spec.clusterQueue``.
* ``Topology``: ``spec.levels[].nodeLabel``, from the top level down.
* ``WorkloadPriorityClass``: ``value``.
* ``ResourceQuota`` (core ``v1``): ``spec.hard`` on whole GPUs and pods, and whether it
  has scopes (``webhook.namespace_quota``); a namespace's quota still applies after
  Kueue admits a job.
* A ``List`` of any of these (what ``kubectl get -o yaml`` prints) is read item by item.

What Kueue has no field for comes from ``tessera.dev/*`` annotations, read on the
LocalQueue first and, field by field, on its ClusterQueue when the LocalQueue has none:
``default-priority-class``, ``default-time-limit`` and ``max-time-limit`` (seconds as a
plain integer, or a Go duration such as ``4h``, ``90m``, ``1h30m``),
``max-gpus-per-job`` (a whole number). A LocalQueue annotated
``tessera.dev/default-queue: "true"`` (or, failing that, one named ``default``) is its
namespace's queue for GPU workloads that name none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeGuard

from cluster import labels
from cluster.model import Taint
from cluster.quantity import QuantityError, to_milli
from webhook.namespace_quota import NamespaceQuota, namespace_quota
from webhook.queues import (
    KUEUE_GROUP,
    ClusterQueue,
    Flavor,
    LocalQueue,
    PolicyError,
    PriorityClass,
    QueueSettings,
    Quota,
    Topology,
    make_topology,
    parse_seconds,
    parse_toleration,
)

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


Record = Flavor | ClusterQueue | LocalQueue | Topology | PriorityClass | NamespaceQuota


@dataclass(frozen=True, slots=True)
class ParsedObject:
    """One Kueue object read on its own, before the policy ties the objects together.

    Reading is the costly part of a build (quantities, durations, annotations): a store
    that keeps these per object rebuilds a policy after one object changed by reading
    that object alone and assembling the rest as they were.
    """

    record: Record | None
    """``None``: skipped (``problems`` say why), or not an object the policy reads."""
    problems: tuple[str, ...] = ()


POLICY_ANNOTATIONS: Final = (
    labels.DEFAULT_PRIORITY_CLASS,
    labels.DEFAULT_TIME_LIMIT,
    labels.MAX_TIME_LIMIT,
    labels.MAX_GPUS_PER_JOB,
    labels.DEFAULT_QUEUE,
    labels.FLAVOR_TOPOLOGY,
)
"""The annotations of Kueue objects that the policy reads."""
_VIEW_FIELDS: Final = ("apiVersion", "kind", "spec", "value", "description")


def policy_view(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a Kueue object that the policy reads: same policy, far less to keep.

    Kept: ``apiVersion``, ``kind``, ``spec``, ``value`` and ``description`` (a
    WorkloadPriorityClass), and of ``metadata`` the name, the namespace and the
    ``POLICY_ANNOTATIONS``. Dropped: ``status`` (which Kueue rewrites whenever workloads
    move), ``managedFields``, ``resourceVersion``, labels and every other annotation, so
    that an update of only those gives an equal view. Anything that is not a single
    object (a ``List``, a document that is not a map) is returned as it is.
    """
    if not isinstance(obj, Mapping) or str(obj.get("kind", "")).endswith("List"):
        return obj
    view = {key: obj[key] for key in _VIEW_FIELDS if key in obj}
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        meta = {key: metadata[key] for key in ("name", "namespace") if key in metadata}
        annotations = metadata.get("annotations")
        if isinstance(annotations, Mapping):
            kept = {key: annotations[key] for key in POLICY_ANNOTATIONS if key in annotations}
            if kept:
                meta["annotations"] = kept
        view["metadata"] = meta
    return view


def parse_objects(objs: Iterable[object]) -> Iterator[ParsedObject]:
    """Each Kueue object read on its own (``List`` items one by one), in order.

    Objects of other API groups give nothing (but core ``v1`` ResourceQuotas); a document
    that cannot be read gives an entry with no record and the reason.
    """
    skipped: list[str] = []
    for obj in _flatten(objs, skipped):
        if skipped:
            yield ParsedObject(None, tuple(skipped))
            skipped.clear()
        yield parse_object(obj)
    if skipped:
        yield ParsedObject(None, tuple(skipped))


def parse_object(obj: Mapping[str, Any]) -> ParsedObject:
    """One Kueue object (not a ``List``) as a record; malformed: no record, and why."""
    problems: list[str] = []
    kind = obj.get("kind")
    name = _name_of(obj)
    record: Record | None = None
    try:
        if kind == "ResourceFlavor":
            record = _parse_flavor(obj, name)
        elif kind == "ClusterQueue":
            record = _parse_cluster_queue(obj, name, problems)
        elif kind == "LocalQueue":
            record = _parse_local_queue(obj, name, problems)
        elif kind == "Topology":
            record, found = make_topology(name, _parse_levels(obj, name))
            problems.extend(found)
        elif kind == "WorkloadPriorityClass":
            record = _parse_priority_class(obj, name)
        elif kind == "ResourceQuota":
            record = namespace_quota(obj)
        elif kind == "Cohort":
            problems.append(
                f"Cohort {name}: Cohort objects are not read; quota they hold is not "
                "counted in what a queue can borrow"
            )
    except PolicyError as exc:
        problems.append(f"{kind} {name or '<unnamed>'} skipped: {exc}")
    return ParsedObject(record, tuple(problems))


def _flatten(objs: Iterable[object], problems: list[str]) -> Iterator[Mapping[str, Any]]:
    for obj in objs:
        if obj is None:
            continue  # an empty YAML document
        if not isinstance(obj, Mapping):
            problems.append(f"skipped a document that is not an object: {str(obj)[:80]!r}")
            continue
        if str(obj.get("kind", "")).endswith("List"):
            items = obj.get("items")
            if isinstance(items, list):
                yield from _flatten(items, problems)
            else:
                problems.append(f"skipped a {obj.get('kind')} without an items list")
            continue
        api_version = obj.get("apiVersion")
        kueue = isinstance(api_version, str) and api_version.startswith(KUEUE_GROUP + "/")
        if kueue or (api_version == "v1" and obj.get("kind") == "ResourceQuota"):
            yield obj


def _is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    # orjson and YAML give dicts: the exact type check spares the slower ABC check
    return type(value) is dict or isinstance(value, Mapping)


def _name_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if _is_map(metadata) else None
    return name if isinstance(name, str) else ""


def _require_name(name: str) -> None:
    if not name:
        raise PolicyError("metadata.name is missing")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if spec is None:
        return _EMPTY
    if not _is_map(spec):
        raise PolicyError("spec is not an object")
    return spec


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if _is_map(metadata) else None
    return annotations if _is_map(annotations) else _EMPTY


def _list(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PolicyError(f"{what} is not a list")
    return value


def _quantity(value: object, what: str) -> int:
    if not isinstance(value, str | int | float):
        raise PolicyError(f"{what} {value!r} is not a quantity")
    try:
        return to_milli(value)
    except QuantityError as exc:
        raise PolicyError(f"{what}: {exc}") from None


def _parse_flavor(obj: Mapping[str, Any], name: str) -> Flavor:
    _require_name(name)
    spec = _spec(obj)
    node_labels = spec.get("nodeLabels") or {}
    if not isinstance(node_labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in node_labels.items()
    ):
        raise PolicyError("spec.nodeLabels is not a map of strings")
    taints = []
    for raw in _list(spec.get("nodeTaints"), "spec.nodeTaints"):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
            raise PolicyError(f"spec.nodeTaints: {raw!r} is not a taint with a key")
        effect = _str(raw.get("effect"))
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise PolicyError(f"spec.nodeTaints: effect {effect!r} is not a taint effect")
        taints.append(Taint(key=raw["key"], value=_str(raw.get("value")), effect=effect))
    tolerations = tuple(
        parse_toleration(raw) for raw in _list(spec.get("tolerations"), "spec.tolerations")
    )
    kueue_topology = spec.get("topologyName")
    if isinstance(kueue_topology, str) and kueue_topology:
        topology: str | None = kueue_topology
    else:
        own = _annotations(obj).get(labels.FLAVOR_TOPOLOGY)
        topology = own if isinstance(own, str) and own else None
    return Flavor(
        name=name,
        node_labels=MappingProxyType(dict(node_labels)),
        node_taints=tuple(taints),
        tolerations=tolerations,
        topology_name=topology,
        kueue_topology=topology is not None and topology == kueue_topology,
    )


def _parse_cluster_queue(obj: Mapping[str, Any], name: str, problems: list[str]) -> ClusterQueue:
    _require_name(name)
    spec = _spec(obj)
    cohort = spec.get("cohortName") or spec.get("cohort")  # v1beta2 | v1beta1
    if cohort is not None and not isinstance(cohort, str):
        raise PolicyError("spec.cohortName is not a string")
    flavors: list[str] = []
    covered: dict[str, list[str]] = {}
    quotas: dict[tuple[str, str], Quota] = {}
    for g, group in enumerate(_list(spec.get("resourceGroups"), "spec.resourceGroups")):
        where = f"spec.resourceGroups[{g}]"
        if not isinstance(group, Mapping):
            raise PolicyError(f"{where} is not an object")
        group_flavors: list[str] = []
        group_resources = list(_list(group.get("coveredResources"), f"{where}.coveredResources"))
        for f, flavor in enumerate(_list(group.get("flavors"), f"{where}.flavors")):
            at = f"{where}.flavors[{f}]"
            if not isinstance(flavor, Mapping) or not isinstance(flavor.get("name"), str):
                raise PolicyError(f"{at} has no name")
            flavor_name = flavor["name"]
            group_flavors.append(flavor_name)
            for r, resource in enumerate(_list(flavor.get("resources"), f"{at}.resources")):
                rat = f"{at}.resources[{r}]"
                if not isinstance(resource, Mapping) or not isinstance(resource.get("name"), str):
                    raise PolicyError(f"{rat} has no name")
                quotas[(flavor_name, resource["name"])] = _parse_quota(resource, rat)
                if resource["name"] not in group_resources:
                    group_resources.append(resource["name"])
        for resource_name in group_resources:
            if not isinstance(resource_name, str):
                raise PolicyError(f"{where}.coveredResources holds a non-string")
            covered.setdefault(resource_name, []).extend(group_flavors)
        flavors.extend(f for f in group_flavors if f not in flavors)
    return ClusterQueue(
        name=name,
        cohort=cohort or None,
        flavors=tuple(flavors),
        covered=MappingProxyType({r: tuple(fs) for r, fs in covered.items()}),
        quotas=MappingProxyType(quotas),
        settings=_parse_settings(obj, f"ClusterQueue {name}", problems),
    )


def _parse_quota(resource: Mapping[str, Any], where: str) -> Quota:
    nominal = resource.get("nominalQuota")
    if nominal is None:
        raise PolicyError(f"{where}.nominalQuota is missing")
    borrowing = resource.get("borrowingLimit")
    lending = resource.get("lendingLimit")
    return Quota(
        nominal=_quantity(nominal, f"{where}.nominalQuota"),
        borrowing_limit=None
        if borrowing is None
        else _quantity(borrowing, f"{where}.borrowingLimit"),
        lending_limit=None if lending is None else _quantity(lending, f"{where}.lendingLimit"),
    )


def _parse_settings(obj: Mapping[str, Any], who: str, problems: list[str]) -> QueueSettings:
    """The ``tessera.dev/*`` annotations; a bad value is reported and treated as unset."""
    annotations = _annotations(obj)
    values: dict[str, Any] = {}

    def read(key: str, attribute: str, parse: Any) -> None:
        raw = annotations.get(key)
        if raw is None:
            return
        try:
            values[attribute] = parse(raw)
        except (PolicyError, ValueError) as exc:
            problems.append(f"{who}: annotation {key}={raw!r} ignored: {exc}")

    read(labels.DEFAULT_PRIORITY_CLASS, "default_priority_class", _nonempty)
    read(labels.DEFAULT_TIME_LIMIT, "default_time_limit_s", parse_seconds)
    read(labels.MAX_TIME_LIMIT, "max_time_limit_s", parse_seconds)
    read(labels.MAX_GPUS_PER_JOB, "max_gpus_per_job", _positive_int)
    return QueueSettings(**values)


def _nonempty(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise PolicyError("expected a name")
    return raw.strip()


def _positive_int(raw: object) -> int:
    text = raw.strip() if isinstance(raw, str) else ""
    if not text.isdigit() or int(text) < 1:
        raise PolicyError("expected a whole number of 1 or more")
    return int(text)


def _parse_local_queue(obj: Mapping[str, Any], name: str, problems: list[str]) -> LocalQueue:
    _require_name(name)
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if _is_map(metadata) else None
    if not isinstance(namespace, str) or not namespace:
        raise PolicyError("metadata.namespace is missing")
    cluster_queue = _spec(obj).get("clusterQueue")
    if not isinstance(cluster_queue, str) or not cluster_queue:
        raise PolicyError("spec.clusterQueue is missing")
    marked = str(_annotations(obj).get(labels.DEFAULT_QUEUE, "")).strip().lower() == "true"
    return LocalQueue(
        namespace=namespace,
        name=name,
        cluster_queue=cluster_queue,
        settings=_parse_settings(obj, f"LocalQueue {namespace}/{name}", problems),
        marked_default=marked,
    )


def _parse_levels(obj: Mapping[str, Any], name: str) -> list[str]:
    _require_name(name)
    levels = []
    for i, level in enumerate(_list(_spec(obj).get("levels"), "spec.levels")):
        label = level.get("nodeLabel") if isinstance(level, Mapping) else None
        if not isinstance(label, str) or not label:
            raise PolicyError(f"spec.levels[{i}].nodeLabel is missing")
        if label in levels:
            raise PolicyError(f"spec.levels: {label} appears twice")
        levels.append(label)
    if not levels:
        raise PolicyError("spec.levels is empty")
    return levels


def _parse_priority_class(obj: Mapping[str, Any], name: str) -> PriorityClass:
    _require_name(name)
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise PolicyError(f"value {value!r} is not an integer")
    return PriorityClass(name=name, value=value)
