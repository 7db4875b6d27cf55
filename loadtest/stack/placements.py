"""What the scenarios read back from the cluster: where each bound pod runs and which GPUs
it holds (``Placement``), an object's true conditions, and every way a set of placements
breaks GPU accounting (``gpu_conflicts``).

Layer: PURE (test support: API objects in, records and problems out; no I/O). Must not
decide where a pod should go: it only checks what the cluster did.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster import labels
from loadtest.stack.fleet import FakeNode


def parse_indices(value: str) -> list[int]:
    """``0,1,2,3`` or ``0-3`` → [0, 1, 2, 3]."""
    out: list[int] = []
    for part in value.split(","):
        first, sep, last = part.strip().partition("-")
        out.extend(range(int(first), int(last) + 1) if sep else [int(first)])
    return out


def _container_limit(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for container in pod["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(resource) or (
            resources.get("requests") or {}
        ).get(resource)
        total += int(value or 0)
    return total


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one bound pod runs and which GPUs it holds, read back from the API."""

    namespace: str
    name: str
    node: str
    indices: tuple[int, ...]
    gpus: int
    gpu_milli: int

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> Placement:
        meta = pod["metadata"]
        raw = (meta.get("annotations") or {}).get(labels.GPU_INDICES, "")
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            node=pod["spec"].get("nodeName") or "",
            indices=tuple(parse_indices(raw)) if raw else (),
            gpus=_container_limit(pod, labels.GPU_RESOURCE),
            gpu_milli=_container_limit(pod, labels.GPU_MILLI_RESOURCE),
        )

    @property
    def uses_gpu(self) -> bool:
        return bool(self.gpus or self.gpu_milli)


def true_condition(obj: Mapping[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The object's status condition ``kind`` (a Workload's ``Evicted``...) once it is true."""
    for c in (obj or {}).get("status", {}).get("conditions") or []:
        if c["type"] == kind and c["status"] == "True":
            found: dict[str, Any] = c
            return found
    return None


def gpu_conflicts(placements: Iterable[Placement], fleet: Mapping[str, FakeNode]) -> list[str]:
    """Every way the placements break GPU accounting: a GPU given to two whole-GPU pods
    (or to one and a share), shares over one GPU, an unhealthy or non-existent GPU, or
    a pod holding a different number of GPUs than it asked for."""
    problems: list[str] = []
    whole: dict[tuple[str, int], list[str]] = defaultdict(list)
    shared: dict[tuple[str, int], int] = defaultdict(int)
    for p in placements:
        if not p.uses_gpu or not p.node:
            continue
        problems += _holding_problems(p, fleet.get(p.node))
        for index in p.indices:
            if p.gpus:
                whole[(p.node, index)].append(f"{p.namespace}/{p.name} on {p.node}")
            else:
                shared[(p.node, index)] += p.gpu_milli
    return problems + _sharing_problems(whole, shared)


def _holding_problems(p: Placement, node: FakeNode | None) -> list[str]:
    """What is wrong with the GPUs one pod holds, on its own."""
    who = f"{p.namespace}/{p.name} on {p.node}"
    problems = []
    expected = p.gpus if p.gpus else 1
    if len(p.indices) != expected or len(set(p.indices)) != len(p.indices):
        problems.append(f"{who} holds GPUs {list(p.indices)} but asked for {expected}")
    if node is not None:
        sick = set(parse_indices(node.unhealthy)) if node.unhealthy else set()
        for index in p.indices:
            if not 0 <= index < node.gpus:
                problems.append(f"{who} holds GPU {index}, which the node does not have")
            if index in sick:
                problems.append(f"{who} holds unhealthy GPU {index}")
    return problems


def _sharing_problems(
    whole: Mapping[tuple[str, int], list[str]], shared: Mapping[tuple[str, int], int]
) -> list[str]:
    """GPUs held twice: by two whole-GPU pods, whole and shared, or shared beyond 1000m."""
    problems = []
    for (node_name, index), holders in sorted(whole.items()):
        if len(holders) > 1:
            problems.append(f"GPU {index} of {node_name} given to {len(holders)} pods: {holders}")
        if shared.get((node_name, index)):
            problems.append(f"GPU {index} of {node_name} is both whole ({holders}) and shared")
    for (node_name, index), milli in sorted(shared.items()):
        if milli > 1000:
            problems.append(f"GPU {index} of {node_name} shared beyond itself: {milli} milli")
    return problems
