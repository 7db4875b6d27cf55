"""kube-scheduler's extender protocol on the wire (``k8s.io/kube-scheduler/extender/v1``).

Layer: EDGE. Pydantic models of the wire shapes, used only here: a body is decoded once
(orjson, through ``cluster.jsonio``), validated, and turned at once into the frozen
records below, with the Pod converted by ``cluster.convert`` (or read back from
``RecentPods`` when kube-scheduler sends the same pod again). Answers are encoded from
plain values straight to bytes. No I/O, no clock, no aiohttp.

The Go types have no JSON tags, so their JSON keys are the Go field names (``Pod``,
``NodeNames``, ``FailedNodes``…), and Go's decoder matches keys case-insensitively,
the last of two spellings winning: so does ``decode_*`` (``nodenames`` is
``NodeNames``). Unknown keys are ignored, as Go ignores them; a wrong type is refused,
as Go refuses it. Anything that is not the expected object raises ``BadRequest`` with a
reason, which the server answers with HTTP 400.

Answers follow the captures in ``../shared/captures`` and the upstream client
(``pkg/scheduler/extender.go``), which reads ``NodeNames`` only from an extender that
is ``nodeCacheCapable`` and ``Nodes`` otherwise:

* filter, asked with ``NodeNames``: ``NodeNames`` (``[]`` when nothing fits, never
  ``null``) and no ``Nodes``; asked with ``Nodes``: ``Nodes``, a NodeList of the fitting
  items exactly as received (``kind``/``apiVersion``/``metadata`` kept), and
  ``NodeNames: null``. ``FailedNodes`` and ``FailedAndUnresolvableNodes`` are always
  maps, ``Error`` always a string.
* prioritize: ``[{"Host", "Score"}]``; bind: ``{"Error"}``; preempt:
  ``{"NodeNameToMetaVictims": {node: {"Pods": [{"UID"}], "NumPDBViolations"}}}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cluster import jsonio
from cluster.convert.pods import pod_from_json
from cluster.convert.raw import ConversionError
from cluster.echo import echo
from cluster.model import NodeName, PodInfo, PodKey, pod_key
from extender.decide import FilterOutcome
from extender.preemption import NodeVictims, Victim

MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""Largest body decoded: 5,000 full Node objects with managedFields stay well inside."""


class BadRequest(ValueError):
    """The body is not the extender request it should be; the message says why."""


# ---------------------------------------------------------------- wire models


class _GoStruct(BaseModel):
    """A Go struct without JSON tags: keys are its field names, in any case."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    _folded: ClassVar[dict[str, str]] = {}
    _exact: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._folded = {name.lower(): name for name in cls.model_fields}
        cls._exact = frozenset(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _go_field_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.keys() <= cls._exact:
            return data  # what kube-scheduler sends: every key spelled as the Go field
        fields: dict[str, Any] = {}
        for key, value in data.items():
            name = cls._folded.get(key.lower()) if isinstance(key, str) else None
            if name is not None:
                fields[name] = value
        return fields


class NodeListModel(_GoStruct):
    """``v1.NodeList``: the items stay raw JSON for ``cluster.convert`` and the answer."""

    kind: str | None = None
    apiVersion: str | None = None
    metadata: dict[str, Any] | None = None
    items: list[dict[str, Any]] | None = None


class ExtenderArgsModel(_GoStruct):
    Pod: dict[str, Any] | None = None
    Nodes: NodeListModel | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResultModel(_GoStruct):
    Nodes: NodeListModel | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] | None = None
    FailedAndUnresolvableNodes: dict[str, str] | None = None
    Error: str | None = None


class HostPriorityModel(_GoStruct):
    Host: str | None = None
    Score: int = 0


class ExtenderBindingArgsModel(_GoStruct):
    PodName: str | None = None
    PodNamespace: str | None = None
    PodUID: str | None = None
    Node: str | None = None


class ExtenderBindingResultModel(_GoStruct):
    Error: str | None = None


class MetaPodModel(_GoStruct):
    UID: str | None = None


class MetaVictimsModel(_GoStruct):
    Pods: list[MetaPodModel | None] | None = None
    NumPDBViolations: int = 0


class VictimsModel(_GoStruct):
    Pods: list[dict[str, Any] | None] | None = None
    NumPDBViolations: int = 0


class ExtenderPreemptionArgsModel(_GoStruct):
    Pod: dict[str, Any] | None = None
    NodeNameToVictims: dict[str, VictimsModel | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictimsModel | None] | None = None


class ExtenderPreemptionResultModel(_GoStruct):
    NodeNameToMetaVictims: dict[str, MetaVictimsModel | None] | None = Field(default=None)


# ---------------------------------------------------------------- decoded requests


@dataclass(frozen=True, slots=True)
class NodeList:
    """The ``Nodes`` of a request, kept as received so the answer can echo them."""

    items: tuple[Mapping[str, Any], ...]
    kind: str | None = None
    api_version: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """``/filter`` and ``/prioritize``: the pod and its candidates, by name or whole."""

    pod: PodInfo
    node_names: tuple[str, ...] | None
    nodes: NodeList | None

    @property
    def by_name(self) -> bool:
        """kube-scheduler sent names (``nodeCacheCapable: true``): answer with names."""
        return self.node_names is not None


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> PodKey:
        return pod_key(self.pod_namespace, self.pod_name)


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """``/preempt``: victims per node, from either map kube-scheduler may send."""

    pod: PodInfo
    proposals: Mapping[str, NodeVictims]


M = TypeVar("M", bound=BaseModel)


def _validate(model: type[M], body: bytes, what: str) -> M:
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is {len(body)} bytes, more than the {MAX_BODY_BYTES} accepted")
    try:
        raw = jsonio.loads(body)
    except jsonio.JsonError as exc:
        raise BadRequest(f"the body is {exc}") from None
    if not isinstance(raw, dict):
        raise BadRequest(f"the body is a JSON {_json_type(raw)}, not an {what} object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadRequest(f"the body is not an {what}: {_first_error(exc)}") from None


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    # a location can hold a key the client chose (a node name in the victims' map)
    where = echo(".".join(str(part) for part in first["loc"]) or "the body", quote=False)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {echo(first['msg'], quote=False)}{more}"


class RecentPods(Mapping[str, PodInfo]):
    """The pods of the last ``limit`` requests, by UID, each with the resourceVersion it
    was decoded from.

    kube-scheduler sends one pod object to ``/filter``, then ``/prioritize`` (and
    ``/preempt``), and binds it moments later, often before the watch shows it. A
    resourceVersion names one content of an object, so a pod that comes again with the
    same UID and resourceVersion is the pod decoded before: a look-up instead of a
    second conversion, which is most of a small request's cost. Without a
    resourceVersion a pod is converted every time, and kept by UID for ``/bind``.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pods: dict[str, tuple[str, PodInfo]] = {}

    def decode(
        self, raw: Mapping[str, Any], known: Mapping[PodKey, PodInfo] | None = None
    ) -> PodInfo:
        """The pod of ``raw`` (``ConversionError`` if it is not one), kept for next time.

        ``known``: the pods the watch has read (``Snapshot.pods``). A pod kube-scheduler
        sends for the first time is most often there already, at the same
        resourceVersion (both watch the same API server, and kube-scheduler asks a few
        milliseconds after the pod appears): taken from there, not converted again.
        """
        metadata = raw.get("metadata")
        if not isinstance(metadata, Mapping):
            return pod_from_json(raw)
        uid, version = metadata.get("uid"), metadata.get("resourceVersion")
        if not isinstance(uid, str) or not uid:
            return pod_from_json(raw)
        version = version if isinstance(version, str) else ""
        kept = self._pods.get(uid)
        if kept is not None and version and kept[0] == version:
            del self._pods[uid]  # back in last: the most recent goes last
            self._pods[uid] = kept
            return kept[1]
        pod = _read_before(metadata, uid, version, known) if version else None
        if pod is None:
            pod = pod_from_json(raw)  # a pod that does not convert changes nothing here
        if self._limit:
            self._pods.pop(uid, None)
            self._pods[uid] = (version, pod)
            if len(self._pods) > self._limit:
                del self._pods[next(iter(self._pods))]
        return pod

    def forget(self, uid: str) -> None:
        """``uid`` is bound: the watch has it, or soon will."""
        self._pods.pop(uid, None)

    def __getitem__(self, uid: str) -> PodInfo:
        return self._pods[uid][1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)


def _read_before(
    metadata: Mapping[str, Any], uid: str, version: str, known: Mapping[PodKey, PodInfo] | None
) -> PodInfo | None:
    """The pod ``known`` holds with this UID and resourceVersion, if any."""
    key = _key(metadata)
    if known is None or key is None:
        return None  # without a name, not a pod: conversion says why
    pod = known.get(key)
    if pod is None or pod.uid != uid or pod.version != version:
        return None
    return pod


def _key(metadata: Mapping[str, Any]) -> PodKey | None:
    """The pod ``metadata`` names (in ``default`` without a namespace); None without a
    name."""
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    return pod_key(namespace if isinstance(namespace, str) and namespace else "default", name)


def _pod(
    raw: Mapping[str, Any] | None,
    what: str,
    recent: RecentPods | None,
    known: Mapping[PodKey, PodInfo] | None,
) -> PodInfo:
    if raw is None:
        raise BadRequest(f"the body is not an {what}: Pod is missing or null")
    try:
        return pod_from_json(raw) if recent is None else recent.decode(raw, known)
    except ConversionError as exc:
        raise BadRequest(f"the body is not an {what}: Pod: {exc}") from None


def decode_extender_args(
    body: bytes,
    recent: RecentPods | None = None,
    known: Mapping[PodKey, PodInfo] | None = None,
) -> ExtenderArgs:
    """An ``ExtenderArgs`` (``/filter``, ``/prioritize``); ``BadRequest`` if it is not one.

    Neither ``NodeNames`` nor ``Nodes`` is a valid ExtenderArgs for Go, and a logical
    problem here: it decodes, with both None, and the caller answers with ``Error``.
    The pod is read through ``recent`` when given, which takes it from ``known`` (the
    pods the watch has read) when the watch read the same version.
    """
    model = _validate(ExtenderArgsModel, body, "ExtenderArgs")
    pod = _pod(model.Pod, "ExtenderArgs", recent, known)
    nodes = None
    if model.Nodes is not None:
        nodes = NodeList(
            items=tuple(model.Nodes.items or ()),
            kind=model.Nodes.kind,
            api_version=model.Nodes.apiVersion,
            metadata=model.Nodes.metadata or {},
        )
    names = tuple(model.NodeNames) if model.NodeNames is not None else None
    return ExtenderArgs(pod=pod, node_names=names, nodes=nodes)


def decode_binding_args(body: bytes) -> BindingArgs:
    """An ``ExtenderBindingArgs``; ``BadRequest`` without a pod name or node."""
    model = _validate(ExtenderBindingArgsModel, body, "ExtenderBindingArgs")
    missing = [f for f in ("PodName", "PodNamespace", "Node") if not getattr(model, f)]
    if missing:
        raise BadRequest(f"the body is not an ExtenderBindingArgs: no {', '.join(missing)}")
    return BindingArgs(
        pod_name=model.PodName or "",
        pod_namespace=model.PodNamespace or "",
        pod_uid=model.PodUID or "",
        node=model.Node or "",
    )


def decode_preemption_args(
    body: bytes,
    recent: RecentPods | None = None,
    known: Mapping[PodKey, PodInfo] | None = None,
) -> PreemptionArgs:
    """An ``ExtenderPreemptionArgs``, from ``NodeNameToMetaVictims`` (nodeCacheCapable)
    or else ``NodeNameToVictims`` (whole victim Pods); the pod read through ``recent``
    and ``known`` (as ``decode_extender_args``)."""
    what = "ExtenderPreemptionArgs"
    model = _validate(ExtenderPreemptionArgsModel, body, what)
    pod = _pod(model.Pod, what, recent, known)
    proposals: dict[str, NodeVictims] = {}
    if model.NodeNameToMetaVictims is not None:
        for node, meta in model.NodeNameToMetaVictims.items():
            pods = (meta.Pods or []) if meta is not None else []
            proposals[node] = NodeVictims(
                tuple(Victim(p.UID or "") for p in pods if p is not None),
                meta.NumPDBViolations if meta is not None else 0,
            )
    elif model.NodeNameToVictims is not None:
        for node, victims in model.NodeNameToVictims.items():
            whole = (victims.Pods or []) if victims is not None else []
            proposals[node] = NodeVictims(
                tuple(_victim(p, node, what) for p in whole if p is not None),
                victims.NumPDBViolations if victims is not None else 0,
            )
    return PreemptionArgs(pod=pod, proposals=MappingProxyType(proposals))


def _victim(raw: Mapping[str, Any], node: str, what: str) -> Victim:
    metadata = raw.get("metadata")
    if not isinstance(metadata, Mapping):
        raise BadRequest(f"the body is not an {what}: a victim on {node} has no metadata")
    uid = metadata.get("uid")
    return Victim(uid if isinstance(uid, str) else "", _key(metadata))


# ---------------------------------------------------------------- answers


def encode_filter(args: ExtenderArgs, outcome: FilterOutcome) -> bytes:
    """The ``ExtenderFilterResult`` for ``args``, in the spelling its mode expects."""
    failed = dict(outcome.failed)
    hopeless = dict(outcome.unresolvable)
    # a node that fits but was not chosen is neither named nor failed: kube-scheduler
    # drops it from the candidates without a reason, as the pod was never refused there
    fits = outcome.fits if outcome.chosen is None else (outcome.chosen,)
    if args.node_names is not None or args.nodes is None:
        return jsonio.dumps(
            {
                "NodeNames": list(fits),
                "FailedNodes": failed,
                "FailedAndUnresolvableNodes": hopeless,
                "Error": "",
            }
        )
    fitting = set(fits)
    items = [item for item in args.nodes.items if _item_name(item) in fitting]
    return jsonio.dumps(
        {
            "Nodes": _node_list(args.nodes, items),
            "NodeNames": None,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": hopeless,
            "Error": "",
        }
    )


def encode_filter_error(message: str, *, by_name: bool = True) -> bytes:
    """A filter answer that fails the whole request with ``Error``."""
    result: dict[str, Any] = {"NodeNames": []} if by_name else {"Nodes": None, "NodeNames": None}
    result.update({"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message})
    return jsonio.dumps(result)


def _item_name(item: Mapping[str, Any]) -> str | None:
    metadata = item.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else None


def _node_list(nodes: NodeList, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    envelope: dict[str, Any] = {}
    if nodes.kind is not None:
        envelope["kind"] = nodes.kind
    if nodes.api_version is not None:
        envelope["apiVersion"] = nodes.api_version
    envelope["metadata"] = dict(nodes.metadata)
    envelope["items"] = list(items)
    return envelope


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """A ``HostPriorityList``: ``scores[i]`` for ``hosts[i]``."""
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts and {len(scores)} scores")
    pairs = zip(hosts, scores, strict=True)
    return jsonio.dumps([{"Host": host, "Score": score} for host, score in pairs])


def encode_binding_result(error: str = "") -> bytes:
    """An ``ExtenderBindingResult``: ``""`` for success."""
    return jsonio.dumps({"Error": error})


def encode_preemption_result(victims: Mapping[NodeName, NodeVictims]) -> bytes:
    """An ``ExtenderPreemptionResult``: victims by UID, whatever form they came in."""
    return jsonio.dumps(
        {
            "NodeNameToMetaVictims": {
                node: {
                    "Pods": [{"UID": victim.uid} for victim in chosen.pods],
                    "NumPDBViolations": chosen.pdb_violations,
                }
                for node, chosen in victims.items()
            }
        }
    )


def encode_bad_request(reason: str) -> bytes:
    """The body of an HTTP 400: kube-scheduler reads only the status; people read this."""
    return jsonio.dumps({"Error": reason})


# ---------------------------------------------------------------- the other side
# kube-scheduler's half of the protocol, for the load test and the tests that play it.


def encode_extender_args(
    pod: Mapping[str, Any],
    *,
    node_names: Sequence[str] | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
) -> bytes:
    """``ExtenderArgs`` as kube-scheduler sends it: one of names or whole Nodes."""
    node_list = None if nodes is None else {"metadata": {}, "items": list(nodes)}
    names = None if node_names is None else list(node_names)
    return jsonio.dumps({"Pod": pod, "Nodes": node_list, "NodeNames": names})


def encode_binding_args(namespace: str, name: str, uid: str, node: str) -> bytes:
    return jsonio.dumps({"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node})


@dataclass(frozen=True, slots=True)
class FilterResult:
    """An ``ExtenderFilterResult`` as kube-scheduler reads it."""

    node_names: tuple[str, ...] | None
    nodes: tuple[Mapping[str, Any], ...] | None
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]
    error: str


def decode_filter_result(body: bytes) -> FilterResult:
    model = _validate(ExtenderFilterResultModel, body, "ExtenderFilterResult")
    return FilterResult(
        node_names=None if model.NodeNames is None else tuple(model.NodeNames),
        nodes=None if model.Nodes is None else tuple(model.Nodes.items or ()),
        failed=MappingProxyType(model.FailedNodes or {}),
        unresolvable=MappingProxyType(model.FailedAndUnresolvableNodes or {}),
        error=model.Error or "",
    )


def decode_priorities(body: bytes) -> list[tuple[str, int]]:
    """A ``HostPriorityList``."""
    try:
        raw = jsonio.loads(body)
    except jsonio.JsonError as exc:
        raise BadRequest(f"the body is {exc}") from None
    if not isinstance(raw, list):
        raise BadRequest(f"the body is a JSON {_json_type(raw)}, not a HostPriorityList array")
    try:
        hosts = [HostPriorityModel.model_validate(item) for item in raw]
    except ValidationError as exc:
        raise BadRequest(f"the body is not a HostPriorityList: {_first_error(exc)}") from None
    return [(h.Host or "", h.Score) for h in hosts]


def decode_binding_result(body: bytes) -> str:
    """The ``Error`` of an ``ExtenderBindingResult`` (``""``: bound)."""
    return _validate(ExtenderBindingResultModel, body, "ExtenderBindingResult").Error or ""


def decode_preemption_result(body: bytes) -> dict[str, NodeVictims]:
    model = _validate(ExtenderPreemptionResultModel, body, "ExtenderPreemptionResult")
    return {
        node: NodeVictims(
            tuple(Victim(p.UID or "") for p in (meta.Pods or []) if p is not None)
            if meta is not None
            else (),
            meta.NumPDBViolations if meta is not None else 0,
        )
        for node, meta in (model.NodeNameToMetaVictims or {}).items()
    }
