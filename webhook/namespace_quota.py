"""A namespace's ResourceQuota limits on whole GPUs and pods, read from the object, and
the arithmetic that sets them against a ClusterQueue: shared by the webhook's rule
(``webhook.rules.namespace``) and the console's report (``console.rquota``).

Layer: PURE. Decoded ResourceQuota objects to frozen records, and sums: no I/O, no
clock, no aiohttp, no pydantic. Must not raise on a malformed quota (a field that cannot
be read is left out) and must not decide anything about a workload.

Why it matters: a ResourceQuota still applies after Kueue admits a job. Kueue counts its
own quota; kube-apiserver counts the namespace's when the job controller creates each
pod, so a quota below what the queue admits leaves a job admitted with pods that can
never be created.

Only whole GPUs are counted against a GPU limit: a share (``tessera.dev/gpu-milli``)
asks no ``nvidia.com/gpu``. A quota with ``scopes`` or a ``scopeSelector`` applies only to
the pods it selects; it is read (``scoped``) and the webhook does not deny by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from cluster import labels
from cluster.quantity import QuantityError, to_milli

if TYPE_CHECKING:
    # webhook.queues names these records in its Policy: only types go this way
    from webhook.queues import ClusterQueue

GPU_KEYS: Final = ("requests.nvidia.com/gpu", "nvidia.com/gpu")
"""How a quota names whole GPUs (an extended resource takes only ``requests.``; the bare
name is accepted as Kubernetes accepts it in ``hard``)."""
POD_KEYS: Final = ("pods", "count/pods")


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """One limit of one ResourceQuota: ``used`` of ``hard`` (whole units)."""

    namespace: str
    quota: str
    resource: str
    hard: int
    used: int = 0
    scoped: bool = False
    """The quota has scopes: it holds only the pods they select."""

    @property
    def room(self) -> int:
        return max(0, self.hard - self.used)

    @property
    def gpus(self) -> bool:
        return self.resource in GPU_KEYS

    @property
    def unit(self) -> str:
        return "GPUs" if self.gpus else "pods"

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


@dataclass(frozen=True, slots=True)
class NamespaceQuota:
    """One ResourceQuota as the policy keeps it: its GPU and pod limits."""

    namespace: str
    name: str
    limits: tuple[QuotaLimit, ...]


def _map(obj: object, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def _whole(value: object) -> int | None:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    try:
        return to_milli(value) // 1000
    except QuantityError:
        return None


def quota_limits(obj: Mapping[str, Any]) -> tuple[QuotaLimit, ...]:
    """The GPU and pod limits of one ResourceQuota (none for any other object)."""
    if obj.get("kind") != "ResourceQuota":
        return ()
    meta = _map(obj, "metadata")
    spec = _map(obj, "spec")
    hard = _map(spec, "hard")
    used = _map(obj, "status", "used")
    scoped = bool(spec.get("scopes") or spec.get("scopeSelector"))
    found = []
    for key in (*GPU_KEYS, *POD_KEYS):
        limit = _whole(hard.get(key)) if key in hard else None
        if limit is not None:
            found.append(
                QuotaLimit(
                    str(meta.get("namespace") or "default"),
                    str(meta.get("name") or "?"),
                    key,
                    limit,
                    _whole(used.get(key, "0")) or 0,
                    scoped,
                )
            )
    return tuple(found)


def namespace_quota(obj: Mapping[str, Any]) -> NamespaceQuota:
    """One ResourceQuota object as a record (with no limits when it holds none of ours)."""
    meta = _map(obj, "metadata")
    return NamespaceQuota(
        str(meta.get("namespace") or "default"), str(meta.get("name") or "?"), quota_limits(obj)
    )


def read_limits(objs: Iterable[Mapping[str, Any]]) -> tuple[QuotaLimit, ...]:
    """The GPU and pod limits of the ResourceQuotas among ``objs``."""
    return tuple(limit for obj in objs for limit in quota_limits(obj))


def nominal_gpus(cq: ClusterQueue) -> int:
    """Whole GPUs (milli) of a ClusterQueue's nominal quota, over all its flavors: what
    Kueue may admit at once from its namespaces without borrowing."""
    return sum(q.nominal for (_, r), q in cq.quotas.items() if r == labels.GPU_RESOURCE)


def below_nominal(limit: QuotaLimit, cq: ClusterQueue) -> int | None:
    """The queue's nominal in whole GPUs when ``limit`` is a GPU limit below it, else
    ``None``: Kueue can then admit from the namespace more than the quota lets it create."""
    nominal = nominal_gpus(cq)
    if limit.gpus and limit.hard * 1000 < nominal:
        return nominal // 1000
    return None
