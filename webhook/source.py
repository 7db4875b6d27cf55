"""The webhook's queue policy, kept current: from Kueue watches or from a file.

Layer: STATE (``PolicyStore``, one writer) and I/O (``watch_policy``, the informers that
write into it). Must not decide admission.

Readers call ``current()`` and get an immutable ``Policy`` at once: they never build
one. The writer keeps, per object, only what the policy reads (``policy_view``) and that
part already parsed, so that the constant ``status`` updates Kueue writes to its queues
cost a comparison and nothing else. A change the policy can see makes the writer build
a new policy from the parsed objects (only the changed object is read again): at once
when there is no event loop (a file, tests), else once per burst of changes, a short
``debounce_s`` after the first, so that a relist or a flurry of edits costs one build
and readers keep the last complete policy until the new one replaces it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cluster import jsonio, logs
from cluster.clock import Clock
from cluster.feed import run_all
from cluster.files import load_objects
from cluster.informer import Informer, ListWatchClient
from webhook.queues import (
    KUEUE_GROUP,
    ParsedObject,
    Policy,
    assemble_policy,
    parse_objects,
    policy_view,
)

log = logging.getLogger(__name__)

KUEUE_RESOURCES = (
    "resourceflavors",
    "topologies",
    "clusterqueues",
    "localqueues",
    "workloadpriorityclasses",
)
DEBOUNCE_S = 0.05
"""How long a change may wait for others before the policy is rebuilt: long enough to
gather a relist or a ``kubectl apply`` of many queues, short against a human edit."""


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('namespace') or ''}/{meta.get('name')}"


class _Entry:
    """One object as the store keeps it: its policy view, encoded, and that view parsed."""

    __slots__ = ("parsed", "view")

    def __init__(self, view: bytes, parsed: tuple[ParsedObject, ...]) -> None:
        self.view = view
        self.parsed = parsed


def _entry(kept: _Entry | None, obj: Mapping[str, Any]) -> _Entry:
    """The entry for ``obj``: ``kept`` itself when it holds the same view, else a new one
    (only then is the object parsed)."""
    view = policy_view(obj)
    # Encoded, views compare exactly as JSON does (1, 1.0 and true differ), and are small.
    encoded = jsonio.dumps(view)
    if kept is not None and kept.view == encoded:
        return kept
    return _Entry(encoded, tuple(parse_objects((view,))))


class PolicyStore:
    """Kueue objects by resource, and the ``Policy`` built from them.

    One writer (``replace``, ``event``, ``load``) and any number of readers
    (``current``), all on one thread.
    """

    def __init__(
        self,
        clock: Clock,
        resources: Sequence[str] = KUEUE_RESOURCES,
        *,
        debounce_s: float = DEBOUNCE_S,
    ) -> None:
        self._clock = clock
        self._debounce_s = debounce_s
        self._objects: dict[str, dict[str, _Entry]] = {r: {} for r in resources}
        self._listed: set[str] = set()
        self._policy: Policy | None = None
        self._generation = 0
        self._stale = False
        self._holding = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._changed_at = clock.monotonic()
        self._problems: tuple[str, ...] = ()

    @property
    def synced(self) -> bool:
        """The first complete policy is built: every resource was listed, then read."""
        return self._policy is not None

    @property
    def generation(self) -> int:
        """How many policies have been built: it moves only when the policy can change."""
        return self._generation

    def age_s(self) -> float:
        """Seconds since the policy last changed."""
        return self._clock.monotonic() - self._changed_at

    def current(self) -> Policy | None:
        """The policy to decide with, or None before the first complete build. Never builds."""
        return self._policy

    def replace(self, resource: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A (re)list of one resource: objects whose view is unchanged are kept as read."""
        old = self._objects[resource]
        new: dict[str, _Entry] = {}
        changed = False
        for obj in items:
            key = _key(obj)
            kept = old.get(key)
            entry = new[key] = _entry(kept, obj)
            changed = changed or entry is not kept
        changed = changed or new.keys() != old.keys()
        self._objects[resource] = new
        first_list = resource not in self._listed
        self._listed.add(resource)
        if changed or first_list:
            self._changed()

    def event(self, resource: str, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event; a change of nothing the policy reads (``status``) costs nothing."""
        objects = self._objects[resource]
        key = _key(obj)
        if kind == "DELETED":
            if objects.pop(key, None) is not None:
                self._changed()
            return
        kept = objects.get(key)
        entry = _entry(kept, obj)
        if entry is not kept:
            objects[key] = entry
            self._changed()

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Standalone mode: everything at once, as a file gives it; built before returning."""
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
        self._holding = True  # one build for the lot, not one per resource
        try:
            for resource, items in by_resource.items():
                self.replace(resource, items)
        finally:
            self._holding = False
        self.flush()

    def load_file(self, path: str) -> None:
        self.load(load_objects(path))

    def flush(self) -> None:
        """Build now if a change is waiting (once every resource has been listed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stale and self._listed == set(self._objects):
            self._rebuild()

    def _changed(self) -> None:
        self._stale = True
        if self._holding:
            return
        if self._policy is None:
            # Readiness waits for the first build; nobody reads a half-listed policy.
            self.flush()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()  # no loop to defer to (a file, a test): the writer builds now
            return
        if self._timer is None or self._timer_loop is not loop:
            # (a timer of a loop that has since stopped would never fire: set a new one)
            self._timer = loop.call_later(self._debounce_s, self.flush)
            self._timer_loop = loop

    def _parsed(self) -> Iterator[ParsedObject]:
        for objects in self._objects.values():
            for entry in objects.values():
                yield from entry.parsed

    def _rebuild(self) -> None:
        policy = assemble_policy(self._parsed())
        self._stale = False
        self._policy = policy
        self._generation += 1
        self._changed_at = self._clock.monotonic()
        if policy.problems != self._problems:
            self._problems = policy.problems
            for problem in self._problems:
                log.warning("queue policy object ignored", extra=logs.fields(problem=problem))


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
