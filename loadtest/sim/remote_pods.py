"""The pods of a remote-mode run, made real in the deployment's cluster.

Layer: I/O (HTTP to kube-apiserver through a kubeconfig). Against a real deployment the
extender binds through its own kube-apiserver and learns from its watch that a pod
ended; pods that exist only in the load test would either fail to bind or, with a
standalone extender, keep their GPUs for ever. So a remote run creates each pod it
schedules in a namespace it owns, deletes it when its (compressed) run time is over,
and at exit deletes whatever is left and the namespace if it made it.

The pods are real Pods: ``schedulerName`` is ``tessera-loadtest``, which no
kube-scheduler serves, so only the load test schedules them; the image is the pause
image. On nodes with kubelets they do start (and take the device plugin's GPUs): use a
test cluster or a control plane without kubelets. A webhook configured for pods sees
them as bare GPU pods in the owned namespace. Must not touch anything outside that
namespace except reading nodes, and must not decide placement.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Collection
from types import TracebackType
from typing import Any, Final, Self

from cluster.kube import ApiError, KubeClient, KubeConfig, TransportError

Obj = dict[str, Any]

OWNER_LABEL: Final = "app.kubernetes.io/managed-by"
OWNER: Final = "tessera-loadtest"
SCHEDULER_NAME: Final = "tessera-loadtest"
"""No kube-scheduler serves it: the cluster's own schedulers leave these pods alone."""
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"


class RemoteClusterError(Exception):
    """The cluster cannot host the run (unreachable, a namespace not ours, nodes
    missing); the message says which."""


class RemotePods:
    """``async with RemotePods(config, namespace) as pods``: the owned namespace exists
    and is empty of old load-test pods; on exit it is cleaned up."""

    def __init__(self, config: KubeConfig, namespace: str, *, timeout_s: float = 10.0) -> None:
        self.namespace = namespace
        self.created = self.deleted = 0
        self._client = KubeClient(config, request_timeout_s=timeout_s, user_agent=OWNER)
        self._made_namespace = False

    # ------------------------------------------------------------ plumbing

    async def _must(
        self, what: str, call: Awaitable[dict[str, Any]], ok: Collection[int] = ()
    ) -> dict[str, Any]:
        """The answer of ``call``; ``{}`` for a status in ``ok``; else RemoteClusterError."""
        try:
            return await call
        except ApiError as exc:
            if exc.status in ok:
                return {}
            raise RemoteClusterError(f"{what}: HTTP {exc.status} {exc.message}".strip()) from None
        except TransportError as exc:
            raise RemoteClusterError(f"{what}: {exc}") from None

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    # ------------------------------------------------------------ the run

    async def __aenter__(self) -> Self:
        await self._client.__aenter__()
        try:
            await self._own_namespace()
            await self._delete_our_pods()
        except BaseException:
            await self._client.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._delete_our_pods()
            if self._made_namespace:
                path = f"/api/v1/namespaces/{self.namespace}"
                await self._must(f"DELETE {path}", self._client.delete_json(path), ok=(404,))
        finally:
            await self._client.close()

    async def _own_namespace(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}"
        found = await self._must(f"GET {path}", self._client.get_json(path), ok=(404,))
        if found.get("kind") == "Namespace" or found.get("metadata", {}).get("name"):
            owner = (found.get("metadata", {}).get("labels") or {}).get(OWNER_LABEL)
            if owner != OWNER:
                raise RemoteClusterError(
                    f"namespace {self.namespace} exists and is not the load test's "
                    f"(no label {OWNER_LABEL}={OWNER}): give --namespace a name of its own"
                )
            return
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {OWNER_LABEL: OWNER}},
        }
        await self._must(
            "POST /api/v1/namespaces", self._client.post_json("/api/v1/namespaces", body)
        )
        self._made_namespace = True

    async def _delete_our_pods(self) -> None:
        """Pods of this or an earlier (crashed) run still hold GPUs: delete them."""
        path = self._pods_path()
        listing = await self._must(f"GET {path}", self._client.get_json(path), ok=(404,))
        for pod in listing.get("items") or []:
            meta = pod.get("metadata") or {}
            if (meta.get("labels") or {}).get(OWNER_LABEL) == OWNER:
                await self.delete(meta["name"])

    async def missing_nodes(self, names: Collection[str]) -> list[str]:
        """The names among ``names`` that the cluster has no Node for."""
        listing = await self._must("GET /api/v1/nodes", self._client.get_json("/api/v1/nodes"))
        known = {(n.get("metadata") or {}).get("name") for n in listing.get("items") or []}
        return sorted(set(names) - known)

    def pod_for(self, pod: Obj) -> Obj:
        """The pod the Job controller would create, moved into the owned namespace (the
        same name: job names are unique in a run), for the load test's scheduler only."""
        out = copy.deepcopy(pod)
        meta = out["metadata"]
        for key in ("uid", "resourceVersion"):
            meta.pop(key, None)
        meta["namespace"] = self.namespace
        meta.setdefault("labels", {})[OWNER_LABEL] = OWNER
        spec = out["spec"]
        spec["schedulerName"] = SCHEDULER_NAME
        spec["terminationGracePeriodSeconds"] = 0
        for container in spec.get("containers") or []:
            container["image"] = PAUSE_IMAGE
        return out

    async def create(self, pod: Obj) -> Obj:
        """POST the pod; the stored pod (with the uid kube-apiserver gave it)."""
        path = self._pods_path()
        stored: Obj = await self._must(f"POST {path}", self._client.post_json(path, pod))
        self.created += 1
        return stored

    async def delete(self, name: str) -> None:
        path = f"{self._pods_path()}/{name}"
        await self._must(f"DELETE {path}", self._client.delete_json(path), ok=(404,))
        self.deleted += 1
