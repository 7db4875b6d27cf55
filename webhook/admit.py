"""``admit``: one AdmissionReview request to one decision, the rules composed in order.

Layer: PURE. Plain functions from (request, policy, config, owners) to a decision: no
async, no I/O, no clock, no settings object, no aiohttp, no pydantic. ``admit`` never
raises for anything a request can contain. The rules are ``webhook.rules`` (their order
and what each decides are written there); this module only runs them, in that order
(the first denial wins), and checks UPDATEs.
"""

from __future__ import annotations

from dataclasses import replace

from cluster import labels
from cluster.echo import echo
from webhook.owners import NO_OWNERS, OwnerVerdict, OwnerView, judge_owner
from webhook.patch import Draft, PatchError
from webhook.queues import Policy
from webhook.rules.gang import name_gang, request_gang_id, rule_gang, rule_quota
from webhook.rules.namespace import rule_namespace_quota
from webhook.rules.outcome import INVALID, UNKNOWN_QUEUE, AdmitConfig, Allowed, Decision, Denied
from webhook.rules.placement import rule_flavors, rule_topology
from webhook.rules.queue import (
    rule_priority,
    rule_queue,
    rule_scheduler,
    rule_suspend,
    rule_time_limit,
)
from webhook.workload import (
    ReviewRequest,
    Workload,
    WorkloadError,
    WorkloadKind,
    workload_from_object,
)

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
        namespace_quota = rule_namespace_quota(workload, queue, policy)
        if isinstance(namespace_quota, Denied):
            return namespace_quota
        gang = rule_gang(workload, queue, flavors, policy, out)
        if isinstance(gang, Denied):
            return gang
        topology = rule_topology(workload, queue, flavors, policy, out)
        if isinstance(topology, Denied):
            return topology
        time_limit = rule_time_limit(workload, queue, out)
        if isinstance(time_limit, Denied):
            return time_limit
        notes += (
            *quota,
            *namespace_quota,
            *topology,
            *time_limit,
            *rule_scheduler(workload, config, out),
        )
    except (WorkloadError, PatchError) as exc:
        return Denied(INVALID, "invalid", f"{workload.kind.value} is not valid: {exc}")
    return Allowed(
        out.root, warnings=tuple(dict.fromkeys(notes)), queue=queue.local.name, gang_slots=gang
    )
