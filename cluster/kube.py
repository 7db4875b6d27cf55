"""The Kubernetes API client: where Tessera's bytes meet kube-apiserver's.

Layer: I/O. The only module that imports kubernetes_asyncio, and only to resolve a
kubeconfig (contexts, exec plugins, embedded data) into a ``KubeConfig``. Requests go
through one aiohttp session and are decoded with orjson (``cluster.jsonio``) into plain
dicts: kubernetes_asyncio's generated model classes are far too slow for lists and watches
of 100,000 pods and are never used here. Must not log or ``repr`` a token; tokens, keys and
certificates appear in logs by file path only. Must not make decisions about the objects
it carries.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import aiohttp
from yarl import URL

from cluster import jsonio, logs
from cluster.clock import Clock, SystemClock

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
"""One Kubernetes object (or Status, or List) as orjson decoded it."""
JsonObjects = list[JsonObject]
Params = Mapping[str, str]

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service-account token, CA bundle and namespace."""

TOKEN_RELOAD_S: Final = 60.0
"""How often a token file is re-read: bound service-account tokens rotate (about hourly,
and the kubelet refreshes them at 80% of their life), so a token read once goes stale."""

PatchType = Literal["merge", "strategic", "json"]
PATCH_CONTENT_TYPES: Final[Mapping[PatchType, str]] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}

METADATA_LIST_ACCEPT: Final = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
METADATA_WATCH_ACCEPT: Final = (
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)
"""What a list or watch of metadata only asks for, as client-go's metadata informers do:
each object's ``metadata`` without its spec and status, or (a server that cannot) the
whole object, which holds the same metadata."""

LIST_PAGE_SIZE: Final = 5000
"""Items a list asks for per page (``limit``). Not client-go's 500: kube-apiserver v1.36
spends CPU on each page in proportion to the whole collection, so a list of 150,000
pods (5,000 nodes) in pages of 500 cost it 17-20 s of CPU and took 20-23 s, in pages of
5,000, 3.3-4.1 s and 10.5-15 s (a page is then about 10 MB of JSON); the extender's
restart there went from 17-19 s to 13-15 s."""

WATCH_READ_GRACE_S: Final = 30.0
"""Extra seconds a watch may stay silent past its ``timeoutSeconds`` before the client
gives up on it: the server should have closed it by then, so the connection is dead."""


class KubeError(Exception):
    """Talking to kube-apiserver failed."""


class ConfigError(KubeError):
    """No usable connection settings: the message names the missing or bad piece."""


class TransportError(KubeError):
    """The connection failed or broke (refused, TLS, reset, truncated or garbled stream)."""


class ApiError(KubeError):
    """kube-apiserver answered with a failure ``Status`` (HTTP error or watch ERROR event)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, status_obj: object, *, http_status: int, http_reason: str) -> ApiError:
        """Read a ``metav1.Status``; fall back to the HTTP status line for anything else."""
        if isinstance(status_obj, dict):
            code = status_obj.get("code")
            reason = status_obj.get("reason")
            message = status_obj.get("message")
            return cls(
                code if isinstance(code, int) and code > 0 else http_status,
                reason if isinstance(reason, str) and reason else http_reason,
                message if isinstance(message, str) else "",
            )
        return cls(http_status, http_reason, "")

    @property
    def gone(self) -> bool:
        """The resourceVersion (or continue token) is too old: only a fresh list helps."""
        return self.status == 410


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream: ADDED, MODIFIED, DELETED or BOOKMARK, and the object.

    ERROR lines are not events: ``KubeClient.watch`` raises them as ``ApiError``.
    """

    type: str
    object: JsonObject

    @property
    def resource_version(self) -> str:
        metadata = self.object.get("metadata")
        if isinstance(metadata, dict):
            rv = metadata.get("resourceVersion")
            if isinstance(rv, str):
                return rv
        return ""


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """How to reach one kube-apiserver. Build it with one of the three constructors."""

    server: str
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        url = URL(self.server)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"server must be an http(s) URL, got {self.server!r}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("a client certificate needs both cert_file and key_file")
        if self.token is not None and self.token_file is not None:
            raise ConfigError("give a token or a token_file, not both")

    @classmethod
    def explicit(
        cls,
        server: str,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        insecure: bool = False,
    ) -> KubeConfig:
        """A server URL and credentials given directly (settings, flags, tests)."""
        return cls(
            server=server.rstrip("/"),
            token=token,
            token_file=token_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            insecure=insecure,
        )

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str],
        *,
        account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> KubeConfig:
        """The pod's own service account: ``KUBERNETES_SERVICE_HOST``/``_PORT`` from
        ``environ`` and the token and CA that the kubelet mounts in ``account_dir``.

        The token is kept as a file, not a value, so the client follows its rotation.
        """
        host = environ.get("KUBERNETES_SERVICE_HOST", "")
        port = environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port:
            raise ConfigError(
                "not running in a cluster: KUBERNETES_SERVICE_HOST and "
                "KUBERNETES_SERVICE_PORT must both be set"
            )
        token_file = account_dir / "token"
        ca_file = account_dir / "ca.crt"
        for path, what in ((token_file, "service-account token"), (ca_file, "cluster CA")):
            if not path.is_file() or path.stat().st_size == 0:
                raise ConfigError(f"{what} file {path} is missing or empty")
        # An IPv6 service address needs brackets in a URL.
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return cls(server=f"https://{netloc}", token_file=token_file, ca_file=ca_file)

    @classmethod
    async def of(
        cls, kubeconfig: str | os.PathLike[str] | None, environ: Mapping[str, str]
    ) -> KubeConfig:
        """A server's choice: the ``kubeconfig`` file when it names one, else the pod's own
        service account (``in_cluster``, from ``environ``)."""
        if kubeconfig is not None:
            return await cls.from_kubeconfig(kubeconfig)
        return cls.in_cluster(environ)

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | os.PathLike[str],
        *,
        context: str | None = None,
        temp_dir: Path | None = None,
    ) -> KubeConfig:
        """A kubeconfig file (``path`` may join several with ``:`` like ``$KUBECONFIG``).

        kubernetes_asyncio's loader resolves the context, runs exec plugins and writes
        embedded ``*-data`` to files in ``temp_dir`` (the system temp dir by default);
        the result is read back from the Configuration it fills. An exec plugin's token is
        taken once: a process that outlives it must load the kubeconfig again.
        """
        # Imported here: kubernetes_asyncio loads every generated model class (~0.5 s),
        # which in-cluster and explicit configurations should not pay for.
        from kubernetes_asyncio.client import Configuration  # noqa: PLC0415
        from kubernetes_asyncio.config import (  # noqa: PLC0415
            ConfigException,
            load_kube_config,
        )

        configuration = Configuration()
        try:
            await load_kube_config(
                config_file=os.fspath(path),
                context=context,
                client_configuration=configuration,
                persist_config=False,
                temp_file_path=None if temp_dir is None else os.fspath(temp_dir),
            )
        except (ConfigException, OSError) as exc:
            raise ConfigError(f"cannot load kubeconfig {os.fspath(path)}: {exc}") from None
        return cls._from_configuration(configuration)

    @classmethod
    def _from_configuration(cls, configuration: Any) -> KubeConfig:
        auth = str(configuration.api_key.get("BearerToken") or "")
        scheme, _, credential = auth.partition(" ")
        if auth and scheme != "Bearer":
            # Basic auth was removed from kube-apiserver in 1.19: say so instead of a 401.
            raise ConfigError(f"kubeconfig user uses {scheme} auth; only bearer tokens work")

        def path_of(value: object) -> Path | None:
            return Path(value) if isinstance(value, str) and value else None

        return cls(
            server=str(configuration.host).rstrip("/"),
            token=credential or None,
            ca_file=path_of(configuration.ssl_ca_cert),
            cert_file=path_of(configuration.cert_file),
            key_file=path_of(configuration.key_file),
            insecure=not configuration.verify_ssl,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings for an https server; ``None`` for plain http.

        Verifies the server against ``ca_file`` (the system roots without one) unless
        ``insecure``; presents the client certificate when there is one.
        """
        if URL(self.server).scheme != "https":
            return None
        try:
            if self.insecure:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                cafile = None if self.ca_file is None else os.fspath(self.ca_file)
                context = ssl.create_default_context(cafile=cafile)
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(os.fspath(self.cert_file), os.fspath(self.key_file))
        except (OSError, ssl.SSLError) as exc:
            files = ", ".join(
                str(p) for p in (self.ca_file, self.cert_file, self.key_file) if p is not None
            )
            raise ConfigError(f"cannot load TLS files ({files}): {exc}") from None
        return context


# ---------------------------------------------------------------- client


class _Token:
    """The bearer token: a fixed value, or a file re-read every ``TOKEN_RELOAD_S``."""

    def __init__(self, config: KubeConfig, clock: Clock, reload_s: float) -> None:
        self._value = config.token
        self._file = config.token_file
        self._clock = clock
        self._reload_s = reload_s
        self._read_at: float | None = None

    def current(self) -> str | None:
        if self._file is None:
            return self._value
        now = self._clock.monotonic()
        if self._read_at is None or now - self._read_at >= self._reload_s:
            # A few hundred bytes from a tmpfs once a minute: not worth a thread.
            try:
                text = self._file.read_text().strip()
            except OSError as exc:
                if self._value is None:
                    raise ConfigError(f"cannot read token file {self._file}: {exc}") from None
                # Keep the last token while the kubelet swaps the file.
                log.warning("token file unreadable", extra=logs.fields(path=str(self._file)))
                text = self._value
            self._value = text or self._value
            self._read_at = now
        return self._value


class KubeClient:
    """An async context manager over one aiohttp session to one kube-apiserver.

    Paths are API paths (``/api/v1/nodes``, ``/apis/kueue.x-k8s.io/v1beta2/...``); bodies
    and answers are plain dicts. Failures raise ``ApiError`` (the server said no) or
    ``TransportError`` (the connection did not carry the answer).
    """

    def __init__(
        self,
        config: KubeConfig,
        *,
        clock: Clock | None = None,
        token_reload_s: float = TOKEN_RELOAD_S,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        user_agent: str = "tessera",
    ) -> None:
        self._config = config
        self._base = URL(config.server)
        self._token = _Token(config, clock or SystemClock(), token_reload_s)
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    @property
    def config(self) -> KubeConfig:
        return self._config

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(ssl=self._config.ssl_context() or True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # kube-apiserver sets no cookie a client must return, and client-go keeps none;
            # aiohttp's jar filtered its cookies for every request, a tenth of a Binding
            # POST's CPU
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": self._user_agent, "Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(
                total=self._request_timeout_s, sock_connect=self._connect_timeout_s
            ),
        )
        log.info(
            "kube client open",
            extra=logs.fields(
                server=self._config.server,
                ca_file=str(self._config.ca_file or ""),
                token_file=str(self._config.token_file or ""),
                client_cert=str(self._config.cert_file or ""),
            ),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ requests

    async def get_json(self, path: str, params: Params | None = None) -> JsonObject:
        return await self._request("GET", path, params=params)

    async def post_json(self, path: str, body: Any, params: Params | None = None) -> JsonObject:
        return await self._request("POST", path, params=params, body=body)

    async def patch_json(
        self,
        path: str,
        body: Any,
        patch_type: PatchType = "merge",
        params: Params | None = None,
    ) -> JsonObject:
        return await self._request(
            "PATCH", path, params=params, body=body, content_type=PATCH_CONTENT_TYPES[patch_type]
        )

    async def delete_json(self, path: str, params: Params | None = None) -> JsonObject:
        """DELETE ``path``: the object as deleted (or a ``Status``), as the server answers."""
        return await self._request("DELETE", path, params=params)

    async def list(
        self,
        path: str,
        params: Params | None = None,
        *,
        page_size: int = LIST_PAGE_SIZE,
        metadata_only: bool = False,
    ) -> tuple[JsonObjects, str]:
        """Every item of a collection, page by page, and the list's resourceVersion.

        All pages of one list come from the same snapshot; an expired ``continue`` token
        raises ``ApiError`` 410 and the caller starts over. ``metadata_only``: the items
        as ``PartialObjectMetadata`` (``METADATA_LIST_ACCEPT``).
        """
        items: JsonObjects = []
        query = dict(params or {})
        query["limit"] = str(page_size)
        accept = METADATA_LIST_ACCEPT if metadata_only else None
        while True:
            page = await self._request("GET", path, params=query, accept=accept)
            page_items = page.get("items") or []
            if not isinstance(page_items, list):
                raise TransportError(f"GET {path}: 'items' is not a list")
            items.extend(page_items)
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return items, str(metadata.get("resourceVersion") or "")
            query["continue"] = token

    async def watch(
        self,
        path: str,
        resource_version: str,
        timeout_s: int,
        *,
        allow_bookmarks: bool = True,
        params: Params | None = None,
        metadata_only: bool = False,
    ) -> AsyncGenerator[WatchEvent, None]:
        """The events after ``resource_version``, until the server ends the watch
        (``metadata_only``: their objects as ``PartialObjectMetadata``).

        The stream is the API's newline-delimited JSON; each line is decoded with orjson.
        The iterator ends when the server closes the watch (``timeout_s`` elapsed); an ERROR
        line raises ``ApiError`` (410 when ``resource_version`` is too old), a broken or
        truncated stream raises ``TransportError``. Close it (``contextlib.aclosing``) to
        release the connection early.
        """
        query = dict(params or {})
        query["watch"] = "true"
        query["timeoutSeconds"] = str(timeout_s)
        if resource_version:
            query["resourceVersion"] = resource_version
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._connect_timeout_s,
            sock_read=timeout_s + WATCH_READ_GRACE_S,
        )
        headers = self._auth()
        if metadata_only:
            headers["Accept"] = METADATA_WATCH_ACCEPT
        try:
            async with self._session_().get(
                self._url(path), params=query, headers=headers, timeout=timeout
            ) as response:
                await _raise_for_status(response)
                pending = b""
                # readline() refuses lines over 128 KiB; one object can be 1.5 MB.
                async for chunk in response.content.iter_any():
                    pending += chunk
                    if b"\n" not in chunk:
                        continue
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _watch_event(path, line)
                if pending.strip():
                    yield _watch_event(path, pending)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"watch {path}: {_describe(exc)}") from exc

    # ------------------------------------------------------------ plumbing

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeClient is used outside 'async with'")
        return self._session

    def _url(self, path: str) -> URL:
        # Joined by hand so that a server URL with a path prefix (an API proxy) keeps it.
        return self._base.with_path(self._base.path.rstrip("/") + path, encoded=False)

    def _auth(self) -> dict[str, str]:
        token = self._token.current()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> JsonObject:
        headers = self._auth()
        if accept is not None:
            headers["Accept"] = accept
        data: bytes | None = None
        if body is not None:
            data = jsonio.dumps(body)
            headers["Content-Type"] = content_type
        try:
            async with self._session_().request(
                method, self._url(path), params=params, data=data, headers=headers
            ) as response:
                await _raise_for_status(response)
                raw = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(f"{method} {path}: {_describe(exc)}") from exc
        try:
            decoded = jsonio.loads(raw)
        except jsonio.JsonError as exc:
            raise TransportError(f"{method} {path}: {exc}") from None
        if not isinstance(decoded, dict):
            raise TransportError(f"{method} {path}: the answer is not a JSON object")
        return decoded


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    raw = await response.read()
    try:
        status_obj = jsonio.loads(raw)
    except jsonio.JsonError:
        status_obj = None
    error = ApiError.from_status(
        status_obj, http_status=response.status, http_reason=response.reason or ""
    )
    if status_obj is None and raw:
        error = ApiError(error.status, error.reason, raw[:200].decode(errors="replace"))
    raise error


def _watch_event(path: str, line: bytes) -> WatchEvent:
    try:
        decoded = jsonio.loads(line)
    except jsonio.JsonError as exc:
        raise TransportError(f"watch {path}: {exc}") from None
    if not isinstance(decoded, dict):
        raise TransportError(f"watch {path}: an event is not a JSON object")
    kind = decoded.get("type")
    obj = decoded.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise TransportError(f"watch {path}: an event lacks 'type' or 'object'")
    if kind == "ERROR":
        raise ApiError.from_status(obj, http_status=500, http_reason="InternalError")
    return WatchEvent(kind, obj)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
