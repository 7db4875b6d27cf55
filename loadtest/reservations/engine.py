"""One run of the reservation study: events in time order, a policy deciding at each
moment, and what a user would notice measured.

Layer: PURE (no I/O, no clock: the run's times are its own seconds). Must not decide
placement (``cluster``) or reservations (``policies``); it only moves time, starts and
ends what they say, and measures.

A run: the warm start (the same pods in the same places for every policy), then jobs
arrive. Those that arrive within the window (``hours``) are measured: each one's wait
(start minus arrival) and, over the window, the GPUs allocated and the GPUs held idle
on reserved nodes. Jobs go on arriving after the window, unmeasured, so that the
cluster stays as busy while the measured ones wait; the run ends once every measured
job has started, or at the hard stop (``WorkloadSpec.stop_s``), where a job still
waiting counts the wait it had by then (a lower bound, and said so: ``unstarted``).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Final

from extender.reservations import ReservationRules
from loadtest.inputs.traces import TraceNode
from loadtest.reservations.cluster import Run, SimCluster
from loadtest.reservations.policies import POLICIES, Greedy, Started
from loadtest.reservations.workload import (
    MILLI,
    Job,
    TraceJob,
    Warm,
    WorkloadSpec,
    job_stream,
    racks_of,
    warm_start,
)

WARM_MISSES: Final = 200
"""Draws in a row that fit nowhere before the warm start stops short of its load."""


@dataclass(frozen=True, slots=True)
class Wait:
    members: int
    gpus: int
    wait_s: float


@dataclass(slots=True)
class RunResult:
    policy: str
    seed: int
    waits: list[Wait] = field(default_factory=list)
    impossible: int = 0
    """Jobs no node could hold even empty: left out."""
    allocated_area: float = 0.0
    """Allocated milli-GPU seconds over the arrival window."""
    idle_held_area: float = 0.0
    """Free milli-GPU seconds on reserved nodes over the arrival window."""
    capacity_milli: int = 0
    window_s: float = 0.0
    warm_allocation_pct: float = 0.0
    events: int = 0
    ended_at_s: float = 0.0
    unstarted: int = 0
    """Measured jobs still waiting at the hard stop (their waits count up to it)."""

    @property
    def mean_allocation_pct(self) -> float:
        return 100.0 * self.allocated_area / (self.capacity_milli * self.window_s)

    @property
    def idle_held_gpu_hours(self) -> float:
        return self.idle_held_area / MILLI / 3600.0


@dataclass(slots=True)
class _Run:
    """The moving parts of one run."""

    sim: SimCluster
    policy: Greedy
    result: RunResult
    window_s: float
    events: list[tuple[float, int, Run]] = field(default_factory=list)
    order: Iterator[int] = field(default_factory=count)
    last: float = 0.0
    measured: dict[int, Job] = field(default_factory=dict)
    """Measured jobs not started yet."""

    def start(self, started: Sequence[Started], now: float) -> None:
        for item in started:
            job = item.job
            if self.measured.pop(job.id, None) is not None:
                self.result.waits.append(Wait(job.members, job.gpus, now - job.arrival))
            for run in item.runs:
                heapq.heappush(self.events, (now + job.runs_for, next(self.order), run))

    def advance(self, now: float) -> None:
        """Measure from the last moment up to ``now`` (within the arrival window)."""
        upto = min(now, self.window_s)
        if upto > self.last:
            span = upto - self.last
            self.result.allocated_area += self.sim.allocated_milli * span
            if self.policy.promised:
                self.result.idle_held_area += self.policy.held_idle_milli() * span
            self.last = upto

    def ending(self, now: float) -> list[Run]:
        """End the pods due at ``now``."""
        ended: list[Run] = []
        while self.events and self.events[0][0] <= now:
            _, _, run = heapq.heappop(self.events)
            self.sim.release(run)
            ended.append(run)
        return ended


def simulate(
    nodes: Sequence[TraceNode],
    pool: Sequence[TraceJob],
    spec: WorkloadSpec,
    seed: int,
    policy: str,
    *,
    rules: ReservationRules | None = None,
) -> RunResult:
    """One seed of one policy on the openb nodes (see the module docstring)."""
    sim = SimCluster(nodes, racks_of(nodes))
    warm = _steady(sim, warm_start(pool, spec, random.Random(seed)), spec)
    arrivals = job_stream(pool, sim.capacity_milli // MILLI, spec, random.Random(seed + 1_000_003))
    return play(
        sim,
        policy,
        warm,
        arrivals,
        window_s=spec.window_s,
        stop_s=spec.stop_s,
        rules=rules,
        seed=seed,
    )


def play(
    sim: SimCluster,
    policy: str,
    warm: Sequence[Warm],
    arrivals: Iterable[Job],
    *,
    window_s: float,
    stop_s: float,
    rules: ReservationRules | None = None,
    seed: int = 0,
) -> RunResult:
    """One run of ``policy`` on ``sim``: the ``warm`` jobs placed (they started ``age``
    seconds before 0), then ``arrivals`` in time order, measured within ``window_s``,
    until every measured job started or ``stop_s``."""
    chosen = POLICIES[policy](sim, rules or ReservationRules())
    run = _Run(sim, chosen, RunResult(policy, seed), window_s)
    run.result.capacity_milli = sim.capacity_milli
    run.result.window_s = window_s
    placer = Greedy(sim)
    for item in warm:
        started = placer.step(-item.age, [item.job], ())
        if not started:
            raise ValueError(f"warm job {item.job.id} fits nowhere")
        for placed in started[0].runs:
            ends = -item.age + item.job.runs_for
            heapq.heappush(run.events, (ends, next(run.order), placed))
    run.result.warm_allocation_pct = 100.0 * sim.allocated_milli / sim.capacity_milli
    _play(run, iter(arrivals), stop_s)
    return run.result


def _steady(sim: SimCluster, drawn: Iterator[Warm], spec: WorkloadSpec) -> list[Warm]:
    """Running jobs until they hold ``load`` of the GPUs, each kind its share: placed
    here on a copy of the plan (the same best fit the run will use), so that only those
    that fit are kept, in the order the run places them."""
    trial = SimCluster.like(sim)
    placer = Greedy(trial)
    target = spec.load * sim.capacity_milli
    share = {True: spec.gang_share * target, False: (1 - spec.gang_share) * target}
    held = {True: 0.0, False: 0.0}
    kept: list[Warm] = []
    misses = 0
    while misses < WARM_MISSES and any(held[k] < share[k] for k in held):
        warm = next(drawn)
        job = warm.job
        if held[job.gang] >= share[job.gang] or job.runs_for <= warm.age:
            continue
        started = placer.step(-warm.age, [job], ())
        placer.waiting.clear()
        placer.kinds.clear()
        placer.order = None
        if not started:
            misses += 1
            continue
        misses = 0
        held[job.gang] += job.members * job.ask.gpu_demand
        kept.append(warm)
    return kept


def _play(run: _Run, arrivals: Iterator[Job], stop_s: float) -> None:
    sim, policy, result = run.sim, run.policy, run.result
    upcoming = next(arrivals, None)
    now = 0.0
    while upcoming is not None or run.events:
        now = min(
            run.events[0][0] if run.events else math.inf,
            upcoming.arrival if upcoming is not None else math.inf,
        )
        if now >= stop_s or (now >= run.window_s and not run.measured):
            break
        run.advance(now)
        ended = run.ending(now)
        arrived: list[Job] = []
        while upcoming is not None and upcoming.arrival <= now:
            if not sim.ever_fits(upcoming.ask):
                result.impossible += upcoming.arrival < run.window_s
            else:
                arrived.append(upcoming)
                if upcoming.arrival < run.window_s:
                    run.measured[upcoming.id] = upcoming
            upcoming = next(arrivals, None)
        run.start(policy.step(now, arrived, ended), now)
        result.events += 1
    run.advance(run.window_s)
    end = min(now, stop_s)
    result.ended_at_s = end
    result.unstarted = len(run.measured)
    for job in run.measured.values():
        result.waits.append(Wait(job.members, job.gpus, end - job.arrival))
