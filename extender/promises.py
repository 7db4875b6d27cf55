"""A node promised from a time on: to maintenance (``tessera.dev/drain-after``) or to a
gang's reservation (``extender.reservations``). One rule for both, and its words.

Layer: PURE. Functions of times and values: no I/O, no clock (``now`` is a value), no
settings, no aiohttp, no cache. Must not decide which nodes are promised (the
maintenance filter reads the node's drain time; the reservations plan their own) nor
run a filter pipeline.

The rule: a pod may start on a promised node only if its time limit
(``activeDeadlineSeconds``, counted from when it starts) ends by the time the node is
promised from. A pod without a time limit never may; nor may any pod while the
promise's start is unknown (a reservation waiting on pods without a time limit).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

from cluster.model import GangId, Promise
from extender.context import FIT, Unfit, Verdict


def ends_in_time(ends: datetime | None, start: datetime | None) -> bool:
    """The one rule of maintenance windows and reservations: whether a pod whose time
    limit ends at ``ends`` (None: it has none) is done by ``start`` (None: unknown)."""
    return ends is not None and start is not None and ends <= start


def latest_start(limit_s: int | None, start: datetime | None) -> datetime | None:
    """``ends_in_time`` solved for the pod's start: the latest time a pod with time limit
    ``limit_s`` may start and still end by ``start``; None when no time is early enough
    (no limit, or ``start`` unknown)."""
    if limit_s is None or start is None:
        return None
    return start - timedelta(seconds=limit_s)


def promise_verdict(
    promise: Promise,
    node: str,
    ends: datetime | None,
    limit_s: int | None,
    now: datetime,
) -> Verdict:
    """``FIT`` when a pod whose time limit (``limit_s``) ends at ``ends`` may start on
    ``node`` under ``promise``; else why not, for ``kubectl describe pod``. Evicting
    pods changes nothing about a promise: never resolvable."""
    if ends_in_time(ends, promise.start):
        return FIT
    if promise.gang is None:
        return _maintenance(promise.start, ends, limit_s)
    return _reserved(promise, node, ends, now)


def binding(promises: Iterable[Promise], pod_gang: GangId | None) -> Iterator[Promise]:
    """The promises a pod of gang ``pod_gang`` (None: of none) must end before: all but
    its own gang's reservation, which is for it."""
    return (p for p in promises if p.gang is None or p.gang != pod_gang)


def backfill_verdict(
    node: str,
    promises: Sequence[Promise],
    *,
    pod_gang: GangId | None,
    ends: datetime | None,
    limit_s: int | None,
    now: datetime,
) -> Verdict:
    """Whether a pod whose time limit ends at ``ends`` may start on ``node`` under its
    ``promises`` (``reservations.node_promises``): it must end by every one of them, but
    its own gang's reservation, which is for it."""
    for promise in binding(promises, pod_gang):
        verdict = promise_verdict(promise, node, ends, limit_s, now)
        if verdict is not FIT:
            return verdict
    return FIT


def _maintenance(drain: datetime | None, ends: datetime | None, limit_s: int | None) -> Unfit:
    when = rfc3339(drain) if drain is not None else "a time not known yet"
    if ends is None or limit_s is None:
        return Unfit(
            f"node drains for maintenance at {when}; pod has no time limit "
            "(activeDeadlineSeconds) to end before it",
            resolvable=False,
        )
    return Unfit(
        f"node drains for maintenance at {when}; pod's time limit of "
        f"{duration(limit_s)} would end at {rfc3339(ends)}",
        resolvable=False,
    )


def _reserved(promise: Promise, node: str, ends: datetime | None, now: datetime) -> Unfit:
    if promise.start is None:
        return Unfit(
            f"node {node} is reserved for gang {promise.gang}, which starts when pods "
            "without a time limit end there: no other pod may start on it meanwhile",
            resolvable=False,
        )
    head = f"node {node} is reserved for gang {promise.gang} from {clock(promise.start, now)}"
    if ends is None:
        return Unfit(
            f"{head}: this pod has no time limit (activeDeadlineSeconds) to end before it",
            resolvable=False,
        )
    return Unfit(f"{head}: this pod's time limit ends {clock(ends, now)}", resolvable=False)


# ---------------------------------------------------------------- words


# Kept: a maintenance reason is written on every request that names a draining node
# (once per drain time: it reads the time, so no memo outlives the request), and
# strftime was most of a plain pod's filter there.
@functools.lru_cache(maxsize=1024)
def rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clock(when: datetime, now: datetime) -> str:
    """``14:05:00Z`` on the day of ``now`` (UTC), the whole RFC 3339 time on another."""
    if when.astimezone(UTC).date() == now.astimezone(UTC).date():
        return when.astimezone(UTC).strftime("%H:%M:%SZ")
    return rfc3339(when)


@functools.lru_cache(maxsize=256)
def duration(seconds: int) -> str:
    """``4h``, ``1h30m``, ``90s``: as a person would write the time limit."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"
