"""Carrying out a planned bind: assume its GPUs, run the binder once, forget on failure.

Layer: I/O (awaits the binder). ``Binds`` takes everything it works with as arguments
(the cluster cache it assumes in, the binder, the clock, where the Binding's duration
goes), so it runs without an aiohttp app. Must not decide where a pod goes or which
GPUs it takes (``verbs.plan_bind`` did, on the snapshot) nor read a request.

The order is what keeps two binds from taking one GPU: the planned GPUs are assumed in
the cache before the first ``await``, so the next request's snapshot already counts
them. Then the binder writes to the API; if it fails the assumption is forgotten and
kube-scheduler gets ``Error``. The one exception is a bind that may have landed (the
connection broke and the pod could not be read back): its GPUs stay assumed until the
watch shows the truth or the assumption expires. A bind kube-scheduler repeats while
the first is under way (after its own timeout) waits for the first one's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from cluster import logs
from cluster.cache import AllocationConflict
from cluster.clock import Clock
from cluster.model import Allocation, NodeName, PodInfo, PodKey
from extender import verbs, wire
from extender.binder import Binder, BindError, Placement

log = logging.getLogger(__name__)


class Assumptions(Protocol):
    """What ``Binds`` needs of ``cluster.cache.ClusterCache``."""

    def assume(self, pod: PodInfo, allocation: Allocation) -> None: ...

    def forget(self, key: PodKey) -> bool: ...


@dataclass(slots=True)
class _InFlight:
    node: str
    done: asyncio.Future[str]


class Binds:
    """What ``/bind`` keeps between requests: the binder, the pods of recent requests
    (kube-scheduler may bind a pod before the watch shows it; ``/prioritize`` reads the
    pod ``/filter`` decoded), and the binds under way."""

    def __init__(
        self,
        binder: Binder | None,
        recent_limit: int,
        *,
        cache: Assumptions,
        clock: Clock,
        observe_api: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.binder = binder
        """None until the server has one (the API binder is made once it connects)."""
        self.recent = wire.RecentPods(recent_limit)
        self.inflight: dict[PodKey, _InFlight] = {}
        self._cache = cache
        self._clock = clock
        self._observe_api = observe_api

    async def bind(self, step: verbs.BindStep, decided: Callable[[], None] = lambda: None) -> str:
        """Carry out ``step``: the ``Error`` to answer (``""``: bound). ``decided`` is
        called once the decision is made and assumed, before the binder runs (not for a
        repeat, which decides nothing)."""
        args, plan = step.args, step.plan
        pod = plan.pod
        if not pod.uid and args.pod_uid:
            pod = replace(pod, uid=args.pod_uid)
        running = self.inflight.get(pod.key)
        if running is not None:
            return await _join(pod.key, running, args.node)
        refused = self._assume(pod, plan.allocation)
        decided()
        if refused is not None:
            return refused
        indices = () if plan.allocation is None else plan.allocation.indices
        return await self._carry_out(Placement(pod, NodeName(args.node), indices))

    def _assume(self, pod: PodInfo, allocation: Allocation | None) -> str | None:
        """Count the planned GPUs as taken; the refusal to answer if the cache says no."""
        if allocation is None:
            return None
        try:
            self._cache.assume(pod, allocation)
        except (AllocationConflict, ValueError) as exc:
            # plan_bind checked the same snapshot: reaching this is a bug, said not hidden
            log.error(
                "assume refused a planned bind", extra=logs.fields(pod=pod.key, error=str(exc))
            )
            return f"cannot bind pod {pod.key}: {exc}"
        return None

    async def _carry_out(self, placement: Placement) -> str:
        """Run the binder for an assumed placement; the ``Error`` to answer."""
        key = placement.pod.key
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.inflight[key] = _InFlight(placement.node, done)
        error = "the bind was interrupted (extender shutting down)"
        began = self._clock.monotonic()
        try:
            if self.binder is None:
                raise BindError("the extender has no binder yet (still starting)")
            await self.binder.bind(placement)
            error = ""
            self.recent.forget(placement.pod.uid)
            # DEBUG, as kube-scheduler logs a bind only from -v=2: a line per pod at the
            # cluster's scheduling rate costs a twentieth of the extender's CPU, and the
            # bind is on record anyway (kube-scheduler's Scheduled event, our metrics).
            if log.isEnabledFor(logging.DEBUG):  # the fields are built before the level is read
                log.debug(
                    "bound",
                    extra=logs.fields(pod=key, node=placement.node, gpus=placement.annotation),
                )
        except BindError as exc:
            error = str(exc)
            if not exc.uncertain:
                self._cache.forget(key)
            log.warning(
                "bind failed",
                extra=logs.fields(pod=key, node=placement.node, error=error, kept=exc.uncertain),
            )
        except Exception as exc:
            error = f"cannot bind pod {key}: internal error: {exc}"
            self._cache.forget(key)
            log.exception("binder crashed", extra=logs.fields(pod=key, node=placement.node))
        finally:
            # On cancellation the bind may or may not have landed: the assumption stays
            # until the watch tells or its TTL ends.
            self._observe_api(self._clock.monotonic() - began)
            del self.inflight[key]
            done.set_result(error)
        return error


async def _join(key: PodKey, running: _InFlight, node: str) -> str:
    """A bind for a pod whose bind is under way: kube-scheduler retried after a timeout."""
    if running.node != node:
        return f"pod {key} is already being bound to node {running.node}"
    log.info("bind repeated while under way", extra=logs.fields(pod=key, node=node))
    return await asyncio.shield(running.done)
