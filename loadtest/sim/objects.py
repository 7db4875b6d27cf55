"""What kube-apiserver and the job controller do to objects, as plain functions.

Layer: PURE. AdmissionReview requests, RFC 6902 JSON patches applied to the stored
object, the pods a Job's controller creates from its template, and the in-tree
scheduler's view of a pod (requests, node selector, required node affinity, taints).
No I/O, no clock, no async. Must not import the servers: it is the other side of the
wire and reads what they answer.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster import jsonio, labels
from cluster.quantity import to_milli, to_units

Obj = dict[str, Any]

_GROUPS = {"Job": ("batch", "v1", "jobs"), "Pod": ("", "v1", "pods")}


def admission_review(
    obj: Obj, uid: str, *, operation: str = "CREATE", old: Obj | None = None
) -> Obj:
    """The ``admission.k8s.io/v1`` review kube-apiserver sends for ``obj``: a CREATE, or
    an UPDATE of the stored ``old`` (``oldObject``, ``UpdateOptions``, as in the capture
    of ``kubectl patch`` unsuspending a Job)."""
    if (operation == "UPDATE") != (old is not None):
        raise ValueError("an UPDATE review carries the stored object; a CREATE does not")
    options = "UpdateOptions" if operation == "UPDATE" else "CreateOptions"
    group, version, resource = _GROUPS[obj["kind"]]
    kind = {"group": group, "version": version, "kind": obj["kind"]}
    gvr = {"group": group, "version": version, "resource": resource}
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": gvr,
            "requestKind": kind,
            "requestResource": gvr,
            "name": obj["metadata"].get("name", ""),
            "namespace": obj["metadata"].get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "loadtest", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
        },
    }


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    patched: Obj
    """The object as stored: the request's object with the patch applied."""
    code: int
    message: str
    patch_ops: int
    warnings: tuple[str, ...]


class BadAnswer(ValueError):
    """The webhook's answer is not a valid AdmissionReview response for the request."""


def read_verdict(obj: Obj, uid: str, body: bytes) -> Verdict:
    """Check an AdmissionReview answer and apply its patch to ``obj``."""
    try:
        review = jsonio.loads(body)
        response = review["response"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadAnswer(f"not an AdmissionReview response: {exc}") from exc
    if response.get("uid") != uid:
        raise BadAnswer(f"answer uid {response.get('uid')!r} is not the request's {uid!r}")
    warnings = tuple(response.get("warnings") or ())
    if not response.get("allowed"):
        status = response.get("status") or {}
        return Verdict(
            False, obj, int(status.get("code", 403)), status.get("message", ""), 0, warnings
        )
    ops: list[Obj] = []
    if response.get("patch"):
        if response.get("patchType") != "JSONPatch":
            raise BadAnswer(f"patchType {response.get('patchType')!r} is not JSONPatch")
        ops = jsonio.loads(base64.b64decode(response["patch"]))
    return Verdict(True, apply_json_patch(obj, ops), 200, "", len(ops), warnings)


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def apply_json_patch(target: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 add / remove / replace / test / copy / move on a copy of ``target``;
    ``BadAnswer`` for a patch kube-apiserver would refuse."""
    doc = copy.deepcopy(target)
    for op in ops:
        _apply_one(doc, op)
    return doc


def _apply_one(doc: Obj, op: Obj) -> None:
    path = op.get("path", "")
    parts = [_unescape(p) for p in path.split("/")[1:]]
    if not parts:
        raise BadAnswer(f"patch op {op.get('op')} on the whole document")
    parent: Any = doc
    try:
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise BadAnswer(f"patch path {path} does not exist") from exc
    last, kind = parts[-1], op.get("op")
    if kind in ("copy", "move"):
        value = _get(doc, op.get("from", ""))
        if kind == "move":
            apply_json_patch(doc, [{"op": "remove", "path": op["from"]}])
        op = {"op": "add", "path": path, "value": copy.deepcopy(value)}
        kind = "add"
    try:
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise BadAnswer(f"patch test failed at {path}")
        elif isinstance(parent, list):
            _in_list(parent, last, kind, op)
        else:
            _in_object(parent, last, kind, op, path)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise BadAnswer(f"patch op {kind} at {path} cannot apply: {exc}") from exc


def _in_list(parent: list[Any], last: str, kind: object, op: Obj) -> None:
    index = len(parent) if last == "-" else int(last)
    if kind == "add":
        parent.insert(index, op["value"])
    elif kind == "remove":
        del parent[index]
    elif kind == "replace":
        parent[index] = op["value"]
    else:
        raise BadAnswer(f"unknown patch op {kind!r}")


def _in_object(parent: Obj, last: str, kind: object, op: Obj, path: str) -> None:
    if kind == "add":
        parent[last] = op["value"]
    elif kind == "replace":
        if last not in parent:
            raise BadAnswer(f"replace of missing {path}")
        parent[last] = op["value"]
    elif kind == "remove":
        del parent[last]
    else:
        raise BadAnswer(f"unknown patch op {kind!r}")


def _get(doc: Any, path: str) -> Any:
    value = doc
    for part in (_unescape(p) for p in path.split("/")[1:]):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


# ---------------------------------------------------------------- jobs → pods


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What Kueue counts for a job: pods x per-pod GPUs (or milli of one GPU)."""

    pods: int
    resource: str
    per_pod: int

    @property
    def total(self) -> int:
        return self.pods * self.per_pod


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def job_demand(job: Obj) -> JobDemand:
    spec = job["spec"]
    pods = int(spec.get("parallelism", 1))
    gpus = milli = 0
    for container in spec["template"]["spec"].get("containers", []):
        limits = _limits(container)
        gpus += int(str(limits.get(labels.GPU_RESOURCE, 0)))
        milli += int(str(limits.get(labels.GPU_MILLI_RESOURCE, 0)))
    if milli and not gpus:
        return JobDemand(pods, labels.GPU_MILLI_RESOURCE, milli)
    return JobDemand(pods, labels.GPU_RESOURCE, gpus)


def unsuspend(job: Obj, node_selector: Mapping[str, str]) -> Obj:
    """What Kueue writes at admission: the flavor's node labels as the template's
    ``nodeSelector``, and ``suspend: false``."""
    admitted = copy.deepcopy(job)
    template = admitted["spec"]["template"]["spec"]
    template["nodeSelector"] = {**(template.get("nodeSelector") or {}), **node_selector}
    admitted["spec"]["suspend"] = False
    return admitted


def job_pods(job: Obj, uid_prefix: str) -> list[Obj]:
    """The pods the Job controller creates (Indexed completion mode), pending."""
    meta = job["metadata"]
    template = job["spec"]["template"]
    pods: list[Obj] = []
    for index in range(int(job["spec"].get("parallelism", 1))):
        pod_meta = copy.deepcopy(template.get("metadata") or {})
        name = f"{meta['name']}-{index}"
        pod_meta.update(
            name=name,
            namespace=meta["namespace"],
            uid=f"{uid_prefix}-{meta['namespace']}-{name}",
        )
        pod_meta.setdefault("labels", {})["job-name"] = meta["name"]
        spec = copy.deepcopy(template["spec"])
        if "activeDeadlineSeconds" in job["spec"]:
            spec["activeDeadlineSeconds"] = job["spec"]["activeDeadlineSeconds"]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": pod_meta,
                "spec": spec,
                "status": {"phase": "Pending"},
            }
        )
    return pods


# ---------------------------------------------------------------- the in-tree view


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """What kube-scheduler's in-tree plugins look at."""

    cpu_milli: int
    memory: int
    gpus: int
    """Whole GPUs (``nvidia.com/gpu``): the only GPU resource the in-tree fit counts."""
    node_selector: Mapping[str, str]
    affinity_terms: tuple[tuple[tuple[str, str, frozenset[str]], ...], ...]
    """Required node affinity: OR of terms, each an AND of (key, operator, values)."""
    tolerations: tuple[tuple[str, str, str], ...]
    """(key, operator, value) with effect NoSchedule or any."""


Terms = tuple[tuple[tuple[str, str, frozenset[str]], ...], ...]


def matches_terms(node_labels: Mapping[str, str], terms: Terms) -> bool:
    """Whether labels satisfy required node affinity (OR of terms, AND inside; no terms:
    anything)."""
    if not terms:
        return True
    for term in terms:
        ok = True
        for key, operator, values in term:
            value = node_labels.get(key)
            if (
                (operator == "In" and value not in values)
                or (operator == "NotIn" and value in values)
                or (operator == "Exists" and value is None)
                or (operator == "DoesNotExist" and value is not None)
            ):
                ok = False
                break
        if ok:
            return True
    return False


def affinity_terms(pod_spec: Mapping[str, Any]) -> Terms:
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return tuple(
        tuple(
            (e["key"], e["operator"], frozenset(e.get("values") or ()))
            for e in term.get("matchExpressions") or ()
        )
        for term in affinity.get("nodeSelectorTerms") or ()
    )


def pod_needs(pod: Obj) -> PodNeeds:
    spec = pod["spec"]
    cpu = memory = gpus = 0
    for container in spec.get("containers", []):
        limits = _limits(container)
        cpu += to_milli(str(limits.get("cpu", "0")))
        memory += to_units(str(limits.get("memory", "0")))
        gpus += int(str(limits.get(labels.GPU_RESOURCE, 0)))
    terms = affinity_terms(spec)
    tolerations = tuple(
        (t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""))
        for t in spec.get("tolerations") or ()
        if t.get("effect", "NoSchedule") in ("NoSchedule", "")
    )
    return PodNeeds(cpu, memory, gpus, dict(spec.get("nodeSelector") or {}), terms, tolerations)
