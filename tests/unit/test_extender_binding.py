"""Carrying out a planned bind (``extender.binding.Binds``), without a server: the GPUs
are held from the moment the bind is decided, a refused bind gives them back at once,
one that may have landed keeps them, and a bind repeated while the first is under way
binds the pod once.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from cluster.cache import ClusterCache
from cluster.clock import ManualClock
from cluster.model import NodeName
from extender import verbs, wire
from extender.binder import Binder, MemoryBinder
from extender.binding import Binds
from extender.decide import BindPlan, plan_bind
from tests.binders import FailingBinder, GatedBinder
from tests.unit.test_extender_builders import CONFIG, NOW, cluster, free_milli, node, pod

NODE = "n1"


def step_for(cache: ClusterCache, name: str, on: str = NODE) -> verbs.BindStep:
    """The bind kube-scheduler asks for ``name`` on ``on``, planned on the cache."""
    snap = cache.snapshot()
    plan = plan_bind(snap, pod(name).key, on, CONFIG, NOW)
    assert isinstance(plan, BindPlan)
    return verbs.BindStep(wire.BindingArgs(name, "ns", f"uid-{name}", on), plan)


def binds_of(cache: ClusterCache, binder: Binder | None) -> tuple[Binds, list[float]]:
    observed: list[float] = []
    clock = ManualClock(NOW)
    return Binds(binder, 16, cache=cache, clock=clock, observe_api=observed.append), observed


def held(cache: ClusterCache) -> int:
    """GPUs of node n1 that no pod can take any more."""
    return sum(
        1 for free in free_milli(cache.snapshot().nodes[NodeName(NODE)]).values() if not free
    )


async def test_a_bind_holds_its_gpus_once_decided_and_the_binder_records_them() -> None:
    cache = cluster([node(".... ....")], [pod("a")])
    binds, observed = binds_of(cache, MemoryBinder(cache))
    decided: list[int] = []

    error = await binds.bind(step_for(cache, "a"), lambda: decided.append(held(cache)))

    assert error == ""
    assert decided == [1]  # assumed before the binder ran
    assert held(cache) == 1
    assert cache.snapshot().pods[pod("a").key].node == NODE
    assert len(observed) == 1  # the Binding's duration was measured
    assert not binds.inflight


@pytest.mark.parametrize(("level", "lines"), [(logging.INFO, 0), (logging.DEBUG, 1)])
async def test_a_bind_that_lands_is_logged_at_debug_and_one_that_fails_at_warning(
    caplog: pytest.LogCaptureFixture, level: int, lines: int
) -> None:
    # kube-scheduler logs a bind from -v=2 only: a line per pod is not worth its CPU
    cache = cluster([node(".... ....")], [pod("a"), pod("b")])
    binds, _ = binds_of(cache, MemoryBinder(cache))
    caplog.set_level(level, logger="extender.binding")
    assert await binds.bind(step_for(cache, "a")) == ""
    assert [r.getMessage() for r in caplog.records].count("bound") == lines
    failing, _ = binds_of(cache, FailingBinder(False))
    assert await failing.bind(step_for(cache, "b")) != ""
    assert [(r.levelno, r.getMessage()) for r in caplog.records][-1] == (
        logging.WARNING,
        "bind failed",
    )


@pytest.mark.parametrize(
    ("uncertain", "held_after"),
    [
        pytest.param(False, 0, id="refused-gives-the-gpus-back"),
        pytest.param(True, 1, id="may-have-landed-keeps-them"),
    ],
)
async def test_a_failed_bind_gives_its_gpus_back_unless_it_may_have_landed(
    uncertain: bool, held_after: int
) -> None:
    cache = cluster([node(".... ....")], [pod("a")])
    binds, _ = binds_of(cache, FailingBinder(uncertain))

    error = await binds.bind(step_for(cache, "a"))

    assert error == "cannot bind pod ns/a: injected"
    assert held(cache) == held_after


async def test_without_a_binder_yet_the_bind_is_refused_and_forgotten() -> None:
    cache = cluster([node(".... ....")], [pod("a")])
    binds, _ = binds_of(cache, None)

    error = await binds.bind(step_for(cache, "a"))

    assert error == "the extender has no binder yet (still starting)"
    assert held(cache) == 0


async def test_a_bind_repeated_while_under_way_binds_the_pod_once() -> None:
    cache = cluster([node(".... ...."), node(".... ....", "n2")], [pod("a")])
    binder = GatedBinder(MemoryBinder(cache))
    binds, _ = binds_of(cache, binder)
    planned = step_for(cache, "a")
    first = asyncio.create_task(binds.bind(planned))
    await asyncio.wait_for(binder.entered.wait(), 5)
    # kube-scheduler's retry after its timeout plans on a snapshot holding the first
    repeat = asyncio.create_task(binds.bind(step_for(cache, "a")))
    # a repeat naming another node (planned before the first was assumed)
    other = verbs.BindStep(wire.BindingArgs("a", "ns", "uid-a", "n2"), planned.plan)
    assert await binds.bind(other) == "pod ns/a is already being bound to node n1"

    binder.release.set()
    assert await first == ""
    assert await repeat == ""
    assert len(binder.calls) == 1
    assert held(cache) == 1
