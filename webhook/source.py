"""The webhook's queue policy, kept current: from Kueue watches or from a file.

Layer: STATE (``PolicyStore``, one writer) and I/O (``watch_policy``, the informers that
write into it). Readers call ``current()`` and get an immutable ``Policy``: it is rebuilt
from the raw objects only when something changed, at most once per change burst, so the
hot path stays a dictionary lookup. Must not decide admission.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cluster import logs
from cluster.clock import Clock
from cluster.feed import run_all
from cluster.files import load_objects
from cluster.informer import Informer, ListWatchClient
from webhook.queues import KUEUE_GROUP, Policy, policy_from_objects

log = logging.getLogger(__name__)

KUEUE_RESOURCES = (
    "resourceflavors",
    "topologies",
    "clusterqueues",
    "localqueues",
    "workloadpriorityclasses",
)

Raw = dict[str, Any]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('namespace') or ''}/{meta.get('name')}"


class PolicyStore:
    """Raw Kueue objects by resource, and the ``Policy`` built from them."""

    def __init__(self, clock: Clock, resources: Sequence[str] = KUEUE_RESOURCES) -> None:
        self._clock = clock
        self._objects: dict[str, dict[str, Raw]] = {r: {} for r in resources}
        self._listed: set[str] = set()
        self._policy: Policy | None = None
        self._dirty = True
        self._changed_at = clock.monotonic()
        self._problems: tuple[str, ...] = ()

    @property
    def synced(self) -> bool:
        """Every resource has been listed once: the policy is complete."""
        return self._listed == set(self._objects)

    def age_s(self) -> float:
        """Seconds since the policy last changed."""
        return self._clock.monotonic() - self._changed_at

    def current(self) -> Policy | None:
        """The policy to decide with, or None before the first full list."""
        if not self.synced:
            return None
        if self._dirty or self._policy is None:
            self._policy = policy_from_objects(
                obj for objs in self._objects.values() for obj in objs.values()
            )
            self._dirty = False
            if self._policy.problems != self._problems:
                self._problems = self._policy.problems
                for problem in self._problems:
                    log.warning("queue policy object ignored", extra=logs.fields(problem=problem))
        return self._policy

    def replace(self, resource: str, items: Iterable[Mapping[str, Any]]) -> None:
        self._objects[resource] = {_key(obj): dict(obj) for obj in items}
        self._listed.add(resource)
        self._touch()

    def event(self, resource: str, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._objects[resource].pop(_key(obj), None)
        else:
            self._objects[resource][_key(obj)] = dict(obj)
        self._touch()

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Standalone mode: everything at once, as a file gives it."""
        by_resource: dict[str, list[Mapping[str, Any]]] = {r: [] for r in self._objects}
        plural = {
            "ResourceFlavor": "resourceflavors",
            "Topology": "topologies",
            "ClusterQueue": "clusterqueues",
            "LocalQueue": "localqueues",
            "WorkloadPriorityClass": "workloadpriorityclasses",
        }
        for obj in objects:
            resource = plural.get(str(obj.get("kind")))
            if resource in by_resource:
                by_resource[resource].append(obj)
        for resource, items in by_resource.items():
            self.replace(resource, items)

    def load_file(self, path: str) -> None:
        self.load(load_objects(path))

    def _touch(self) -> None:
        self._dirty = True
        self._changed_at = self._clock.monotonic()


def policy_informers(
    store: PolicyStore, client: ListWatchClient, version: str = "v1beta2", **options: Any
) -> list[Informer]:
    """One informer per Kueue resource, each writing into ``store``."""

    def bind(resource: str) -> Informer:
        return Informer(
            client,
            f"/apis/{KUEUE_GROUP}/{version}/{resource}",
            on_replace=lambda items: store.replace(resource, items),
            on_event=lambda kind, obj: store.event(resource, kind, obj),
            **options,
        )

    return [bind(resource) for resource in KUEUE_RESOURCES]


async def watch_policy(
    store: PolicyStore, client: ListWatchClient, version: str = "v1beta2"
) -> None:
    await run_all(policy_informers(store, client, version))
