"""Rules 5 and 6: quota, and gang metadata; the gang id, written as the last step.

Layer: PURE. Functions from (workload, queue, flavors, policy, draft) to notes, slots or
a denial, and ``name_gang``, which writes the id made from the name and the request
where ``rule_gang`` left room for it. No I/O, no clock, no aiohttp, no pydantic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster import labels
from cluster.echo import ECHO_LIMIT, echo
from cluster.model import MILLI_PER_GPU, GangId
from webhook.patch import Draft
from webhook.queues import ClusterQueue, Flavor, Limit, Policy
from webhook.rules.outcome import (
    FORBIDDEN,
    INVALID,
    Allowed,
    Denied,
    GangSlots,
    Notes,
    QueueChoice,
    plural,
)
from webhook.workload import Path, PodTemplate, ReviewRequest, Workload

GANG_MIN_DIGITS: Final = 9
"""The most digits a gang-min annotation may have."""
GANG_ID_MAX: Final = 63
"""A label value's maximum length."""
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
"""The characters Kubernetes draws generated-name suffixes from (no vowels, no 0/1/3)."""

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
        return plural(units, "GPU")
    return f"{units} milli-GPUs"


def breakdown(ask: GpuAsk) -> str:
    text = " + ".join(
        f"{echo(name, quote=False) + ': ' if name else ''}{plural(count, 'pod')} × {each}"  # noqa: RUF001
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
            f"{_amount(ask.resource, ask.total)} ({breakdown(ask)}); "
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
            asked = "; ".join(f"{_amount(a.resource, a.total)} ({breakdown(a)})" for a in asks)
            return Denied(
                FORBIDDEN,
                "quota",
                f"{workload.kind_word} {workload.display_name} asks for {asked}; {queue} "
                f"allows at most {plural(limit_gpus, 'GPU')} per job "
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
                f"the {plural(size, 'pod')} of {workload.kind_word} "
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
            f"{labels.GANG_MIN}={min_count}: the {plural(min_count, 'pod')} that must run "
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
                f"{plural(size, 'pod')}; remove the annotation (the webhook sets it)",
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
