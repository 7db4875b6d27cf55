"""A fake kube-apiserver for integration tests: real HTTP(S) on 127.0.0.1, real watch streams.

Layer: test support (I/O). Plays the parts of kube-apiserver that Tessera talks to, over
real sockets: LIST with resourceVersion and ``limit``/``continue`` pages from one
snapshot, WATCH as chunked newline-delimited JSON with bookmarks, GET, POST (create, and
``pods/binding`` with kube-apiserver's checks and its copy of the Binding's annotations
onto the pod), PATCH (merge, strategic as merge, JSON patch), bearer-token checks and
TLS. Tests steer it from outside, the way a cluster misbehaves: hold back events, compact
history (410 Gone as an ERROR event or as HTTP 410), end watches (server-side timeout),
drop connections mid-stream, fail the next requests, go down and come back on the same
address (``go_down``, ``come_back``). Must not import Tessera code: it is the other side
of the wire.

Collections are named by their cluster-wide path (``/api/v1/pods``); namespaced paths
(``/api/v1/namespaces/ns/pods``) are views of the same collection. To serve more, add
routes to ``server.app.router`` before ``start()`` and use ``store``/``notify``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import socket
import ssl
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

from cluster import jsonio
from server.tls import server_context
from tests.certfiles import make_material

Obj = dict[str, Any]
GROUP_VERSION = r"{gv:api/v1|apis/[^/]+/[^/]+}"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the server received it."""

    method: str
    kind: str
    """``list``, ``watch``, ``get``, ``post`` or ``patch``."""
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonio.loads(self.body)


@dataclass(frozen=True, slots=True)
class Fault:
    """Answer the next matching request with this HTTP status and a Status body."""

    kind: Literal["list", "watch", "get", "post", "patch", "any"]
    status: int
    reason: str = "InternalError"
    message: str = "injected fault"


@dataclass(slots=True, eq=False)
class _Watcher:
    collection: str
    namespace: str | None
    labels: str
    fields: str
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    drop_after: int | None = None


def status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonio.dumps(body), status=status, content_type="application/json")


def _status_response(code: int, reason: str, message: str) -> web.Response:
    return _json_response(status_body(code, reason, message), status=code)


def _line(event: str, obj: Obj) -> bytes:
    return jsonio.dumps({"type": event, "object": obj}) + b"\n"


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _dig(obj: Obj, dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _selector_matches(selector: str, lookup: Callable[[str], str | None]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, want = term.split("!=", 1)
            if lookup(key.strip()) == want.strip():
                return False
        elif "=" in term:
            key, want = term.replace("==", "=").split("=", 1)
            if lookup(key.strip()) != want.strip():
                return False
        elif term.startswith("!"):
            if lookup(term[1:]) is not None:
                return False
        elif lookup(term) is None:
            return False
    return True


def _matches(obj: Obj, namespace: str | None, labels: str, fields: str) -> bool:
    meta = obj.get("metadata") or {}
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    obj_labels = meta.get("labels") or {}
    return _selector_matches(labels, obj_labels.get) and _selector_matches(
        fields, lambda path: _dig(obj, path)
    )


def _as_seen_by(watcher: _Watcher, event: str, obj: Obj, old: Obj | None) -> str | None:
    """The event a selector-filtered watch reports, as kube-apiserver's watch cache does:
    an object that starts matching is ADDED, one that stops matching is DELETED."""
    now = _matches(obj, watcher.namespace, watcher.labels, watcher.fields)
    before = old is not None and _matches(old, watcher.namespace, watcher.labels, watcher.fields)
    if event == "MODIFIED" and now != before:
        return "ADDED" if now else "DELETED"
    return event if now else None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 add/remove/replace/test: enough for the patches Tessera sends."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                parent[index] = op["value"]
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise ValueError(f"replace of missing {op['path']}")
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"unsupported op {kind}")
    return doc


class FakeApiServer:
    """An in-memory kube-apiserver. ``async with FakeApiServer() as api: api.url``."""

    def __init__(
        self,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        too_old: Literal["event", "http"] = "event",
    ) -> None:
        self.token = token
        self.too_old = too_old
        """How a watch from a compacted resourceVersion is refused: kube-apiserver's watch
        cache answers 200 with an ERROR event; older paths answer HTTP 410."""
        self.requests: list[Recorded] = []
        self.faults: deque[Fault] = deque()
        self.before_list: Callable[[Recorded], Awaitable[None]] | None = None
        """Awaited before each LIST page is served: hold a list, or change things mid-list."""
        self.before_get: Callable[[Recorded], Awaitable[None]] | None = None
        """Awaited before each GET of one object is served: hold a lookup."""
        self.store: dict[str, dict[str, Obj]] = {}
        self._ssl = ssl_context
        self._rv = 100
        self._oldest = 0
        self._history: list[tuple[int, str, str, Obj, Obj | None]] = []
        self._snapshots: dict[str, tuple[int, list[Obj]]] = {}
        self._watchers: set[_Watcher] = set()
        self._withheld = False
        self._runner: web.AppRunner | None = None
        self._port_holder: socket.socket | None = None
        self.url = ""
        self.app = web.Application(middlewares=[self._middleware])
        gv = GROUP_VERSION
        self.app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", self._bind)
        self.app.router.add_get(f"/{gv}/namespaces/{{namespace}}/{{resource}}", self._collection)
        self.app.router.add_get(f"/{gv}/namespaces/{{namespace}}/{{resource}}/{{name}}", self._get)
        self.app.router.add_post(f"/{gv}/namespaces/{{namespace}}/{{resource}}", self._create)
        self.app.router.add_patch(
            f"/{gv}/namespaces/{{namespace}}/{{resource}}/{{name}}", self._patch
        )
        self.app.router.add_delete(
            f"/{gv}/namespaces/{{namespace}}/{{resource}}/{{name}}", self._delete
        )
        self.app.router.add_get(f"/{gv}/{{resource}}", self._collection)
        self.app.router.add_get(f"/{gv}/{{resource}}/{{name}}", self._get)
        self.app.router.add_post(f"/{gv}/{{resource}}", self._create)
        self.app.router.add_patch(f"/{gv}/{{resource}}/{{name}}", self._patch)
        self.app.router.add_delete(f"/{gv}/{{resource}}/{{name}}", self._delete)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        # The port is held by a socket of the server's own that never listens: while the
        # server is down, connections to it are refused and nothing else can take it.
        # Both that socket and the listening ones share it through SO_REUSEPORT.
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        self._port_holder = holder
        port = holder.getsockname()[1]
        self.url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        await self._serve(port)
        return self.url

    async def _serve(self, port: int) -> None:
        # handler_cancellation: a watch handler learns at once that its client went away.
        runner = web.AppRunner(
            self.app, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=self._ssl, reuse_port=True)
        await site.start()
        self._runner = runner

    async def go_down(self) -> None:
        """kube-apiserver stops: open watches break mid-stream, and every connection after
        is refused, until ``come_back``. The objects stay (they are in etcd)."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def come_back(self) -> None:
        """kube-apiserver starts again on the same address. Its watch cache starts at the
        current resourceVersion, so a watch from before the restart is answered 410 and the
        client has to list again."""
        assert self._port_holder is not None, "come_back needs a server that was started"
        self.compact()
        await self._serve(self._port_holder.getsockname()[1])

    async def close(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._port_holder is not None:
            self._port_holder.close()
            self._port_holder = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ state, from the test

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def objects(self, collection: str) -> dict[str, Obj]:
        """``name`` (or ``namespace/name``) → object: what a consumer should end up with."""
        return copy.deepcopy(self.store.get(collection, {}))

    def put(self, collection: str, obj: Obj) -> Obj:
        """Create or replace an object; watchers see ADDED or MODIFIED."""
        items = self.store.setdefault(collection, {})
        key = object_key(obj)
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        old = items.get(key)
        event = "MODIFIED" if old is not None else "ADDED"
        items[key] = stored
        self.notify(collection, event, stored, old)
        return copy.deepcopy(stored)

    def delete(self, collection: str, key: str) -> None:
        """Remove an object; watchers see DELETED with its last state."""
        obj = self.store[collection].pop(key)
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.notify(collection, "DELETED", obj)

    def notify(self, collection: str, event: str, obj: Obj, old: Obj | None = None) -> None:
        """Record an event in history and stream it to the watchers that match it."""
        rv = int(obj["metadata"]["resourceVersion"])
        self._history.append((rv, collection, event, copy.deepcopy(obj), old))
        if self._withheld:
            return
        for watcher in list(self._watchers):
            seen = _as_seen_by(watcher, event, obj, old)
            if watcher.collection == collection and seen is not None:
                watcher.queue.put_nowait(("event", (seen, copy.deepcopy(obj))))

    @contextlib.contextmanager
    def withheld(self) -> Iterator[None]:
        """Changes made inside are kept from open watches (a lagging watch cache)."""
        self._withheld = True
        try:
            yield
        finally:
            self._withheld = False

    def compact(self) -> None:
        """Forget history (etcd compaction): watches from older versions get 410."""
        self._oldest = self._rv
        self._history.clear()
        self._snapshots.clear()

    # ------------------------------------------------------------ steering open watches

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    def _watching(self, collection: str | None) -> list[_Watcher]:
        return [w for w in self._watchers if collection in (None, w.collection)]

    def _control(self, item: tuple[str, Any], collection: str | None = None) -> None:
        for watcher in self._watching(collection):
            watcher.queue.put_nowait(item)

    def send_bookmark(self) -> str:
        """A BOOKMARK at the current resourceVersion to watches that asked for them."""
        self._control(("bookmark", str(self._rv)))
        return str(self._rv)

    def end_watches(self) -> None:
        """Close open watches cleanly, as when their ``timeoutSeconds`` runs out."""
        self._control(("end", None))

    def expire_watches(self, collection: str | None = None) -> None:
        """Send open watches (of ``collection``, or all) an ERROR event with a 410 Status,
        then close them."""
        self._control(("error", 410), collection)

    def drop_watches(self, after_events: int = 0, collection: str | None = None) -> None:
        """Cut open watches' connections (of ``collection``, or all; no final chunk)
        after ``after_events`` more."""
        for watcher in self._watching(collection):
            watcher.drop_after = after_events
            if after_events == 0:
                watcher.queue.put_nowait(("drop", None))

    def requests_of(self, kind: str) -> list[Recorded]:
        """The requests of one kind (``list``, ``watch``, ...) in the order they came."""
        return [r for r in self.requests if r.kind == kind]

    # ------------------------------------------------------------ HTTP

    @web.middleware
    async def _middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        body = await request.read()
        recorded = Recorded(
            request.method,
            _kind(request),
            request.path,
            dict(request.query),
            dict(request.headers),
            body,
        )
        self.requests.append(recorded)
        if self.token is not None and request.headers.get("Authorization") != (
            f"Bearer {self.token}"
        ):
            return _status_response(401, "Unauthorized", "Unauthorized")
        if self.faults:
            fault = self.faults[0]
            if fault.kind in ("any", recorded.kind):
                self.faults.popleft()
                return _status_response(fault.status, fault.reason, fault.message)
        return await handler(request)

    def _collection_of(self, request: web.Request) -> str:
        return f"/{request.match_info['gv']}/{request.match_info['resource']}"

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request)
        if self.before_list is not None:
            await self.before_list(self.requests[-1])
        collection = self._collection_of(request)
        namespace = request.match_info.get("namespace")
        labels = request.query.get("labelSelector", "")
        fields = request.query.get("fieldSelector", "")
        token = request.query.get("continue")
        if token:
            snapshot_id, _, offset_text = base64.b64decode(token).decode().partition(":")
            if snapshot_id not in self._snapshots:
                return _status_response(
                    410, "Expired", "The provided continue parameter is too old"
                )
            rv, items = self._snapshots[snapshot_id]
            offset = int(offset_text)
        else:
            snapshot_id = uuid.uuid4().hex
            rv = self._rv
            items = [
                copy.deepcopy(obj)
                for _, obj in sorted(self.store.get(collection, {}).items())
                if _matches(obj, namespace, labels, fields)
            ]
            offset = 0
        limit = int(request.query.get("limit", "0") or 0)
        end = offset + limit if limit > 0 else len(items)
        metadata: Obj = {"resourceVersion": str(rv)}
        if end < len(items):
            self._snapshots[snapshot_id] = (rv, items)
            metadata["continue"] = base64.b64encode(f"{snapshot_id}:{end}".encode()).decode()
            metadata["remainingItemCount"] = len(items) - end
        return _json_response(
            {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": items[offset:end]}
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        collection = self._collection_of(request)
        since_text = request.query.get("resourceVersion", "")
        since = int(since_text) if since_text not in ("", "0") else None
        if since is not None and since < self._oldest and self.too_old == "http":
            return _status_response(410, "Expired", f"too old resource version: {since}")
        watcher = _Watcher(
            collection=collection,
            namespace=request.match_info.get("namespace"),
            labels=request.query.get("labelSelector", ""),
            fields=request.query.get("fieldSelector", ""),
            bookmarks=request.query.get("allowWatchBookmarks") == "true",
        )
        # Registered and replayed with no await between: no event is missed or doubled.
        self._replay(watcher, since)
        self._watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            timeout_s = float(request.query.get("timeoutSeconds", "1800"))
            async with asyncio.timeout(timeout_s):
                if await _stream(watcher, request, response):
                    return response
            await response.write_eof()
        except TimeoutError:
            await _quietly_end(response)
        except ConnectionError:
            pass
        finally:
            self._watchers.discard(watcher)
        return response

    def _replay(self, watcher: _Watcher, since: int | None) -> None:
        """What a new watch sees first: 410 for a version older than the history, every
        object for none, else the history's events after ``since``."""
        if since is not None and since < self._oldest:
            watcher.queue.put_nowait(("error", 410))
        elif since is None:
            for obj in self.store.get(watcher.collection, {}).values():
                if _matches(obj, watcher.namespace, watcher.labels, watcher.fields):
                    watcher.queue.put_nowait(("event", ("ADDED", copy.deepcopy(obj))))
        else:
            for rv, name, event, obj, old in self._history:
                seen = _as_seen_by(watcher, event, obj, old)
                if rv > since and name == watcher.collection and seen is not None:
                    watcher.queue.put_nowait(("event", (seen, copy.deepcopy(obj))))

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if self.before_get is not None:
            await self.before_get(self.requests[-1])
        key = _key(request)
        obj = self.store.get(self._collection_of(request), {}).get(key)
        if obj is None:
            return _status_response(404, "NotFound", f"{key} not found")
        return _json_response(obj)

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        collection, key = self._collection_of(request), _key(request)
        obj = self.store.get(collection, {}).get(key)
        if obj is None:
            return _status_response(404, "NotFound", f"{key} not found")
        self.delete(collection, key)
        return _json_response(obj)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        obj = jsonio.loads(await request.read())
        meta = obj.setdefault("metadata", {})
        if "namespace" in request.match_info:
            meta["namespace"] = request.match_info["namespace"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        collection = self._collection_of(request)
        if object_key(obj) in self.store.get(collection, {}):
            return _status_response(409, "AlreadyExists", f"{object_key(obj)} already exists")
        meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return _json_response(self.put(collection, obj), status=201)

    async def _patch(self, request: web.Request) -> web.StreamResponse:
        collection = self._collection_of(request)
        key = _key(request)
        current = self.store.get(collection, {}).get(key)
        if current is None:
            return _status_response(404, "NotFound", f"{key} not found")
        content_type = request.headers.get("Content-Type", "")
        body = jsonio.loads(await request.read())
        try:
            if content_type == "application/json-patch+json":
                patched = json_patch(current, body)
            elif content_type in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                # Strategic merge differs only for lists with merge keys; not needed here.
                patched = merge_patch(current, body)
            else:
                return _status_response(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown "
                    f"format - accepted media types include: application/json-patch+json, "
                    f"application/merge-patch+json, got {content_type}",
                )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return _status_response(422, "Invalid", f"patch failed: {exc}")
        return _json_response(self.put(collection, patched))

    async def _bind(self, request: web.Request) -> web.StreamResponse:
        """``pods/{name}/binding`` as kube-apiserver v1.36 serves it (``BindingREST`` in
        pkg/registry/core/pod/storage/storage.go): the Binding's name and namespace must
        be the URL's; its ``metadata.uid`` (and ``resourceVersion``) are preconditions;
        a pod being deleted or already bound is a conflict; ``setPodNodeAndMetadata``
        sets ``spec.nodeName``, copies the Binding's annotations onto the pod (over any
        of the same key) and marks it scheduled, in one update."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        binding = jsonio.loads(await request.read())
        meta = binding.get("metadata") or {}
        if meta.get("name") != name:
            return _status_response(
                400, "BadRequest", "name in URL does not match name in Binding object"
            )
        if meta.get("namespace", namespace) != namespace:
            return _status_response(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent "
                "on the request",
            )
        node = (binding.get("target") or {}).get("name", "")
        if not node:
            return _status_response(422, "Invalid", "target.name: Required value")
        pod = self.store.get("/api/v1/pods", {}).get(f"{namespace}/{name}")
        if pod is None:
            return _status_response(404, "NotFound", f'pods "{name}" not found')
        stored = pod["metadata"]
        conflict = ""
        for field_name in ("uid", "resourceVersion"):
            wanted = meta.get(field_name)
            if wanted and wanted != stored.get(field_name):
                conflict = (
                    f"Precondition failed: {field_name} in precondition: {wanted}, "
                    f"{field_name} in object meta: {stored.get(field_name)}"
                )
        bound = pod.get("spec", {}).get("nodeName")
        if not conflict and stored.get("deletionTimestamp"):
            conflict = f"pod {name} is being deleted, cannot be assigned to a host"
        if not conflict and bound:
            conflict = f"pod {name} is already assigned to node {bound!r}"
        if conflict:
            message = f'Operation cannot be fulfilled on pods/binding "{name}": {conflict}'
            return _status_response(409, "Conflict", message)
        pod = copy.deepcopy(pod)
        pod.setdefault("spec", {})["nodeName"] = node
        annotations = meta.get("annotations") or {}
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True"})
        self.put("/api/v1/pods", pod)
        return _json_response(status_body(201, "", ""), status=201)


def write_kubeconfig(folder: Path, api: FakeApiServer, user: str) -> Path:
    """A kubeconfig file for a server under test to reach ``api`` as ``user``, with the
    fake's bearer token."""
    path = folder / "kubeconfig"
    token = {"token": api.token} if api.token is not None else {}
    path.write_bytes(
        jsonio.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": user, "user": token}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": user}}],
                "current-context": "fake",
            }
        )
    )
    return path


def _kind(request: web.Request) -> str:
    if request.method == "GET":
        if request.query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if "name" in request.match_info else "list"
    return request.method.lower()


def _key(request: web.Request) -> str:
    name = request.match_info["name"]
    namespace = request.match_info.get("namespace")
    return f"{namespace}/{name}" if namespace else name


async def _quietly_end(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionError):
        await response.write_eof()


def _abort(request: web.Request) -> None:
    # Close the socket without the chunked terminator: the client sees a truncated body.
    transport = request.transport
    if transport is not None:
        transport.abort()


# ---------------------------------------------------------------- TLS


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A throwaway CA, a serving certificate for 127.0.0.1/localhost and a client cert,
    made by the ``certs`` package like every other certificate in the tests."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        return server_context(
            self.server_cert,
            self.server_key,
            client_ca=self.ca_cert if require_client_cert else None,
        )


def make_tls(directory: Path) -> TlsFiles:
    """Write a fresh CA and certificates signed by it into ``directory``."""
    material = make_material(directory)
    return TlsFiles(
        ca_cert=material["ca.crt"],
        server_cert=material["webhook.crt"],
        server_key=material["webhook.key"],
        client_cert=material["kube-scheduler.crt"],
        client_key=material["kube-scheduler.key"],
    )


async def _stream(watcher: _Watcher, request: web.Request, response: web.StreamResponse) -> bool:
    """Write the watcher's queue to the response until it ends; true when the
    connection was dropped on purpose (the response must not be ended cleanly)."""
    while True:
        kind, payload = await watcher.queue.get()
        if kind == "end":
            return False
        if kind == "drop":
            _abort(request)
            return True
        if kind == "error":
            status = status_body(payload, "Expired", "too old resource version")
            await response.write(_line("ERROR", status))
            return False
        if kind == "bookmark":
            if watcher.bookmarks:
                bookmark = {"metadata": {"resourceVersion": payload}}
                await response.write(_line("BOOKMARK", bookmark))
            continue
        event, obj = payload
        await response.write(_line(event, obj))
        if watcher.drop_after is not None:
            watcher.drop_after -= 1
            if watcher.drop_after <= 0:
                _abort(request)
                return True
