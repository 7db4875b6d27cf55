"""Where ``tessera why`` reads the extender's reasons: ``GET /debug/reasons`` of each
extender, straight (a URL) or through kube-apiserver's pod proxy.

Layer: I/O. Fetches and decodes (``extender.explain.record_from_json``); must not word or
judge anything (``console.why`` does). A failure to reach one extender is a note, not an
error: the rest of the answer (the webhook's marks, Kueue's state) stands without it.

``--extender`` takes one of:

* ``pods:NAMESPACE/SELECTOR`` (the default, ``DEFAULT_EXTENDER``): every running pod that
  the label selector picks in the namespace, asked through kube-apiserver
  (``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/debug/reasons``, the pod's port named
  ``metrics``). Each scheduler replica has its own extender, and only the leader's is
  asked to filter: asking them all and keeping each pod's newest record finds it
  wherever it is. It needs ``get`` on ``pods/proxy`` in that namespace
  (``manifests/console-rbac.yaml``).
* one or more URLs, comma-separated (``http://127.0.0.1:8889`` through
  ``kubectl port-forward``), asked directly;
* ``none``: the extender is not asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp

from cluster import jsonio
from cluster.kube import JsonObject, KubeError
from extender.explain import PodReasons, RecordError, record_from_json

DEFAULT_EXTENDER: Final = "pods:tessera-system/app.kubernetes.io/name=tessera-scheduler"
METRICS_PORT: Final = 8889
"""The extender's metrics port in the manifests, when a pod names no port ``metrics``."""
PODS_PER_QUERY: Final = 32
"""As the extender's page allows (``extender.reasons.PODS_PER_QUERY``)."""
TIMEOUT_S: Final = 10.0


class ProxySource(Protocol):
    async def namespaced(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[JsonObject]: ...

    async def proxy_get(self, path: str, params: Mapping[str, str]) -> JsonObject: ...


@dataclass(frozen=True, slots=True)
class Fetched:
    """What the extenders said: each pod's newest record, where it came from, and why an
    extender could not be read."""

    records: Mapping[str, tuple[str, PodReasons]] = field(default_factory=dict)
    asked: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def _records(where: str, answer: object, into: dict[str, tuple[str, PodReasons]]) -> None:
    pods = answer.get("pods") if isinstance(answer, Mapping) else None
    if not isinstance(pods, list):
        raise RecordError("the answer has no list 'pods'")
    for item in pods:
        if isinstance(item, Mapping) and item.get("found") is False:
            continue
        record = record_from_json(item)
        held = into.get(record.pod)
        if held is None or held[1].at < record.at:
            into[record.pod] = (where, record)


def _chunks(keys: Sequence[str]) -> list[str]:
    return [",".join(keys[i : i + PODS_PER_QUERY]) for i in range(0, len(keys), PODS_PER_QUERY)]


def _port(pod: Mapping[str, Any]) -> int:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return METRICS_PORT


async def fetch(spec: str, keys: Sequence[str], source: object) -> Fetched:
    """The newest record of each pod in ``keys`` that the extenders ``spec`` names
    have (see the module's docstring for ``spec``)."""
    if spec == "none" or not keys:
        return Fetched()
    if spec.startswith("pods:"):
        namespace, _, selector = spec.removeprefix("pods:").partition("/")
        if not hasattr(source, "proxy_get"):
            return Fetched(
                problems=(
                    "the extender was not asked: a cluster file has no pods to proxy to "
                    "(give --extender URL)",
                )
            )
        api: ProxySource = source  # type: ignore[assignment]
        return await _fetch_proxied(api, namespace, selector, keys)
    urls = [u.strip().rstrip("/") for u in spec.split(",") if u.strip()]
    return await _fetch_direct(urls, keys)


async def _fetch_proxied(
    api: ProxySource, namespace: str, selector: str, keys: Sequence[str]
) -> Fetched:
    """Ask every running pod that ``selector`` picks in ``namespace``, through
    kube-apiserver's pod proxy."""
    labels = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
    try:
        pods = await api.namespaced("Pod", namespace, labels)
    except KubeError as exc:
        return Fetched(problems=(f"the extender pods could not be listed: {exc}",))
    found: dict[str, tuple[str, PodReasons]] = {}
    problems: list[str] = []
    asked: list[str] = []
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        problems.append(f"no running extender pod in {namespace} matches {selector}")
    for pod in running:
        name = pod["metadata"]["name"]
        where = f"pod {namespace}/{name}"
        asked.append(where)
        path = f"/api/v1/namespaces/{namespace}/pods/{name}:{_port(pod)}/proxy/debug/reasons"
        try:
            for chunk in _chunks(keys):
                _records(where, await api.proxy_get(path, {"pod": chunk}), found)
        except (KubeError, RecordError) as exc:
            problems.append(f"{where}: {exc}")
    return Fetched(found, tuple(asked), tuple(problems))


async def _fetch_direct(urls: Sequence[str], keys: Sequence[str]) -> Fetched:
    """Ask each URL's ``/debug/reasons`` straight."""
    found: dict[str, tuple[str, PodReasons]] = {}
    problems: list[str] = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            try:
                for chunk in _chunks(keys):
                    _records(url, await _get_reasons(session, url, chunk), found)
            except (aiohttp.ClientError, TimeoutError, RecordError, ValueError) as exc:
                problems.append(f"{url}: {str(exc) or type(exc).__name__}")
    return Fetched(found, tuple(urls), tuple(problems))


async def _get_reasons(session: aiohttp.ClientSession, url: str, chunk: str) -> object:
    async with session.get(f"{url}/debug/reasons", params={"pod": chunk}) as got:
        body = await got.read()
        if got.status != 200:
            text = body.decode(errors="replace")[:200]
            raise RecordError(f"HTTP {got.status}: {text}")
        return jsonio.loads(body)
