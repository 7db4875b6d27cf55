"""Namespace ResourceQuotas that fight Kueue: a quota on ``requests.nvidia.com/gpu`` (or on
pods) still applies after Kueue admits a job, so the job controller's pod creations
fail and the job hangs with events nobody reads.

Layer: PURE. From ResourceQuota objects (decoded JSON), the queue policy and the
Workloads to frozen records and sentences: no I/O, no clock. Must not raise on a
malformed quota: a field that cannot be read is left out.

The conflicts named:

* a namespace's quota below the nominal GPU quota of a ClusterQueue its LocalQueues
  point at: Kueue can admit there more than the namespace may create;
* a workload asking more GPUs (or pods) than a quota of its namespace allows in all:
  its pods can never all be created;
* an admitted workload whose pods are not all there while the quota has less room left
  than the GPUs (or pods) missing: the job controller is being refused now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from cluster.quantity import QuantityError, to_milli
from console.queues import Workload
from console.reading import field_map
from console.why import WhyReport
from webhook.queues import Policy

GPU_KEYS: Final = ("requests.nvidia.com/gpu", "nvidia.com/gpu")
"""How a quota names whole GPUs (an extended resource takes only ``requests.``; the bare
name is accepted as Kubernetes accepts it in ``hard``)."""
POD_KEYS: Final = ("pods", "count/pods")


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit of one ResourceQuota: ``used`` of ``hard`` (whole units)."""

    namespace: str
    quota: str
    resource: str
    hard: int
    used: int

    @property
    def room(self) -> int:
        return max(0, self.hard - self.used)

    @property
    def gpus(self) -> bool:
        return self.resource in GPU_KEYS

    @property
    def name(self) -> str:
        return f"ResourceQuota {self.namespace}/{self.quota}"

    def to_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "name": self.quota,
            "resource": self.resource,
            "hard": self.hard,
            "used": self.used,
        }


def read_limits(objs: Iterable[Mapping[str, Any]]) -> tuple[Limit, ...]:
    """The GPU and pod limits of the ResourceQuotas among ``objs``."""
    found = []
    for obj in objs:
        if obj.get("kind") != "ResourceQuota":
            continue
        meta = field_map(obj, "metadata")
        hard = field_map(obj, "spec", "hard")
        used = field_map(obj, "status", "used")
        for key in (*GPU_KEYS, *POD_KEYS):
            if key not in hard:
                continue
            limit, in_use = _whole(hard.get(key)), _whole(used.get(key, "0"))
            if limit is not None:
                found.append(
                    Limit(
                        str(meta.get("namespace") or "default"),
                        str(meta.get("name") or "?"),
                        key,
                        limit,
                        in_use or 0,
                    )
                )
    return tuple(found)


def _whole(value: object) -> int | None:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    try:
        return to_milli(value) // 1000
    except QuantityError:
        return None


def _pods(w: Workload) -> int:
    return sum(count for count, _ in w.pod_sets)


def _asked(limit: Limit, w: Workload) -> int:
    return w.gpus if limit.gpus else _pods(w)


def _unit(limit: Limit) -> str:
    return "GPUs" if limit.gpus else "pods"


def conflicts(
    limits: Sequence[Limit], policy: Policy, workloads: Sequence[Workload]
) -> tuple[str, ...]:
    """The first two conflicts of the module's docstring, as sentences."""
    found = []
    for limit in limits:
        if not limit.gpus:
            continue
        queues = sorted(
            {
                lq.cluster_queue
                for (ns, _), lq in policy.local_queues.items()
                if ns == limit.namespace
            }
        )
        for name in queues:
            cq = policy.cluster_queue(name)
            if cq is None:
                continue
            nominal = sum(q.nominal for (_, r), q in cq.quotas.items() if r == "nvidia.com/gpu")
            if limit.hard * 1000 < nominal:
                found.append(
                    f"{limit.name} allows {limit.hard} GPUs ({limit.resource}), below "
                    f"ClusterQueue {name}'s nominal {nominal // 1000} that namespace "
                    f"{limit.namespace} queues to: Kueue can admit jobs whose pods it refuses"
                )
    for w in workloads:
        for limit in limits:
            if limit.namespace == w.namespace and _asked(limit, w) > limit.hard:
                found.append(
                    f"workload {w.namespace}/{w.name} asks {_asked(limit, w)} {_unit(limit)}, "
                    f"more than {limit.name} allows ({limit.hard}): its pods can never all "
                    "be created"
                )
    return tuple(found)


def refusing(
    limits: Sequence[Limit], namespace: str, missing_gpus: int, missing_pods: int
) -> tuple[str, ...]:
    """The third conflict: the quotas of ``namespace`` with less room than the GPUs and
    pods an admitted job still has to create."""
    found = []
    for limit in limits:
        missing = missing_gpus if limit.gpus else missing_pods
        if limit.namespace == namespace and missing > limit.room:
            found.append(
                f"{limit.name}: {limit.used} of {limit.hard} {_unit(limit)} used "
                f"({limit.resource}), {missing} more needed: the job controller cannot create "
                "the rest of its pods"
            )
    return tuple(found)


def job_refusals(limits: Sequence[Limit], workload: Workload, pods_found: int) -> tuple[str, ...]:
    """``refusing`` for an admitted workload of which ``pods_found`` pods exist."""
    expected = _pods(workload)
    if not workload.admitted or pods_found >= expected or expected <= 0:
        return ()
    missing = expected - pods_found
    return refusing(limits, workload.namespace, workload.gpus * missing // expected, missing)


def with_refusals(report: WhyReport, refusals: Sequence[str]) -> WhyReport:
    """``tessera why``'s answer with the quotas refusing the job's pods in its verdict:
    no other stage would say why the pods are missing."""
    if not refusals:
        return report
    return replace(
        report, verdict=f"{report.verdict}; {refusals[0]}", notes=(*report.notes, *refusals[1:])
    )
