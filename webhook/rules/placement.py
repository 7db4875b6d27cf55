"""Rules 4 and 7: the GPU flavors a job may use (node affinity, tolerations) and topology.

Layer: PURE. Functions from (workload, queue, policy, draft) to a choice, notes or a
denial; they write only into the ``Draft`` they are given. No I/O, no clock, no aiohttp,
no pydantic. The per-queue fragments they write (flavor terms, tolerations) are made once
per policy (``webhook.queues.Steering``) and never changed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from cluster import labels
from cluster.convert.grammar import AnnotationError, parse_topology
from cluster.echo import echo
from cluster.model import TopologyMode, product_matches
from webhook.patch import Draft, pointer
from webhook.queues import Flavor, Policy, Steering, parse_toleration, steering
from webhook.rules.outcome import (
    FORBIDDEN,
    INVALID,
    Denied,
    FlavorChoice,
    Notes,
    QueueChoice,
    names,
)
from webhook.workload import Path, PodTemplate, Workload, WorkloadError

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
    return names(f"{f.name} ({f.product or 'no GPU product label'})" for f in flavors)


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
                f"tolerations added for the taints of flavors {names(added)}: "
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
            f"({names(f.name for f in flavors)}) have no Topology; remove the annotation or "
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
            f"flavors {names(lacking)} have no topology level {echo(constraint.level)}; "
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
    extender keeps the gang within the level; and for a gang whose level is required, a
    required pod affinity to its own gang at that level's node label (``gang_affinity``),
    so that kube-scheduler's own filters reject the nodes outside the domain of the
    members already placed, before it samples the nodes it sends the extender (without
    it, a member could be shown no node of its gang's rack and wait for minutes). The
    first member matches no placed pod and may go anywhere: the extender chooses the
    domain. Mode B, a flavor with ``spec.topologyName``:
    Kueue's topology-aware scheduling picks the nodes before kube-scheduler sees the pods,
    so the level goes to Kueue as its pod-set annotation (the level's node label) and is
    not copied, lest the extender second-guess the nodes Kueue chose.

    Which mode to use when (figures: README, "With Kueue", from ``python -m loadtest demo
    --real --topology both``): mode A by default. Only the extender sees what decides
    whether a pod really fits a node: unhealthy GPUs, NVLink islands, maintenance windows
    and GPU shares; Kueue's topology-aware scheduling counts allocatable GPUs per node, so
    in mode B it can pin a pod to a host whose free GPUs the extender must refuse, and the
    pod waits until ``waitForPodsReady`` evicts the workload. Mode B when Kueue must not
    admit a gang before a rack (or block) has room for all of it, e.g. when admitted
    gangs that wait for a rack would hold quota other queues need, or when pods of other
    schedulers share the nodes; the extender then still picks the NVLink islands and GPUs
    inside each host Kueue chose.
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
    follows = _gang_follows_itself(workload)
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
            continue
        if own is None:
            out.set_default((*template.metadata_path, "annotations"), labels.TOPOLOGY, effective)
        node_label = _required_node_label(effective, flavors, policy) if follows else None
        if node_label is not None:
            add_pod_affinity(out, template.spec_path, gang_affinity(node_label))
    return tuple(dict.fromkeys(notes))


def gang_affinity(node_label: str) -> dict[str, Any]:
    """A required pod-affinity term: stay in the domain at ``node_label`` of the pods of
    one's own gang. The one statement of what the webhook writes (``rule_topology``) and
    what the load test's gang pods carry.

    ``matchLabelKeys`` has kube-apiserver add ``tessera.dev/gang In (<the pod's gang id>)``
    to the selector when it creates each pod, so the term names no gang and is the same
    for objects that differ only in name (``webhook.answers``). The selector is otherwise
    empty because kube-apiserver refuses a pod whose selector already has an expression on
    a ``matchLabelKeys`` key ("exists in both matchLabelKeys and labelSelector"), even
    ``Exists``. Needs ``MatchLabelKeysInPodAffinity`` (on by default from Kubernetes 1.31,
    GA in 1.33): where it is off, the field is dropped and the term would select every
    pod of the namespace."""
    return {
        "labelSelector": {},
        "matchLabelKeys": [labels.GANG],
        "topologyKey": node_label,
    }


def _gang_follows_itself(workload: Workload) -> bool:
    """Whether the gang's pods may be told to stay with each other: a gang, all of whose
    pods the extender places. A member without GPUs never reaches the extender, which
    keeps no gang near it; with the gang's label it would pull the others to its node's
    domain, or keep them off every node if its own node lacks the label."""
    return workload.pod_count > 1 and all(t.uses_gpu for t in workload.templates if t.count)


def _required_node_label(value: str, flavors: Sequence[Flavor], policy: Policy) -> str | None:
    """The node label of a ``required:<level>`` ``value`` (checked already) that every
    allowed flavor with a Topology agrees on; ``None`` for a preference, or when they
    differ or one's Topology is missing (the extender still keeps the gang together).
    A flavor without a Topology does not count: the extender refuses its nodes unless
    they have the label, as the affinity does."""
    constraint = parse_topology(value)
    if constraint.mode is not TopologyMode.REQUIRED:
        return None
    found: set[str | None] = set()
    for flavor in flavors:
        if flavor.topology_name is None:
            continue
        topology = policy.topology(flavor.topology_name)
        found.add(None if topology is None else topology.node_label(constraint.level))
    if len(found) != 1:
        return None
    return found.pop()


_POD_AFFINITY: Final = ("affinity", "podAffinity")
_REQUIRED_TERMS: Final = "requiredDuringSchedulingIgnoredDuringExecution"


def add_pod_affinity(out: Draft, spec_path: Path, term: Mapping[str, Any]) -> None:
    """Append ``term`` to a pod spec's required pod-affinity terms (ANDed with the
    user's), unless one equal to it is there already (a second pass, or the user's)."""
    where = (*spec_path, *_POD_AFFINITY, _REQUIRED_TERMS)
    existing = out.get(where)
    if existing is None:
        existing = []
    if not isinstance(existing, list):
        raise WorkloadError(f"{pointer(where)} is not a list")
    if term in existing:
        return
    out.node((*spec_path, *_POD_AFFINITY))[_REQUIRED_TERMS] = [*existing, dict(term)]


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
            f"flavors {names(others)} have no spec.topologyName: Kueue admits a job that "
            "asks for a topology only to flavors that have one"
        )
    return tuple(notes)
