"""Whether a reviewed object was really made by a Job or JobSet controller.

Layer: PURE. Frozen records and functions: no I/O, no clock, no settings object, no
aiohttp, no pydantic. ``webhook.source`` keeps the watch cache this module reads through
an ``OwnerView``, and fetches an owner the view lacks; nothing here waits for either.

The webhook lets through, unchanged, the pods that the Job controller makes and the Jobs
that the JobSet controller makes: their template was admitted with the Job or JobSet.
Anyone may write an ownerReference, though, so a claim counts only when all of these
hold (``judge_owner``):

* the reference has ``controller: true`` and names a ``batch/v1`` Job or a
  ``jobset.x-k8s.io`` JobSet, by a name the API could hold;
* the request comes from that controller (``ControllerUsers``; an empty list for a kind
  does not check the sender);
* that Job or JobSet exists in the object's namespace with the reference's uid
  (``OwnerView``: the watch cache, or a GET made for this review).

Anything else is judged as a workload of its own, by every rule. When the only thing
missing is the owner in the view (the watch may lag the controller by a moment), the
verdict says so (``confirmable``), and the caller may fetch that owner once and ask again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from cluster.echo import echo


class OwnerKind(Enum):
    JOB = "Job"
    JOBSET = "JobSet"


JOB_API_VERSION: Final = "batch/v1"
JOBSET_GROUP: Final = "jobset.x-k8s.io"

_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""An object name as the API accepts it (a DNS subdomain). A name that is not one names
no object, and is never put into a URL."""


def owner_kind(api_version: object, kind: object) -> OwnerKind | None:
    """The owner kind a reference or object names, or ``None`` for any other kind. Any
    version of JobSet's group counts: a uid is the same whichever version it is read at."""
    if kind == "Job" and api_version == JOB_API_VERSION:
        return OwnerKind.JOB
    if (
        kind == "JobSet"
        and isinstance(api_version, str)
        and api_version.startswith(JOBSET_GROUP + "/")
    ):
        return OwnerKind.JOBSET
    return None


@dataclass(frozen=True, slots=True)
class OwnerKey:
    """A Job or JobSet by namespace and name."""

    kind: OwnerKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return (
            f"{self.kind.value} {echo(self.namespace, quote=False)}/{echo(self.name, quote=False)}"
        )


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def owner_record(obj: Mapping[str, Any]) -> tuple[tuple[str, str], str] | None:
    """``((namespace, name), uid)`` of a Job or JobSet as listed or watched: the slim
    record the watch cache keeps. ``None`` for an object without all three."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    namespace, name, uid = metadata.get("namespace"), metadata.get("name"), metadata.get("uid")
    if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)):
        return None
    if not (namespace and name and uid):
        return None
    return (namespace, name), uid


def claims_job_owner(obj: Mapping[str, Any]) -> bool:
    """``obj`` has an ownerReference to a Job or JobSet, controller or not: whether its
    answer may depend on more than the object (who sent it, what exists)."""
    metadata = obj.get("metadata")
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not refs or not isinstance(refs, list):
        return False
    return any(
        isinstance(ref, Mapping) and owner_kind(ref.get("apiVersion"), ref.get("kind")) is not None
        for ref in refs
    )


# ---------------------------------------------------------------- what is known


_NO_UIDS: Final[Mapping[tuple[str, str], str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class OwnerView:
    """What the webhook knows of the Jobs and JobSets that exist, for one review.

    ``known`` is the watch cache (or the Jobs and JobSets of a policy file): per kind,
    ``(namespace, name) → uid``. Readers take the view and decide with no ``await`` in
    between, so the writer's changes never show half-made. ``fetched`` holds owners read
    from the API for this review (``None``: it does not exist), and wins over ``known``.
    """

    known: Mapping[OwnerKind, Mapping[tuple[str, str], str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    fetched: Mapping[OwnerKey, str | None] = field(default_factory=lambda: MappingProxyType({}))

    def uid(self, key: OwnerKey) -> str | None:
        if key in self.fetched:
            return self.fetched[key]
        return self.known.get(key.kind, _NO_UIDS).get((key.namespace, key.name))

    def with_fetched(self, key: OwnerKey, uid: str | None) -> OwnerView:
        """This view, and ``key`` as the API answered: its uid, or ``None`` (not found)."""
        return OwnerView(self.known, MappingProxyType({**self.fetched, key: uid}))


NO_OWNERS: Final = OwnerView()
"""Knows no owner: every claimed owner is unverified (a policy file without Jobs)."""


JOB_CONTROLLER_USERNAMES: Final = (
    "system:serviceaccount:kube-system:job-controller",
    "system:kube-controller-manager",
)
"""Who the Job controller's requests come from: its own service account when
kube-controller-manager runs with ``--use-service-account-credentials`` (kubeadm's
default), else kube-controller-manager's identity."""
JOBSET_CONTROLLER_USERNAMES: Final = (
    "system:serviceaccount:jobset-system:jobset-controller-manager",
)
"""Who the JobSet controller's requests come from, installed as JobSet's release
manifests install it."""


@dataclass(frozen=True, slots=True)
class ControllerUsers:
    """The usernames each controller's requests come with; empty: any sender."""

    job: frozenset[str] = frozenset(JOB_CONTROLLER_USERNAMES)
    jobset: frozenset[str] = frozenset(JOBSET_CONTROLLER_USERNAMES)

    def allows(self, kind: OwnerKind, username: str) -> bool:
        names = self.job if kind is OwnerKind.JOB else self.jobset
        return not names or username in names


DEFAULT_CONTROLLERS: Final = ControllerUsers()


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One ``metadata.ownerReferences`` entry, as decoded from the object."""

    api_version: str
    kind: str
    name: str
    uid: str = ""
    controller: bool = False


@dataclass(frozen=True, slots=True)
class OwnerVerdict:
    """Whether to let the object through as its controller's, and if not, why."""

    owned: bool
    claimed: OwnerKey | None = None
    """The Job or JobSet the object names as its controller, if it names one."""
    refused: str = ""
    """Why the claim was not taken (for the user's warning); empty when owned or none."""
    confirmable: bool = False
    """Only the owner's presence in the view was missing: one GET of ``claimed`` may
    still find it (the watch can lag the controller that just made the object)."""


NOT_CLAIMED: Final = OwnerVerdict(owned=False)


def controller_reference(refs: Sequence[OwnerRef]) -> OwnerRef | None:
    """The ownerReference with ``controller: true`` (the API allows one), if it names a
    Job or JobSet."""
    for ref in refs:
        if ref.controller:
            return ref if owner_kind(ref.api_version, ref.kind) is not None else None
    return None


def judge_owner(
    refs: Sequence[OwnerRef],
    namespace: str,
    username: str,
    view: OwnerView,
    controllers: ControllerUsers,
) -> OwnerVerdict:
    """Whether an object in ``namespace`` with ``refs``, sent by ``username``, was made
    by the Job or JobSet controller (see the module's docstring)."""
    ref = controller_reference(refs)
    if ref is None:
        return NOT_CLAIMED
    kind = owner_kind(ref.api_version, ref.kind)
    assert kind is not None  # controller_reference keeps only those
    if not (valid_name(ref.name) and valid_name(namespace)):
        return OwnerVerdict(
            False, None, f"ownerReference {kind.value} {echo(ref.name)} names no object"
        )
    key = OwnerKey(kind, namespace, ref.name)
    if not controllers.allows(kind, username):
        return OwnerVerdict(
            False, key, f"the request comes from {echo(username)}, not the {kind.value} controller"
        )
    uid = view.uid(key)
    if uid is not None and uid == ref.uid:
        return OwnerVerdict(True, key)
    fetched = key in view.fetched
    if uid is None:
        why = f"{key} does not exist" if fetched else f"{key} is not known to the webhook"
    else:
        why = f"{key} has uid {uid}, not {echo(ref.uid)}"
    return OwnerVerdict(False, key, why, confirmable=not fetched)
