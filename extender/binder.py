"""Carrying out a bind: one ``v1.Binding`` that binds the pod and records its GPUs.

Layer: I/O. ``Binder`` is the seam the server calls once the GPUs are chosen and assumed
in the cache; ``ApiBinder`` talks to kube-apiserver, ``MemoryBinder`` (standalone mode)
records the placement in the cache the way the watch would. Must not choose GPUs or
decide anything about placement, must not touch the cache's assumptions (the server
assumes and forgets; a binder only reports how the bind ended), and must not write the
pod itself: the extender holds no ``patch`` right on pods.

Why one request: whoever needs to know which GPUs a pod holds (this cache rebuilding
after a restart, tools on the node) reads ``tessera.dev/gpu-indices``. The Binding
carries it in its own ``metadata.annotations``, and kube-apiserver copies those onto the
pod in the very update that sets ``spec.nodeName`` (``setPodNodeAndMetadata``,
pkg/registry/core/pod/storage/storage.go, v1.36). So a pod is bound with its GPUs
recorded, or not bound and untouched: no pod bound without the annotation, and no
unbound pod left with one (as an annotate-then-bind did when it died in between).

The rest of the Binding is what kube-scheduler's own DefaultBinder posts
(``pkg/scheduler/framework/plugins/defaultbinder``): the pod's namespace, name and UID
(kube-apiserver takes the UID as a precondition, so a pod deleted and re-created under
the same name is refused with 409) and a ``Node`` target.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from cluster import logs
from cluster.cache import ClusterCache
from cluster.convert.grammar import format_indices
from cluster.kube import ApiError, JsonObject, KubeError, Params
from cluster.labels import GPU_INDICES
from cluster.model import NodeName, PodInfo

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S: Final = 2.0
"""Extra time to ask kube-apiserver whether a bind that broke off took effect."""


class BindError(Exception):
    """The pod was not bound. ``uncertain``: it may have been (the connection broke after
    the Binding was sent and the pod could not be read back), so its GPUs must stay
    counted until the watch tells or the assumption expires."""

    def __init__(self, message: str, *, uncertain: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain


@dataclass(frozen=True, slots=True)
class Placement:
    """One bind to carry out: the pod, its node, and the GPUs it takes there."""

    pod: PodInfo
    node: NodeName
    gpu_indices: tuple[int, ...]
    """Empty for a pod without GPUs: nothing to annotate."""

    @property
    def annotation(self) -> str:
        return format_indices(self.gpu_indices)


class Binder(Protocol):
    async def bind(self, placement: Placement) -> None:
        """Bind the pod, or raise ``BindError`` saying why not."""
        ...


class PodApi(Protocol):
    """What ``ApiBinder`` needs of ``cluster.kube.KubeClient``: post the Binding, and
    read the pod back when its outcome is unknown."""

    async def get_json(self, path: str, params: Params | None = None) -> JsonObject: ...

    async def post_json(self, path: str, body: Any, params: Params | None = None) -> JsonObject: ...


def pod_path(placement: Placement) -> str:
    return f"/api/v1/namespaces/{placement.pod.namespace}/pods/{placement.pod.name}"


def binding_body(placement: Placement) -> dict[str, Any]:
    """The ``v1.Binding`` to post to ``pods/{name}/binding``: DefaultBinder's, plus the
    GPU indices in its annotations for kube-apiserver to copy onto the pod."""
    metadata: dict[str, Any] = {
        "name": placement.pod.name,
        "namespace": placement.pod.namespace,
    }
    if placement.pod.uid:
        metadata["uid"] = placement.pod.uid
    if placement.gpu_indices:
        metadata["annotations"] = {GPU_INDICES: placement.annotation}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"kind": "Node", "name": placement.node},
    }


class ApiBinder:
    """Binds through kube-apiserver: POST one Binding that also records the GPUs.

    A Binding refused as a conflict, or lost to a broken connection, is not the end of
    the story: the pod is read back, and if it is bound to this very node (an earlier
    attempt landed) the bind succeeded. Otherwise nothing was written: a Binding that
    did not bind the pod did not annotate it either.
    """

    def __init__(self, api: PodApi, *, timeout_s: float = 4.0) -> None:
        self._api = api
        self._timeout_s = timeout_s

    async def bind(self, placement: Placement) -> None:
        path = pod_path(placement) + "/binding"
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._api.post_json(path, binding_body(placement))
        except ApiError as exc:
            if exc.status != 409:
                raise BindError(f"cannot bind pod {placement.pod.key}: {_why(exc)}") from None
            await self._settle(placement, exc)
        except (KubeError, TimeoutError) as exc:
            await self._settle(placement, exc)

    async def _settle(self, placement: Placement, failure: BaseException) -> None:
        """The Binding may or may not exist: read the pod to know."""
        key = placement.pod.key
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                pod = await self._api.get_json(pod_path(placement))
        except (KubeError, TimeoutError) as exc:
            raise BindError(
                f"binding pod {key} failed ({_why(failure)}) and reading it back failed "
                f"({_why(exc)}): it may be bound",
                uncertain=True,
            ) from None
        metadata = pod.get("metadata") or {}
        bound = (pod.get("spec") or {}).get("nodeName") or ""
        same_pod = not placement.pod.uid or metadata.get("uid") == placement.pod.uid
        if same_pod and bound == placement.node:
            log.info(
                "bind landed despite an error",
                extra=logs.fields(pod=key, node=placement.node, error=_why(failure)),
            )
            return
        where = f"bound to node {bound}" if bound else "not bound"
        raise BindError(f"cannot bind pod {key}: {_why(failure)}; the pod is {where}")


class MemoryBinder:
    """Standalone mode (``--cluster-file``): the bound pod goes into the cache as the
    watch would report it, which also confirms the assumption."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache

    async def bind(self, placement: Placement) -> None:
        self._cache.upsert_pod(
            replace(placement.pod, node=placement.node, gpu_indices=placement.gpu_indices)
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
