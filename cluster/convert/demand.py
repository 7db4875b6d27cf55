"""A pod's (or pod template's) spec → ``PodDemand``: GPUs, CPU, memory, gang, topology
constraint, time limit and accepted GPU products, as Kubernetes counts them.

Layer: PURE. No I/O, no clock, no logging, no cache. ``read_demand`` never raises and
says what it ignored or assumed; ``pod_demand`` (the webhook's) raises ``DemandError``
listing every fault. Must not read where the pod may go (``cluster.convert.selection``)
or its binding (``cluster.convert.pods``). Decisions a reader might otherwise guess:

* ``tessera.dev/gpu-milli`` of 1000 or more, or together with ``nvidia.com/gpu``: the
  share is counted as whole GPUs (``ceil(milli / 1000)`` more), so that a pod someone
  else bound is never under-counted; the webhook rejects such pods with ``pod_demand``.
* A GPU request that is no count of GPUs (``nvidia.com/gpu`` or ``tessera.dev/gpu-milli``
  negative, not a number, a fraction of a unit, or more than a node can have) is not
  read as no GPUs, which every node would fit: it is a ``refusal`` (``DemandReading``,
  ``PodInfo``), and the extender places the pod nowhere, saying which request and why.
* A gang label without a readable ``tessera.dev/gang-size`` is no gang (the pod is
  scheduled alone); a bad ``tessera.dev/gang-min`` means all members.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels as keys
from cluster.convert.grammar import (
    MAX_GPUS_PER_NODE,
    AnnotationError,
    parse_topology,
    positive_int,
)
from cluster.convert.raw import (
    NOT_A_NUMBER,
    NOT_NEGATIVE,
    field_list,
    field_map,
    field_text,
    read_nanos,
)
from cluster.echo import echo
from cluster.model import MILLI_PER_GPU, GangId, GangSpec, PodDemand, TopologyConstraint
from cluster.quantity import NANO_PER_UNIT, QuantityError, nanos_to, to_nanos

_CPU: Final = "cpu"
_MEMORY: Final = "memory"
_DEMAND_RESOURCES: Final = (_CPU, _MEMORY, keys.GPU_RESOURCE, keys.GPU_MILLI_RESOURCE)
_GPU_WHOLE: Final = {
    keys.GPU_RESOURCE: f"GPUs are whole; ask for {keys.GPU_MILLI_RESOURCE} for a share of one",
    keys.GPU_MILLI_RESOURCE: "a share is a whole number of thousandths of a GPU",
}
"""Why a fraction of each GPU resource's unit cannot be asked for."""
_POD_LEVEL_RESOURCES: Final = (_CPU, _MEMORY)
"""Resources that ``spec.resources`` (pod-level resources) may set for the whole pod."""


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
        why = NOT_A_NUMBER
    elif amount < 0:
        why = NOT_NEGATIVE
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
    requests = field_map(resources, "requests")
    limits = field_map(resources, "limits")
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
            amount = read_nanos(raw, f"{where}.resources.{field}[{echo(name)}]", problems)
        if amount is not None:
            amounts[name] = amount
    return amounts


def _container_requests(
    container: Any, where: str, problems: list[str], refusals: list[str]
) -> _Amounts:
    if not isinstance(container, Mapping):
        problems.append(f"{where} is not a container; ignored")
        return {}
    return _requests(field_map(container, "resources"), where, problems, refusals)


def _pod_requests(spec: Mapping[str, Any], problems: list[str], refusals: list[str]) -> _Amounts:
    total = _zero()
    for number, container in enumerate(field_list(spec, "containers")):
        for name, amount in _container_requests(
            container, _named(container, number), problems, refusals
        ).items():
            total[name] += amount

    init_containers = field_list(spec, "initContainers")
    if init_containers:
        _add_init_containers(init_containers, total, problems, refusals)

    pod_level = field_map(spec, "resources")
    if pod_level:
        # pod-level resources (KEP-2837) replace the containers' sum where they are set
        total.update(_requests(pod_level, "spec", problems, refusals, _POD_LEVEL_RESOURCES))

    overhead = field_map(spec, "overhead")
    for name in _DEMAND_RESOURCES:
        raw = overhead.get(name)
        if raw is None:
            continue
        if name in _GPU_WHOLE:
            refusal = _gpu_refusal(name, raw, _nanos_or_none(raw), "spec.overhead")
            if refusal:
                refusals.append(refusal)
        total[name] += read_nanos(raw, f"spec.overhead[{echo(name)}]", problems) or 0
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
    gang_id = field_text(labels, keys.GANG, problems, "label")
    if not gang_id:
        return None
    size_text = field_text(annotations, keys.GANG_SIZE, problems, "annotation")
    if size_text is None:
        problems.append(
            f"label {keys.GANG}={echo(gang_id)} has no {keys.GANG_SIZE} annotation; "
            "scheduled as a single pod"
        )
        return None
    try:
        size = positive_int(size_text)
    except AnnotationError as exc:
        problems.append(f"annotation {keys.GANG_SIZE}: {exc}; scheduled as a single pod")
        return None
    min_count = size
    min_text = field_text(annotations, keys.GANG_MIN, problems, "annotation")
    if min_text is not None:
        try:
            min_count = positive_int(min_text)
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
    text = field_text(annotations, keys.TOPOLOGY, problems, "annotation")
    if text is None:
        return None
    try:
        return parse_topology(text)
    except AnnotationError as exc:
        problems.append(f"annotation {keys.TOPOLOGY}: {exc}; ignored")
        return None


def _products(annotations: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    text = field_text(annotations, keys.GPU_PRODUCT, problems, "annotation")
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
