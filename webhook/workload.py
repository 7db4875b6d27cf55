"""The admitted request and object, decoded into what the policy rules read.

Layer: PURE. Frozen records built from the raw JSON of an AdmissionReview request: no I/O,
no clock, no pydantic (``webhook.review`` is the wire edge that builds ``ReviewRequest``),
no aiohttp. Never mutates the object it is given.

A workload is a ``batch/v1`` Job, a ``jobset.x-k8s.io/v1alpha2`` JobSet or a ``v1`` Pod.
Its pod templates carry the JSON path of the template (where rules write) and how many
pods each one makes:

* Job: ``/spec/template``, ``spec.parallelism`` pods (default 1);
* JobSet: ``/spec/replicatedJobs/<i>/template/spec/template``, ``replicas`` (default 1)
  times that Job's ``parallelism`` (default 1) pods;
* Pod: the pod itself, one pod, metadata at ``/metadata`` and spec at ``/spec``.

A template's GPU demand is ``cluster.convert.demand.pod_demand`` of its spec. The time-limit
holders are where ``activeDeadlineSeconds`` bounds the whole workload: the Job's spec,
each replicated Job's spec of a JobSet (a JobSet has no deadline of its own), the Pod's
spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from cluster import labels
from cluster.convert.demand import DemandError, pod_demand
from cluster.echo import echo
from cluster.model import PodDemand
from webhook.owners import OwnerRef
from webhook.patch import PathToken, pointer

_EMPTY: Mapping[str, Any] = MappingProxyType({})

Path = tuple[PathToken, ...]


class WorkloadError(ValueError):
    """The object is not a well-formed workload; the message names the field (HTTP 422)."""


class WorkloadKind(Enum):
    JOB = "Job"
    JOBSET = "JobSet"
    POD = "Pod"


API_VERSIONS: Final[Mapping[WorkloadKind, str]] = MappingProxyType(
    {
        WorkloadKind.JOB: "batch/v1",
        WorkloadKind.JOBSET: "jobset.x-k8s.io/v1alpha2",
        WorkloadKind.POD: "v1",
    }
)


# ---------------------------------------------------------------- the request


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str

    @property
    def api_version(self) -> str:
        """``batch/v1``, or ``v1`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(frozen=True, slots=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """One AdmissionReview request, decoded (by ``webhook.review.decode_review``)."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: str
    """``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT``."""
    namespace: str = ""
    name: str = ""
    object: Mapping[str, Any] | None = None
    old_object: Mapping[str, Any] | None = None
    sub_resource: str = ""
    dry_run: bool = False
    user: UserInfo = UserInfo()

    @property
    def workload_kind(self) -> WorkloadKind | None:
        """The workload kind this request is about, or ``None`` for anything else."""
        return _WORKLOAD_KINDS.get((self.kind.api_version, self.kind.kind))


_WORKLOAD_KINDS: Final[Mapping[tuple[str, str], WorkloadKind]] = MappingProxyType(
    {(api_version, kind.value): kind for kind, api_version in API_VERSIONS.items()}
)
"""(apiVersion, kind) → the workload kind it is."""


# ---------------------------------------------------------------- the workload


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod template of a workload, where it sits, and what its pods ask for."""

    name: str
    """The replicated Job's name for a JobSet; empty for a Job or Pod."""
    metadata_path: Path
    spec_path: Path
    count: int
    demand: PodDemand
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    spec: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @property
    def pointer(self) -> str:
        """JSON pointer of the template (its metadata's parent): ``/spec/template``."""
        return pointer(self.metadata_path[:-1])

    @property
    def uses_gpu(self) -> bool:
        return self.demand.uses_gpu


@dataclass(frozen=True, slots=True)
class Deadline:
    """Where ``activeDeadlineSeconds`` sits (the spec holding it) and its value."""

    spec_path: Path
    seconds: int | None
    what: str
    """For messages: ``job``, ``replicated job workers``, ``pod``."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A Job, JobSet or Pod as the rules see it. ``obj`` is the raw object, unchanged."""

    kind: WorkloadKind
    namespace: str
    name: str
    generate_name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    templates: tuple[PodTemplate, ...]
    deadlines: tuple[Deadline, ...]
    owners: tuple[OwnerRef, ...]
    suspended: bool
    obj: Mapping[str, Any]

    @property
    def pod_count(self) -> int:
        return sum(t.count for t in self.templates)

    @property
    def uses_gpu(self) -> bool:
        """Any container or init container asks for a whole GPU or a share of one."""
        return any(t.uses_gpu for t in self.templates)

    @property
    def display_name(self) -> str:
        """``finetune-abc``, or ``finetune-*`` for a name still to be generated; cut like
        every value a message repeats (``cluster.echo``)."""
        return echo(self.name or f"{self.generate_name}*", quote=False)

    @property
    def kind_word(self) -> str:
        """How messages name the object: ``job``, ``jobset``, ``pod``."""
        return self.kind.value.lower()

    @property
    def queue_name(self) -> str | None:
        return self.labels.get(labels.QUEUE_NAME)


def workload_from_object(
    obj: Mapping[str, Any], kind: WorkloadKind, namespace: str = ""
) -> Workload:
    """Decode ``obj`` as a workload of ``kind``; raises ``WorkloadError`` when malformed.

    ``namespace`` is the request's: an object created with no ``metadata.namespace``
    reaches admission without one.
    """
    if not isinstance(obj, Mapping):
        raise WorkloadError("the object is not a JSON object")
    metadata = _map(obj.get("metadata"), "metadata")
    spec = _map(obj.get("spec"), "spec")
    namespace = namespace or _string(metadata.get("namespace"), "metadata.namespace")
    name = _string(metadata.get("name"), "metadata.name")
    generate_name = _string(metadata.get("generateName"), "metadata.generateName")

    templates: tuple[PodTemplate, ...]
    deadlines: tuple[Deadline, ...]
    if kind is WorkloadKind.JOB:
        template = _map(spec.get("template"), "spec.template")
        templates = (
            _template(
                "",
                template,
                ("spec", "template"),
                _count(spec.get("parallelism"), "spec.parallelism"),
            ),
        )
        deadlines = (_deadline(spec, ("spec",), "job"),)
        suspended = spec.get("suspend") is True
    elif kind is WorkloadKind.JOBSET:
        templates, deadlines = _jobset_templates(spec)
        suspended = spec.get("suspend") is True
    else:
        templates = (
            PodTemplate(
                name="",
                metadata_path=("metadata",),
                spec_path=("spec",),
                count=1,
                demand=_demand(spec, lambda: "spec"),
                labels=_string_map(metadata.get("labels"), "metadata.labels"),
                annotations=_string_map(metadata.get("annotations"), "metadata.annotations"),
                spec=spec,
            ),
        )
        deadlines = (_deadline(spec, ("spec",), "pod"),)
        gates = _list(spec.get("schedulingGates"), "spec.schedulingGates")
        suspended = any(
            isinstance(g, Mapping) and g.get("name") == labels.KUEUE_ADMISSION_GATE for g in gates
        )

    return Workload(
        kind=kind,
        namespace=namespace,
        name=name,
        generate_name=generate_name,
        labels=_string_map(metadata.get("labels"), "metadata.labels"),
        annotations=_string_map(metadata.get("annotations"), "metadata.annotations"),
        templates=templates,
        deadlines=deadlines,
        owners=_owners(metadata.get("ownerReferences")),
        suspended=suspended,
        obj=obj,
    )


def _jobset_templates(
    spec: Mapping[str, Any],
) -> tuple[tuple[PodTemplate, ...], tuple[Deadline, ...]]:
    replicated = _list(spec.get("replicatedJobs"), "spec.replicatedJobs")
    if not replicated:
        raise WorkloadError("spec.replicatedJobs is empty: a JobSet needs at least one")
    templates = []
    deadlines = []
    for i, raw in enumerate(replicated):
        where = f"spec.replicatedJobs[{i}]"
        rjob = _map(raw, where)
        rname = _string(rjob.get("name"), f"{where}.name") or str(i)
        replicas = _count(rjob.get("replicas"), f"{where}.replicas")
        job_template = _map(rjob.get("template"), f"{where}.template")
        job_spec = _map(job_template.get("spec"), f"{where}.template.spec")
        parallelism = _count(job_spec.get("parallelism"), f"{where}.template.spec.parallelism")
        base: Path = ("spec", "replicatedJobs", i, "template", "spec")
        templates.append(
            _template(
                rname,
                _map(job_spec.get("template"), f"{where}.template.spec.template"),
                (*base, "template"),
                replicas * parallelism,
            )
        )
        deadlines.append(_deadline(job_spec, base, f"replicated job {echo(rname, quote=False)}"))
    return tuple(templates), tuple(deadlines)


def _template(name: str, template: Mapping[str, Any], path: Path, count: int) -> PodTemplate:
    metadata = template.get("metadata")
    spec = template.get("spec")
    labels_ = metadata.get("labels") if type(metadata) is dict else None
    annotations = metadata.get("annotations") if type(metadata) is dict else None
    if not (
        (metadata is None or type(metadata) is dict)
        and type(spec) is dict
        and (labels_ is None or _all_strings(labels_))
        and (annotations is None or _all_strings(annotations))
    ):
        return _checked_template(name, template, path, count)
    return PodTemplate(
        name=name,
        metadata_path=(*path, "metadata"),
        spec_path=(*path, "spec"),
        count=count,
        demand=_demand(spec, lambda: f"{_dotted(path)}.spec"),
        labels=_EMPTY if labels_ is None else labels_,
        annotations=_EMPTY if annotations is None else annotations,
        spec=spec,
    )


def _checked_template(
    name: str, template: Mapping[str, Any], path: Path, count: int
) -> PodTemplate:
    """``_template`` field by field, for a template that is not plain JSON maps of strings:
    the first field that is wrong raises, named."""
    where = _dotted(path)
    metadata = _map(template.get("metadata"), f"{where}.metadata")
    spec = _map(template.get("spec"), f"{where}.spec")
    return PodTemplate(
        name=name,
        metadata_path=(*path, "metadata"),
        spec_path=(*path, "spec"),
        count=count,
        demand=_demand(spec, lambda: f"{where}.spec"),
        labels=_string_map(metadata.get("labels"), f"{where}.metadata.labels"),
        annotations=_string_map(metadata.get("annotations"), f"{where}.metadata.annotations"),
        spec=spec,
    )


def _dotted(path: Path) -> str:
    """``spec.template`` for ``("spec", "template")``: how messages name a field."""
    return pointer(path)[1:].replace("/", ".")


def _all_strings(mapping: object) -> bool:
    """A map of strings to strings, as labels and annotations must be."""
    return type(mapping) is dict and all(type(item) is str for item in mapping.values())


def _demand(spec: Mapping[str, Any], where: Callable[[], str]) -> PodDemand:
    """The template's demand; ``where`` names its spec, for messages only."""
    if not isinstance(spec.get("containers"), list):
        raise WorkloadError(f"{where()}.containers is missing")
    # Resources only: the gang and topology annotations are checked by the policy rules
    # with their own messages, and a template being created lacks the gang-size that
    # the gang rule is about to add (pod_demand would reject the gang label without it).
    try:
        return pod_demand(spec, _EMPTY, _EMPTY)
    except DemandError as exc:
        raise WorkloadError(f"{where()}: {'; '.join(exc.problems)}") from None


def _deadline(spec: Mapping[str, Any], path: Path, what: str) -> Deadline:
    value = spec.get("activeDeadlineSeconds")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise WorkloadError(
            f"{pointer((*path, 'activeDeadlineSeconds'))[1:].replace('/', '.')} must be a "
            f"whole number of seconds, 1 or more (got {echo(value)})"
        )
    return Deadline(spec_path=path, seconds=value, what=what)


def _owners(raw: object) -> tuple[OwnerRef, ...]:
    """The ownerReferences; a field of the wrong type reads as absent (kube-apiserver
    refuses such an object after admission; ``webhook.owners`` trusts none of it)."""
    owners = []
    for ref in _list(raw, "metadata.ownerReferences"):
        if isinstance(ref, Mapping):
            owners.append(
                OwnerRef(
                    api_version=_text(ref.get("apiVersion")),
                    kind=_text(ref.get("kind")),
                    name=_text(ref.get("name")),
                    uid=_text(ref.get("uid")),
                    controller=ref.get("controller") is True,
                )
            )
    return tuple(owners)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _map(value: object, where: str) -> Mapping[str, Any]:
    if type(value) is dict:  # what orjson gives: skip the slower ABC check
        return value
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{where} is not an object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WorkloadError(f"{where} is not a list")
    return value


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WorkloadError(f"{where} is not a string")
    return value


def _string_map(value: object, where: str) -> Mapping[str, str]:
    mapping = _map(value, where)
    for key, item in mapping.items():
        if type(item) is not str:
            raise WorkloadError(f"{where}[{echo(key)}] is not a string")
    return mapping


def _count(value: object, where: str) -> int:
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WorkloadError(f"{where} must be a whole number, 0 or more (got {echo(value)})")
    return value
