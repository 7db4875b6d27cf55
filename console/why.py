"""``tessera why JOB|POD``: one answer to "why is it not running", stage by stage.

Layer: PURE. From the objects the command read (the Job, JobSet or Pod, its owners, its
pods, its Kueue Workload, the events about them, the queue policy and the workloads of
its ClusterQueue) and the extender's records (``extender.explain.PodReasons``) to a
frozen report: no I/O, no clock (``now`` is a value). Must not guess what it cannot
read: a stage whose objects are missing says so.

The stages, in the order a GPU job passes them:

1. the webhook: what it wrote on the object (queue and priority labels, gang and
   topology keys on the pod template, scheduler name, time limit, suspension);
2. Kueue: the Workload's conditions (``QuotaReserved``, ``Admitted``, ``Evicted``,
   ``Finished``, with reason and message), its admission checks, the GPUs it asks, and
   its ClusterQueue's quota as ``tessera queues`` counts it;
3. the scheduler: each pod's ``PodScheduled`` condition and, for pods not placed, what
   the extender's last ``/filter`` said, reasons grouped and nodes counted;
4. the events about all of these, newest first.

The verdict is the first stage that holds the job back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cluster import labels
from cluster.convert.grammar import format_rfc3339
from console.reading import field_list, field_map, timestamp
from extender.explain import PodReasons, by_category, headline

EVENTS_SHOWN: Final = 12
PODS_SHOWN: Final = 20

# (where, key, what it means): the marks the webhook leaves, read off the object
_LABEL_MARKS: Final = (
    (labels.QUEUE_NAME, "LocalQueue"),
    (labels.PRIORITY_CLASS, "WorkloadPriorityClass"),
)
_TEMPLATE_LABEL_MARKS: Final = ((labels.GANG, "gang id (the extender places its members)"),)
_TEMPLATE_ANNOTATION_MARKS: Final = (
    (labels.GANG_SIZE, "members in the gang"),
    (labels.GANG_MIN, "members that must run together"),
    (labels.TOPOLOGY, "topology the gang is kept in"),
    (labels.KUEUE_REQUIRED_TOPOLOGY, "Kueue keeps the pod set in one domain of this level"),
    (labels.KUEUE_PREFERRED_TOPOLOGY, "Kueue prefers one domain of this level"),
)


@dataclass(frozen=True, slots=True)
class Mark:
    key: str
    value: str
    meaning: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "meaning": self.meaning}


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    since: datetime | None

    def to_json(self) -> dict[str, object]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "since": None if self.since is None else format_rfc3339(self.since),
        }


@dataclass(frozen=True, slots=True)
class Quota:
    """The workload's ClusterQueue as ``tessera queues`` counts it (whole GPUs)."""

    cluster_queue: str
    cohort: str
    nominal: int
    used: int
    borrowed: int
    lent: int
    pending: int

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_queue": self.cluster_queue,
            "cohort": self.cohort or None,
            "gpus_nominal": self.nominal,
            "gpus_used": self.used,
            "gpus_borrowed": self.borrowed,
            "gpus_lent": self.lent,
            "workloads_pending": self.pending,
        }


@dataclass(frozen=True, slots=True)
class WorkloadState:
    name: str
    queue: str
    cluster_queue: str
    gpus: int
    conditions: tuple[Condition, ...]
    checks: tuple[tuple[str, str, str], ...]
    """Admission checks: (name, state, message)."""
    quota: Quota | None

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def holds(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.status == "True"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "queue": self.queue,
            "cluster_queue": self.cluster_queue,
            "gpus": self.gpus,
            "conditions": [c.to_json() for c in self.conditions],
            "admission_checks": [{"name": n, "state": s, "message": m} for n, s, m in self.checks],
            "quota": None if self.quota is None else self.quota.to_json(),
        }


@dataclass(frozen=True, slots=True)
class PodState:
    name: str
    phase: str
    node: str
    scheduled: str
    """``PodScheduled``'s status, or ``-`` without one."""
    reason: str
    message: str
    gates: tuple[str, ...]

    @property
    def placed(self) -> bool:
        return bool(self.node)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "phase": self.phase,
            "node": self.node or None,
            "scheduled": self.scheduled,
            "reason": self.reason,
            "message": self.message,
            "scheduling_gates": list(self.gates),
        }


@dataclass(frozen=True, slots=True)
class ReasonsSeen:
    """Pods whose last ``/filter`` was refused alike (same counts per kind of reason),
    and the newest of their records."""

    pods: tuple[str, ...]
    source: str
    record: PodReasons

    def to_json(self) -> dict[str, object]:
        return {
            "pods": list(self.pods),
            "extender": self.source,
            "summary": headline(self.record),
            "record": self.record.to_json(),
        }


@dataclass(frozen=True, slots=True)
class EventRow:
    at: datetime | None
    type: str
    reason: str
    about: str
    """The object the event is about, as ``kind/name``."""
    message: str
    count: int

    def to_json(self) -> dict[str, object]:
        return {
            "last_seen": None if self.at is None else format_rfc3339(self.at),
            "type": self.type,
            "reason": self.reason,
            "object": self.about,
            "message": self.message,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class WhyReport:
    target: str
    """``job team-nlp/pretrain``."""
    verdict: str
    marks: tuple[Mark, ...]
    workload: WorkloadState | None
    pods: tuple[PodState, ...]
    reasons: tuple[ReasonsSeen, ...]
    events: tuple[EventRow, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "verdict": self.verdict,
            "webhook": [m.to_json() for m in self.marks],
            "workload": None if self.workload is None else self.workload.to_json(),
            "pods": [p.to_json() for p in self.pods],
            "extender": [r.to_json() for r in self.reasons],
            "events": [e.to_json() for e in self.events],
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- reading objects


def name_of(obj: Mapping[str, Any]) -> str:
    return str(field_map(obj, "metadata").get("name") or "")


def templates(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod templates of a Job (one), a JobSet (one per replicated Job), or the Pod
    itself."""
    kind = obj.get("kind")
    if kind == "Job":
        return [field_map(obj, "spec", "template")]
    if kind == "JobSet":
        return [
            field_map(r, "template", "spec", "template")
            for r in field_list(field_map(obj, "spec"), "replicatedJobs")
        ]
    return [obj]


def webhook_marks(obj: Mapping[str, Any]) -> tuple[Mark, ...]:
    """What the webhook wrote on ``obj`` (and what a user may have written the same)."""
    meta_labels = field_map(obj, "metadata", "labels")
    found = [
        Mark(key, str(meta_labels[key]), meaning)
        for key, meaning in _LABEL_MARKS
        if key in meta_labels
    ]
    found += _spec_marks(obj)
    seen: set[tuple[str, str]] = set()
    for template in templates(obj):
        found += _template_marks(template, seen)
        if obj.get("kind") == "Pod":
            found += _gate_marks(field_map(template, "spec"))
    return tuple(found)


def _spec_marks(obj: Mapping[str, Any]) -> list[Mark]:
    """Suspension and the time limit, on the object's own spec."""
    found = []
    spec = field_map(obj, "spec")
    if obj.get("kind") in ("Job", "JobSet") and "suspend" in spec:
        suspended = spec.get("suspend") is True
        found.append(
            Mark(
                "spec.suspend",
                "true" if suspended else "false",
                "held until Kueue admits it" if suspended else "let run (Kueue admitted it)",
            )
        )
    if "activeDeadlineSeconds" in spec:
        found.append(
            Mark("spec.activeDeadlineSeconds", str(spec["activeDeadlineSeconds"]), "time limit (s)")
        )
    return found


def _template_marks(template: Mapping[str, Any], seen: set[tuple[str, str]]) -> list[Mark]:
    """The gang and topology keys and the scheduler of one pod template, each (key, value)
    once across the templates (``seen``: those already shown)."""
    tmeta = field_map(template, "metadata")
    candidates = [
        (key, field_map(tmeta, "labels").get(key), meaning)
        for key, meaning in _TEMPLATE_LABEL_MARKS
    ]
    candidates += [
        (key, field_map(tmeta, "annotations").get(key), meaning)
        for key, meaning in _TEMPLATE_ANNOTATION_MARKS
    ]
    scheduler = field_map(template, "spec").get("schedulerName")
    if isinstance(scheduler, str):
        candidates.append(("schedulerName", scheduler, "the kube-scheduler profile"))
    found = []
    for key, value, meaning in candidates:
        if value is not None and (key, str(value)) not in seen:
            seen.add((key, str(value)))
            found.append(Mark(key, str(value), meaning))
    return found


def _gate_marks(spec: Mapping[str, Any]) -> list[Mark]:
    """Kueue's admission gate on a pod (a pod of a plain Pod workload)."""
    gates = [g.get("name") for g in field_list(spec, "schedulingGates") if isinstance(g, Mapping)]
    if labels.KUEUE_ADMISSION_GATE not in gates:
        return []
    return [Mark("spec.schedulingGates", labels.KUEUE_ADMISSION_GATE, "held until Kueue admits it")]


def owned_by(obj: Mapping[str, Any], uids: Iterable[str]) -> bool:
    wanted = set(uids)
    return any(
        isinstance(ref, Mapping) and ref.get("uid") in wanted
        for ref in field_list(field_map(obj, "metadata"), "ownerReferences")
    )


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller ownerReference."""
    for ref in field_list(field_map(obj, "metadata"), "ownerReferences"):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return None


def workload_state(obj: Mapping[str, Any], gpus: int, quota: Quota | None) -> WorkloadState:
    status, spec = field_map(obj, "status"), field_map(obj, "spec")
    conditions = tuple(
        Condition(
            str(c.get("type") or ""),
            str(c.get("status") or ""),
            str(c.get("reason") or ""),
            str(c.get("message") or ""),
            timestamp(c.get("lastTransitionTime")),
        )
        for c in field_list(status, "conditions")
        if isinstance(c, Mapping)
    )
    checks = tuple(
        (str(c.get("name") or ""), str(c.get("state") or ""), str(c.get("message") or ""))
        for c in field_list(status, "admissionChecks")
        if isinstance(c, Mapping)
    )
    admitted_to = field_map(status, "admission").get("clusterQueue")
    return WorkloadState(
        name=name_of(obj),
        queue=str(spec.get("queueName") or ""),
        cluster_queue=str(admitted_to or (quota.cluster_queue if quota else "")),
        gpus=gpus,
        conditions=conditions,
        checks=checks,
        quota=quota,
    )


def pod_state(obj: Mapping[str, Any]) -> PodState:
    spec, status = field_map(obj, "spec"), field_map(obj, "status")
    scheduled = next(
        (
            c
            for c in field_list(status, "conditions")
            if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
        ),
        {},
    )
    gates = tuple(
        str(g.get("name")) for g in field_list(spec, "schedulingGates") if isinstance(g, Mapping)
    )
    return PodState(
        name=name_of(obj),
        phase=str(status.get("phase") or "Pending"),
        node=str(spec.get("nodeName") or ""),
        scheduled=str(scheduled.get("status") or "-"),
        reason=str(scheduled.get("reason") or ""),
        message=str(scheduled.get("message") or ""),
        gates=gates,
    )


def event_rows(
    events: Iterable[Mapping[str, Any]], names: Mapping[str, str]
) -> tuple[EventRow, ...]:
    """The events about the objects of ``names`` (uid or ``kind/name`` → shown name),
    newest first, at most ``EVENTS_SHOWN``."""
    rows = []
    for event in events:
        involved = field_map(event, "involvedObject") or field_map(event, "regarding")
        key = involved.get("uid") or ""
        shown = names.get(str(key)) or names.get(f"{involved.get('kind')}/{involved.get('name')}")
        if shown is None:
            continue
        at = (
            timestamp(event.get("lastTimestamp"))
            or timestamp(event.get("eventTime"))
            or timestamp(field_map(event, "series").get("lastObservedTime"))
            or timestamp(field_map(event, "metadata").get("creationTimestamp"))
        )
        count = event.get("count") or field_map(event, "series").get("count") or 1
        rows.append(
            EventRow(
                at,
                str(event.get("type") or ""),
                str(event.get("reason") or ""),
                shown,
                str(event.get("message") or event.get("note") or ""),
                int(count) if isinstance(count, int) else 1,
            )
        )
    rows.sort(key=lambda r: (r.at is not None, r.at.timestamp() if r.at else 0.0), reverse=True)
    return tuple(rows[:EVENTS_SHOWN])


def group_records(
    pods: Sequence[PodState], namespace: str, records: Mapping[str, tuple[str, PodReasons]]
) -> tuple[ReasonsSeen, ...]:
    """The extender's records of the pods not placed, pods refused alike together, the
    group with the newest record first."""
    groups: dict[tuple[object, ...], list[tuple[str, str, PodReasons]]] = {}
    for pod in pods:
        if pod.placed:
            continue
        held = records.get(f"{namespace}/{pod.name}")
        if held is None:
            continue
        source, record = held
        shape = (record.fit, record.candidates, tuple(by_category(record.groups)))
        groups.setdefault(shape, []).append((pod.name, source, record))
    seen = []
    for members in groups.values():
        newest = max(members, key=lambda m: m[2].at)
        seen.append(ReasonsSeen(tuple(m[0] for m in members), newest[1], newest[2]))
    seen.sort(key=lambda s: s.record.at, reverse=True)
    return tuple(seen)


# ---------------------------------------------------------------- the verdict


def verdict(  # noqa: PLR0917 - one argument per stage
    kind: str,
    marks: Sequence[Mark],
    workload: WorkloadState | None,
    pods: Sequence[PodState],
    reasons: Sequence[ReasonsSeen],
    events: Sequence[EventRow],
) -> str:
    """The first stage that holds the job back, in one sentence."""
    return (
        _running(pods)
        or _unknown_to_kueue(kind, marks, workload, pods)
        or (_kueue_holds(workload) if workload is not None else None)
        or _scheduler_holds(pods, reasons, events)
    )


def _running(pods: Sequence[PodState]) -> str | None:
    if not pods or not all(p.phase in ("Running", "Succeeded") for p in pods):
        return None
    state = "running" if any(p.phase == "Running" for p in pods) else "done"
    return f"running: {len(pods)} pod(s) {state}"


def _unknown_to_kueue(
    kind: str, marks: Sequence[Mark], workload: WorkloadState | None, pods: Sequence[PodState]
) -> str | None:
    """Without a Workload: Kueue does not manage it, or has not seen it yet."""
    if workload is not None:
        return None
    if not any(m.key == labels.QUEUE_NAME for m in marks):
        return (
            f"not managed by Kueue: no {labels.QUEUE_NAME} label and no Workload; "
            "nothing holds it but the scheduler"
            if kind == "Pod" or pods
            else f"no {labels.QUEUE_NAME} label and no Workload: Kueue does not know it"
        )
    if not pods:
        return (
            "no Kueue Workload for it yet: Kueue makes one when it sees the job "
            "(is Kueue running, and does the queue exist?)"
        )
    return None


def _kueue_holds(workload: WorkloadState) -> str | None:
    """Finished, evicted, waiting for quota or for admission checks; None: admitted."""
    if workload.holds("Finished"):
        done = workload.condition("Finished")
        return f"finished: {done.message if done else ''}".rstrip(": ")
    evicted = workload.condition("Evicted")
    if evicted is not None and evicted.status == "True" and not workload.holds("QuotaReserved"):
        return f"evicted by Kueue ({evicted.reason}): {evicted.message}"
    if not workload.holds("QuotaReserved"):
        waiting = workload.condition("QuotaReserved")
        why = waiting.message if waiting is not None and waiting.message else "no quota yet"
        return f"waiting for quota in ClusterQueue {workload.cluster_queue or '?'}: {why}"
    if not workload.holds("Admitted"):
        pending = [
            f"{n} {s}" + (f" ({m})" if m else "") for n, s, m in workload.checks if s != "Ready"
        ]
        return "quota reserved, waiting for admission checks: " + (
            "; ".join(pending) or "none reported"
        )
    return None


def _scheduler_holds(
    pods: Sequence[PodState], reasons: Sequence[ReasonsSeen], events: Sequence[EventRow]
) -> str:
    """Past Kueue: no pods yet, gated pods, pods the scheduler did not place, or pods
    placed and starting."""
    if not pods:
        warning = next((e for e in events if e.type == "Warning"), None)
        tail = f": {warning.reason}: {warning.message}" if warning else ""
        return f"admitted, but it has no pods{tail}"
    gated = [p for p in pods if p.gates]
    if gated:
        names = sorted({g for p in gated for g in p.gates})
        return f"{len(gated)} pod(s) held by scheduling gates: {', '.join(names)}"
    unplaced = [p for p in pods if not p.placed]
    if unplaced:
        if reasons:
            return f"{len(unplaced)} pod(s) not scheduled: {headline(reasons[0].record)}"
        message = next((p.message for p in unplaced if p.message), "")
        return f"{len(unplaced)} pod(s) not scheduled" + (f": {message}" if message else "")
    return f"scheduled, starting: {len(pods)} pod(s) placed, not all running yet"


def report(
    target: Mapping[str, Any],
    *,
    owners: Sequence[Mapping[str, Any]],
    workload: WorkloadState | None,
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    records: Mapping[str, tuple[str, PodReasons]],
    notes: Sequence[str] = (),
    workload_obj: Mapping[str, Any] | None = None,
) -> WhyReport:
    """The whole answer for ``target`` (a Job, JobSet or Pod as read)."""
    kind = str(target.get("kind") or "")
    meta = field_map(target, "metadata")
    namespace = str(meta.get("namespace") or "default")
    # the webhook judged the top of the chain: a Job's pod carries no queue label
    judged = owners[-1] if owners else target
    marks = webhook_marks(judged)
    states = tuple(pod_state(p) for p in pods)
    shown: dict[str, str] = {}
    for obj in (target, *owners, *pods, *((workload_obj,) if workload_obj else ())):
        uid = field_map(obj, "metadata").get("uid")
        label = f"{str(obj.get('kind') or '').lower()}/{name_of(obj)}"
        if isinstance(uid, str) and uid:
            shown[uid] = label
        shown[f"{obj.get('kind')}/{name_of(obj)}"] = label
    rows = event_rows(events, shown)
    seen = group_records(states, namespace, records)
    return WhyReport(
        target=f"{kind.lower()} {namespace}/{name_of(target)}",
        verdict=verdict(str(judged.get("kind") or kind), marks, workload, states, seen, rows),
        marks=marks,
        workload=workload,
        pods=states[:PODS_SHOWN] if len(states) > PODS_SHOWN else states,
        reasons=seen,
        events=rows,
        notes=tuple(notes)
        + (
            (f"{len(states) - PODS_SHOWN} more pods not shown",) if len(states) > PODS_SHOWN else ()
        ),
    )
