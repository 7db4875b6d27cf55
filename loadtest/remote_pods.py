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
from collections.abc import Collection
from types import TracebackType
from typing import Any, Final, Self

import aiohttp

from cluster import jsonio
from cluster.kube import KubeConfig

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
        self.config = config
        self.namespace = namespace
        self.created = self.deleted = 0
        self._timeout_s = timeout_s
        self._made_namespace = False
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------ plumbing

    def _headers(self) -> dict[str, str]:
        token = self.config.token
        if token is None and self.config.token_file is not None:
            token = self.config.token_file.read_text().strip()
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if self._session is None:
            raise RuntimeError("RemotePods is used outside 'async with'")
        data = None if body is None else jsonio.dumps(body)
        async with self._session.request(
            method, self.config.server + path, data=data, headers=self._headers()
        ) as response:
            raw = await response.read()
        try:
            return response.status, jsonio.loads(raw) if raw else {}
        except jsonio.JsonError:
            return response.status, {"message": raw[:200].decode(errors="replace")}

    async def _must(
        self, method: str, path: str, body: Any = None, ok: Collection[int] = ()
    ) -> Any:
        try:
            status, answer = await self._call(method, path, body)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RemoteClusterError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        if status >= 400 and status not in ok:
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            raise RemoteClusterError(f"{method} {path}: HTTP {status} {message}".strip())
        return answer

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    # ------------------------------------------------------------ the run

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(ssl=self.config.ssl_context() or False, limit=16)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self._timeout_s)
        )
        try:
            await self._own_namespace()
            await self._delete_our_pods()
        except BaseException:
            await self._session.close()
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
                await self._must("DELETE", f"/api/v1/namespaces/{self.namespace}", ok=(404,))
        finally:
            if self._session is not None:
                await self._session.close()

    async def _own_namespace(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}"
        found = await self._must("GET", path, ok=(404,))
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
        await self._must("POST", "/api/v1/namespaces", body)
        self._made_namespace = True

    async def _delete_our_pods(self) -> None:
        """Pods of this or an earlier (crashed) run still hold GPUs: delete them."""
        listing = await self._must("GET", self._pods_path(), ok=(404,))
        for pod in listing.get("items") or []:
            meta = pod.get("metadata") or {}
            if (meta.get("labels") or {}).get(OWNER_LABEL) == OWNER:
                await self._must("DELETE", f"{self._pods_path()}/{meta['name']}", ok=(404,))
                self.deleted += 1

    async def missing_nodes(self, names: Collection[str]) -> list[str]:
        """The names among ``names`` that the cluster has no Node for."""
        listing = await self._must("GET", "/api/v1/nodes")
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
        stored: Obj = await self._must("POST", self._pods_path(), pod)
        self.created += 1
        return stored

    async def delete(self, name: str) -> None:
        await self._must("DELETE", f"{self._pods_path()}/{name}", ok=(404,))
        self.deleted += 1
