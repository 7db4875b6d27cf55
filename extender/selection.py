"""Whether a pod's node selector, required node affinity and tolerations let it onto a
node, as kube-scheduler's in-tree filters judge them; and which nodes it would rather
not go to (``avoided``: a ``PreferNoSchedule`` taint it does not tolerate).

Layer: PURE. Functions of a ``NodeSelection`` and a ``NodeState``: no I/O, no clock, no
settings. Must not judge anything but labels, fields and taints. ``selection_refusal``
is shared by the filter pipeline (``filters.filter_node_selection``: where a gang's
other members may go) and the reservations' plan (``outlooks``: which nodes a gang may
ever be given), so that a reservation never holds nodes its members may not use;
``avoided`` by ``decide.choose``.
"""

from __future__ import annotations

from cluster.model import NodeRequirement, NodeSelection, NodeState, Taint, Toleration


def selection_refusal(selection: NodeSelection, node: NodeState) -> str | None:
    """Why ``selection`` keeps its pod off ``node``; None when it lets it in."""
    if not all(_meets(node, r) for r in selection.required) or (
        selection.terms is not None
        and not any(all(_meets(node, r) for r in term) for term in selection.terms)
    ):
        return "node does not match the pod's node selector or required node affinity"
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(
            _tolerates(t, taint) for t in selection.tolerations
        ):
            return (
                f"node has taint {taint.key}={taint.value}:{taint.effect}, which the pod "
                "does not tolerate"
            )
    return None


def avoided(selection: NodeSelection, node: NodeState) -> bool:
    """Whether ``node`` has a ``PreferNoSchedule`` taint the pod does not tolerate: it
    may go there, but kube-scheduler's scoring (``TaintToleration``) would rather not."""
    return any(
        taint.effect == "PreferNoSchedule"
        and not any(_tolerates(t, taint) for t in selection.tolerations)
        for taint in node.taints
    )


def _meets(node: NodeState, requirement: NodeRequirement) -> bool:
    if requirement.field:
        value: str | None = node.name if requirement.key == "metadata.name" else None
    else:
        value = node.labels.get(requirement.key)
    operator, values = requirement.operator, requirement.values
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    try:  # Gt, Lt: one integer on each side
        here, there = int(value or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return here > there if operator == "Gt" else here < there


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value
