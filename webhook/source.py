"""The webhook's queue policy (Kueue's objects and the namespaces' ResourceQuotas) and
the Jobs and JobSets that exist, kept current: from watches or from a file.

Layer: STATE (``PolicyStore`` and ``OwnerStore``, one writer each) and I/O
(``watch_policy`` and ``watch_owners``, the informers that write into them, and
``OwnerSource.confirm``, one GET of an owner). Must not decide admission.

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
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

from cluster import jsonio, logs
from cluster.clock import Clock
from cluster.feed import run_all
from cluster.files import load_objects
from cluster.informer import Informer, ListWatchClient
from cluster.kube import ApiError, JsonObject, KubeError, Params
from webhook.kueue_objects import ParsedObject, parse_objects, policy_view
from webhook.owners import OwnerKey, OwnerKind, OwnerView, owner_kind, owner_record
from webhook.policy_build import assemble_policy
from webhook.queues import KUEUE_GROUP, Policy

log = logging.getLogger(__name__)

KUEUE_RESOURCES = (
    "resourceflavors",
    "topologies",
    "clusterqueues",
    "localqueues",
    "workloadpriorityclasses",
)
CORE_RESOURCES: Final = ("resourcequotas",)
"""Core ``v1`` resources the policy reads: a namespace's ResourceQuotas, which still
apply after Kueue admits a job (``webhook.rules.namespace``)."""
POLICY_RESOURCES: Final = (*KUEUE_RESOURCES, *CORE_RESOURCES)
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
        resources: Sequence[str] = POLICY_RESOURCES,
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
            "ResourceQuota": "resourcequotas",
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
    """One informer per Kueue resource and per core resource the policy reads, each
    writing into ``store``."""

    def bind(resource: str, path: str) -> Informer:
        return Informer(
            client,
            path,
            on_replace=lambda items: store.replace(resource, items),
            on_event=lambda kind, obj: store.event(resource, kind, obj),
            **options,
        )

    return [bind(r, f"/apis/{KUEUE_GROUP}/{version}/{r}") for r in KUEUE_RESOURCES] + [
        bind(r, f"/api/v1/{r}") for r in CORE_RESOURCES
    ]


async def watch_policy(
    store: PolicyStore, client: ListWatchClient, version: str = "v1beta2"
) -> None:
    await run_all(policy_informers(store, client, version))


# ---------------------------------------------------------------- owners
#
# The webhook lets a pod through untouched only when the Job it names as its controller
# exists with the uid the pod names (``webhook.owners``), and likewise a Job and its
# JobSet. It watches the uids of all Jobs and JobSets for that: metadata only, kept as
# ``(namespace, name) → uid``, about 300 bytes a Job.

OWNER_COLLECTIONS: Final[Mapping[OwnerKind, tuple[str, str]]] = MappingProxyType(
    {
        OwnerKind.JOB: ("/apis/batch/v1", "jobs"),
        OwnerKind.JOBSET: ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets"),
    }
)
"""Per owner kind: the API group version watched, and the resource."""
JOBSET_RECHECK_S: Final = 300.0
"""How often to look again for the JobSet API when it is not served (JobSet is optional;
a claimed JobSet is looked up by GET meanwhile, which finds none)."""
DISCOVERY_RETRY_S: Final = 10.0
"""How soon to ask again when asking whether the JobSet API is served failed."""
OWNER_GET_TIMEOUT_S: Final = 1.0
"""How long a review waits for the GET of an owner: well inside the webhook's 5 s
``timeoutSeconds``, and a GET of one object takes milliseconds."""


class OwnerStore:
    """The uid of every Job and JobSet, by kind, namespace and name: the watch cache
    behind ``OwnerView``. One writer (the informers, or ``load``); readers take
    ``view()``, which reads the store as it is when read."""

    def __init__(self) -> None:
        self._uids: dict[OwnerKind, dict[tuple[str, str], str]] = {k: {} for k in OwnerKind}
        self._view = OwnerView(MappingProxyType(self._uids))

    def view(self) -> OwnerView:
        return self._view

    def __len__(self) -> int:
        return sum(len(uids) for uids in self._uids.values())

    def replace(self, kind: OwnerKind, items: Iterable[Mapping[str, Any]]) -> None:
        """A (re)list of one kind."""
        uids: dict[tuple[str, str], str] = {}
        for obj in items:
            record = owner_record(obj)
            if record is not None:
                (namespace, name), uid = record
                # one string per namespace, however many Jobs it holds
                uids[sys.intern(namespace), name] = uid
        self._uids[kind] = uids

    def event(self, kind: OwnerKind, event: str, obj: Mapping[str, Any]) -> None:
        record = owner_record(obj)
        if record is None:
            return
        (namespace, name), uid = record
        uids = self._uids[kind]
        if event == "DELETED":
            if uids.get((namespace, name)) == uid:
                del uids[namespace, name]
        else:
            uids[sys.intern(namespace), name] = uid

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Standalone mode: the Jobs and JobSets among the objects of a policy file (most
        files have none, and then every claimed owner is unverified)."""
        by_kind: dict[OwnerKind, list[Mapping[str, Any]]] = {k: [] for k in OwnerKind}
        for obj in objects:
            kind = owner_kind(obj.get("apiVersion"), obj.get("kind"))
            if kind is not None:
                by_kind[kind].append(obj)
        for kind, items in by_kind.items():
            self.replace(kind, items)


class OwnerClient(ListWatchClient, Protocol):
    """What watching and fetching owners needs from ``cluster.kube.KubeClient``."""

    async def get_json(self, path: str, params: Params | None = None) -> JsonObject: ...


def owner_path(key: OwnerKey) -> str:
    """The API path of one owner; ``key`` holds names ``webhook.owners`` found valid."""
    group_version, resource = OWNER_COLLECTIONS[key.kind]
    return f"{group_version}/namespaces/{key.namespace}/{resource}/{key.name}"


async def fetch_owner_uid(client: OwnerClient, key: OwnerKey) -> str | None:
    """The uid of the owner as the API has it now; ``None`` when it does not exist (or its
    kind is not served). Raises ``KubeError`` when the API does not say."""
    try:
        obj = await client.get_json(owner_path(key))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    record = owner_record(obj)
    return None if record is None else record[1]


class OwnerSource:
    """What reviews learn of owners: the watch cache, and, once a client is attached
    (watch mode), one GET of an owner the cache lacks."""

    def __init__(
        self, store: OwnerStore | None = None, *, timeout_s: float = OWNER_GET_TIMEOUT_S
    ) -> None:
        self.store = store or OwnerStore()
        self.client: OwnerClient | None = None
        """Set while the app watches the API; none with a policy file."""
        self._timeout_s = timeout_s

    def view(self) -> OwnerView:
        return self.store.view()

    async def confirm(self, key: OwnerKey, *, within_s: float | None = None) -> OwnerView | None:
        """The view, with ``key`` as the API has it now; ``None`` when there is no API to
        ask (a policy file) or it did not answer in time, and the review stands as it is.
        ``within_s`` is what the review has left before its answer would be late: the GET
        waits no longer, and with nothing left it is not made (kube-apiserver would have
        given up on the answer it waits for).

        The watch cache misses an owner for a moment after it is created: the Job
        controller makes pods as soon as it sees a Job, and the webhook's watch may see
        the Job a little later. One GET tells such a pod from one naming a Job that does
        not exist, at the cost of a request only for reviews that would be answered
        differently."""
        client = self.client
        if client is None:
            return None
        timeout_s = self._timeout_s if within_s is None else min(self._timeout_s, within_s)
        if timeout_s <= 0:
            log.warning(
                "no time left to look up the owner; the object is judged as a workload of its own",
                extra=logs.fields(owner=str(key)),
            )
            return None
        try:
            async with asyncio.timeout(timeout_s):
                uid = await fetch_owner_uid(client, key)
        except (KubeError, TimeoutError) as exc:
            log.warning(
                "owner lookup failed; the object is judged as a workload of its own",
                extra=logs.fields(owner=str(key), reason=str(exc) or type(exc).__name__),
            )
            return None
        return self.store.view().with_fetched(key, uid)


def owner_informer(
    store: OwnerStore, client: ListWatchClient, kind: OwnerKind, **options: Any
) -> Informer:
    """An informer of one owner kind's metadata, writing into ``store``."""
    group_version, resource = OWNER_COLLECTIONS[kind]
    return Informer(
        client,
        f"{group_version}/{resource}",
        on_replace=lambda items: store.replace(kind, items),
        on_event=lambda event, obj: store.event(kind, event, obj),
        metadata_only=True,
        **options,
    )


Sleep = Callable[[float], Awaitable[None]]


async def served(client: OwnerClient, group_version: str) -> bool:
    """Whether the API serves ``group_version`` (discovery: 404 when a CRD is absent)."""
    try:
        await client.get_json(group_version)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def watch_owners(
    store: OwnerStore,
    client: OwnerClient,
    *,
    recheck_s: float = JOBSET_RECHECK_S,
    sleep: Sleep = asyncio.sleep,
    **options: Any,
) -> None:
    """Watch Jobs, and JobSets once their API is served, into ``store``."""
    async with asyncio.TaskGroup() as group:
        group.create_task(owner_informer(store, client, OwnerKind.JOB, **options).run())
        group.create_task(_watch_jobsets_once_served(store, client, recheck_s, sleep, options))


async def _watch_jobsets_once_served(
    store: OwnerStore,
    client: OwnerClient,
    recheck_s: float,
    sleep: Sleep,
    options: Mapping[str, Any],
) -> None:
    group_version, _ = OWNER_COLLECTIONS[OwnerKind.JOBSET]
    said = False
    while True:
        try:
            if await served(client, group_version):
                break
        except KubeError as exc:
            log.warning(
                "cannot tell whether the JobSet API is served",
                extra=logs.fields(path=group_version, reason=str(exc)),
            )
            await sleep(DISCOVERY_RETRY_S)
            continue
        if not said:
            log.info(
                "JobSet API not served: JobSets are not watched, a claimed one is looked up",
                extra=logs.fields(path=group_version, recheck_s=recheck_s),
            )
            said = True
        await sleep(recheck_s)
    await owner_informer(store, client, OwnerKind.JOBSET, **options).run()
