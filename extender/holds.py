"""The reservations the live extender holds, from one plan to the next.

Layer: PURE. Functions of a snapshot, the config, the rules, what was held and ``now``:
no I/O, no clock, no settings, no aiohttp, no cache. Must not write anything: the shell
(``extender.reserving``) puts the promises in the cache and records each hold on the API
server. The plan itself is ``extender.reservations.plan_reservations``; this module
says what a plan changes about what is held:

* A waiting gang (no member placed) gets the plan's reservation. One that held a
  reservation and fits now (its nodes have freed) is held from now (``start`` = now):
  nobody else starts on those nodes before its members land there. One that fits now
  and held nothing holds nothing: it is placed as any gang is, and no other pod's
  answer changes because a plan ran. A gang past the bound, or that no domain can ever
  hold, holds nothing.
* A gang with members placed but fewer than ``min`` keeps what it held, from now on, so
  that its last members find their GPUs free; once ``min`` are placed it has started
  and its hold is released.
* A gang whose pods are gone (Kueue requeued it after ``waitForPodsReady``, or it was
  deleted: the extender cannot tell the two apart) keeps its hold for
  ``requeue_grace`` after it was last seen, and when its pods come back it is served
  as the gang it was: from when it first waited (``since``), not from the back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeGuard

from cluster import labels
from cluster.convert.grammar import (
    AnnotationError,
    format_reservation,
    parse_reservation,
    parse_rfc3339,
)
from cluster.model import GangId, NodeName, Promise
from cluster.snapshot import Snapshot
from extender.config import ExtenderConfig
from extender.holdings import GangPodsMemo, HoldingsMemo
from extender.outlooks import OutlookMemo
from extender.reservations import (
    GangDemand,
    PlanInput,
    Reservation,
    ReservationRules,
    gang_demands,
    plan_reservations,
)


@dataclass(frozen=True, slots=True)
class Hold:
    """``reservation`` held for its gang, which has waited since ``since`` and whose
    pods were last seen at ``seen``."""

    reservation: Reservation
    since: datetime
    seen: datetime

    @property
    def gang(self) -> GangId:
        return self.reservation.gang


@dataclass(frozen=True, slots=True)
class HoldRules:
    """The plan's rules, and how long a gang whose pods are gone keeps its hold."""

    plan: ReservationRules = field(default_factory=ReservationRules)
    requeue_grace: timedelta = timedelta(minutes=3)


@dataclass(frozen=True, slots=True)
class Holds:
    """What is held after a plan, by gang, and what the plan left without a hold."""

    held: Mapping[GangId, Hold]
    unreserved: tuple[GangId, ...] = ()
    unplaceable: tuple[GangId, ...] = ()

    def promises(self) -> dict[NodeName, tuple[Promise, ...]]:
        """Per node held, the promises of the holds on it (earliest gang first)."""
        found: dict[NodeName, list[Promise]] = {}
        for gang in sorted(self.held):
            reservation = self.held[gang].reservation
            for name in reservation.nodes:
                found.setdefault(name, []).append(reservation.promise)
        return {name: tuple(held) for name, held in found.items()}


@dataclass(frozen=True, slots=True)
class PlanMemo:
    """What one caller's plans under ``config`` carry from one to the next, so that a
    plan costs what changed since the last: the pods holding GPUs per node, and each
    node's outlook and each domain's totals while those are the same. Changes no
    decision. One plan at a time (the live extender plans in one worker thread, one
    plan after the other)."""

    config: ExtenderConfig
    outlooks: OutlookMemo = field(default_factory=OutlookMemo)
    holdings: HoldingsMemo = field(default_factory=HoldingsMemo)
    gangs: GangPodsMemo = field(default_factory=GangPodsMemo)


def next_holds(
    snapshot: Snapshot,
    config: ExtenderConfig,
    rules: HoldRules,
    held: Mapping[GangId, Hold],
    now: datetime,
    *,
    memo: PlanMemo | None = None,
) -> Holds:
    """What is held after planning on ``snapshot`` at ``now``, given what was ``held``
    (see the module docstring). ``memo``: what the caller's last plan kept (one of
    another config is not read)."""
    if memo is None or memo.config is not config:
        memo = PlanMemo(config)
    specs, unbound = memo.gangs.members(snapshot.pods)
    kept: dict[GangId, Hold] = {}
    for gang, hold in held.items():
        spec = specs.get(gang)
        placed = len(snapshot.gangs.get(gang, ()))
        if spec is None:
            if now - hold.seen <= rules.requeue_grace:
                kept[gang] = hold  # gone: requeued or deleted, kept for the grace
        elif placed and placed < spec.min_count:
            kept[gang] = _from_now(hold, now)
    demands = gang_demands(snapshot, config, now, unbound=unbound)
    waiting = [_since(d, held.get(d.gang)) for d in demands]
    bound = max(0, rules.plan.max_reservations - len(kept))
    cluster = PlanInput(
        snapshot.nodes,
        memo.holdings.holdings(snapshot, now),
        config,
        replace(rules.plan, max_reservations=bound),
        memo.outlooks,
    )
    previous = {gang: hold.reservation for gang, hold in held.items()}
    plan = plan_reservations(waiting, cluster, previous, now)
    since = {d.gang: d.since for d in waiting}
    for reservation in plan.reservations:
        kept[reservation.gang] = Hold(reservation, since[reservation.gang], now)
    for gang, estimate in plan.fits_now:
        if gang not in held:
            continue  # never reserved: nothing to keep for it (see the module docstring)
        now_held = Reservation(gang, estimate.domain, estimate.nodes, now)
        kept[gang] = Hold(now_held, since[gang], now)
    return Holds(kept, plan.unreserved, plan.unplaceable)


def _since(demand: GangDemand, hold: Hold | None) -> GangDemand:
    """``demand`` served from when its gang first waited, as far as a hold remembers."""
    if hold is None or hold.since >= demand.since:
        return demand
    return replace(demand, since=hold.since)


def _from_now(hold: Hold, now: datetime) -> Hold:
    """``hold`` promised from ``now`` at the latest: its gang has begun to land."""
    reservation = hold.reservation
    start = reservation.start
    if start is not None and start <= now:
        return replace(hold, seen=now)
    return Hold(replace(reservation, start=now), hold.since, now)


def changed(
    recorded: Mapping[GangId, Hold], after: Mapping[GangId, Hold], refresh: timedelta
) -> Iterable[GangId]:
    """The gangs whose record must be written: reservation made, moved or released, or
    its pods seen ``refresh`` or more after the record says (so that a restarted
    extender knows how long ago a gang whose pods are gone was last seen)."""
    for gang in sorted(recorded.keys() | after.keys()):
        old, new = recorded.get(gang), after.get(gang)
        if (
            old is None
            or new is None
            or old.reservation != new.reservation
            or new.seen - old.seen >= refresh
        ):
            yield gang


# ---------------------------------------------------------------- the Lease of a hold

LEASE_PREFIX: Final = "tessera-reservation-"
_NAME_CHARS: Final = 253


def lease_name(gang: GangId) -> str:
    """The Lease of ``gang``'s hold: ``tessera-reservation-<gang>`` (a gang id is a
    namespace and a job name joined by a dot, so a valid object name), or with a hash
    in place of a gang id too long for one."""
    name = LEASE_PREFIX + gang
    if len(name) <= _NAME_CHARS:
        return name
    digest = hashlib.sha256(gang.encode()).hexdigest()[:16]
    return f"{name[: _NAME_CHARS - 17]}-{digest}"


def lease_of(hold: Hold, namespace: str) -> dict[str, Any]:
    """The ``coordination.k8s.io/v1`` Lease that records ``hold``: the gang as holder,
    ``acquireTime`` when it first waited, ``renewTime`` when its pods were last seen,
    and what is held in the ``tessera.dev/reservation`` annotation."""
    reservation = hold.reservation
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(hold.gang),
            "namespace": namespace,
            "labels": {labels.RESERVATION: "true"},
            "annotations": {
                labels.RESERVATION: format_reservation(
                    reservation.domain, reservation.start, reservation.nodes
                )
            },
        },
        "spec": {
            "holderIdentity": hold.gang,
            "acquireTime": _micro_time(hold.since),
            "renewTime": _micro_time(hold.seen),
        },
    }


def hold_of(lease: Mapping[str, Any]) -> Hold:
    """The hold a Lease written by ``lease_of`` records; ``AnnotationError`` naming what
    is missing or broken."""
    metadata = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    value = (metadata.get("annotations") or {}).get(labels.RESERVATION)
    gang, since, seen = spec.get("holderIdentity"), spec.get("acquireTime"), spec.get("renewTime")
    if not (_text(value) and _text(gang) and _text(since) and _text(seen)):
        raise AnnotationError(
            f"Lease {metadata.get('name')!r} lacks its holder, times or "
            f"{labels.RESERVATION} annotation"
        )
    domain, start, nodes = parse_reservation(value)
    reservation = Reservation(GangId(gang), domain, tuple(map(NodeName, nodes)), start)
    return Hold(reservation, parse_rfc3339(since), parse_rfc3339(seen))


def _text(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value)


def _micro_time(when: datetime) -> str:
    """A ``MicroTime`` as kube-apiserver takes it: UTC, six decimals, ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
