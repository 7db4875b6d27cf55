"""A Node object → ``NodeState``: its GPUs (islands, health), resources, labels,
topology domains, drain time and taints.

Layer: PURE. No I/O, no clock, no logging, no cache. Must never raise on a malformed
value (only on a Node without a name, ``ConversionError``): what cannot be read is
ignored and said in the node's ``problems``. Decisions a reader might otherwise guess:

* ``tessera.dev/nvlink-islands`` (grammar in ``cluster.convert.grammar``): a GPU the
  annotation does not name is an island of its own (numbered after the listed ones, by
  index): nothing says it shares NVLink with anyone. A malformed value (bad syntax, an
  index the node does not have, an index in two islands) is ignored whole: one island
  of all GPUs, as if absent.
* ``tessera.dev/unhealthy-gpus``: a value that cannot be read marks every GPU of the
  node unhealthy, because it was written to keep work off some GPU and we cannot tell
  which. An index the node does not have is reported and skipped; the rest apply.
* A node's ``nvidia.com/gpu`` that is no count of GPUs (negative, not a number, a
  fraction, more than ``MAX_GPUS_PER_NODE``) means the node offers none.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from cluster import labels as keys
from cluster.convert.grammar import (
    MAX_GPUS_PER_NODE,
    AnnotationError,
    format_indices,
    parse_index_list,
    parse_islands,
    parse_rfc3339,
    positive_int,
)
from cluster.convert.raw import (
    NOT_A_NUMBER,
    NOT_NEGATIVE,
    ConversionError,
    field_list,
    field_map,
    field_text,
    read_nanos,
)
from cluster.echo import echo
from cluster.model import GpuDevice, NodeName, NodeState, Taint
from cluster.quantity import NANO_PER_UNIT, QuantityError, nanos_to, to_nanos

DEFAULT_MAX_PODS: Final = 110
"""The kubelet's default ``--max-pods``, for a node whose status does not say."""

_CPU: Final = "cpu"
_MEMORY: Final = "memory"
_PODS: Final = "pods"


def node_from_json(obj: Mapping[str, Any], levels: Sequence[str] = ()) -> NodeState:
    """A Node object → ``NodeState``; ``levels`` are the node-label keys of the topology.

    The GPUs are ``status.allocatable["nvidia.com/gpu"]`` (``capacity`` when there is no
    allocatable), all free: the cache subtracts what pods hold.
    """
    metadata = field_map(obj, "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError("a Node without metadata.name")
    node_labels = {k: v for k, v in field_map(metadata, "labels").items() if isinstance(v, str)}
    annotations = field_map(metadata, "annotations")
    spec = field_map(obj, "spec")
    status = field_map(obj, "status")
    problems: list[str] = []
    resources = _NodeResources(status, problems)

    gpu_count = _gpu_count(status, problems)

    island_of = _islands(annotations, gpu_count, problems)
    unhealthy = _unhealthy(annotations, gpu_count, problems)
    gpus = tuple(
        GpuDevice(index=i, island=island_of[i], healthy=i not in unhealthy)
        for i in range(gpu_count)
    )

    memory_mib = 0
    memory_text = node_labels.get(keys.GFD_MEMORY)
    if memory_text is not None:
        try:
            memory_mib = positive_int(memory_text)
        except AnnotationError as exc:
            problems.append(f"label {keys.GFD_MEMORY}: {exc}; ignored")

    drain_after = None
    drain_text = field_text(annotations, keys.DRAIN_AFTER, problems, "annotation")
    if drain_text is not None:
        try:
            drain_after = parse_rfc3339(drain_text)
        except AnnotationError as exc:
            problems.append(f"annotation {keys.DRAIN_AFTER}: {exc}; ignored")

    return NodeState(
        name=NodeName(sys.intern(name)),
        gpus=gpus,
        product=node_labels.get(keys.GFD_PRODUCT, ""),
        gpu_memory_mib=memory_mib,
        cpu_milli=nanos_to(resources.nanos(_CPU), 1000),
        memory_bytes=resources.units(_MEMORY, 0),
        max_pods=resources.units(_PODS, DEFAULT_MAX_PODS),
        labels=node_labels,
        domains={level: node_labels[level] for level in levels if level in node_labels},
        drain_after=drain_after,
        unschedulable=spec.get("unschedulable") is True,
        taints=_taints(spec, problems),
        problems=tuple(problems),
    )


def _gpu_count(status: Mapping[str, Any], problems: list[str]) -> int:
    """The node's ``nvidia.com/gpu`` (allocatable, else capacity); 0, with a problem
    saying so, for a value that is no count of GPUs."""
    for field in ("allocatable", "capacity"):
        values = field_map(status, field)
        if keys.GPU_RESOURCE not in values:
            continue
        raw = values[keys.GPU_RESOURCE]
        why = ""
        try:
            nanos = to_nanos(raw)
        except QuantityError:
            why = NOT_A_NUMBER
        else:
            count, fraction = divmod(nanos, NANO_PER_UNIT)
            if nanos < 0:
                why = NOT_NEGATIVE
            elif fraction:
                why = "GPUs are whole"
            elif count > MAX_GPUS_PER_NODE:
                why = f"more than a node can have ({MAX_GPUS_PER_NODE})"
            else:
                return count
        problems.append(
            f"status.{field}[{keys.GPU_RESOURCE!r}] is {echo(raw)}: {why}; the node offers no GPUs"
        )
        return 0
    return 0


class _NodeResources:
    """Allocatable values of a node, falling back to capacity, problems reported once."""

    __slots__ = ("_allocatable", "_capacity", "_problems")

    def __init__(self, status: Mapping[str, Any], problems: list[str]) -> None:
        self._allocatable = field_map(status, "allocatable")
        self._capacity = field_map(status, "capacity")
        self._problems = problems

    def nanos(self, resource: str) -> int:
        for field, values in (("allocatable", self._allocatable), ("capacity", self._capacity)):
            if resource in values:
                where = f"status.{field}[{echo(resource)}]"
                return read_nanos(values[resource], where, self._problems) or 0
        return 0

    def units(self, resource: str, default: int) -> int:
        if resource not in self._allocatable and resource not in self._capacity:
            return default
        return nanos_to(self.nanos(resource), 1)


def _islands(annotations: Mapping[str, Any], gpu_count: int, problems: list[str]) -> list[int]:
    """The island number of each GPU index."""
    default = [0] * gpu_count
    text = field_text(annotations, keys.NVLINK_ISLANDS, problems, "annotation")
    if text is None or not text.strip():
        return default
    try:
        islands = parse_islands(text, gpu_count)
    except AnnotationError as exc:
        problems.append(
            f"annotation {keys.NVLINK_ISLANDS}: {exc}; using one island of all {gpu_count} GPUs"
        )
        return default
    island_of = [-1] * gpu_count
    for number, island in enumerate(islands):
        for index in island:
            island_of[index] = number
    next_island = len(islands)
    for index in range(gpu_count):
        if island_of[index] < 0:
            island_of[index] = next_island
            next_island += 1
    return island_of


def _unhealthy(annotations: Mapping[str, Any], gpu_count: int, problems: list[str]) -> set[int]:
    key = keys.UNHEALTHY_GPUS
    if key not in annotations:
        return set()
    text = annotations[key]
    try:
        if not isinstance(text, str):
            raise AnnotationError(f"{echo(text)} is not a string")
        named = parse_index_list(text)
    except AnnotationError as exc:
        problems.append(f"annotation {key}: {exc}; treating all {gpu_count} GPUs as unhealthy")
        return set(range(gpu_count))
    missing = [i for i in named if i >= gpu_count]
    if missing:
        problems.append(
            f"annotation {key}: GPU {format_indices(missing)} does not exist "
            f"on a node of {gpu_count} GPUs; ignored"
        )
    return {i for i in named if i < gpu_count}


def _taints(spec: Mapping[str, Any], problems: list[str]) -> tuple[Taint, ...]:
    taints: list[Taint] = []
    for number, raw in enumerate(field_list(spec, "taints")):
        key = raw.get("key") if isinstance(raw, Mapping) else None
        effect = raw.get("effect") if isinstance(raw, Mapping) else None
        if not isinstance(raw, Mapping) or not isinstance(key, str) or not isinstance(effect, str):
            problems.append(f"spec.taints[{number}] = {echo(raw)} has no key or effect; ignored")
            continue
        value = raw.get("value")
        taints.append(Taint(key=key, value=value if isinstance(value, str) else "", effect=effect))
    return tuple(taints)
