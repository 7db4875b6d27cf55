"""Rules 1, 2, 3, 8 and 9: the queue, suspension, priority, time limit and scheduler.

Layer: PURE. Functions from (workload, queue, policy, draft) to notes or a denial; they
write only into the ``Draft`` they are given. No I/O, no clock, no aiohttp, no pydantic.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from cluster import labels
from cluster.echo import echo
from webhook.patch import Draft
from webhook.queues import Policy, format_seconds
from webhook.rules.outcome import (
    DEFAULT_SCHEDULER,
    FORBIDDEN,
    UNKNOWN_QUEUE,
    AdmitConfig,
    Denied,
    Notes,
    QueueChoice,
    names,
)
from webhook.workload import Deadline, PodTemplate, Workload, WorkloadKind

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
            f"it, or use another queue ({names(others)})",
            queue=local.name,
        )
    return QueueChoice(local=local, cluster=cluster, defaulted=name is None)


def _queues_there(policy: Policy, namespace: str) -> str:
    existing = policy.queues_in(namespace)
    if existing:
        return f"queues in namespace {namespace}: {names(existing)}"
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
            f"use one of: {names(policy.priority_class_names)}, or remove the label to get "
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
