"""Where the console's objects come from and where its writes go: a cluster file or the API.

Layer: I/O. Lists and gets objects (plain dicts, ``kind`` filled in) and sends patches
and creations; builds the extender's own cache from the nodes and pods so that the
console counts GPUs exactly as the extender does. Must not decide anything about the
objects: the PURE modules of the console do.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from cluster.cache import ClusterCache
from cluster.clock import Clock
from cluster.feed import LIVE_PODS, CacheFeed
from cluster.files import load_objects
from cluster.kube import ApiError, JsonObject, KubeClient
from cluster.snapshot import Snapshot

KUEUE_API: Final = "/apis/kueue.x-k8s.io/v1beta2"
COLLECTIONS: Final = {
    "Node": ("/api/v1", "nodes"),
    "Pod": ("/api/v1", "pods"),
    "ResourceFlavor": (KUEUE_API, "resourceflavors"),
    "Topology": (KUEUE_API, "topologies"),
    "ClusterQueue": (KUEUE_API, "clusterqueues"),
    "LocalQueue": (KUEUE_API, "localqueues"),
    "WorkloadPriorityClass": (KUEUE_API, "workloadpriorityclasses"),
    "Workload": (KUEUE_API, "workloads"),
    "Job": ("/apis/batch/v1", "jobs"),
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets"),
    "Event": ("/api/v1", "events"),
    "ResourceQuota": ("/api/v1", "resourcequotas"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
}
"""Each kind the console reads, by API group version and resource."""
KUEUE_KINDS: Final = ("ResourceFlavor", "Topology", "ClusterQueue", "LocalQueue")


class ReadOnlyError(Exception):
    """A write asked of a cluster file."""


class Source(Protocol):
    """A cluster the console reads (and, through the API, writes)."""

    @property
    def writable(self) -> bool: ...

    async def objects(self, kinds: Collection[str]) -> list[JsonObject]: ...

    async def node(self, name: str) -> JsonObject | None: ...

    async def get(self, kind: str, namespace: str, name: str) -> JsonObject | None:
        """One namespaced object of ``kind`` (``COLLECTIONS``); None: there is none."""
        ...

    async def namespaced(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[JsonObject]:
        """The objects of ``kind`` in ``namespace`` that carry every one of ``labels``."""
        ...

    async def patch_node(self, name: str, patch: JsonObject) -> JsonObject: ...

    async def create(self, path: str, obj: JsonObject) -> JsonObject: ...


class FileSource:
    """Objects from a YAML or JSON file (``kubectl get -o yaml``); it takes no writes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._objects: list[JsonObject] | None = None

    @property
    def writable(self) -> bool:
        return False

    def _all(self) -> list[JsonObject]:
        if self._objects is None:
            self._objects = load_objects(self._path)
        return self._objects

    async def objects(self, kinds: Collection[str]) -> list[JsonObject]:
        return [obj for obj in self._all() if obj.get("kind") in kinds]

    async def node(self, name: str) -> JsonObject | None:
        for obj in await self.objects(("Node",)):
            if obj.get("metadata", {}).get("name") == name:
                return obj
        return None

    async def get(self, kind: str, namespace: str, name: str) -> JsonObject | None:
        for obj in await self.namespaced(kind, namespace):
            if obj.get("metadata", {}).get("name") == name:
                return obj
        return None

    async def namespaced(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[JsonObject]:
        found = []
        for obj in await self.objects((kind,)):
            meta = obj.get("metadata") or {}
            carried = meta.get("labels") or {}
            if (meta.get("namespace") or "default") == namespace and all(
                carried.get(k) == v for k, v in (labels or {}).items()
            ):
                found.append(obj)
        return found

    async def patch_node(self, name: str, patch: JsonObject) -> JsonObject:
        raise ReadOnlyError(f"{self._path} is a file: nothing is written to it")

    async def create(self, path: str, obj: JsonObject) -> JsonObject:
        raise ReadOnlyError(f"{self._path} is a file: nothing is written to it")


class ApiSource:
    """Objects from kube-apiserver through one ``KubeClient``. A Kueue kind the server
    does not serve (Kueue not installed) lists as nothing."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    @property
    def writable(self) -> bool:
        return True

    async def objects(self, kinds: Collection[str]) -> list[JsonObject]:
        found: list[JsonObject] = []
        for kind in kinds:
            group_version, resource = COLLECTIONS[kind]
            params = {"fieldSelector": LIVE_PODS} if kind == "Pod" else None
            try:
                items, _ = await self._client.list(f"{group_version}/{resource}", params)
            except ApiError as exc:
                if exc.status == 404 and group_version == KUEUE_API:
                    continue
                raise
            for item in items:
                # the API leaves kind and apiVersion off a list's items
                item.setdefault("kind", kind)
                item.setdefault(
                    "apiVersion", group_version.removeprefix("/api/").removeprefix("/apis/")
                )
            found.extend(items)
        return found

    async def node(self, name: str) -> JsonObject | None:
        try:
            return await self._client.get_json(f"/api/v1/nodes/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def get(self, kind: str, namespace: str, name: str) -> JsonObject | None:
        group_version, resource = COLLECTIONS[kind]
        try:
            obj = await self._client.get_json(
                f"{group_version}/namespaces/{namespace}/{resource}/{name}"
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        obj.setdefault("kind", kind)
        return obj

    async def namespaced(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[JsonObject]:
        group_version, resource = COLLECTIONS[kind]
        params = {}
        if labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        try:
            items, _ = await self._client.list(
                f"{group_version}/namespaces/{namespace}/{resource}", params
            )
        except ApiError as exc:
            # a kind whose API is not served (Kueue or JobSet not installed) has none
            if exc.status == 404 and kind not in ("Pod", "Event", "Job"):
                return []
            raise
        for item in items:
            item.setdefault("kind", kind)
        return items

    async def proxy_get(self, path: str, params: Mapping[str, str]) -> JsonObject:
        """GET through kube-apiserver (a pod's ``…/proxy/…`` path)."""
        return await self._client.get_json(path, params)

    async def patch_node(self, name: str, patch: JsonObject) -> JsonObject:
        return await self._client.patch_json(f"/api/v1/nodes/{name}", patch, "merge")

    async def create(self, path: str, obj: JsonObject) -> JsonObject:
        return await self._client.post_json(path, obj)


async def resource_quotas(
    source: Source, namespace: str | None = None
) -> tuple[list[JsonObject], tuple[str, ...]]:
    """The ResourceQuotas (of one namespace, or all), and a note when they cannot be read
    (a role without them): a quota unseen is a conflict not named, not a failure."""
    try:
        if namespace is None:
            return await source.objects(("ResourceQuota",)), ()
        return await source.namespaced("ResourceQuota", namespace), ()
    except ApiError as exc:
        if exc.status in (401, 403, 404):
            return [], (f"note: cannot read ResourceQuotas ({exc}): conflicts with them unchecked",)
        raise


def build_snapshot(
    objects: Sequence[dict[str, Any]], levels: Sequence[str], clock: Clock
) -> tuple[Snapshot, tuple[str, ...]]:
    """The extender's cache fed these nodes and pods, as a snapshot; and the problems
    the cache found (malformed annotations, over-committed GPUs)."""
    cache = ClusterCache(clock)
    CacheFeed(cache, levels=levels).load(objects)
    snapshot = cache.snapshot()
    problems = [f"node {n.name}: {p}" for n in snapshot.nodes.values() for p in n.problems]
    return snapshot, (*problems, *cache.problems)
