"""The nine admission rules, and ``admit`` that composes them into one decision.

Layer: PURE. Plain functions from (workload, policy, config) to a decision: no async, no
I/O, no clock, no settings object, no aiohttp, no pydantic. ``admit`` never raises for
anything a request can contain.

CREATE mutates, UPDATE only validates. Mutation works on a copy-on-write ``Draft`` of the
object: each rule reads the decoded ``Workload`` (the object as the user sent it) and
writes into the draft, keeping every value the user set. The patch is ``diff(original, copy)``
(``webhook.patch``). Every rule is idempotent: ``admit`` applied to its own output
changes nothing, which is what kube-apiserver's ``reinvocationPolicy: IfNeeded`` needs.

The rules, in the order they run (the first denial wins), for every workload but those
the Job and JobSet controllers made, which are let through as they are: a controller
ownerReference, from that controller's username, to an owner that exists with that uid
(``webhook.owners``; any other ownerReference changes nothing):

1. ``rule_queue``: the ``kueue.x-k8s.io/queue-name`` LocalQueue, or the namespace's
   default queue for a GPU workload with no label.
2. ``rule_suspend``: ``spec.suspend: true`` (Job, JobSet), or the Kueue scheduling gate
   (Pod).
3. ``rule_priority``: the WorkloadPriorityClass label, defaulted from the queue.
4. ``rule_flavors``: the queue's GPU flavors the job accepts (and where the queue could
   get some of every GPU resource it asks for); their node labels as a required node
   affinity (ORed across flavors, ANDed with the user's) and tolerations of their
   taints, on the pod templates that use GPUs. Never ``nodeSelector``: Kueue writes that
   at admission.
5. ``rule_quota``: the GPUs asked for against the most the queue could ever get.
6. ``rule_gang``: gang id, size and minimum on every pod template of a multi-pod
   workload; a gang-min below the size must fit the quota on its own (all pods
   together are rule 5's).
7. ``rule_topology``: ``tessera.dev/topology`` names a level of the flavors' Topology;
   copied onto pod templates.
8. ``rule_time_limit``: ``activeDeadlineSeconds`` defaulted and bounded by the queue.
9. ``rule_scheduler``: ``schedulerName`` of the extender's profile.

Decisions a reader might otherwise have to guess:

* GPU product matching (rule 4): a product the job accepts (``H100``) matches a
  flavor's ``nvidia.com/gpu.product`` label (``NVIDIA-H100-80GB-HBM3``, as GPU Feature
  Discovery writes it) when its ``-``-separated parts appear as consecutive parts of the
  label, case-insensitively: ``h100``, ``H100-80GB`` and the full label match it;
  ``H10`` and ``A100`` do not. A flavor without the label matches no named product.
* Node affinity (rule 4): required node-affinity terms are ORed and the expressions
  inside a term ANDed, so (user terms) AND (flavor A OR flavor B) is every user term
  ANDed with each flavor term. A user term that already contains every expression of
  some flavor term already implies the flavors and is kept as it is; that is also what
  makes a second pass change nothing. An empty user term matches no node and stays
  empty. A flavor with no node labels may run anywhere, so then no affinity is added.
* Tolerations (rule 4): one per taint in the allowed flavors' ``nodeTaints`` that no
  existing toleration tolerates. The flavors' ``spec.tolerations`` are Kueue's to add
  when it admits the workload to one flavor.
* Gang id (rule 6): ``<namespace>.<name>``. A ``generateName`` object has no name at
  admission, so its id is ``<namespace>.<generateName><5 characters>``, the characters
  drawn from a SHA-256 of the admission request's uid in the alphabet Kubernetes uses
  for generated names: unique (request uids are), and stable across reinvocation
  because an existing ``tessera.dev/gang`` label, on the object or on a template, is
  never rewritten. An id longer than a label value may be (63) keeps its first 57
  characters and ends in ``-`` and 5 characters from a hash of the whole id.
* Scheduler (rule 9): kube-apiserver defaults ``schedulerName`` to ``default-scheduler``
  before admission, so that value counts as "not chosen" and is replaced.
* Time limit (rule 8): the limit of a Job is its ``spec.activeDeadlineSeconds``, of a
  JobSet each replicated Job's, of a Pod its own. The same value is also written into
  pod templates that have none, because the extender only sees pods and needs it to
  keep jobs off nodes that drain before the limit ends. With no default but a maximum,
  the maximum is the default (a job without a limit would break the maximum).
* Quota (rule 5): counted per GPU resource: whole GPUs against ``nvidia.com/gpu``
  quota, shares (milli) against ``tessera.dev/gpu-milli`` quota. The job fits when one
  allowed flavor can hold all of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from cluster import labels
from cluster.convert import AnnotationError, parse_topology
from cluster.echo import ECHO_LIMIT, echo
from cluster.model import MILLI_PER_GPU, GangId, TopologyMode, product_matches
from webhook.owners import (
    DEFAULT_CONTROLLERS,
    NO_OWNERS,
    ControllerUsers,
    OwnerKey,
    OwnerVerdict,
    OwnerView,
    judge_owner,
)
from webhook.patch import Draft, PatchError, pointer
from webhook.queues import (
    ClusterQueue,
    Flavor,
    Limit,
    LocalQueue,
    Policy,
    Steering,
    format_seconds,
    parse_toleration,
    steering,
)
from webhook.workload import (
    Deadline,
    Path,
    PodTemplate,
    ReviewRequest,
    Workload,
    WorkloadError,
    WorkloadKind,
    workload_from_object,
)

FORBIDDEN: Final = 403
"""The object is well-formed but the cluster's policy does not allow it."""
INVALID: Final = 422
"""The object carries a value that cannot be right (a malformed or immutable field)."""

DEFAULT_SCHEDULER: Final = "default-scheduler"
"""What kube-apiserver writes into ``schedulerName`` when the user chose nothing."""
UNKNOWN_QUEUE: Final = "unknown"
"""The ``queue`` a decision reports (for metrics) when the object names a LocalQueue that
does not exist: what it names is the user's to choose, and must not become a label."""
GANG_MIN_DIGITS: Final = 9
"""The most digits a gang-min annotation may have."""
GANG_ID_MAX: Final = 63
"""A label value's maximum length."""
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
"""The characters Kubernetes draws generated-name suffixes from (no vowels, no 0/1/3)."""

Notes = tuple[str, ...]
"""Warnings a rule returns for the user (kubectl prints them)."""
GangSlots = tuple[Path, ...]
"""Label maps, by path in the object, where the gang id goes (``rule_gang``)."""


# ---------------------------------------------------------------- config and decisions


@dataclass(frozen=True, slots=True)
class AdmitConfig:
    """The few settings the rules read; built once by the app from its settings."""

    scheduler_name: str = labels.DEFAULT_SCHEDULER_NAME
    managed_namespaces: frozenset[str] = frozenset()
    """Namespaces where a GPU workload without a queue is denied; ``*`` means all."""
    controllers: ControllerUsers = DEFAULT_CONTROLLERS
    """Who the Job and JobSet controllers' requests come from (``webhook.owners``)."""

    def manages(self, namespace: str) -> bool:
        return namespace in self.managed_namespaces or "*" in self.managed_namespaces


@dataclass(frozen=True, slots=True)
class Allowed:
    """Admit ``object`` (the mutated copy, or the request's object when unchanged)."""

    object: Mapping[str, Any]
    warnings: Notes = ()
    reason: str = "admitted"
    """For metrics: ``admitted``, ``validated`` or why the object was let through as is."""
    queue: str = ""
    """For metrics: a LocalQueue of the policy, ``UNKNOWN_QUEUE``, or empty (none named)."""
    unconfirmed: OwnerKey | None = None
    """The controller the object claims, which the view lacked: found by one GET, it
    would let the object through as is (see ``admit``)."""
    gang_slots: GangSlots = ()
    """The label maps of ``object`` where the gang id made from the name goes
    (``rule_gang``); empty once ``name_gang`` wrote it, or when none is needed."""


@dataclass(frozen=True, slots=True)
class Denied:
    """Reject, with HTTP-style ``code`` (403 or 422) and a message a person can act on."""

    code: int
    reason: str
    """For metrics: the rule that denied (``queue``, ``quota``, …)."""
    message: str
    queue: str = ""
    """For metrics: a LocalQueue of the policy, ``UNKNOWN_QUEUE``, or empty (none named)."""
    unconfirmed: OwnerKey | None = None
    """As ``Allowed.unconfirmed``."""

    @property
    def status_reason(self) -> str:
        """The ``metav1.Status`` reason for ``code``."""
        return "Invalid" if self.code == INVALID else "Forbidden"


Decision = Allowed | Denied


@dataclass(frozen=True, slots=True)
class QueueChoice:
    """The queue a workload goes to, and how it was chosen."""

    local: LocalQueue
    cluster: ClusterQueue
    defaulted: bool = False

    def __str__(self) -> str:
        return f"queue {self.local.name} (ClusterQueue {self.cluster.name})"


@dataclass(frozen=True, slots=True)
class FlavorChoice:
    """The queue's GPU flavors the workload may use, in the queue's order."""

    flavors: tuple[Flavor, ...]
    warnings: Notes = ()


# ---------------------------------------------------------------- message helpers


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _names(items: Iterable[str]) -> str:
    return ", ".join(items) or "none"


# ---------------------------------------------------------------- rule 1: queue


def rule_queue(
    workload: Workload, policy: Policy, config: AdmitConfig, out: Draft
) -> QueueChoice | Denied | None:
    """The LocalQueue named by the label (or the namespace's default), and its ClusterQueue.

    ``None``: no label, no default queue, and a namespace not managed by Tessera: the
    workload is not Tessera's to touch.
    """
    namespace = workload.namespace
    name = workload.queue_name
    if name is None:
        local = policy.default_queue(namespace)
        if local is None:
            if not config.manages(namespace):
                return None
            return Denied(
                FORBIDDEN,
                "queue",
                f"{workload.kind_word} {workload.display_name} uses GPUs but has no "
                f"{labels.QUEUE_NAME} label, and namespace {echo(namespace, quote=False)} "
                "has no default "
                f"queue; set the label to one of the {_queues_there(policy, namespace)}",
            )
        out.node(("metadata", "labels"))[labels.QUEUE_NAME] = local.name
    else:
        found = policy.local_queue(namespace, name)
        if found is None:
            return Denied(
                FORBIDDEN,
                "queue",
                f"LocalQueue {echo(name)} (label {labels.QUEUE_NAME}) does not exist in "
                f"namespace {echo(namespace, quote=False)}; {_queues_there(policy, namespace)}",
                queue=UNKNOWN_QUEUE,
            )
        local = found
    cluster = policy.cluster_queue(local.cluster_queue)
    if cluster is None:
        others = [q for q in policy.queues_in(namespace) if q != local.name]
        return Denied(
            FORBIDDEN,
            "queue",
            f"LocalQueue {local.name} in namespace {local.namespace} points at ClusterQueue "
            f"{local.cluster_queue}, which does not exist; ask your cluster admin to fix "
            f"it, or use another queue ({_names(others)})",
            queue=local.name,
        )
    return QueueChoice(local=local, cluster=cluster, defaulted=name is None)


def _queues_there(policy: Policy, namespace: str) -> str:
    existing = policy.queues_in(namespace)
    if existing:
        return f"queues in namespace {namespace}: {_names(existing)}"
    return (
        f"namespace {echo(namespace, quote=False)} has no LocalQueue; ask your cluster admin "
        "for one"
    )


# ---------------------------------------------------------------- rule 2: suspend


def rule_suspend(workload: Workload, out: Draft) -> Notes:
    """Hold the workload for Kueue: ``spec.suspend`` (Job, JobSet) or the admission gate."""
    if workload.kind is WorkloadKind.POD:
        gates = out.get(("spec", "schedulingGates"))
        gates = gates if isinstance(gates, list) else []
        if not any(
            isinstance(g, Mapping) and g.get("name") == labels.KUEUE_ADMISSION_GATE for g in gates
        ):
            gate = {"name": labels.KUEUE_ADMISSION_GATE}
            out.node(("spec",))["schedulingGates"] = [*gates, gate]
    elif out.get(("spec", "suspend")) is not True:
        out.node(("spec",))["suspend"] = True
    return ()


# ---------------------------------------------------------------- rule 3: priority


def rule_priority(
    workload: Workload, queue: QueueChoice, policy: Policy, out: Draft
) -> Notes | Denied:
    """A named WorkloadPriorityClass must exist; none named: the queue's default."""
    name = workload.labels.get(labels.PRIORITY_CLASS)
    if name is not None:
        if policy.priority_class(name) is not None:
            return ()
        return Denied(
            FORBIDDEN,
            "priority",
            f"WorkloadPriorityClass {echo(name)} (label {labels.PRIORITY_CLASS}) does not exist; "
            f"use one of: {_names(policy.priority_class_names)}, or remove the label to get "
            f"the default of {queue}",
            queue=queue.local.name,
        )
    default = queue.local.settings.default_priority_class
    if default is None:
        return ()
    if policy.priority_class(default) is None:
        return (
            f"the default priority class {default} of queue {queue.local.name} does not "
            "exist; the job has no priority class (tell your cluster admin)",
        )
    out.node(("metadata", "labels"))[labels.PRIORITY_CLASS] = default
    return (f"priority class set to {default}, the default of queue {queue.local.name}",)


# ---------------------------------------------------------------- rule 4: flavors


def _gpu_resources(workload: Workload) -> tuple[str, ...]:
    """The GPU resources the workload asks for: whole GPUs, shares, or both."""
    whole = share = False
    for template in workload.templates:
        whole = whole or bool(template.demand.gpus)
        share = share or template.demand.is_share
    return ((labels.GPU_RESOURCE,) if whole else ()) + (
        (labels.GPU_MILLI_RESOURCE,) if share else ()
    )


def _describe(flavors: Iterable[Flavor]) -> str:
    return _names(f"{f.name} ({f.product or 'no GPU product label'})" for f in flavors)


def rule_flavors(
    workload: Workload, queue: QueueChoice, policy: Policy, out: Draft
) -> FlavorChoice | Denied:
    """Keep the queue's GPU flavors that the job accepts; steer its GPU pods onto them."""
    resources = _gpu_resources(workload)
    offer = policy.offer(queue.cluster, resources)
    offered = offer.flavors
    if not offered:
        return Denied(
            FORBIDDEN,
            "flavor",
            f"{queue} has no flavor with quota for {' and '.join(resources)}; "
            "use a queue that offers these GPUs",
            queue=queue.local.name,
        )
    chosen = offer
    raw = workload.annotations.get(labels.GPU_PRODUCT)
    if raw is not None:
        accepted = [p.strip() for p in raw.split("|") if p.strip()]
        if not accepted:
            return Denied(
                INVALID,
                "flavor",
                f"annotation {labels.GPU_PRODUCT} is empty; name the GPU products the job "
                "accepts (e.g. H100|A100) or remove it",
                queue=queue.local.name,
            )
        allowed = tuple(
            f for f in offered if f.product and any(product_matches(a, f.product) for a in accepted)
        )
        if not allowed:
            return Denied(
                FORBIDDEN,
                "flavor",
                f"{workload.kind_word} {workload.display_name} accepts GPU products "
                f"{echo(' or '.join(accepted), quote=False)} (annotation "
                f"{labels.GPU_PRODUCT}), but {queue} "
                f"offers {_describe(offered)}; change the annotation or use a queue that "
                "offers those GPUs",
                queue=queue.local.name,
            )
        if len(allowed) < len(offered):
            chosen = steering(allowed)
    notes: list[str] = []
    for template in workload.templates:
        if not template.uses_gpu:
            continue  # a CPU-only member (a JobSet driver) gets CPU flavors from Kueue
        if chosen.terms is not None:
            merge_required_affinity(out, template.spec_path, chosen.terms)
        added = add_tolerations(out, template.spec_path, chosen)
        if added:
            notes.append(
                f"tolerations added for the taints of flavors {_names(added)}: "
                "pods may run on those nodes"
            )
    return FlavorChoice(flavors=chosen.flavors, warnings=tuple(dict.fromkeys(notes)))


def _implies(term: Mapping[str, Any], flavor_term: Mapping[str, Any]) -> bool:
    have = term.get("matchExpressions") or []
    return all(expr in have for expr in flavor_term["matchExpressions"])


def _check_terms(terms: object, where: Path) -> list[Any]:
    """The user's ``nodeSelectorTerms``, each with its ``matchExpressions`` a list
    (kube-apiserver decodes them so; a client of our own port may not)."""
    if not isinstance(terms, list):
        raise WorkloadError(f"{pointer(where)} is not a list")
    for index, term in enumerate(terms):
        if isinstance(term, Mapping) and not isinstance(term.get("matchExpressions") or [], list):
            raise WorkloadError(f"{pointer((*where, index, 'matchExpressions'))} is not a list")
    return terms


_REQUIRED: Final = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")


def merge_required_affinity(
    out: Draft, spec_path: Path, flavor_terms: Sequence[Mapping[str, Any]]
) -> None:
    """AND the flavor terms (ORed among themselves) into a pod spec's required node affinity."""
    where = (*spec_path, *_REQUIRED, "nodeSelectorTerms")
    existing = _check_terms(out.get(where) or [], where)
    if not existing:
        out.node((*spec_path, *_REQUIRED))["nodeSelectorTerms"] = list(flavor_terms)
        return
    if all(
        not isinstance(term, Mapping)
        or (not term.get("matchExpressions") and not term.get("matchFields"))
        or any(_implies(term, f) for f in flavor_terms)
        for term in existing
    ):
        return  # already means (user) AND (flavors): nothing to write
    merged: list[Any] = []
    for term in existing:
        empty = (
            isinstance(term, Mapping)
            and not term.get("matchExpressions")
            and not term.get("matchFields")
        )
        if not isinstance(term, Mapping) or empty or any(_implies(term, f) for f in flavor_terms):
            merged.append(term)
            continue
        own = list(term.get("matchExpressions") or [])
        for flavor_term in flavor_terms:
            extra = [e for e in flavor_term["matchExpressions"] if e not in own]
            merged.append({**term, "matchExpressions": [*own, *extra]})
    out.node((*spec_path, *_REQUIRED))["nodeSelectorTerms"] = merged


def add_tolerations(out: Draft, spec_path: Path, chosen: Steering) -> list[str]:
    """Tolerate the flavors' node taints; returns the flavors that needed a new one."""
    if not chosen.taints:
        return []
    current = out.get((*spec_path, "tolerations"))
    current = current if isinstance(current, list) else []
    existing = []
    for raw in current:
        try:
            existing.append(parse_toleration(raw))
        except ValueError:
            continue  # kube-apiserver validates tolerations; an odd one tolerates nothing
    added: list[str] = []
    new: list[Mapping[str, Any]] = []
    for flavor, taint, toleration, written in chosen.taints:
        if any(t.tolerates(taint) for t in existing):
            continue
        existing.append(toleration)
        new.append(written)
        if flavor not in added:
            added.append(flavor)
    if new:
        out.node(spec_path)["tolerations"] = [*current, *new]
    return added


# ---------------------------------------------------------------- rule 5: quota


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """What a workload asks of one GPU resource, in that resource's own units."""

    resource: str
    total: int
    parts: tuple[tuple[str, int, int], ...]
    """(template name, pods, per pod) of each template asking for this resource."""


def gpu_asks(templates: Iterable[PodTemplate]) -> tuple[GpuAsk, ...]:
    """Whole GPUs (``nvidia.com/gpu``) and shares (``tessera.dev/gpu-milli``) asked for."""
    whole: list[tuple[str, int, int]] = []
    share: list[tuple[str, int, int]] = []
    for t in templates:
        if t.count and t.demand.gpus:
            whole.append((t.name, t.count, t.demand.gpus))
        elif t.count and t.demand.gpu_milli:
            share.append((t.name, t.count, t.demand.gpu_milli))
    asks = []
    for resource, parts in ((labels.GPU_RESOURCE, whole), (labels.GPU_MILLI_RESOURCE, share)):
        if parts:
            asks.append(GpuAsk(resource, sum(c * n for _, c, n in parts), tuple(parts)))
    return tuple(asks)


def _amount(resource: str, units: int) -> str:
    if resource == labels.GPU_RESOURCE:
        return _plural(units, "GPU")
    return f"{units} milli-GPUs"


def _breakdown(ask: GpuAsk) -> str:
    text = " + ".join(
        f"{echo(name, quote=False) + ': ' if name else ''}{_plural(count, 'pod')} × {each}"  # noqa: RUF001
        for name, count, each in ask.parts
    )
    # a JobSet may have thousands of replicated jobs: say how they add up, not each one
    return echo(text, quote=False, limit=3 * ECHO_LIMIT)


def _why_borrowable(limit: Limit, cluster: ClusterQueue) -> str:
    if cluster.cohort is None:
        return f"ClusterQueue {cluster.name} is in no cohort"
    if limit.borrowing_limit is not None and limit.borrowing_limit <= limit.cohort_lendable:
        return "its borrowingLimit"
    return f"what the rest of cohort {cluster.cohort} can lend"


def _fits(asks: Sequence[GpuAsk], queue: QueueChoice, flavor: Flavor, policy: Policy) -> bool:
    cluster = queue.cluster.name
    for ask in asks:  # a loop, not all(...): this runs for every review
        if ask.total * 1000 > policy.limit(cluster, flavor.name, ask.resource).total:
            return False
    return True


def _over_quota(
    asks: Sequence[GpuAsk], queue: QueueChoice, flavors: Sequence[Flavor], policy: Policy
) -> tuple[GpuAsk, Flavor, Limit] | None:
    """``None`` when one flavor holds every ask; else the ask and the flavor closest to it."""
    if not asks or not flavors:
        return None  # no flavors at all is rule 4's denial, not a quota question
    for flavor in flavors:
        if _fits(asks, queue, flavor, policy):
            return None
    for ask in asks:
        best = max(
            flavors, key=lambda f: policy.limit(queue.cluster.name, f.name, ask.resource).total
        )
        limit = policy.limit(queue.cluster.name, best.name, ask.resource)
        if ask.total * 1000 > limit.total:
            return ask, best, limit
    # Each ask fits some flavor, but none holds them all (whole GPUs and shares mixed):
    # name what does not fit in the flavor best for the first ask.
    best = max(
        flavors, key=lambda f: policy.limit(queue.cluster.name, f.name, asks[0].resource).total
    )
    for ask in asks:
        limit = policy.limit(queue.cluster.name, best.name, ask.resource)
        if ask.total * 1000 > limit.total:
            return ask, best, limit
    raise AssertionError("unreachable: the best flavor holds every ask")


def _can_get(queue: QueueChoice, ask: GpuAsk, flavor: Flavor, limit: Limit) -> str:
    units = 1000
    return (
        f"{queue} can get at most {_amount(ask.resource, limit.total // units)} in flavor "
        f"{flavor.name}{f' ({flavor.product})' if flavor.product else ''}: nominal "
        f"{limit.nominal // units} + borrowable {limit.borrowable // units} "
        f"({_why_borrowable(limit, queue.cluster)})"
    )


def rule_quota(
    workload: Workload, queue: QueueChoice, flavors: Sequence[Flavor], policy: Policy
) -> Notes | Denied:
    """Deny what the queue could never admit: over its best flavor, or over max-gpus-per-job."""
    asks = gpu_asks(workload.templates)
    over = _over_quota(asks, queue, flavors, policy)
    if over is not None:
        ask, flavor, limit = over
        return Denied(
            FORBIDDEN,
            "quota",
            f"{workload.kind_word} {workload.display_name} asks for "
            f"{_amount(ask.resource, ask.total)} ({_breakdown(ask)}); "
            f"{_can_get(queue, ask, flavor, limit)}; ask for fewer GPUs or use a queue with "
            "more quota",
            queue=queue.local.name,
        )
    limit_gpus = queue.local.settings.max_gpus_per_job
    if limit_gpus is not None:
        milli = sum(
            a.total * (MILLI_PER_GPU if a.resource == labels.GPU_RESOURCE else 1) for a in asks
        )
        if milli > limit_gpus * MILLI_PER_GPU:
            asked = "; ".join(f"{_amount(a.resource, a.total)} ({_breakdown(a)})" for a in asks)
            return Denied(
                FORBIDDEN,
                "quota",
                f"{workload.kind_word} {workload.display_name} asks for {asked}; {queue} "
                f"allows at most {_plural(limit_gpus, 'GPU')} per job "
                f"({labels.MAX_GPUS_PER_JOB}); ask for fewer GPUs or use another queue",
                queue=queue.local.name,
            )
    return ()


# ---------------------------------------------------------------- rule 6: gang


def _suffix(text: str, length: int = 5) -> str:
    number = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    chars = []
    for _ in range(length):
        number, digit = divmod(number, len(_NAME_ALPHABET))
        chars.append(_NAME_ALPHABET[digit])
    return "".join(chars)


def gang_id(namespace: str, name: str, generate_name: str, request_uid: str) -> GangId:
    """``<namespace>.<name>``; for a ``generateName`` object, a suffix from the request uid."""
    base = name or f"{generate_name}{_suffix(request_uid)}"
    value = f"{namespace}.{base}"
    if len(value) > GANG_ID_MAX:
        value = f"{value[: GANG_ID_MAX - 6].rstrip('-._')}-{_suffix(value)}"
    return GangId(value)


def _positive_count(value: str) -> int | None:
    text = value.strip()
    # ASCII digits only (int() refuses '²', which isdigit() accepts), and few of them: no
    # gang has a billion pods, and int() refuses a 60,000-digit string with a ValueError
    if not (text.isascii() and text.isdigit() and len(text) <= GANG_MIN_DIGITS):
        return None
    count = int(text)
    return count if count >= 1 else None


def _user_gang_min(workload: Workload) -> str | None:
    if labels.GANG_MIN in workload.annotations:
        return workload.annotations[labels.GANG_MIN]
    for template in workload.templates:
        if labels.GANG_MIN in template.annotations:
            return template.annotations[labels.GANG_MIN]
    return None


def _cheapest(templates: Sequence[PodTemplate], members: int) -> list[PodTemplate]:
    """Templates, with counts cut, of the ``members`` pods asking for the fewest GPUs."""
    picked = []
    for template in sorted(templates, key=lambda t: t.demand.total_milli):
        if members <= 0:
            break
        take = min(members, template.count)
        picked.append(
            PodTemplate(
                name=template.name,
                metadata_path=template.metadata_path,
                spec_path=template.spec_path,
                count=take,
                demand=template.demand,
            )
        )
        members -= take
    return picked


def rule_gang(
    workload: Workload,
    queue: QueueChoice,
    flavors: Sequence[Flavor],
    policy: Policy,
    out: Draft,
) -> GangSlots | Denied:
    """Gang metadata on every template of a multi-pod workload; gang-min must be possible.

    An id the workload carries (on itself or a template) is copied onto the templates
    that lack it. Without one, the id is made from the name and the request
    (``gang_id``), which no other rule reads: the rule only makes room for the label in
    each template's labels (so that the map sits where it always has) and returns where
    it goes, for ``name_gang`` to write as the last step. What the rules answer is then
    the same for objects that differ only in name (``webhook.answers``)."""
    size = workload.pod_count
    raw_min = _user_gang_min(workload)
    min_count = size
    if raw_min is not None:
        parsed = _positive_count(raw_min)
        if parsed is None or parsed > size:
            return Denied(
                INVALID,
                "gang",
                f"annotation {labels.GANG_MIN}={echo(raw_min)} must be a whole number from 1 to "
                f"the {_plural(size, 'pod')} of {workload.kind_word} "
                f"{workload.display_name}; fix it or remove it (default: all pods)",
                queue=queue.local.name,
            )
        min_count = parsed
    # All pods together are rule 5's to check; fewer must fit on their own.
    over = None
    if min_count < size:
        cheapest = gpu_asks(_cheapest(workload.templates, min_count))
        over = _over_quota(cheapest, queue, flavors, policy)
    if over is not None:
        ask, flavor, limit = over
        return Denied(
            FORBIDDEN,
            "gang",
            f"{labels.GANG_MIN}={min_count}: the {_plural(min_count, 'pod')} that must run "
            f"together need at least {_amount(ask.resource, ask.total)}; "
            f"{_can_get(queue, ask, flavor, limit)}; lower {labels.GANG_MIN} or ask for "
            "fewer GPUs per pod",
            queue=queue.local.name,
        )
    if size <= 1:
        return ()

    gid = workload.labels.get(labels.GANG) or next(
        (t.labels[labels.GANG] for t in workload.templates if labels.GANG in t.labels), None
    )
    slots: list[Path] = []
    for template in workload.templates:
        given = template.annotations.get(labels.GANG_SIZE)
        if given is not None and given.strip() != str(size):
            return Denied(
                INVALID,
                "gang",
                f"pod template {template.pointer} has annotation {labels.GANG_SIZE}={echo(given)}, "
                f"but {workload.kind_word} {workload.display_name} makes "
                f"{_plural(size, 'pod')}; remove the annotation (the webhook sets it)",
                queue=queue.local.name,
            )
        given_min = template.annotations.get(labels.GANG_MIN)
        if given_min is not None and given_min.strip() != str(min_count):
            return Denied(
                INVALID,
                "gang",
                f"pod template {template.pointer} has annotation {labels.GANG_MIN}="
                f"{echo(given_min)}, but the {workload.kind_word} asks for {min_count}; set "
                f"{labels.GANG_MIN} once, on the {workload.kind_word}",
                queue=queue.local.name,
            )
        meta = template.metadata_path
        if gid is not None:
            out.set_default((*meta, "labels"), labels.GANG, gid)
        else:
            out.node((*meta, "labels"))
            slots.append((*meta, "labels"))
        out.set_default((*meta, "annotations"), labels.GANG_SIZE, str(size))
        out.set_default((*meta, "annotations"), labels.GANG_MIN, str(min_count))
    return tuple(slots)


def name_gang(decision: Allowed, gid: str) -> Allowed:
    """``decision`` with ``gid`` written into each label map the gang rule left room in:
    the last step of a decision, the one part that depends on the object's name."""
    if not decision.gang_slots:
        return decision
    out = Draft(decision.object)
    for slot in decision.gang_slots:
        out.node(slot)[labels.GANG] = gid
    return Allowed(
        out.root, decision.warnings, decision.reason, decision.queue, decision.unconfirmed
    )


def request_gang_id(request: ReviewRequest) -> GangId:
    """The gang id of the object a request creates (``gang_id``); the request's
    namespace first, as kube-apiserver leaves ``metadata.namespace`` out at creation."""
    metadata: Any = (request.object or {}).get("metadata") or {}
    namespace = request.namespace or str(metadata.get("namespace") or "")
    name, generate_name = metadata.get("name") or "", metadata.get("generateName") or ""
    return gang_id(namespace, str(name), str(generate_name), request.uid)


# ---------------------------------------------------------------- rule 7: topology


def _check_level(
    value: str, where: str, flavors: Sequence[Flavor], policy: Policy, queue: QueueChoice
) -> Notes | Denied:
    try:
        constraint = parse_topology(value)
    except AnnotationError as exc:
        return Denied(
            INVALID,
            "topology",
            f"annotation {labels.TOPOLOGY} on {where}: {exc}",
            queue=queue.local.name,
        )
    topologies = {
        f.topology_name: policy.topology(f.topology_name)
        for f in flavors
        if f.topology_name is not None
    }
    known = {name: t for name, t in topologies.items() if t is not None}
    if not known:
        return Denied(
            FORBIDDEN,
            "topology",
            f"annotation {labels.TOPOLOGY}={echo(value)} on {where}: the flavors {queue} allows "
            f"({_names(f.name for f in flavors)}) have no Topology; remove the annotation or "
            "use a queue with topology-aware flavors",
            queue=queue.local.name,
        )
    having = [f for f in flavors if f.topology_name in known
              and known[f.topology_name].node_label(constraint.level) is not None]  # fmt: skip
    if not having:
        levels = "; ".join(
            f"Topology {name}: {', '.join(t.level_names)}" for name, t in sorted(known.items())
        )
        return Denied(
            FORBIDDEN,
            "topology",
            f"annotation {labels.TOPOLOGY}={echo(value)} on {where}: "
            f"{echo(constraint.level)} is not a level of the allowed flavors' topology "
            f"({levels}); use one of those levels",
            queue=queue.local.name,
        )
    if constraint.mode is TopologyMode.REQUIRED and len(having) < len(flavors):
        lacking = [f.name for f in flavors if f not in having]
        return (
            f"flavors {_names(lacking)} have no topology level {echo(constraint.level)}; "
            "Kueue may still place the job there",
        )
    return ()


def rule_topology(
    workload: Workload,
    queue: QueueChoice,
    flavors: Sequence[Flavor],
    policy: Policy,
    out: Draft,
) -> Notes | Denied:
    """The topology annotation must name a level of the flavors' Topology.

    Who acts on it depends on the flavors (README, "With Kueue"). Mode A, flavors that name
    their Topology in ``tessera.dev/topology-name``: copied onto the pod templates, where the
    extender keeps the gang within the level. Mode B, a flavor with ``spec.topologyName``:
    Kueue's topology-aware scheduling picks the nodes before kube-scheduler sees the pods,
    so the level goes to Kueue as its pod-set annotation (the level's node label) and is
    not copied, lest the extender second-guess the nodes Kueue chose.
    """
    value = workload.annotations.get(labels.TOPOLOGY)
    kueue_flavors = [f for f in flavors if f.kueue_topology]
    notes: list[str] = []
    if value is not None:
        checked = _check_level(
            value, f"{workload.kind_word} {workload.display_name}", flavors, policy, queue
        )
        if isinstance(checked, Denied):
            return checked
        notes.extend(checked)
    for template in workload.templates:
        own = template.annotations.get(labels.TOPOLOGY)
        if own is not None and own != value:
            checked = _check_level(own, f"pod template {template.pointer}", flavors, policy, queue)
            if isinstance(checked, Denied):
                return checked
            notes.extend(checked)
        effective = own if own is not None else value
        if effective is None:
            continue
        if kueue_flavors:
            notes.extend(_ask_kueue(effective, template, flavors, policy, out))
        elif own is None:
            out.set_default((*template.metadata_path, "annotations"), labels.TOPOLOGY, effective)
    return tuple(dict.fromkeys(notes))


def _ask_kueue(
    value: str,
    template: PodTemplate,
    flavors: Sequence[Flavor],
    policy: Policy,
    out: Draft,
) -> Notes:
    """Kueue's pod-set topology annotation for ``value`` (checked already) on ``template``."""
    kueue_flavors = [f for f in flavors if f.kueue_topology]
    constraint = parse_topology(value)
    node_label = next(
        (
            label
            for f in kueue_flavors
            if f.topology_name is not None
            and (topology := policy.topology(f.topology_name)) is not None
            and (label := topology.node_label(constraint.level)) is not None
        ),
        None,
    )
    if node_label is None:
        return ()
    key = (
        labels.KUEUE_REQUIRED_TOPOLOGY
        if constraint.mode is TopologyMode.REQUIRED
        else labels.KUEUE_PREFERRED_TOPOLOGY
    )
    out.set_default((*template.metadata_path, "annotations"), key, node_label)
    notes = [f"topology {value.strip()}: Kueue's topology-aware scheduling places the pods ({key})"]
    if len(kueue_flavors) < len(flavors):
        others = [f.name for f in flavors if not f.kueue_topology]
        notes.append(
            f"flavors {_names(others)} have no spec.topologyName: Kueue admits a job that "
            "asks for a topology only to flavors that have one"
        )
    return tuple(notes)


# ---------------------------------------------------------------- rule 8: time limit


def rule_time_limit(workload: Workload, queue: QueueChoice, out: Draft) -> Notes | Denied:
    """``activeDeadlineSeconds`` defaulted from the queue and never above its maximum."""
    settings = queue.local.settings
    maximum = settings.max_time_limit_s
    default = settings.default_time_limit_s or maximum
    if maximum is not None:
        for seconds, holder in _time_limits(workload):
            if seconds is not None and seconds > maximum:
                return Denied(
                    FORBIDDEN,
                    "time-limit",
                    f"{_where(holder)} asks for activeDeadlineSeconds {seconds} "
                    f"({format_seconds(seconds)}); {queue} allows at most {maximum} "
                    f"({format_seconds(maximum)}, {labels.MAX_TIME_LIMIT}); set a shorter "
                    "activeDeadlineSeconds or use another queue",
                    queue=queue.local.name,
                )
    notes: list[str] = []
    for index, deadline in enumerate(workload.deadlines):
        limit = deadline.seconds
        if limit is None and default is not None:
            limit = default
            out.node(deadline.spec_path)["activeDeadlineSeconds"] = default
            notes.append(
                f"activeDeadlineSeconds set to {default} ({format_seconds(default)}), the "
                f"default time limit of queue {queue.local.name}"
            )
        if limit is not None and workload.kind is not WorkloadKind.POD:
            template = workload.templates[index]
            out.set_default(template.spec_path, "activeDeadlineSeconds", limit)
    return tuple(dict.fromkeys(notes))


def _time_limits(workload: Workload) -> Iterator[tuple[int | None, Deadline | PodTemplate]]:
    """Each ``activeDeadlineSeconds`` that bounds the workload, and where it is set."""
    for deadline in workload.deadlines:
        yield deadline.seconds, deadline
    if workload.kind is not WorkloadKind.POD:
        # a pod template's own limit must respect the maximum too
        for template in workload.templates:
            value = template.spec.get("activeDeadlineSeconds")
            yield (
                (value if isinstance(value, int) and not isinstance(value, bool) else None),
                template,
            )


def _where(holder: Deadline | PodTemplate) -> str:
    """How a message names a holder: built only for a message, never on the way to yes."""
    return holder.what if isinstance(holder, Deadline) else f"pod template {holder.pointer}"


# ---------------------------------------------------------------- rule 9: scheduler


def rule_scheduler(workload: Workload, config: AdmitConfig, out: Draft) -> Notes:
    """Pod templates go to the extender's scheduler profile unless the user chose one."""
    for template in workload.templates:
        chosen = template.spec.get("schedulerName")
        if not chosen or chosen == DEFAULT_SCHEDULER:
            out.node(template.spec_path)["schedulerName"] = config.scheduler_name
    return ()


# ---------------------------------------------------------------- UPDATE


def _shown(value: str | None) -> str:
    return "unset" if value is None else echo(value)


def check_gang_namespace(workload: Workload) -> Denied | None:
    """A gang id is ``<namespace>.<name>``: a label naming a gang of another namespace
    would make the extender count this workload's pods as that gang's members, and so
    steer another team's job. Checked before any queue rule, since a workload that names
    no queue is let through otherwise."""
    own = f"{workload.namespace}."
    found = [(workload.labels.get(labels.GANG), None)] + [
        (t.labels.get(labels.GANG), t) for t in workload.templates
    ]
    for gid, template in found:
        if gid is not None and not gid.startswith(own):
            at = "" if template is None else f" of pod template {template.pointer}"
            return Denied(
                INVALID,
                "gang",
                f"label {labels.GANG}={echo(gid)}{at} names a gang outside namespace "
                f"{echo(workload.namespace, quote=False)}; gang ids are "
                f"<namespace>.<job name>: remove the label (the webhook sets it)",
            )
    return None


def check_update(new: Workload, old: Workload) -> Denied | None:
    """UPDATE: the queue label is fixed once running, the gang metadata for good, and a
    pod's GPU record is the extender's alone (a Binding writes it, never an UPDATE)."""
    if new.kind is WorkloadKind.POD:
        now, before = (
            new.annotations.get(labels.GPU_INDICES),
            old.annotations.get(labels.GPU_INDICES),
        )
        if now != before:
            return Denied(
                INVALID,
                "update",
                f"annotation {labels.GPU_INDICES} cannot change (was {_shown(before)}, now "
                f"{_shown(now)}): it records the GPUs the extender gave pod "
                f"{new.display_name} when it bound it, and only that Binding writes it",
            )
    if new.queue_name != old.queue_name and not (old.suspended and new.suspended):
        return Denied(
            INVALID,
            "update",
            f"label {labels.QUEUE_NAME} cannot change from {_shown(old.queue_name)} to "
            f"{_shown(new.queue_name)} while {new.kind_word} {new.display_name} is admitted or "
            "running; suspend it first, or create a new one in the other queue",
        )
    checks = [
        (new.annotations.get(labels.GANG_MIN), old.annotations.get(labels.GANG_MIN),
         f"annotation {labels.GANG_MIN}", "")
    ]  # fmt: skip
    if len(new.templates) == len(old.templates):
        for n, o in zip(new.templates, old.templates, strict=True):
            at = f" of pod template {n.pointer}"
            checks += [
                (n.labels.get(labels.GANG), o.labels.get(labels.GANG),
                 f"label {labels.GANG}", at),
                (n.annotations.get(labels.GANG_SIZE), o.annotations.get(labels.GANG_SIZE),
                 f"annotation {labels.GANG_SIZE}", at),
                (n.annotations.get(labels.GANG_MIN), o.annotations.get(labels.GANG_MIN),
                 f"annotation {labels.GANG_MIN}", at),
            ]  # fmt: skip
    for now, before, what, at in checks:
        if now != before:
            return Denied(
                INVALID,
                "update",
                f"{what}{at} cannot change after creation (was {_shown(before)}, now "
                f"{_shown(now)}); delete and re-create {new.kind_word} {new.display_name} "
                "to change its gang",
            )
    return None


# ---------------------------------------------------------------- admit


def admit(
    request: ReviewRequest, policy: Policy, config: AdmitConfig, *, owners: OwnerView = NO_OWNERS
) -> Decision:
    """The webhook's whole decision for one AdmissionReview request: ``decide``, then
    the gang id made from the name written (``name_gang``)."""
    decision = decide(request, policy, config, owners=owners)
    if isinstance(decision, Allowed) and decision.gang_slots:
        return name_gang(decision, request_gang_id(request))
    return decision


def decide(
    request: ReviewRequest, policy: Policy, config: AdmitConfig, *, owners: OwnerView = NO_OWNERS
) -> Decision:
    """The rules' decision for one AdmissionReview request, all but the gang id made
    from the name: an ``Allowed`` says where that goes (``gang_slots``).

    An object made by the Job or JobSet controller (its controller ownerReference, the
    sender and ``owners`` say so: ``webhook.owners.judge_owner``) is let through as it
    is: its template was admitted with its owner. Any other object is judged as a
    workload of its own, whatever ownerReferences it carries. When only the owner's
    absence from ``owners`` stood in the way and the answer is not "allowed as is", the
    decision names that owner (``unconfirmed``) so that the caller may fetch it and
    decide again with ``owners.with_fetched``."""
    obj = request.object
    kind = request.workload_kind
    if kind is None or obj is None:
        return Allowed(obj or {}, reason="not-a-workload")
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return Allowed(obj, reason="not-mutated")
    try:
        workload = workload_from_object(obj, kind, request.namespace)
    except WorkloadError as exc:
        return Denied(INVALID, "invalid", f"{kind.value} is not valid: {exc}")
    verdict = judge_owner(
        workload.owners, workload.namespace, request.user.username, owners, config.controllers
    )
    if verdict.owned:
        return Allowed(obj, reason="owned")
    decision = _judge(request, workload, policy, config)
    if verdict.refused:
        return _claim_refused(decision, verdict, workload)
    return decision


def _judge(
    request: ReviewRequest,
    workload: Workload,
    policy: Policy,
    config: AdmitConfig,
) -> Decision:
    """The rules, for a workload of its own."""
    if not workload.uses_gpu:
        return Allowed(workload.obj, reason="no-gpu")
    foreign = check_gang_namespace(workload)
    if foreign is not None:
        return replace(foreign, queue=queue_label(policy, workload.namespace, workload.queue_name))
    if request.operation == "UPDATE":
        return _validate_update(request, workload, workload.kind, policy)
    return _mutate(workload, policy, config)


def _claim_refused(decision: Decision, verdict: OwnerVerdict, workload: Workload) -> Decision:
    """``decision`` on an object whose claimed controller was not taken. A user whose
    object is changed learns why it was judged at all; and where the answer is not to
    let it through as is, a claim the view could not confirm is named for a GET."""
    as_is = isinstance(decision, Allowed) and decision.object is workload.obj
    unconfirmed = verdict.claimed if verdict.confirmable and not as_is else None
    if isinstance(decision, Allowed) and not as_is:
        note = (
            f"{workload.kind_word} {workload.display_name} is judged as a {workload.kind_word} "
            f"of its own, not as made by its controller: {verdict.refused}"
        )
        return replace(decision, warnings=(*decision.warnings, note), unconfirmed=unconfirmed)
    return replace(decision, unconfirmed=unconfirmed) if unconfirmed is not None else decision


def queue_label(policy: Policy, namespace: str, name: str | None) -> str:
    """What a decision reports as its queue: ``name`` when it is a LocalQueue of the
    policy, else ``UNKNOWN_QUEUE``; empty when no queue is named. A bounded set, so that
    metrics counted by it cannot grow with what users write."""
    if not name:
        return ""
    return name if policy.local_queue(namespace, name) is not None else UNKNOWN_QUEUE


def _validate_update(
    request: ReviewRequest, workload: Workload, kind: WorkloadKind, policy: Policy
) -> Decision:
    queue = queue_label(policy, workload.namespace, workload.queue_name)
    if request.old_object is None:
        return Allowed(workload.obj, reason="validated", queue=queue)
    try:
        old = workload_from_object(request.old_object, kind, request.namespace)
    except WorkloadError:
        # The stored object is what it is; only the new one is ours to judge.
        return Allowed(workload.obj, reason="validated", queue=queue)
    denied = check_update(workload, old)
    if denied is not None:
        return replace(denied, queue=queue)
    return Allowed(workload.obj, reason="validated", queue=queue)


def _mutate(workload: Workload, policy: Policy, config: AdmitConfig) -> Decision:
    out = Draft(workload.obj)
    try:
        queue = rule_queue(workload, policy, config, out)
        if queue is None:
            return Allowed(workload.obj, reason="no-queue")
        if isinstance(queue, Denied):
            return queue
        notes: list[str] = []
        if queue.defaulted:
            notes.append(
                f"no {labels.QUEUE_NAME} label: sent to {queue.local.name}, the default "
                f"queue of namespace {echo(workload.namespace, quote=False)}"
            )
        notes += rule_suspend(workload, out)
        priority = rule_priority(workload, queue, policy, out)
        if isinstance(priority, Denied):
            return priority
        notes += priority
        chosen = rule_flavors(workload, queue, policy, out)
        if isinstance(chosen, Denied):
            return chosen
        notes += chosen.warnings
        flavors = chosen.flavors
        quota = rule_quota(workload, queue, flavors, policy)
        if isinstance(quota, Denied):
            return quota
        gang = rule_gang(workload, queue, flavors, policy, out)
        if isinstance(gang, Denied):
            return gang
        topology = rule_topology(workload, queue, flavors, policy, out)
        if isinstance(topology, Denied):
            return topology
        time_limit = rule_time_limit(workload, queue, out)
        if isinstance(time_limit, Denied):
            return time_limit
        notes += (*quota, *topology, *time_limit, *rule_scheduler(workload, config, out))
    except (WorkloadError, PatchError) as exc:
        return Denied(INVALID, "invalid", f"{workload.kind.value} is not valid: {exc}")
    return Allowed(
        out.root, warnings=tuple(dict.fromkeys(notes)), queue=queue.local.name, gang_slots=gang
    )
