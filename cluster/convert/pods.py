"""A Pod object → ``PodInfo``: identity, demand, where it may go, binding and lifecycle.

Layer: PURE. No I/O, no clock, no logging, no cache. Must never raise on a malformed
value (only on a Pod without a name, ``ConversionError``): what cannot be read is
ignored and said in the pod's ``problems``. The demand is ``cluster.convert.demand``'s,
where it may go ``cluster.convert.selection``'s. Decisions a reader might otherwise guess:

* ``tessera.dev/gpu-indices`` that does not name exactly as many GPUs as the pod asks
  for (one for a share) is ignored: the cache then picks GPUs so accounting stays whole.
* A gang label naming another namespace's gang is no gang: the pod is scheduled alone.
* Times are kept where a reservation reads them: a bound pod's ``status.startTime``
  (its time limit runs from it), and for a gang member waiting to be placed its
  ``metadata.creationTimestamp`` and ``spec.priority``. One object per distinct time
  text: the members of a job are created and started within the same second.
* A pod not bound yet keeps its ``metadata.resourceVersion`` (``PodInfo.version``): the
  extender takes a pod kube-scheduler sends from the cache when the versions match.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from cluster import labels as keys
from cluster.convert.demand import read_demand
from cluster.convert.grammar import AnnotationError, parse_index_list, parse_rfc3339
from cluster.convert.raw import ConversionError, field_map, field_text
from cluster.convert.selection import node_selection
from cluster.echo import echo
from cluster.model import UNCONSTRAINED, NodeName, PodDemand, PodInfo, PodPhase, pod_key


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo:
    """A Pod object → ``PodInfo``: identity, demand, binding and lifecycle.

    A pod without a namespace (a file written for ``kubectl apply``) is in ``default``.
    """
    metadata = field_map(obj, "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError("a Pod without metadata.name")
    namespace = metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = "default"
    spec = field_map(obj, "spec")
    annotations = field_map(metadata, "annotations")
    reading = read_demand(spec, annotations, field_map(metadata, "labels"))
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
    version = metadata.get("resourceVersion") if not node else None
    scheduler = spec.get("schedulerName")
    status = field_map(obj, "status")
    started, created, priority = _times(
        metadata, spec, status, bound=bool(node), problems=problems, gang=demand.gang is not None
    )
    # a node's name and the scheduler's are shared by many pods: one string each, not
    # one per pod (150,000 pods keep 10-20 MB less)
    return PodInfo(
        key=pod_key(namespace, name),
        uid=uid if isinstance(uid, str) else "",
        demand=demand,
        node=NodeName(sys.intern(node)) if isinstance(node, str) and node else None,
        gpu_indices=_gpu_indices(annotations, demand, problems),
        phase=_phase(status, problems),
        scheduler_name=sys.intern(scheduler) if isinstance(scheduler, str) else "",
        deleting=metadata.get("deletionTimestamp") is not None,
        problems=tuple(problems),
        refusal="; ".join(reading.refusals),
        started_at=started,
        created_at=created,
        priority=priority,
        version=version if isinstance(version, str) else "",
    )


def _times(
    metadata: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    bound: bool,
    gang: bool,
    problems: list[str],
) -> tuple[datetime | None, datetime | None, int]:
    """(started, created, priority): the start of a bound pod; the creation time and
    priority of a gang member waiting to be placed."""
    if bound:
        return _time(status, "startTime", "status", problems), None, 0
    if gang:
        created = _time(metadata, "creationTimestamp", "metadata", problems)
        return None, created, _priority(spec, problems)
    return None, None, 0


def _time(part: Mapping[str, Any], key: str, where: str, problems: list[str]) -> datetime | None:
    value = part.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise AnnotationError(value)
        return _moment(value)
    except AnnotationError:
        problems.append(f"{where}.{key}={echo(value)} is not an RFC 3339 time; ignored")
        return None


@functools.lru_cache(maxsize=4096)
def _moment(text: str) -> datetime:
    return parse_rfc3339(text)


def _priority(spec: Mapping[str, Any], problems: list[str]) -> int:
    value = spec.get("priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"spec.priority={echo(value)} is not an integer; ignored")
        return 0
    return value


def _gpu_indices(
    annotations: Mapping[str, Any], demand: PodDemand, problems: list[str]
) -> tuple[int, ...]:
    text = field_text(annotations, keys.GPU_INDICES, problems, "annotation")
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
