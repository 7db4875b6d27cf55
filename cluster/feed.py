"""Feeds the cluster cache: from the API through informers, or from a file.

Layer: I/O. The glue between raw Kubernetes objects and the cache, which is the cache's
one writer: it converts each object with ``cluster.convert`` as it arrives and hands the
record to the cache. Must not decide placement, and must not let one bad object stop the
stream: an object that cannot be converted is logged and skipped.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cluster import jsonio, logs
from cluster.cache import ClusterCache
from cluster.convert.nodes import node_from_json
from cluster.convert.pods import pod_from_json
from cluster.convert.raw import ConversionError
from cluster.files import load_objects
from cluster.informer import Informer, ListWatchClient
from cluster.model import NodeName, NodeState, PodKey, pod_key

log = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/pods"
# Finished pods hold no GPUs; the API drops them from the watch (as DELETED) once they
# stop matching, so the cache never has to hold the cluster's whole pod history.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"

T = TypeVar("T")


def _converted(
    objs: Iterable[Mapping[str, Any]], convert: Callable[[Mapping[str, Any]], T]
) -> Iterator[T]:
    for obj in objs:
        try:
            yield convert(obj)
        except ConversionError as exc:
            log.warning("object skipped", extra=logs.fields(reason=str(exc)))


def _give_back_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; nothing
    where there is none). The blobs of ``load_file`` lived on the C heap, and glibc
    keeps freed pages below its top otherwise: about 600 MB of them at 150,000 pods."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _parsed(blobs: list[bytes]) -> Iterator[dict[str, Any]]:
    """Each JSON blob parsed, releasing the blob once it has been."""
    for i, blob in enumerate(blobs):
        blobs[i] = b""
        yield jsonio.loads(blob)


@dataclass(frozen=True, slots=True)
class CacheFeed:
    """Callbacks that turn raw watch traffic into cache writes."""

    cache: ClusterCache
    levels: Sequence[str] = ()

    def _node(self, obj: Mapping[str, Any]) -> NodeState:
        return node_from_json(obj, self.levels)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.cache.replace_nodes(_converted(items, self._node))

    def node_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            name = obj.get("metadata", {}).get("name")
            if isinstance(name, str):
                self.cache.delete_node(NodeName(name))
            return
        for node in _converted((obj,), self._node):
            self.cache.upsert_node(node)

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.cache.replace_pods(_converted(items, pod_from_json))

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            key, uid = _pod_identity(obj)
            if key is not None:
                self.cache.delete_pod(key, uid)
            return
        for pod in _converted((obj,), pod_from_json):
            self.cache.upsert_pod(pod)

    def load(self, objects: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
        """Standalone mode: nodes and pods from one list of objects. Returns their counts."""
        nodes = [obj for obj in objects if obj.get("kind") == "Node"]
        pods = [obj for obj in objects if obj.get("kind") == "Pod"]
        self.replace_nodes(nodes)
        self.replace_pods(pods)
        return len(nodes), len(pods)

    def load_file(
        self, path: Path, *, others: Callable[[Mapping[str, Any]], None] | None = None
    ) -> tuple[int, int]:
        """``load`` from a file, one object at a time; each object of another kind goes
        to ``others`` (the extender's ResourceFlavors), when given.

        The file is parsed whole (as ``load_objects`` must, for YAML and Lists), then each
        object is set aside as compact JSON and the parsed tree dropped before anything
        is converted; each object is parsed again on its own just before it is converted.
        Converting straight from the tree would leave each record among the tree's dead
        dicts, and the allocator can give a block back only when all of it is free: at
        150,000 pods that kept about 600 MB resident for 100 MB of records.
        """
        nodes: list[bytes] = []
        pods: list[bytes] = []
        objects = load_objects(path)
        while objects:
            obj = objects.pop()
            kind = obj.get("kind")
            if kind in ("Node", "Pod"):
                (nodes if kind == "Node" else pods).append(jsonio.dumps(obj))
            elif others is not None:
                others(obj)
        del objects
        nodes.reverse()
        pods.reverse()
        self.replace_nodes(_parsed(nodes))
        self.replace_pods(_parsed(pods))
        _give_back_free_memory()
        return len(nodes), len(pods)

    def informers(self, client: ListWatchClient, **options: Any) -> tuple[Informer, Informer]:
        """A node and a pod informer writing into the cache; run both, wait for both synced."""
        nodes = Informer(
            client, NODES_PATH, on_replace=self.replace_nodes, on_event=self.node_event, **options
        )
        pods = Informer(
            client,
            PODS_PATH,
            on_replace=self.replace_pods,
            on_event=self.pod_event,
            field_selector=LIVE_PODS,
            **options,
        )
        return nodes, pods


def _pod_identity(obj: Mapping[str, Any]) -> tuple[PodKey | None, str | None]:
    metadata = obj.get("metadata") or {}
    name, namespace = metadata.get("name"), metadata.get("namespace") or "default"
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None, None
    uid = metadata.get("uid")
    return pod_key(namespace, name), uid if isinstance(uid, str) else None


async def run_all(informers: Sequence[Informer]) -> None:
    """Run informers together; if one ends with an error, the others are cancelled."""
    async with asyncio.TaskGroup() as group:
        for informer in informers:
            group.create_task(informer.run())
