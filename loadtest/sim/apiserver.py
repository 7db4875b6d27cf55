"""A minimal kube-apiserver for the extender: nodes and pods, list + watch, bind.

Layer: I/O. An aiohttp server on 127.0.0.1 that serves what the extender's informers and
``ApiBinder`` use, and nothing else: ``GET /api/v1/nodes|pods`` (one page, with the
list's resourceVersion), the same with ``watch=true`` (newline-delimited JSON events
from a resourceVersion, ``ERROR`` 410 when it is older than the kept history), ``GET``
of one pod, and ``POST .../pods/{name}/binding`` (copying the Binding's annotations onto
the pod, as kube-apiserver does). The simulator
(kube-apiserver's other clients: the job controller, the kubelet) writes through
``put``/``delete`` in the same process. It also takes the writes a remote-mode run
makes through a kubeconfig (``loadtest.sim.remote_pods``): namespaces (GET, POST, DELETE),
pod create (POST, which assigns the uid), pod delete and a namespace's pod list, so
that tests can stand it in for a real cluster. Must not decide anything about scheduling.

Why it exists: with ``--cluster-file`` the extender loads the cluster once and has no
watch, so it never learns that a pod ended and its GPUs would stay taken forever. A
load test with pods that come and go needs the extender's real watch path, so the
extender runs with ``--kubeconfig`` pointing here. Selectors are ignored (the
extender's field selector only drops finished pods, and finished pods are deleted here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from cluster import jsonio

Obj = dict[str, Any]
NODES = "nodes"
PODS = "pods"
NAMESPACES = "namespaces"
HISTORY = 20_000
"""Events kept for watches that resume from an older resourceVersion."""


def _key(obj: Obj) -> str:
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    body.update(reason=reason, message=message)
    return web.Response(status=code, body=jsonio.dumps(body), content_type="application/json")


@dataclass(slots=True, eq=False)
class _Watcher:
    collection: str
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)


class MiniApiServer:
    """``async with MiniApiServer() as api``; ``api.url``; ``api.kubeconfig(folder)``."""

    def __init__(self, on_bound: Callable[[str, str], None] | None = None) -> None:
        self.store: dict[str, dict[str, Obj]] = {NODES: {}, PODS: {}, NAMESPACES: {}}
        self.on_bound = on_bound
        """Called with (pod key, node) when a Binding lands."""
        self.bindings = 0
        self.created = self.deleted = 0
        """Pods created and deleted over HTTP (by a remote-mode run)."""
        self._uids = 0
        self._rv = 1
        self._history: deque[tuple[int, str, bytes]] = deque(maxlen=HISTORY)
        self._watchers: set[_Watcher] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/api/v1/{resource:nodes|pods}", self._collection)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}", self._get)
        app.router.add_delete("/api/v1/namespaces/{namespace}/pods/{name}", self._delete_pod)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._namespace_pods)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods", self._create_pod)
        app.router.add_get("/api/v1/namespaces/{name}", self._get_namespace)
        app.router.add_delete("/api/v1/namespaces/{name}", self._delete_namespace)
        app.router.add_post("/api/v1/namespaces", self._create_namespace)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", self._bind)
        self.app = app

    async def __aenter__(self) -> MiniApiServer:
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, folder: Path) -> Path:
        path = folder / "loadtest-apiserver.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "loadtest", "cluster": {"server": self.url}}],
            "users": [{"name": "loadtest", "user": {"token": "loadtest"}}],
            "contexts": [
                {"name": "loadtest", "context": {"cluster": "loadtest", "user": "loadtest"}}
            ],
            "current-context": "loadtest",
        }
        path.write_bytes(jsonio.dumps(config))
        return path

    # ------------------------------------------------------------ writes from the simulator

    def put(self, collection: str, obj: Obj) -> None:
        items = self.store[collection]
        key = _key(obj)
        event = "MODIFIED" if key in items else "ADDED"
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        items[key] = obj
        self._emit(collection, event, obj)

    def delete(self, collection: str, key: str) -> None:
        obj = self.store[collection].pop(key, None)
        if obj is None:
            return
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._emit(collection, "DELETED", obj)

    def _emit(self, collection: str, event: str, obj: Obj) -> None:
        line = jsonio.dumps({"type": event, "object": obj}) + b"\n"
        self._history.append((self._rv, collection, line))
        for watcher in self._watchers:
            if watcher.collection == collection:
                watcher.queue.put_nowait(line)

    # ------------------------------------------------------------ HTTP

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        collection = request.match_info["resource"]
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, collection)
        body = {
            "kind": "List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": list(self.store[collection].values()),
        }
        return web.Response(body=jsonio.dumps(body), content_type="application/json")

    async def _watch(self, request: web.Request, collection: str) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        watcher = _Watcher(collection)
        oldest = self._history[0][0] if self._history else self._rv + 1
        if since and since + 1 < oldest:
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
            gone.update(reason="Expired", message=f"too old resource version: {since}")
            watcher.queue.put_nowait(jsonio.dumps({"type": "ERROR", "object": gone}) + b"\n")
            watcher.queue.put_nowait(None)
        else:
            for rv, name, line in self._history:
                if rv > since and name == collection:
                    watcher.queue.put_nowait(line)
        self._watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        timeout_s = float(request.query.get("timeoutSeconds", "300"))
        try:
            await response.prepare(request)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while True:
                        chunk = await watcher.queue.get()
                        if chunk is None:
                            break
                        await response.write(chunk)
            await response.write_eof()
        except ConnectionError:
            pass  # the extender went away (stopped at the end of the run)
        finally:
            self._watchers.discard(watcher)
        return response

    async def _get(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        obj = self.store[PODS].get(key)
        if obj is None:
            return _status(404, "NotFound", f"pods {key!r} not found")
        return web.Response(body=jsonio.dumps(obj), content_type="application/json")

    async def _bind(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        obj = self.store[PODS].get(key)
        if obj is None:
            return _status(404, "NotFound", f"pods {key!r} not found")
        binding = jsonio.loads(await request.read())
        node = binding["target"]["name"]
        meta = binding.get("metadata") or {}
        uid = meta.get("uid")
        if uid and uid != obj["metadata"].get("uid"):
            return _status(409, "Conflict", f"pod {key} has another uid")
        if obj["spec"].get("nodeName"):
            return _status(409, "Conflict", f"pod {key} is already assigned to a node")
        bound = dict(obj)
        bound["spec"] = {**obj["spec"], "nodeName": node}
        # as kube-apiserver does: the Binding's annotations land on the pod as it is bound
        annotations = meta.get("annotations") or {}
        if annotations:
            old_annotations = obj["metadata"].get("annotations") or {}
            bound["metadata"] = {
                **obj["metadata"],
                "annotations": {**old_annotations, **annotations},
            }
        bound["status"] = {**obj.get("status", {}), "phase": "Running"}
        self.put(PODS, bound)
        self.bindings += 1
        if self.on_bound is not None:
            self.on_bound(key, node)
        body = {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        return web.Response(status=201, body=jsonio.dumps(body), content_type="application/json")

    # ------------------------------------------------------------ a remote-mode run's writes

    async def _create_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        if namespace not in self.store[NAMESPACES]:
            return _status(404, "NotFound", f"namespaces {namespace!r} not found")
        pod = jsonio.loads(await request.read())
        meta = pod.setdefault("metadata", {})
        meta["namespace"] = namespace
        if f"{namespace}/{meta.get('name')}" in self.store[PODS]:
            return _status(409, "AlreadyExists", f"pods {meta.get('name')!r} already exists")
        self._uids += 1
        meta["uid"] = f"mini-{self._uids:08d}"
        self.put(PODS, pod)
        self.created += 1
        return web.Response(status=201, body=jsonio.dumps(pod), content_type="application/json")

    async def _delete_pod(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        obj = self.store[PODS].get(key)
        if obj is None:
            return _status(404, "NotFound", f"pods {key!r} not found")
        self.delete(PODS, key)
        self.deleted += 1
        return web.Response(body=jsonio.dumps(obj), content_type="application/json")

    async def _namespace_pods(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        items = [p for p in self.store[PODS].values() if p["metadata"]["namespace"] == namespace]
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }
        return web.Response(body=jsonio.dumps(body), content_type="application/json")

    async def _get_namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        obj = self.store[NAMESPACES].get(name)
        if obj is None:
            return _status(404, "NotFound", f"namespaces {name!r} not found")
        return web.Response(body=jsonio.dumps(obj), content_type="application/json")

    async def _create_namespace(self, request: web.Request) -> web.Response:
        obj = jsonio.loads(await request.read())
        if obj["metadata"]["name"] in self.store[NAMESPACES]:
            return _status(409, "AlreadyExists", "namespace already exists")
        self.put(NAMESPACES, obj)
        return web.Response(status=201, body=jsonio.dumps(obj), content_type="application/json")

    async def _delete_namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        obj = self.store[NAMESPACES].get(name)
        if obj is None:
            return _status(404, "NotFound", f"namespaces {name!r} not found")
        for key in [k for k, p in self.store[PODS].items() if p["metadata"]["namespace"] == name]:
            self.delete(PODS, key)
        self.delete(NAMESPACES, name)
        return web.Response(body=jsonio.dumps(obj), content_type="application/json")
