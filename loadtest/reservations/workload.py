"""The reservation study's workload: the openb trace's GPU pods as a stream of jobs
with durations and time limits, gangs added to them, and the racks the gangs need.

Layer: PURE. Functions of trace rows, a ``WorkloadSpec`` and a seeded
``random.Random``: no I/O, no clock, no cluster state. Must not know which policy runs
the jobs: every policy gets the same arrivals for a seed.

* A trace pod's duration is its ``deletion_time - creation_time`` (at least a second),
  cut at ``max_hours``: the trace's longest pods (up to 145 days) are services that a
  run of a day cannot see end, and without the cut they would fill the cluster and
  never leave. Its time limit (the ``activeDeadlineSeconds`` the webhook injects) is
  the duration times ``limit_factor``, rounded up to a second. CPU-only pods are left
  out: they wait for no GPU. A trace without times (the multigpu variants) has no
  durations, and cannot be played.
* Arrivals: two Poisson streams over ``hours``, single pods drawn uniformly from the
  trace, and gangs; their rates are set so that the GPU demand offered (GPUs times
  duration) is ``load`` of the cluster's GPUs, ``gang_share`` of it in gangs.
* A gang: 2 to 8 pods (uniformly) of 8 whole GPUs each, which must all run at once in
  one rack; its duration is a trace pod's drawn at random, its time limit the same
  factor of it. Each member asks for 64 cores and 256 GiB, which every 8-GPU node of
  the openb list has.
* The run starts warm: the cluster holds what it would hold in a steady state, pods
  drawn in proportion to the GPU time they take, each somewhere in its life
  (``warm_start``), so that measuring can start at once.
* Racks are SYNTHETIC (the node list has none): nodes of one GPU model and GPU count,
  in file order, eight to a rack, so that the largest gang fills one rack of 8-GPU
  nodes. They say nothing about where the real machines stand.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Final

from loadtest.inputs.asks import PodAsk
from loadtest.inputs.traces import TraceNode, TracePod

RACK_NODES: Final = 8
GANG_GPUS: Final = 8
GANG_SIZES: Final = tuple(range(2, 9))
GANG_CPU_MILLI: Final = 64_000
GANG_MEMORY_MIB: Final = 262_144
MILLI: Final = 1000


GANG_MEMBER: Final = PodAsk(GANG_CPU_MILLI, GANG_MEMORY_MIB, GANG_GPUS, MILLI)


@dataclass(frozen=True, slots=True)
class Job:
    """A job: ``members`` pods of ``ask`` (more than one: a gang, which needs one rack),
    arriving at ``arrival`` s, running ``duration`` s unless its time limit ends first."""

    id: int
    arrival: float
    ask: PodAsk
    members: int
    duration: float
    limit_s: int

    @property
    def gang(self) -> bool:
        return self.members > 1

    @property
    def gpus(self) -> int:
        """GPUs the job holds (whole GPUs; a share counts as one)."""
        return self.members * self.ask.num_gpu

    @property
    def runs_for(self) -> float:
        """How long it holds its GPUs: its duration, or until ``activeDeadlineSeconds``."""
        return min(self.duration, float(self.limit_s))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    load: float = 1.0
    """GPU demand offered, as a share of the cluster's GPUs: 1.0 is a cluster whose
    demand is its capacity, the one the issue is about (at 0.95 the packing of single
    pods leaves racks empty often enough that gangs seldom wait long)."""
    gang_share: float = 0.05
    """The share of that demand in gangs."""
    limit_factor: float = 1.5
    hours: float = 6.0
    """Jobs that arrive within this long are measured (about 45 gangs a seed)."""
    max_hours: float = 24.0
    """Durations are cut here (see the module docstring)."""
    tail_hours: float | None = None
    """After the measured window, jobs go on arriving (unmeasured) until every measured
    job has started, for at most this long; its default, the longest time limit
    (``max_hours`` times ``limit_factor``), is the longest a reservation can wait for
    pods with time limits. A measured job still waiting then counts the wait it had."""

    @property
    def window_s(self) -> float:
        return self.hours * 3600.0

    @property
    def stop_s(self) -> float:
        tail = self.max_hours * self.limit_factor if self.tail_hours is None else self.tail_hours
        return (self.hours + tail) * 3600.0

    def __post_init__(self) -> None:
        if not (self.load > 0 and 0 <= self.gang_share < 1 and self.limit_factor > 0):
            raise ValueError(f"a workload needs load > 0, gang share in [0, 1), factor > 0: {self}")
        if self.hours <= 0 or self.max_hours <= 0:
            raise ValueError(f"a workload needs hours > 0: {self}")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A trace pod as the study plays it: what it asks for and how long it runs."""

    ask: PodAsk
    duration: float


class TraceWithoutTimes(ValueError):
    """The trace variant has no creation or deletion times, so no durations."""


def trace_jobs(pods: Sequence[TracePod], max_hours: float) -> list[TraceJob]:
    """The trace's GPU pods with their durations (see the module docstring)."""
    cap = max_hours * 3600.0
    found: list[TraceJob] = []
    asks: dict[PodAsk, PodAsk] = {}
    for pod in pods:
        if not pod.num_gpu or pod.creation_time is None or pod.deletion_time is None:
            continue
        # multi-GPU pods ask for whole GPUs (the FGD method's reading of the trace)
        milli = MILLI if pod.num_gpu > 1 else pod.gpu_milli
        ask = PodAsk(pod.cpu_milli, pod.memory_mib, pod.num_gpu, milli, pod.gpu_spec)
        ask = asks.setdefault(ask, ask)  # one object per shape: cheap to key on
        lived = float(max(1, pod.deletion_time - pod.creation_time))
        found.append(TraceJob(ask, min(cap, lived)))
    if not found:
        raise TraceWithoutTimes(
            "the trace has no GPU pod with a creation and a deletion time: no durations "
            "to play (the multigpu variants have none)"
        )
    return found


def time_limit(duration: float, factor: float) -> int:
    return max(1, math.ceil(duration * factor))


@dataclass(frozen=True, slots=True)
class Rates:
    """Arrivals per second of single pods and of gangs."""

    singles: float
    gangs: float


def rates(pool: Sequence[TraceJob], gpus: int, spec: WorkloadSpec) -> Rates:
    """The rates that offer ``spec.load`` of ``gpus`` GPUs' time, ``gang_share`` of it
    in gangs (see the module docstring)."""
    per_single = sum(j.ask.gpu_demand / MILLI * j.duration for j in pool) / len(pool)
    mean_duration = sum(j.duration for j in pool) / len(pool)
    per_gang = GANG_GPUS * (sum(GANG_SIZES) / len(GANG_SIZES)) * mean_duration
    offered = spec.load * gpus
    return Rates(
        singles=(1 - spec.gang_share) * offered / per_single,
        gangs=spec.gang_share * offered / per_gang if spec.gang_share else 0.0,
    )


def job_stream(
    pool: Sequence[TraceJob], gpus: int, spec: WorkloadSpec, rng: random.Random
) -> Iterator[Job]:
    """Jobs in arrival order until ``spec.stop_s``: single pods and gangs, each from its
    own Poisson stream (see the module docstring)."""
    rate = rates(pool, gpus, spec)
    end = spec.stop_s
    next_single = rng.expovariate(rate.singles)
    next_gang = rng.expovariate(rate.gangs) if rate.gangs else math.inf
    number = 0
    while min(next_single, next_gang) < end:
        if next_single <= next_gang:
            drawn = rng.choice(pool)
            yield Job(
                number,
                next_single,
                drawn.ask,
                1,
                drawn.duration,
                time_limit(drawn.duration, spec.limit_factor),
            )
            next_single += rng.expovariate(rate.singles)
        else:
            yield gang_job(number, next_gang, pool, spec, rng)
            next_gang += rng.expovariate(rate.gangs)
        number += 1


def gang_job(
    number: int, at: float, pool: Sequence[TraceJob], spec: WorkloadSpec, rng: random.Random
) -> Job:
    duration = rng.choice(pool).duration
    size = rng.choice(GANG_SIZES)
    return Job(number, at, GANG_MEMBER, size, duration, time_limit(duration, spec.limit_factor))


@dataclass(frozen=True, slots=True)
class Warm:
    """A job already running when the run starts: it started ``age`` seconds ago."""

    job: Job
    age: float


def warm_start(pool: Sequence[TraceJob], spec: WorkloadSpec, rng: random.Random) -> Iterator[Warm]:
    """Jobs running in a steady state, endlessly: a gang with ``gang_share``'s chance,
    else a single pod. In a steady state a job is running in proportion to how long it
    runs, so each is drawn with its duration as its weight (a gang's size uniformly, as
    it arrives), and caught at a uniform point of its life. The caller places them
    until the GPUs they hold reach the load, and stops taking a kind once it has its
    share."""
    by_duration = list(accumulate(j.duration for j in pool))
    number = -1
    while True:
        drawn = rng.choices(pool, cum_weights=by_duration)[0]
        if rng.random() < spec.gang_share:
            size, ask = rng.choice(GANG_SIZES), GANG_MEMBER
        else:
            size, ask = 1, drawn.ask
        duration = drawn.duration
        job = Job(number, 0.0, ask, size, duration, time_limit(duration, spec.limit_factor))
        yield Warm(job, rng.random() * duration)
        number -= 1


def racks_of(nodes: Sequence[TraceNode]) -> list[str]:
    """Each node's synthetic rack (see the module docstring)."""
    seen: dict[tuple[str, int], int] = {}
    racks: list[str] = []
    for node in nodes:
        group = (node.model, node.gpus)
        at = seen.get(group, 0)
        seen[group] = at + 1
        racks.append(f"synthetic-{node.model}-{node.gpus}gpu-rack-{at // RACK_NODES:03d}")
    return racks
