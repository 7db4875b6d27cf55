"""The queue policy: Kueue's objects as frozen records, and the ``Policy`` of them.

Layer: PURE. Records and the questions the rules ask of them, with O(1) lookups: no I/O,
no clock, no settings, no aiohttp. Must not read Kueue's objects: ``webhook.kueue_objects``
reads them (what is read, and how a malformed object is reported) and
``webhook.policy_build`` builds a ``Policy`` of what it read.

Topology level names: a level is named either by its full node label or by the label's
name part, the text after the last ``/`` (``rack`` for ``example.com/rack``, ``hostname``
for ``kubernetes.io/hostname``; a label without ``/`` is its own name part). When two
levels of one Topology share a name part, that short name is ambiguous and only the full
labels name them (recorded as a problem).

Cohort arithmetic (``Policy.limit``): the most a queue could ever get of one flavor and
resource is its ``nominalQuota`` plus what it can borrow. What the rest of its cohort can
lend is, summed over the other ClusterQueues of the cohort that have quota for that
flavor and resource, each one's ``lendingLimit`` if set, else its ``nominalQuota``. The
queue can borrow all of that when it has no ``borrowingLimit``, and at most its
``borrowingLimit`` otherwise (never more than the cohort can lend). A queue in no cohort
borrows nothing. Kueue's hierarchical ``Cohort`` objects are not read: their own quota is
not counted (a documented limitation; the verdict can only be stricter than Kueue's).
Quantities are kept in milli-units of the quantity (``to_milli``): ``"16"`` GPUs is 16000.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from cluster import labels
from cluster.model import Taint, level_short_name

if TYPE_CHECKING:
    from webhook.namespace_quota import QuotaLimit

KUEUE_GROUP: Final = "kueue.x-k8s.io"
GPU_RESOURCES: Final = (labels.GPU_RESOURCE, labels.GPU_MILLI_RESOURCE)
"""The resources that make a flavor a GPU flavor and a workload a GPU workload."""
DEFAULT_QUEUE_NAME: Final = "default"

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


class PolicyError(ValueError):
    """One malformed object or field; the message says which and why."""


# ---------------------------------------------------------------- durations


_GO_DURATION_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_NANOS_PER_SECOND: Final = 10**9
_UNIT_NANOS: Final = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "μs": 10**3,
    "ms": 10**6,
    "s": _NANOS_PER_SECOND,
    "m": 60 * _NANOS_PER_SECOND,
    "h": 3600 * _NANOS_PER_SECOND,
}


def parse_seconds(value: object) -> int:
    """Whole seconds from ``3600``, ``"3600"`` or a Go duration (``4h``, ``1h30m``, ``90s``).

    A fraction of a second rounds up (a limit is never shortened). Zero, negative and
    anything else raise ``PolicyError``.
    """
    if isinstance(value, bool):
        raise PolicyError(f"{value!r} is not a duration")
    # Nano-seconds, exact: whole numbers stay ints, a decimal one is a Fraction.
    nanos: int | Fraction
    if isinstance(value, int):
        nanos = value * _NANOS_PER_SECOND
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            nanos = int(text) * _NANOS_PER_SECOND
        else:
            nanos = 0
            position = 0
            for match in _GO_DURATION_PART.finditer(text):
                if match.start() != position:
                    break
                number = match[1]
                amount = int(number) if number.isdigit() else Fraction(number)
                nanos += amount * _UNIT_NANOS[match[2]]
                position = match.end()
            if position == 0 or position != len(text):
                raise PolicyError(
                    f"{value!r} is not a duration: use whole seconds (3600) "
                    "or a Go duration (4h, 90m, 1h30m)"
                )
    else:
        raise PolicyError(f"{value!r} is not a duration")
    if nanos <= 0:
        raise PolicyError(f"{value!r} is not a positive duration")
    return -(-nanos // _NANOS_PER_SECOND)  # rounded up


def format_seconds(seconds: int) -> str:
    """``14400`` → ``4h``, ``5400`` → ``1h30m``, ``59`` → ``59s``: for messages."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration; ``operator`` is ``Equal`` or ``Exists``, empty strings mean unset."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: effect matches (or is unset), key matches, value or Exists."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return bool(self.key) and self.value == taint.value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


def toleration_for(taint: Taint) -> Toleration:
    """The narrowest toleration of ``taint``: this key, this value, this effect."""
    if taint.value:
        return Toleration(key=taint.key, operator="Equal", value=taint.value, effect=taint.effect)
    return Toleration(key=taint.key, operator="Exists", effect=taint.effect)


def parse_toleration(raw: object) -> Toleration:
    """A toleration from pod-spec JSON; raises ``PolicyError`` when it is not one."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"toleration {raw!r} is not an object")
    seconds = raw.get("tolerationSeconds")
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
        raise PolicyError(f"toleration {dict(raw)!r}: tolerationSeconds is not an integer")
    operator = raw.get("operator") or "Equal"
    if operator not in ("Equal", "Exists"):
        raise PolicyError(f"toleration {dict(raw)!r}: operator must be Equal or Exists")
    return Toleration(
        key=_str(raw.get("key")),
        operator=operator,
        value=_str(raw.get("value")),
        effect=_str(raw.get("effect")),
        toleration_seconds=seconds,
    )


@dataclass(frozen=True, slots=True)
class Flavor:
    """A ResourceFlavor: where its nodes are (labels), what keeps others off (taints)."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_name: str | None = None
    kueue_topology: bool = False
    """The Topology is the flavor's ``spec.topologyName``: Kueue's topology-aware
    scheduling assigns the domains, so Tessera asks it for a level instead of choosing."""

    @property
    def product(self) -> str | None:
        """The GPU model of the flavor's nodes (GFD's ``nvidia.com/gpu.product`` label)."""
        return self.node_labels.get(labels.GFD_PRODUCT)

    @property
    def selector_term(self) -> dict[str, Any] | None:
        """A fresh node-selector term for the flavor's nodes; ``None``: it has no labels."""
        if not self.node_labels:
            return None
        return {
            "matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(self.node_labels.items())
            ]
        }


@dataclass(frozen=True, slots=True)
class Steering:
    """Where a set of flavors sends pods: their node-selector terms and the tolerations of
    their taints, worked out once per policy rather than for every review."""

    flavors: tuple[Flavor, ...]
    terms: tuple[Mapping[str, Any], ...] | None
    """One node-selector term per distinct flavor, in order; ``None`` when a flavor fits any
    node. Shared by every review and never changed: a rule writes them into its draft
    whole, as values (``webhook.patch.Draft`` copies a container before writing into it)."""
    taints: tuple[tuple[str, Taint, Toleration, Mapping[str, Any]], ...]
    """(flavor name, taint, the narrowest toleration of it, that toleration as pod-spec
    JSON) for each flavor's taints; the JSON shared as ``terms`` are."""


def steering(flavors: Iterable[Flavor]) -> Steering:
    """How to steer pods onto ``flavors`` (in the order given)."""
    chosen = tuple(flavors)
    terms: list[dict[str, Any]] = []
    anywhere = False
    for flavor in chosen:
        term = flavor.selector_term
        if term is None:
            anywhere = True
            break
        if term not in terms:
            terms.append(term)
    return Steering(
        flavors=chosen,
        terms=None if anywhere else tuple(terms),
        taints=tuple(
            (flavor.name, taint, toleration, toleration.to_json())
            for flavor in chosen
            for taint in flavor.node_taints
            for toleration in (toleration_for(taint),)
        ),
    )


@dataclass(frozen=True, slots=True)
class Quota:
    """One flavor/resource row of a ClusterQueue, in milli-units of the quantity."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def lendable(self) -> int:
        """What this queue lends its cohort: ``lendingLimit`` if set, else all its nominal."""
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)


@dataclass(frozen=True, slots=True)
class Limit:
    """The most a queue could ever get of one flavor and resource, and its parts.

    ``cohort_lendable`` is what the rest of the cohort can lend; ``borrowable`` is what
    this queue can take of it (capped by its ``borrowing_limit``). Milli-units.
    """

    nominal: int = 0
    borrowable: int = 0
    borrowing_limit: int | None = None
    cohort_lendable: int = 0

    @property
    def total(self) -> int:
        return self.nominal + self.borrowable


_NO_LIMIT: Final = Limit()


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The ``tessera.dev/*`` queue annotations; ``None`` means not set."""

    default_priority_class: str | None = None
    default_time_limit_s: int | None = None
    max_time_limit_s: int | None = None
    max_gpus_per_job: int | None = None

    def over(self, fallback: QueueSettings) -> QueueSettings:
        """These settings, with each unset field taken from ``fallback``."""
        # Spelled out rather than looped over ``fields()``: a policy build resolves every
        # LocalQueue, and most set nothing of their own.
        if self == _NO_SETTINGS:
            return fallback
        priority, default, maximum, gpus = (
            self.default_priority_class,
            self.default_time_limit_s,
            self.max_time_limit_s,
            self.max_gpus_per_job,
        )
        return QueueSettings(
            default_priority_class=priority
            if priority is not None
            else fallback.default_priority_class,
            default_time_limit_s=default if default is not None else fallback.default_time_limit_s,
            max_time_limit_s=maximum if maximum is not None else fallback.max_time_limit_s,
            max_gpus_per_job=gpus if gpus is not None else fallback.max_gpus_per_job,
        )


_NO_SETTINGS: Final = QueueSettings()


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    """A ClusterQueue: its cohort, its flavors in order, and its quota per flavor/resource."""

    name: str
    cohort: str | None = None
    flavors: tuple[str, ...] = ()
    covered: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    """Resource name → flavors (in order) of the resource groups that cover it."""
    quotas: Mapping[tuple[str, str], Quota] = field(default_factory=lambda: _EMPTY)
    """(flavor, resource) → quota."""
    settings: QueueSettings = QueueSettings()

    def flavors_for(self, resource: str) -> tuple[str, ...]:
        return self.covered.get(resource, ())

    @property
    def gpu_flavors(self) -> tuple[str, ...]:
        """Flavors of the resource groups that cover a GPU resource, in queue order."""
        return _gpu_flavors(self.flavors, self.covered)


def _gpu_flavors(
    flavors: tuple[str, ...], covered: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    names = {f for resource in GPU_RESOURCES for f in covered.get(resource, ())}
    return tuple(f for f in flavors if f in names)


@dataclass(frozen=True, slots=True)
class LocalQueue:
    """A LocalQueue, with its effective settings (its annotations over its ClusterQueue's)."""

    namespace: str
    name: str
    cluster_queue: str
    settings: QueueSettings = QueueSettings()
    marked_default: bool = False


@dataclass(frozen=True, slots=True)
class Topology:
    """A Topology: its level node labels from the top (``block``) down (``hostname``)."""

    name: str
    levels: tuple[str, ...]
    names: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """Every accepted level name (full label or unambiguous name part) → node label."""

    def node_label(self, level: str) -> str | None:
        """The node label a level name stands for, or ``None`` if this Topology lacks it."""
        return self.names.get(level)

    @property
    def level_names(self) -> tuple[str, ...]:
        """The short name of each level where it is unambiguous, else its full label."""
        short = {label: name for name, label in self.names.items() if name != label}
        return tuple(short.get(label, label) for label in self.levels)


def make_topology(name: str, levels: Iterable[str]) -> tuple[Topology, list[str]]:
    """A Topology with its name lookup built; also the ambiguity problems found."""
    levels = tuple(levels)
    problems: list[str] = []
    names: dict[str, str] = {label: label for label in levels}
    by_part: dict[str, list[str]] = {}
    for label in levels:
        by_part.setdefault(level_short_name(label), []).append(label)
    for part, owners in by_part.items():
        if len(owners) > 1:
            problems.append(
                f"Topology {name}: levels {', '.join(owners)} share the name {part!r}; "
                "name them by their full node label"
            )
        elif part not in names:
            names[part] = owners[0]
    return Topology(name=name, levels=levels, names=MappingProxyType(names)), problems


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int


# ---------------------------------------------------------------- the policy


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything the webhook decides against. Build it with ``policy_from_objects``."""

    flavors: Mapping[str, Flavor] = field(default_factory=lambda: _EMPTY)
    cluster_queues: Mapping[str, ClusterQueue] = field(default_factory=lambda: _EMPTY)
    local_queues: Mapping[tuple[str, str], LocalQueue] = field(default_factory=lambda: _EMPTY)
    """(namespace, name) → LocalQueue."""
    queue_names: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    """Namespace → its LocalQueue names, sorted (for messages)."""
    default_queues: Mapping[str, LocalQueue] = field(default_factory=lambda: _EMPTY)
    topologies: Mapping[str, Topology] = field(default_factory=lambda: _EMPTY)
    priority_classes: Mapping[str, PriorityClass] = field(default_factory=lambda: _EMPTY)
    limits: Mapping[tuple[str, str, str], Limit] = field(default_factory=lambda: _EMPTY)
    """(ClusterQueue, flavor, resource) → the most the queue could ever get."""
    offers: Mapping[tuple[str, tuple[str, ...]], Steering] = field(default_factory=lambda: _EMPTY)
    """(ClusterQueue, GPU resources asked) → ``offer``, worked out for every queue once."""
    namespace_quotas: Mapping[str, tuple[QuotaLimit, ...]] = field(default_factory=lambda: _EMPTY)
    """Namespace → the GPU and pod limits of its ResourceQuotas (``spec.hard``; what is
    used is not kept: it changes with every pod, and the rule asks only what could ever
    fit). A quota change builds a new policy, so no answer kept under the old one is
    given (``answers``)."""
    problems: tuple[str, ...] = ()
    answers: dict[tuple[object, ...], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    """Answers given under this policy (``webhook.answers``), kept by that module; a new
    policy starts without any. Not part of equality or ``repr``."""

    def quotas_in(self, namespace: str) -> tuple[QuotaLimit, ...]:
        return self.namespace_quotas.get(namespace, ())

    def local_queue(self, namespace: str, name: str) -> LocalQueue | None:
        return self.local_queues.get((namespace, name))

    def queues_in(self, namespace: str) -> tuple[str, ...]:
        return self.queue_names.get(namespace, ())

    def default_queue(self, namespace: str) -> LocalQueue | None:
        return self.default_queues.get(namespace)

    def cluster_queue(self, name: str) -> ClusterQueue | None:
        return self.cluster_queues.get(name)

    def flavor(self, name: str) -> Flavor | None:
        return self.flavors.get(name)

    def topology(self, name: str) -> Topology | None:
        return self.topologies.get(name)

    def priority_class(self, name: str) -> PriorityClass | None:
        return self.priority_classes.get(name)

    @property
    def priority_class_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.priority_classes))

    def limit(self, cluster_queue: str, flavor: str, resource: str) -> Limit:
        """The most ``cluster_queue`` could ever get of ``flavor``/``resource`` (0 if none)."""
        return self.limits.get((cluster_queue, flavor, resource), _NO_LIMIT)

    def offer(self, cluster_queue: ClusterQueue, resources: tuple[str, ...]) -> Steering:
        """The queue's GPU flavors, in its order, from which it could get some of every
        resource in ``resources`` (``GPU_RESOURCES`` order), with their steering."""
        found = self.offers.get((cluster_queue.name, resources))
        if found is not None:
            return found
        return offer_of(cluster_queue, resources, self.flavors, self.limits, {})


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def offer_of(
    cq: ClusterQueue,
    resources: tuple[str, ...],
    flavors: Mapping[str, Flavor],
    limits: Mapping[tuple[str, str, str], Limit],
    made: dict[tuple[str, ...], Steering],
) -> Steering:
    """``Policy.offer`` worked out; ``made`` shares one ``Steering`` among queues whose
    offered flavors are the same."""
    # A flavor the queue could never get any of a demanded resource from is no option:
    # Kueue would never admit the job there, so the pods must not be steered there.
    names = tuple(
        name
        for name in cq.gpu_flavors
        if name in flavors
        and all(limits.get((cq.name, name, r), _NO_LIMIT).total > 0 for r in resources)
    )
    found = made.get(names)
    if found is None:
        found = made[names] = steering(flavors[name] for name in names)
    return found
