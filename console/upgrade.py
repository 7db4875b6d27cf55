"""``tessera upgrade-plan``: the nodes of a driver upgrade in waves, each wave leaving
enough of every flavor's GPUs schedulable, in the order the nodes' jobs must end.

Layer: PURE. From a ``Snapshot`` (the extender's own cache, fed the nodes and pods), the
pods as read (their start times) and the Kueue ResourceFlavors to a frozen plan: no I/O,
no clock (``now`` is a value). Writing the plan is ``console.annotate.drain``'s, node by
node, with the wave's start as the drain-after time. Must not guess a time it cannot
read: a node whose jobs have no time limit has no known end, and the plan says so.

The words of the plan:

* A node's jobs **end** at the latest ``start + spec.activeDeadlineSeconds`` of the pods
  holding its GPUs (as the extender counts them; ``status.startTime``, or now for a pod
  not started). The webhook writes a time limit into every Job's pod template, so these
  pods carry one; a pod without one makes the node's end unknown. A node no pod holds
  GPUs of is free now. Pods without GPUs (DaemonSets) are not jobs and do not count.
* A **pool** is what "each flavor's GPUs" counts over: every ResourceFlavor whose node
  labels the node carries (a node may count in several), or its GPU product when it
  carries none.
* **Schedulable** GPUs are the healthy GPUs of uncordoned nodes. While a wave is out, a
  pool keeps its schedulable GPUs outside the wave; the share kept is that over all the
  pool's GPUs (so GPUs already unhealthy lower it). Every wave keeps at least ``keep``
  of each pool; a node that alone would take more is refused with the numbers
  (``PlanError``), as a plan without it would not be the one asked for. Nodes outside
  the selection with their own drain windows count as schedulable.

The waves, one after another, each ``window`` long: a wave starts at the later of the
end of the previous wave (or ``not_before``, or now) and the end of the earliest-ending
node still waiting; it takes, in order of their ends (then names), the waiting nodes
whose jobs have ended by then and that leave every pool its share; the others wait for
the next wave. Nodes of unknown end come after all the others, in waves of their own
that start no earlier than that, and only once their jobs have ended.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Final

from cluster.convert.grammar import AnnotationError, format_rfc3339, parse_rfc3339
from cluster.model import NodeName, NodeState, PodKey, pod_key
from cluster.snapshot import Snapshot
from console.nodes import flavors_of
from webhook.queues import Flavor, PolicyError, parse_seconds


class PlanError(ValueError):
    """No plan can be made as asked; the message says why, with the numbers.
    ``nodes``: the selected nodes that alone would break a pool's share."""

    def __init__(self, message: str, nodes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.nodes = nodes


# ---------------------------------------------------------------- flags


_PERCENT: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")
_FRACTION: Final = re.compile(r"(?:0|1)?\.[0-9]+|0|1")


def parse_keep(text: str) -> Fraction:
    """``80%`` or ``0.8`` → 4/5: the share of each pool's GPUs a wave must keep."""
    value = text.strip()
    if (match := _PERCENT.fullmatch(value)) is not None:
        keep = Fraction(match[1]) / 100
    elif _FRACTION.fullmatch(value) is not None:
        keep = Fraction(value)
    else:
        raise PlanError(f"--keep {text!r}: give a share such as 80% or 0.8")
    if keep >= 1:
        raise PlanError(f"--keep {text}: keeping every GPU leaves none to upgrade")
    return keep


def parse_window(text: str) -> timedelta:
    """``2h``, ``90m``, ``1h30m`` or seconds: how long one wave's nodes are out."""
    try:
        return timedelta(seconds=parse_seconds(text))
    except PolicyError as exc:
        raise PlanError(f"--window: {exc}") from None


_KEY: Final = re.compile(
    r"([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?"
)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of an equality-based label selector: ``key=value``, ``key!=value``,
    ``key`` (has the label) or ``!key`` (has not)."""

    key: str
    value: str | None
    equal: bool

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.value is None:
            return (self.key in labels) == self.equal
        return (labels.get(self.key) == self.value) == self.equal


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """``kubectl -l``'s equality-based selectors, terms comma-separated (all must hold)."""
    terms = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(terms):
        raise PlanError(f"--selector {text!r}: give label terms such as pool=a,!cordoned")
    found = []
    for term in terms:
        if term.startswith("!"):
            key, value, equal = term[1:].strip(), None, False
        elif "!=" in term:
            key, _, value = term.partition("!=")
            equal = False
        elif "=" in term:
            key, _, value = term.replace("==", "=", 1).partition("=")
            equal = True
        else:
            key, value, equal = term, None, True
        key = key.strip()
        if _KEY.fullmatch(key) is None or (value is not None and "=" in value):
            raise PlanError(
                f"--selector: {term!r} is not a label term (key=value, key!=value, key, !key; "
                "set-based terms are not supported)"
            )
        found.append(Requirement(key, None if value is None else value.strip(), equal))
    return tuple(found)


def selected(labels: Mapping[str, str], selector: Iterable[Requirement]) -> bool:
    return all(term.matches(labels) for term in selector)


# ---------------------------------------------------------------- the nodes


@dataclass(frozen=True, slots=True)
class UpgradeNode:
    """One GPU node as the plan weighs it."""

    name: str
    pools: tuple[str, ...]
    gpus: int
    gpus_schedulable: int
    """Healthy GPUs, none on a cordoned node."""
    free_at: datetime | None
    """When every pod holding its GPUs must have ended; None: some pod has no limit."""
    pods: tuple[str, ...] = ()
    """The pods holding its GPUs (``namespace/name``)."""
    unlimited: tuple[str, ...] = ()
    """Those of ``pods`` without a time limit."""
    drain_after: datetime | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pools": list(self.pools),
            "gpus": self.gpus,
            "gpus_schedulable": self.gpus_schedulable,
            "jobs_end": _stamp(self.free_at),
            "gpu_pods": len(self.pods),
            "pods_without_time_limit": list(self.unlimited),
            "drain_after": _stamp(self.drain_after),
        }


def _stamp(when: datetime | None) -> str | None:
    return None if when is None else format_rfc3339(when)


def pools_of(node: NodeState, flavors: Iterable[Flavor]) -> tuple[str, ...]:
    """``flavor NAME`` for every flavor the node carries the labels of, or its
    ``product NAME`` when none."""
    names = flavors_of(node, flavors)
    if names:
        return tuple(f"flavor {name}" for name in names)
    return (f"product {node.product or 'unknown'}",)


def _start(pod: Mapping[str, Any] | None, now: datetime) -> datetime:
    status = pod.get("status") if isinstance(pod, Mapping) else None
    text = status.get("startTime") if isinstance(status, Mapping) else None
    if isinstance(text, str):
        try:
            return parse_rfc3339(text)
        except AnnotationError:
            pass
    return now  # not started yet: its time limit runs from a start still to come


def _jobs_end(
    snapshot: Snapshot, keys: Iterable[PodKey], starts: Mapping[PodKey, datetime], now: datetime
) -> tuple[datetime | None, tuple[str, ...]]:
    """When the pods ``keys`` must all have ended (now at the earliest; None: some have no
    time limit), and those without one."""
    ends, unlimited = [now], []
    for key in keys:
        info = snapshot.pods.get(key)
        limit = info.demand.time_limit_s if info is not None else None
        if limit is None:
            unlimited.append(key)
        else:
            ends.append(starts.get(key, now) + timedelta(seconds=limit))
    return (None if unlimited else max(ends)), tuple(unlimited)


def upgrade_nodes(
    snapshot: Snapshot,
    pods: Iterable[Mapping[str, Any]],
    flavors: Iterable[Flavor],
    now: datetime,
) -> tuple[UpgradeNode, ...]:
    """Every GPU node of ``snapshot``, by name, with when its jobs end (``pods``: the Pod
    objects the snapshot was fed, for their start times)."""
    flavor_list = list(flavors)
    starts: dict[PodKey, datetime] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        starts[pod_key(meta.get("namespace") or "default", str(meta.get("name")))] = _start(
            pod, now
        )
    holders: dict[NodeName, list[PodKey]] = {}
    for key, allocation in snapshot.allocations.items():
        holders.setdefault(allocation.node, []).append(key)
    found = []
    for node in sorted(snapshot.nodes.values(), key=lambda n: n.name):
        if not node.gpus:
            continue
        keys = sorted(holders.get(node.name, ()))
        end, unlimited = _jobs_end(snapshot, keys, starts, now)
        found.append(
            UpgradeNode(
                name=node.name,
                pools=pools_of(node, flavor_list),
                gpus=node.gpu_count,
                gpus_schedulable=0 if node.unschedulable else len(node.healthy_gpus),
                free_at=end,
                pods=tuple(keys),
                unlimited=unlimited,
                drain_after=node.drain_after,
            )
        )
    return tuple(found)


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class PoolShare:
    """What a pool keeps schedulable while a wave is out."""

    pool: str
    gpus_total: int
    gpus_kept: int

    @property
    def share(self) -> Fraction:
        return Fraction(self.gpus_kept, self.gpus_total)

    def to_json(self) -> dict[str, object]:
        return {
            "pool": self.pool,
            "gpus_total": self.gpus_total,
            "gpus_kept": self.gpus_kept,
            "share_kept": round(float(self.share), 4),
        }


@dataclass(frozen=True, slots=True)
class Wave:
    number: int
    start: datetime
    """Its nodes' drain-after time: the wave starts then (for a wave of nodes of unknown
    end, not before then, and only once their jobs have ended)."""
    end: datetime
    nodes: tuple[UpgradeNode, ...]
    kept: tuple[PoolShare, ...]
    """Each pool its nodes count in."""

    @property
    def gpus_out(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def start_known(self) -> bool:
        return all(n.free_at is not None for n in self.nodes)

    def to_json(self) -> dict[str, object]:
        return {
            "wave": self.number,
            "start": format_rfc3339(self.start),
            "start_known": self.start_known,
            "end": format_rfc3339(self.end),
            "nodes": [n.name for n in self.nodes],
            "gpus_out": self.gpus_out,
            "kept": [k.to_json() for k in self.kept],
        }


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    keep: Fraction
    window: timedelta
    now: datetime
    waves: tuple[Wave, ...]
    notes: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[UpgradeNode, ...]:
        return tuple(n for w in self.waves for n in w.nodes)

    @property
    def done(self) -> datetime | None:
        """When the last wave ends; None: it waits for jobs without a time limit."""
        if not self.waves or not self.waves[-1].start_known:
            return None
        return self.waves[-1].end

    def wave_of(self, node: str) -> Wave:
        return next(w for w in self.waves if any(n.name == node for n in w.nodes))

    def to_json(self) -> dict[str, object]:
        return {
            "keep": float(self.keep),
            "window_s": int(self.window.total_seconds()),
            "planned_at": format_rfc3339(self.now),
            "done_by": _stamp(self.done),
            "waves": [w.to_json() for w in self.waves],
            "nodes": [{**n.to_json(), "wave": w.number} for w in self.waves for n in w.nodes],
            "notes": list(self.notes),
        }


def percent(share: Fraction) -> str:
    """``83.3%``: rounded down, so a share never reads as more than it is."""
    tenths = math.floor(share * 1000)
    return f"{tenths // 10}%" if tenths % 10 == 0 else f"{tenths / 10:.1f}%"


def _ceil_second(when: datetime) -> datetime:
    if when.microsecond == 0:
        return when
    return when.replace(microsecond=0) + timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class _Pools:
    """Each pool's GPUs, and how many are schedulable with no wave out."""

    total: Mapping[str, int]
    schedulable: Mapping[str, int]

    @classmethod
    def of(cls, nodes: Iterable[UpgradeNode]) -> _Pools:
        total: Counter[str] = Counter()
        schedulable: Counter[str] = Counter()
        for node in nodes:
            for pool in node.pools:
                total[pool] += node.gpus
                schedulable[pool] += node.gpus_schedulable
        return cls(total, schedulable)

    def kept(self, pool: str, out: Mapping[str, int]) -> PoolShare:
        return PoolShare(pool, self.total[pool], self.schedulable[pool] - out.get(pool, 0))

    def short(self, node: UpgradeNode, out: Mapping[str, int], keep: Fraction) -> str | None:
        """The first pool that would keep less than ``keep`` if ``node`` joined a wave
        that takes ``out`` schedulable GPUs of each pool out already; None: it fits."""
        for pool in node.pools:
            if self.kept(pool, {pool: out.get(pool, 0) + node.gpus_schedulable}).share < keep:
                return pool
        return None


def _refuse_alone(chosen: Sequence[UpgradeNode], pools: _Pools, keep: Fraction) -> None:
    """``PlanError`` when some node would break a pool's share even in a wave alone."""
    refused = [(n, pool) for n in chosen if (pool := pools.short(n, {}, keep)) is not None]
    if not refused:
        return
    first, pool = refused[0]
    left = pools.kept(pool, {pool: first.gpus_schedulable})
    already = left.gpus_total - pools.schedulable[pool]
    why = (
        f"node {first.name} cannot go out even alone: {pool} would keep "
        f"{left.gpus_kept} of its {left.gpus_total} GPUs schedulable ({percent(left.share)}), "
        f"below --keep {percent(keep)}"
    )
    if already:
        why += f" ({already} of them unhealthy or cordoned already)"
    more = len(refused) - 1
    if more:
        why += f"; {more} more node{'s' if more > 1 else ''} the same"
    raise PlanError(
        why + ": lower --keep or upgrade them by hand", tuple(n.name for n, _ in refused)
    )


def plan_upgrade(
    nodes: Sequence[UpgradeNode],
    chosen: Collection[str],
    *,
    now: datetime,
    window: timedelta,
    keep: Fraction,
    not_before: datetime | None = None,
) -> UpgradePlan:
    """The waves for the nodes named in ``chosen`` (``nodes``: every GPU node, for the
    pools' sizes). See the module's docstring for the rules."""
    if window <= timedelta(0):
        raise PlanError("--window must be positive")
    if not 0 <= keep < 1:
        raise PlanError(f"--keep {keep} is not a share below 100%")
    pools = _Pools.of(nodes)
    picked = [n for n in nodes if n.name in chosen]
    if not picked:
        raise PlanError("no GPU node matches the selector")
    _refuse_alone(picked, pools, keep)
    known = sorted((n for n in picked if n.free_at is not None), key=_by_end)
    unknown = sorted((n for n in picked if n.free_at is None), key=lambda n: n.name)
    earliest = _ceil_second(max(now, not_before) if not_before is not None else now)
    waves: list[Wave] = []
    waves += _waves(known, pools, keep, window, earliest, first=1)
    after = waves[-1].end if waves else earliest
    waves += _waves(unknown, pools, keep, window, after, first=len(waves) + 1)
    return UpgradePlan(keep, window, now, tuple(waves), _notes(picked, waves))


def _by_end(node: UpgradeNode) -> tuple[datetime, str]:
    assert node.free_at is not None
    return node.free_at, node.name


def _waves(
    waiting: list[UpgradeNode],
    pools: _Pools,
    keep: Fraction,
    window: timedelta,
    earliest: datetime,
    *,
    first: int,
) -> list[Wave]:
    """Waves one after another from ``earliest``, as the module's docstring says. Each
    takes at least the first node waiting (it fits alone: ``_refuse_alone``), so the
    loop ends."""
    waves: list[Wave] = []
    while waiting:
        head = waiting[0].free_at
        start = earliest if head is None else max(earliest, _ceil_second(head))
        taken: list[UpgradeNode] = []
        rest: list[UpgradeNode] = []
        out: Counter[str] = Counter()
        for node in waiting:
            free = node.free_at is None or node.free_at <= start
            if free and pools.short(node, out, keep) is None:
                taken.append(node)
                for pool in node.pools:
                    out[pool] += node.gpus_schedulable
            else:
                rest.append(node)
        touched = sorted({p for n in taken for p in n.pools})
        kept = tuple(pools.kept(p, out) for p in touched)
        waves.append(Wave(first + len(waves), start, start + window, tuple(taken), kept))
        earliest, waiting = start + window, rest
    return waves


def _notes(picked: Sequence[UpgradeNode], waves: Sequence[Wave]) -> tuple[str, ...]:
    wave_of = {n.name: w for w in waves for n in w.nodes}
    notes = []
    for node in picked:
        if node.unlimited:
            pods = ", ".join(node.unlimited[:3]) + (
                f" and {len(node.unlimited) - 3} more" if len(node.unlimited) > 3 else ""
            )
            notes.append(
                f"{node.name}: {pods} {'has' if len(node.unlimited) == 1 else 'have'} no time "
                f"limit (spec.activeDeadlineSeconds), so when its jobs end is unknown: it comes "
                f"last, and wave {wave_of[node.name].number} can start only once they have ended"
            )
    for node in picked:
        wave = wave_of[node.name]
        if node.drain_after is not None and node.drain_after != wave.start:
            notes.append(
                f"{node.name} drains after {format_rfc3339(node.drain_after)} already; "
                f"wave {wave.number} drains it after {format_rfc3339(wave.start)}"
            )
    return tuple(notes)
