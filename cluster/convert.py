"""Raw Kubernetes JSON (dicts as orjson returns them) → the records of ``cluster.model``.

Layer: PURE. Functions from dicts to frozen dataclasses: no I/O, no clock, no logging,
no pydantic, no cache. Must never raise on a malformed annotation or resource value:
the field is ignored, a line naming the key and the value goes into ``problems``, and
the caller (the cache) logs it once. Only an object that cannot be a node or pod at all
(no ``metadata.name``) raises ``ConversionError``.

Decisions a reader might otherwise have to guess, all visible in ``problems``:

* ``tessera.dev/nvlink-islands``: islands are numbered 0, 1, … in the order listed.
  ``0-3,4-7`` lists one island per comma-separated item (an index or a range); with a
  ``;`` in the value, islands are ``;``-separated index lists (``0,2,4,6;1,3,5,7``;
  a trailing ``;`` is allowed, so that ``0,2;`` can name one island).
  A GPU the annotation does not name is an island of its own (numbered after the
  listed ones, by index): nothing says it shares NVLink with anyone. A malformed value
  (bad syntax, an index the node does not have, an index in two islands) is ignored
  whole: one island of all GPUs, as if absent.
* ``tessera.dev/unhealthy-gpus``: a value that cannot be read marks every GPU of the
  node unhealthy, because it was written to keep work off some GPU and we cannot tell
  which. An index the node does not have is reported and skipped; the rest apply.
* ``tessera.dev/gpu-milli`` of 1000 or more, or together with ``nvidia.com/gpu``: the
  share is counted as whole GPUs (``ceil(milli / 1000)`` more), so that a pod someone
  else bound is never under-counted; the webhook rejects such pods with ``pod_demand``.
* A GPU request that is no count of GPUs (``nvidia.com/gpu`` or ``tessera.dev/gpu-milli``
  negative, not a number, a fraction of a unit, or more than a node can have) is not
  read as no GPUs, which every node would fit: it is a ``refusal`` (``DemandReading``,
  ``PodInfo``), and the extender places the pod nowhere, saying which request and why.
* A node's ``nvidia.com/gpu`` that is no count of GPUs (negative, not a number, a
  fraction, more than ``MAX_GPUS_PER_NODE``) means the node offers none.
* A gang label without a readable ``tessera.dev/gang-size`` is no gang (the pod is
  scheduled alone); a bad ``tessera.dev/gang-min`` means all members.
* ``tessera.dev/gpu-indices`` that does not name exactly as many GPUs as the pod asks
  for (one for a share) is ignored: the cache then picks GPUs so accounting stays whole.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from cluster import labels as keys
from cluster.echo import echo
from cluster.model import (
    MILLI_PER_GPU,
    UNCONSTRAINED,
    GangId,
    GangSpec,
    GpuDevice,
    NodeName,
    NodeRequirement,
    NodeSelection,
    NodeState,
    PodDemand,
    PodInfo,
    PodPhase,
    Taint,
    Toleration,
    TopologyConstraint,
    TopologyMode,
    pod_key,
)
from cluster.quantity import NANO_PER_UNIT, QuantityError, nanos_to, to_nanos

MAX_GPUS_PER_NODE: Final = 1024
"""GPU indices run below this; a node claiming more is misreported, not a big node."""

DEFAULT_MAX_PODS: Final = 110
"""The kubelet's default ``--max-pods``, for a node whose status does not say."""

_CPU: Final = "cpu"
_MEMORY: Final = "memory"
_PODS: Final = "pods"
_DEMAND_RESOURCES: Final = (_CPU, _MEMORY, keys.GPU_RESOURCE, keys.GPU_MILLI_RESOURCE)
_GPU_WHOLE: Final = {
    keys.GPU_RESOURCE: f"GPUs are whole; ask for {keys.GPU_MILLI_RESOURCE} for a share of one",
    keys.GPU_MILLI_RESOURCE: "a share is a whole number of thousandths of a GPU",
}
"""Why a fraction of each GPU resource's unit cannot be asked for."""
_NOT_NEGATIVE: Final = "a count cannot be negative"
_NOT_A_NUMBER: Final = "not a number of GPUs"
_POD_LEVEL_RESOURCES: Final = (_CPU, _MEMORY)
"""Resources that ``spec.resources`` (pod-level resources) may set for the whole pod."""

_DIGITS: Final = re.compile(r"[0-9]+")
_INDEX_ITEM: Final = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_RFC3339: Final = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.(?P<frac>[0-9]+))?(?P<zone>[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_NO_SPACE: Final = re.compile(r"\S+")
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


class ConversionError(ValueError):
    """The object cannot be a node or a pod at all (it has no ``metadata.name``)."""


class AnnotationError(ValueError):
    """An annotation value that does not follow its grammar; the message says why."""


class DemandError(ValueError):
    """A pod (template) whose resources or scheduling annotations are not usable.

    ``problems`` holds one human-readable line per fault, ready for a rejection message.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class DemandReading:
    """A pod's demand, read leniently, with what had to be ignored or assumed.

    ``refusals``: GPU requests that are no count of GPUs, each naming the request and
    why. The demand leaves them out (or rounds them up), but the pod must not be placed
    as if it asked for that; all but a count over ``MAX_GPUS_PER_NODE`` are also among
    the ``problems``, whose wording the webhook's rejections keep.
    """

    demand: PodDemand
    problems: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()


def _refuse(resource: str, detail: str) -> str:
    return f"the pod's {resource} request is unusable: {detail}"


# ---------------------------------------------------------------- annotation grammars


def parse_index_list(value: str) -> tuple[int, ...]:
    """GPU indices such as ``0,1,2,3``, ``0-3`` or ``1,5-7``, in ascending order.

    Items are single indices or inclusive ranges ``a-b`` (a ≤ b), separated by commas,
    with optional spaces around them. An empty value names no GPU. An index named twice
    or not below ``MAX_GPUS_PER_NODE`` is an error.
    """
    text = value.strip()
    if not text:
        return ()
    seen: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        for index in _index_item(item, value):
            if index in seen:
                raise AnnotationError(f"GPU {index} is named twice in {echo(value)}")
            seen.add(index)
    return tuple(sorted(seen))


def _index_item(item: str, value: str) -> range:
    match = _INDEX_ITEM.fullmatch(item)
    if match is None:
        what = "an empty item" if not item else echo(item)
        raise AnnotationError(
            f"{what} in {echo(value)} is not a GPU index or a range of them (like 0-3)"
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise AnnotationError(f"range {echo(item)} in {echo(value)} runs backwards")
    if last >= MAX_GPUS_PER_NODE:
        raise AnnotationError(f"GPU index {last} in {echo(value)} is not below {MAX_GPUS_PER_NODE}")
    return range(first, last + 1)


def parse_islands(value: str, gpu_count: int | None = None) -> tuple[tuple[int, ...], ...]:
    """NVLink islands, in the order listed, each a tuple of GPU indices in ascending order.

    ``0-3,4-7``: one island per comma-separated item. ``0,2,4,6;1,3,5,7``: with a ``;``
    in the value, one island per ``;``-separated index list, and a trailing ``;`` is
    allowed (``0,2;`` is one island of GPUs 0 and 2). Every island must name at least
    one GPU, no GPU may be in two islands, and with ``gpu_count`` every index must be
    below it.
    """
    text = value.strip()
    if not text:
        raise AnnotationError("names no island")
    if ";" in text:
        parts = text.split(";")
        if not parts[-1].strip():
            parts.pop()
        islands = [parse_index_list(part) for part in parts]
        if any(not island for island in islands):
            raise AnnotationError(f"an island in {echo(value)} names no GPU")
    else:
        islands = [tuple(_index_item(item.strip(), value)) for item in text.split(",")]
    owner: dict[int, int] = {}
    for number, island in enumerate(islands):
        for index in island:
            if index in owner:
                raise AnnotationError(
                    f"GPU {index} is in islands {owner[index]} and {number} of {echo(value)}"
                )
            if gpu_count is not None and index >= gpu_count:
                raise AnnotationError(
                    f"GPU {index} in {echo(value)} does not exist on a node of {gpu_count} GPUs"
                )
            owner[index] = number
    return tuple(islands)


def format_indices(indices: Iterable[int], *, ranges: bool = False) -> str:
    """``0,1,2,3`` (or ``0-3`` with ``ranges``): ascending, each index once.

    The inverse of ``parse_index_list``; ``tessera.dev/gpu-indices`` is written without
    ranges, as DESIGN.md shows it.
    """
    ordered = sorted(set(indices))
    if ordered and ordered[0] < 0:
        raise ValueError(f"GPU indices are not negative: {ordered[0]}")
    if not ranges:
        return ",".join(map(str, ordered))
    parts: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def format_islands(islands: Iterable[Iterable[int]]) -> str:
    """The ``tessera.dev/nvlink-islands`` value for these islands, the inverse of
    ``parse_islands``: ``0-3,4-7`` when every island is one run of indices, else the
    ``;`` form (``0,2;1,3``; ``0,2;`` for a single such island)."""
    parts = [format_indices(island, ranges=True) for island in islands]
    if all("," not in part for part in parts):
        return ",".join(parts)
    return ";".join(parts) + (";" if len(parts) == 1 else "")


def parse_topology(value: str) -> TopologyConstraint:
    """``required:<level>`` or ``preferred:<level>`` (spaces around the value ignored)."""
    mode_text, sep, level = value.strip().partition(":")
    try:
        mode = TopologyMode(mode_text)
    except ValueError:
        mode = None
    if not sep or mode is None or _NO_SPACE.fullmatch(level) is None:
        raise AnnotationError(
            f"{echo(value)} is not required:<level> or preferred:<level> "
            "(a topology level such as a rack or block node label)"
        )
    return TopologyConstraint(mode=mode, level=level)


def parse_topology_levels(text: str) -> tuple[tuple[str, str], ...]:
    """``block=example.com/block,rack=example.com/rack`` → ((name, node label), ...), widest
    level first: the extender's ``--topology-levels`` format, read the same way wherever
    it is taken; ``ValueError`` naming the bad item. Empty text gives no levels."""
    levels: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, label = (s.strip() for s in item.partition("="))
        if not sep or not name or not label:
            raise ValueError(f"topology level {item!r} is not <name>=<node label>")
        levels.append((name, label))
    return tuple(levels)


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 timestamp (``2026-12-01T02:00:00Z``) as a timezone-aware datetime.

    Fractions of a second beyond microseconds are dropped (Go writes up to nanoseconds).
    """
    match = _RFC3339.fullmatch(value.strip())
    if match is None:
        raise AnnotationError(f"{echo(value)} is not an RFC 3339 time like 2026-12-01T02:00:00Z")
    frac = f".{match['frac'][:6]}" if match["frac"] else ""
    zone = "+00:00" if match["zone"] in ("Z", "z") else match["zone"]
    try:
        return datetime.fromisoformat(f"{match['date']}T{match['time']}{frac}{zone}")
    except ValueError as exc:
        raise AnnotationError(f"{echo(value)} is not a valid time: {exc}") from None


def format_rfc3339(when: datetime) -> str:
    """The ``tessera.dev/drain-after`` value for ``when``: UTC, whole seconds, ``Z``
    (``2026-12-01T02:00:00Z``), the inverse of ``parse_rfc3339``. A naive time is no
    time at all (which zone?) and raises ``ValueError``; fractions of a second are cut,
    which moves a drain earlier, never later."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{when.isoformat()} has no time zone")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _positive_int(value: str) -> int:
    text = value.strip()
    if _DIGITS.fullmatch(text) is None or int(text) < 1:
        raise AnnotationError(f"{echo(value)} is not a positive whole number")
    return int(text)


# ---------------------------------------------------------------- small readers


def _mapping(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    # orjson gives dicts, and absent keys are common: both spare an ABC check
    if type(value) is dict:
        return value
    if value is not None and isinstance(value, Mapping):
        return value
    return _EMPTY


def _sequence(obj: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = obj.get(key)
    return value if isinstance(value, list | tuple) else ()


def _text(values: Mapping[str, Any], key: str, problems: list[str], what: str) -> str | None:
    """A label or annotation value; a non-string one (YAML ``4`` unquoted) is a problem."""
    value = values.get(key)
    if value is None or isinstance(value, str):
        return value
    problems.append(f"{what} {key}={echo(value)} is not a string; ignored")
    return None


def _nanos(value: Any, what: str, problems: list[str]) -> int | None:
    """A quantity in nano-units, or None (and a problem) when unusable."""
    try:
        amount = to_nanos(value)
    except QuantityError as exc:
        problems.append(f"{what}: {exc}; ignored")
        return None
    if amount < 0:
        problems.append(f"{what} is negative ({echo(value)}); ignored")
        return None
    return amount


# ---------------------------------------------------------------- nodes


def node_from_json(obj: Mapping[str, Any], levels: Sequence[str] = ()) -> NodeState:
    """A Node object → ``NodeState``; ``levels`` are the node-label keys of the topology.

    The GPUs are ``status.allocatable["nvidia.com/gpu"]`` (``capacity`` when there is no
    allocatable), all free: the cache subtracts what pods hold.
    """
    metadata = _mapping(obj, "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError("a Node without metadata.name")
    node_labels = {k: v for k, v in _mapping(metadata, "labels").items() if isinstance(v, str)}
    annotations = _mapping(metadata, "annotations")
    spec = _mapping(obj, "spec")
    status = _mapping(obj, "status")
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
            memory_mib = _positive_int(memory_text)
        except AnnotationError as exc:
            problems.append(f"label {keys.GFD_MEMORY}: {exc}; ignored")

    drain_after = None
    drain_text = _text(annotations, keys.DRAIN_AFTER, problems, "annotation")
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
        values = _mapping(status, field)
        if keys.GPU_RESOURCE not in values:
            continue
        raw = values[keys.GPU_RESOURCE]
        why = ""
        try:
            nanos = to_nanos(raw)
        except QuantityError:
            why = _NOT_A_NUMBER
        else:
            count, fraction = divmod(nanos, NANO_PER_UNIT)
            if nanos < 0:
                why = _NOT_NEGATIVE
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
        self._allocatable = _mapping(status, "allocatable")
        self._capacity = _mapping(status, "capacity")
        self._problems = problems

    def nanos(self, resource: str) -> int:
        for field, values in (("allocatable", self._allocatable), ("capacity", self._capacity)):
            if resource in values:
                where = f"status.{field}[{echo(resource)}]"
                return _nanos(values[resource], where, self._problems) or 0
        return 0

    def units(self, resource: str, default: int) -> int:
        if resource not in self._allocatable and resource not in self._capacity:
            return default
        return nanos_to(self.nanos(resource), 1)


def _islands(annotations: Mapping[str, Any], gpu_count: int, problems: list[str]) -> list[int]:
    """The island number of each GPU index."""
    default = [0] * gpu_count
    text = _text(annotations, keys.NVLINK_ISLANDS, problems, "annotation")
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
    for number, raw in enumerate(_sequence(spec, "taints")):
        key = raw.get("key") if isinstance(raw, Mapping) else None
        effect = raw.get("effect") if isinstance(raw, Mapping) else None
        if not isinstance(raw, Mapping) or not isinstance(key, str) or not isinstance(effect, str):
            problems.append(f"spec.taints[{number}] = {echo(raw)} has no key or effect; ignored")
            continue
        value = raw.get("value")
        taints.append(Taint(key=key, value=value if isinstance(value, str) else "", effect=effect))
    return tuple(taints)


# ---------------------------------------------------------------- pods


def pod_demand(
    spec: Mapping[str, Any], annotations: Mapping[str, Any], labels: Mapping[str, Any]
) -> PodDemand:
    """What a pod (or a pod template) asks for; ``DemandError`` lists every fault.

    Strict: for the webhook, which must reject what cannot run and say why. The cache
    uses ``read_demand``, which never raises.
    """
    reading = read_demand(spec, annotations, labels)
    if reading.problems:
        raise DemandError(reading.problems)
    return reading.demand


def read_demand(
    spec: Mapping[str, Any], annotations: Mapping[str, Any], labels: Mapping[str, Any]
) -> DemandReading:
    """What a pod (or pod template) asks for, as Kubernetes counts it, never raising.

    Per resource: the sum over app containers and sidecars (init containers with
    ``restartPolicy: Always``), or, if larger, what any init container needs while it
    runs (itself plus the sidecars started before it) — KEP-753's rule, as
    kube-scheduler applies it. ``spec.resources`` (pod-level) replaces the CPU and
    memory sums; ``spec.overhead`` is added. A container's request defaults to its
    limit, per resource, as the API server defaults it.
    """
    problems: list[str] = []
    refusals: list[str] = []
    totals = _pod_requests(spec, problems, refusals)

    whole = _whole(totals[keys.GPU_RESOURCE], keys.GPU_RESOURCE, problems)
    milli = _whole(totals[keys.GPU_MILLI_RESOURCE], keys.GPU_MILLI_RESOURCE, problems)
    if whole > MAX_GPUS_PER_NODE:
        refusals.append(
            _refuse(
                keys.GPU_RESOURCE,
                f"the pod asks for {whole} GPUs, more than a node can have ({MAX_GPUS_PER_NODE})",
            )
        )
    if milli > MAX_GPUS_PER_NODE * MILLI_PER_GPU:
        refusals.append(
            _refuse(
                keys.GPU_MILLI_RESOURCE,
                f"the pod asks for {milli} thousandths of a GPU, more than a node can have "
                f"({MAX_GPUS_PER_NODE} GPUs)",
            )
        )
    if milli and (whole or milli >= MILLI_PER_GPU):
        extra = -(-milli // MILLI_PER_GPU)
        if whole:
            problems.append(
                f"asks for both {keys.GPU_RESOURCE} ({whole}) and {keys.GPU_MILLI_RESOURCE} "
                f"({milli}): a pod takes whole GPUs or one share of a GPU, not both; "
                f"counted as {whole + extra} whole GPUs"
            )
        else:
            problems.append(
                f"{keys.GPU_MILLI_RESOURCE} is {milli}: a share is 1-999 thousandths of one "
                f"GPU; ask for {keys.GPU_RESOURCE} for whole GPUs; counted as {extra} whole GPUs"
            )
        whole, milli = whole + extra, 0

    return DemandReading(
        demand=PodDemand(
            gpus=whole,
            gpu_milli=milli,
            cpu_milli=nanos_to(totals[_CPU], 1000),
            memory_bytes=nanos_to(totals[_MEMORY], 1),
            gang=_gang(annotations, labels, problems),
            topology=_topology(annotations, problems),
            time_limit_s=_time_limit(spec, problems),
            products=_products(annotations, problems),
        ),
        problems=tuple(problems),
        refusals=tuple(refusals),
    )


_Amounts = dict[str, int]
"""Nano-units per resource of ``_DEMAND_RESOURCES``."""


def _zero() -> _Amounts:
    return dict.fromkeys(_DEMAND_RESOURCES, 0)


def _nanos_or_none(raw: Any) -> int | None:
    """``to_nanos``, or None for a value that is not a quantity (no message built)."""
    try:
        return to_nanos(raw)
    except QuantityError:
        return None


def _gpu_refusal(name: str, raw: Any, amount: int | None, where: str) -> str:
    """Why the GPU request ``raw`` of ``name`` at ``where`` is no count of GPUs (``amount``:
    its nano-units, None when it is not a quantity); ``""`` when it is one."""
    if amount is None:
        why = _NOT_A_NUMBER
    elif amount < 0:
        why = _NOT_NEGATIVE
    elif amount % NANO_PER_UNIT:
        why = _GPU_WHOLE[name]
    else:
        return ""
    return _refuse(name, f"{where} is {echo(raw)}: {why}")


def _requests(
    resources: Mapping[str, Any],
    where: str,
    problems: list[str],
    refusals: list[str],
    names: Sequence[str] = _DEMAND_RESOURCES,
) -> _Amounts:
    """Requests of ``names`` that are set; a missing request defaults to the limit."""
    requests = _mapping(resources, "requests")
    limits = _mapping(resources, "limits")
    amounts: _Amounts = {}
    for name in names:
        if requests.get(name) is not None:
            field, raw = "requests", requests[name]
        elif limits.get(name) is not None:
            field, raw = "limits", limits[name]
        else:
            continue
        try:
            amount: int | None = to_nanos(raw)
        except QuantityError:
            amount = None
        if name in _GPU_WHOLE and (amount is None or amount < 0 or amount % NANO_PER_UNIT):
            refusals.append(_gpu_refusal(name, raw, amount, f"{where}.resources.{field}"))
        if amount is None or amount < 0:
            # Only a bad value pays for the message: read it again, noting the problem.
            amount = _nanos(raw, f"{where}.resources.{field}[{echo(name)}]", problems)
        if amount is not None:
            amounts[name] = amount
    return amounts


def _container_requests(
    container: Any, where: str, problems: list[str], refusals: list[str]
) -> _Amounts:
    if not isinstance(container, Mapping):
        problems.append(f"{where} is not a container; ignored")
        return {}
    return _requests(_mapping(container, "resources"), where, problems, refusals)


def _pod_requests(spec: Mapping[str, Any], problems: list[str], refusals: list[str]) -> _Amounts:
    total = _zero()
    for number, container in enumerate(_sequence(spec, "containers")):
        for name, amount in _container_requests(
            container, _named(container, number), problems, refusals
        ).items():
            total[name] += amount

    init_containers = _sequence(spec, "initContainers")
    if init_containers:
        _add_init_containers(init_containers, total, problems, refusals)

    pod_level = _mapping(spec, "resources")
    if pod_level:
        # pod-level resources (KEP-2837) replace the containers' sum where they are set
        total.update(_requests(pod_level, "spec", problems, refusals, _POD_LEVEL_RESOURCES))

    overhead = _mapping(spec, "overhead")
    for name in _DEMAND_RESOURCES:
        raw = overhead.get(name)
        if raw is None:
            continue
        if name in _GPU_WHOLE:
            refusal = _gpu_refusal(name, raw, _nanos_or_none(raw), "spec.overhead")
            if refusal:
                refusals.append(refusal)
        total[name] += _nanos(raw, f"spec.overhead[{echo(name)}]", problems) or 0
    return total


def _add_init_containers(
    init_containers: Sequence[Any], total: _Amounts, problems: list[str], refusals: list[str]
) -> None:
    """Sidecars add to ``total``; the peak of any init container running raises it."""
    sidecars = _zero()
    init_peak = _zero()
    for number, container in enumerate(init_containers):
        where = _named(container, number, "initContainers")
        own = _container_requests(container, where, problems, refusals)
        restart = container.get("restartPolicy") if isinstance(container, Mapping) else None
        for name in _DEMAND_RESOURCES:
            if restart == "Always":
                # a sidecar keeps running beside everything started after it
                sidecars[name] += own.get(name, 0)
                total[name] += own.get(name, 0)
                running = sidecars[name]
            else:
                running = own.get(name, 0) + sidecars[name]
            init_peak[name] = max(init_peak[name], running)
    for name in _DEMAND_RESOURCES:
        total[name] = max(total[name], init_peak[name])


def _named(container: Any, number: int, field: str = "containers") -> str:
    name = container.get("name") if isinstance(container, Mapping) else None
    return f"{field}[{echo(name)}]" if isinstance(name, str) else f"{field}[{number}]"


def _whole(nanos: int, resource: str, problems: list[str]) -> int:
    count = nanos_to(nanos, 1)
    units, fraction = divmod(nanos, NANO_PER_UNIT)
    if fraction:
        decimals = f"{fraction:09d}".rstrip("0")
        problems.append(f"{resource} is {units}.{decimals}, not a whole number; counted as {count}")
    return count


def _gang(
    annotations: Mapping[str, Any], labels: Mapping[str, Any], problems: list[str]
) -> GangSpec | None:
    gang_id = _text(labels, keys.GANG, problems, "label")
    if not gang_id:
        return None
    size_text = _text(annotations, keys.GANG_SIZE, problems, "annotation")
    if size_text is None:
        problems.append(
            f"label {keys.GANG}={echo(gang_id)} has no {keys.GANG_SIZE} annotation; "
            "scheduled as a single pod"
        )
        return None
    try:
        size = _positive_int(size_text)
    except AnnotationError as exc:
        problems.append(f"annotation {keys.GANG_SIZE}: {exc}; scheduled as a single pod")
        return None
    min_count = size
    min_text = _text(annotations, keys.GANG_MIN, problems, "annotation")
    if min_text is not None:
        try:
            min_count = _positive_int(min_text)
        except AnnotationError as exc:
            problems.append(f"annotation {keys.GANG_MIN}: {exc}; all {size} members required")
        else:
            if min_count > size:
                problems.append(
                    f"annotation {keys.GANG_MIN}={min_count} is more than the gang's "
                    f"{size} members; all {size} required"
                )
                min_count = size
    return GangSpec(id=GangId(gang_id), size=size, min_count=min_count)


def _topology(annotations: Mapping[str, Any], problems: list[str]) -> TopologyConstraint | None:
    text = _text(annotations, keys.TOPOLOGY, problems, "annotation")
    if text is None:
        return None
    try:
        return parse_topology(text)
    except AnnotationError as exc:
        problems.append(f"annotation {keys.TOPOLOGY}: {exc}; ignored")
        return None


def _products(annotations: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    text = _text(annotations, keys.GPU_PRODUCT, problems, "annotation")
    if text is None:
        return ()
    products = (part.strip() for part in text.split("|"))
    return tuple(dict.fromkeys(p for p in products if p))


def _time_limit(spec: Mapping[str, Any], problems: list[str]) -> int | None:
    value = spec.get("activeDeadlineSeconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(
            f"spec.activeDeadlineSeconds={echo(value)} is not a positive integer; ignored"
        )
        return None
    return value


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo:
    """A Pod object → ``PodInfo``: identity, demand, binding and lifecycle.

    A pod without a namespace (a file written for ``kubectl apply``) is in ``default``.
    """
    metadata = _mapping(obj, "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError("a Pod without metadata.name")
    namespace = metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = "default"
    spec = _mapping(obj, "spec")
    annotations = _mapping(metadata, "annotations")
    reading = read_demand(spec, annotations, _mapping(metadata, "labels"))
    problems = list(reading.problems)
    demand = reading.demand
    if demand.gang is not None and not demand.gang.id.startswith(f"{namespace}."):
        # Gang ids are <namespace>.<job>: a pod claiming another namespace's gang would
        # hold that gang to the pod's own rack. The webhook refuses such labels; pods it
        # does not see (system namespaces) are kept out here.
        problems.append(
            f"label {keys.GANG}={echo(demand.gang.id)} names a gang outside namespace "
            f"{namespace}; scheduled as a single pod"
        )
        demand = replace(demand, gang=None)

    node = spec.get("nodeName")
    if demand.uses_gpu and not node:
        # where the pod may go matters only until it is bound: kept for pending pods
        selection = node_selection(spec, problems)
        demand = replace(
            demand, selection=UNCONSTRAINED if selection == UNCONSTRAINED else selection
        )
    uid = metadata.get("uid")
    scheduler = spec.get("schedulerName")
    # a node's name and the scheduler's are shared by many pods: one string each, not
    # one per pod (150,000 pods keep 10-20 MB less)
    return PodInfo(
        key=pod_key(namespace, name),
        uid=uid if isinstance(uid, str) else "",
        demand=demand,
        node=NodeName(sys.intern(node)) if isinstance(node, str) and node else None,
        gpu_indices=_gpu_indices(annotations, demand, problems),
        phase=_phase(_mapping(obj, "status"), problems),
        scheduler_name=sys.intern(scheduler) if isinstance(scheduler, str) else "",
        deleting=metadata.get("deletionTimestamp") is not None,
        problems=tuple(problems),
        refusal="; ".join(reading.refusals),
    )


_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def node_selection(spec: Mapping[str, Any], problems: list[str]) -> NodeSelection:
    """A pod spec's ``nodeSelector``, required node affinity and tolerations. What cannot
    be read is left out with a problem noted: the extender then counts more nodes as
    possible for the pod, never fewer, and kube-scheduler still filters them."""
    required = tuple(
        NodeRequirement(key, "In", (value,))
        for key, value in sorted(_mapping(spec, "nodeSelector").items())
        if isinstance(key, str) and isinstance(value, str)
    )
    affinity = _mapping(_mapping(spec, "affinity"), "nodeAffinity")
    chosen = _mapping(affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[tuple[NodeRequirement, ...], ...] | None = None
    raw_terms = _sequence(chosen, "nodeSelectorTerms")
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
        for raw in _sequence(spec, "tolerations")
        if isinstance(raw, Mapping)
    )
    return NodeSelection(required, terms, tolerations)


def _term(term: Any, problems: list[str]) -> tuple[NodeRequirement, ...] | None:
    """One ``nodeSelectorTerm``; None when it or an item cannot be read (the whole
    affinity is then left to kube-scheduler)."""
    if not isinstance(term, Mapping):
        problems.append(f"node selector term {echo(term)} cannot be read; ignored")
        return None
    items: list[NodeRequirement] = []
    for part, is_field in (("matchExpressions", False), ("matchFields", True)):
        for raw in _sequence(term, part):
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


def _gpu_indices(
    annotations: Mapping[str, Any], demand: PodDemand, problems: list[str]
) -> tuple[int, ...]:
    text = _text(annotations, keys.GPU_INDICES, problems, "annotation")
    if text is None or not text.strip():
        return ()
    try:
        indices = parse_index_list(text)
    except AnnotationError as exc:
        problems.append(f"annotation {keys.GPU_INDICES}: {exc}; ignored")
        return ()
    wanted = demand.gpus if demand.gpus else (1 if demand.gpu_milli else 0)
    if len(indices) != wanted:
        problems.append(
            f"annotation {keys.GPU_INDICES}={echo(text)} names {len(indices)} GPUs "
            f"but the pod takes {wanted}; ignored"
        )
        return ()
    return indices


def _phase(status: Mapping[str, Any], problems: list[str]) -> PodPhase:
    value = status.get("phase")
    if value is None or value == "":
        return PodPhase.PENDING
    try:
        if not isinstance(value, str):
            raise ValueError(value)  # the enum's own error would repr it whole
        return PodPhase(value)
    except ValueError:
        problems.append(f"status.phase={echo(value)} is not a pod phase; treated as Unknown")
        return PodPhase.UNKNOWN
