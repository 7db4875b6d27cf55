"""The three ways the reservation study schedules the same arrivals.

Layer: PURE (decisions over one run's ``SimCluster``; no I/O, no clock). Must not
re-implement what ``extender.reservations`` decides: ``tessera`` and ``easy`` ask it
for their reservations, and keep its rule (``extender.promises.ends_in_time``) for
which pod may start on a promised node.

* ``none`` (today): every waiting job is tried, oldest first, whenever GPUs free up,
  and starts wherever it fits; a gang waits until one rack has room for all of it.
* ``tessera``: the same, and every gang that cannot start is given a reservation by
  ``extender.reservations.plan_reservations`` (at most ``max_reservations`` at once,
  the oldest gang first): the rack whose pods end soonest by their time limits, from
  the estimated start. Other pods may start on a reserved node only if their time limit
  ends by then (backfill). A reservation sticks to its rack; its start and nodes are
  estimated again whenever a node of the rack changes.
* ``easy``: EASY backfilling as Slurm runs it: the oldest waiting job, gang or single
  pod, is the queue's head and gets the one reservation, at its earliest start (for a
  single pod: the node that can hold it soonest); every other job may start only where
  it does not delay the head, by the same rule.

Both reservations hold whole nodes: a pod that does not end in time is refused on any
GPU of a reserved node, not only on the GPUs the gang will take.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from cluster.model import GangId, PodDemand, Promise
from extender.config import HOSTNAME_LEVEL, ExtenderConfig, TopologyLevel
from extender.outlooks import OutlookMemo
from extender.promises import ends_in_time
from extender.reservations import (
    GangDemand,
    PlanInput,
    Reservation,
    ReservationRules,
    plan_reservations,
)
from loadtest.inputs.fleet import RACK_LABEL
from loadtest.reservations.cluster import (
    Allowed,
    HoldingViews,
    NodeViews,
    Run,
    SimCluster,
    moment,
    seconds,
)
from loadtest.reservations.workload import GANG_GPUS, Job

RACK_LEVEL = TopologyLevel("rack", RACK_LABEL)
CONFIG = ExtenderConfig(levels=(RACK_LEVEL, HOSTNAME_LEVEL))
"""The extender's config for the study's cluster: racks, then nodes; one island a node."""
RETRIES = 3
"""Passes over the waiting jobs after reservations changed, in one step at most."""
REPLAN_S = 300.0
"""Reservations are planned again at least this often while any job waits, besides
when a gang arrives or starts and when a pod ends that held a reservation's start back
(Slurm's backfill scheduler runs every 30 s by default; on seeds 50 and 51, 300 s and
60 s gave the same waits within 0.1 h, at two thirds of the CPU)."""


@dataclass(frozen=True, slots=True)
class Started:
    job: Job
    runs: tuple[Run, ...]


def kind_of(job: Job) -> int:
    """Jobs of one kind fit where each other fit: gangs of one size (negative), single
    pods of one ask (one object per ask: ``workload.trace_jobs``)."""
    return -job.members if job.members > 1 else id(job.ask)


def gang_id(job: Job) -> GangId:
    return GangId(f"study.job-{job.id}")


def demand_of(job: Job) -> GangDemand:
    """The job as the reservation core reads it: a gang of 8-GPU members in one rack,
    or one pod anywhere."""
    ask = job.ask
    member = PodDemand(
        gpus=ask.num_gpu if ask.whole else 0,
        gpu_milli=0 if ask.whole else ask.gpu_milli,
        cpu_milli=ask.cpu_milli,
        products=ask.gpu_spec,
        time_limit_s=job.limit_s,
    )
    level = RACK_LABEL if job.gang else None
    return GangDemand(gang_id(job), member, job.members, level, moment(job.arrival))


@dataclass(slots=True)
class Greedy:
    """``none``: no reservations (see the module docstring)."""

    sim: SimCluster
    rules: ReservationRules = field(default_factory=ReservationRules)
    name: ClassVar[str] = "none"
    waiting: dict[int, Job] = field(default_factory=dict)
    """Jobs waiting, in the order they arrived."""
    kinds: dict[int, dict[int, Job]] = field(default_factory=dict)
    """The same by kind (``kind_of``), each in the order they arrived."""
    promised: dict[int, Promise] = field(default_factory=dict)
    """Reserved nodes (by index) and their promises."""
    held: dict[GangId, Reservation] = field(default_factory=dict)
    watched: set[int] = field(default_factory=set)
    """Racks with a reserved node: a gang asks about each of their nodes."""
    started: list[Started] = field(default_factory=list)
    order: list[int] | None = None
    """The kinds, the kind of the oldest job first; None once that may have changed."""
    notices: ClassVar[str] = ""
    """Which waiting jobs ``_blocked`` is about, for a walk to call it on: none (``""``),
    the oldest job (``"head"``), or every kind of gang (``"gangs"``)."""

    def step(self, now: float, arrived: Sequence[Job], ended: Sequence[Run]) -> list[Started]:
        """What starts at ``now``, after the ``ended`` pods gave their GPUs back and
        ``arrived`` jobs came: waiting jobs first (the oldest first), then the new ones."""
        self.started = []
        if ended and self.waiting:
            self._walk(now, {run.node for run in ended})
        for job in arrived:
            if not self._try(job, now):
                self.waiting[job.id] = job
                kind = kind_of(job)
                if kind not in self.kinds:
                    self.kinds[kind] = {}
                    self.order = None
                self.kinds[kind][job.id] = job
                self._blocked(job, now)
        self._after(now, ended)
        return self.started

    def held_idle_milli(self) -> int:
        """Free GPU capacity on reserved nodes: held idle for the reservations."""
        return self.sim.free_milli(self.promised)

    # ------------------------------------------------------------ hooks

    def _blocked(self, job: Job, now: float) -> None:
        """``job`` could not start at ``now``."""

    def _after(self, now: float, ended: Sequence[Run]) -> None:
        """The end of a step."""

    def _released(self, job: Job) -> None:
        """``job`` started."""

    # ------------------------------------------------------------ starting jobs

    def _walk(self, now: float, changed: set[int]) -> None:
        """Try the waiting jobs that could use a ``changed`` node, kind by kind, the
        kind of the oldest job first, each kind's jobs oldest first: once one fails, the
        younger ones of its kind would fail too, but those that end sooner where
        reserved nodes take only the jobs that end in time, and other gangs (each gang
        has a reservation of its own)."""
        sim = self.sim
        room = max((sim.rack_slots[r] for r in {sim.rack_of[n] for n in changed}), default=0)
        fitting: dict[int, list[int]] = {}
        kinds = self.kinds
        order = self.order
        if order is None:
            order = self.order = sorted(kinds, key=lambda kind: next(iter(kinds[kind])))
        notices = self.notices
        for kind in order:
            jobs = kinds.get(kind)
            if not jobs:
                continue
            first = next(iter(jobs.values()))
            if self._could_use(first, now, changed, room, fitting):
                self._try_kind(jobs, now)
            if not jobs:
                continue
            if notices == "gangs" and first.members > 1:
                self._blocked(next(iter(jobs.values())), now)
            elif notices == "head" and next(iter(jobs)) == next(iter(self.waiting)):
                # the oldest job left waiting (a new one once the last has started)
                self._blocked(next(iter(jobs.values())), now)

    def _try_kind(self, jobs: dict[int, Job], now: float) -> None:
        shortest = math.inf
        for job in list(jobs.values()):
            if job.limit_s >= shortest and job.members == 1:
                continue
            if self._try(job, now):
                continue
            if not self.promised:
                return
            shortest = min(shortest, job.limit_s)

    def _could_use(
        self, job: Job, now: float, changed: set[int], room: int, fitting: dict[int, list[int]]
    ) -> bool:
        """Whether jobs of ``job``'s kind could start on a ``changed`` node: a gang in a
        rack with ``room`` member slots; a pod on a node that fits it (kept in
        ``fitting`` by ask). Whether they may use it is ``_try``'s to say."""
        if job.members > 1:
            return job.members <= room
        ask = job.ask
        nodes = fitting.get(id(ask))
        if nodes is None:
            sim = self.sim
            nodes = fitting[id(ask)] = [n for n in changed if sim.fits(n, ask)]
        return bool(nodes)

    def _allowed(self, job: Job, now: float) -> Allowed | None:
        """Which nodes ``job`` may start on: a reserved node only if it is the job's own
        reservation or the job's time limit ends by the reservation's start."""
        if not self.promised:
            return None
        promised = self.promised
        ends = moment(now + job.limit_s)
        mine = gang_id(job)

        def allowed(n: int) -> bool:
            promise = promised.get(n)
            return promise is None or promise.gang == mine or ends_in_time(ends, promise.start)

        return allowed

    def _try(self, job: Job, now: float) -> bool:
        """Start ``job`` now if it fits; say whether it did."""
        allowed = self._allowed(job, now)
        sim = self.sim
        if job.gang:
            nodes = sim.best_rack(job.members, allowed, self.watched, self._prefer(job))
            if nodes is None:
                return False
            placed = [(n, tuple(range(GANG_GPUS))) for n in nodes]
        else:
            found = sim.best_single(job.ask, allowed)
            if found is None:
                return False
            placed = [found]
        runs = []
        for n, indices in placed:
            run = Run(job, n, indices, now + job.limit_s)
            sim.take(n, job.ask, indices, run)
            runs.append(run)
        self.started.append(Started(job, tuple(runs)))
        if self.waiting.pop(job.id, None) is not None:
            kind = kind_of(job)
            jobs = self.kinds[kind]
            if next(iter(jobs)) == job.id:
                self.order = None  # the kind's oldest job is another now
            del jobs[job.id]
            if not jobs:
                del self.kinds[kind]
        self._released(job)
        return True

    def _prefer(self, job: Job) -> int | None:
        """The rack of the job's reservation, where it lands when that has room."""
        held = self.held.get(gang_id(job))
        if held is None or not held.nodes:
            return None
        return self.sim.rack_of[self.sim.index[held.nodes[0]]]


@dataclass(slots=True)
class Reserving(Greedy):
    """What ``tessera`` and ``easy`` share: the plan's inputs kept up to date, the plan
    asked again when what it read changed, and the waiting jobs tried again where its
    promises changed."""

    config: ExtenderConfig = CONFIG
    memo: OutlookMemo = field(default_factory=lambda: OutlookMemo(told=True))
    cluster: PlanInput | None = None
    """What the plans read: the nodes they may use, as the extender sees them."""
    watch_nodes: dict[int, float] = field(default_factory=dict)
    """Nodes of the reserved domains, with the start of the domain's reservation (s): a
    pod there whose time limit ends by the start holds back nothing, and its end
    changes no estimate; the end of one whose limit ends later may."""
    stale: bool = True
    next_plan: float = -math.inf
    demands: dict[int, GangDemand] = field(default_factory=dict)

    def _candidates(self) -> list[Job]:
        raise NotImplementedError

    def _relevant(self, n: int) -> bool:
        """Whether the plans read node ``n`` (every node, unless a policy knows better)."""
        return True

    def _after(self, now: float, ended: Sequence[Run]) -> None:
        watch = self.watch_nodes
        for _ in range(RETRIES):
            due = now >= self.next_plan and (self.held or self.waiting)
            if not (due or self.stale) and not any(
                run.node in watch and run.limit_ends >= watch[run.node] for run in ended
            ):
                return
            changed = self._replan(now)
            ended = ()
            if not changed or not self.waiting:
                return
            self._walk(now, changed)
            watch = self.watch_nodes

    def _released(self, job: Job) -> None:
        self.demands.pop(job.id, None)
        if self.held and gang_id(job) in self.held:
            self.stale = True
            del self.held[gang_id(job)]
            self._promise(self.held.values())

    def _replan(self, now: float) -> set[int]:
        """Ask the core again; the nodes whose promise changed."""
        self.stale = False
        self.next_plan = now + REPLAN_S
        candidates = self._candidates()
        if not candidates and not self.held:
            return set()
        self._refresh()
        cluster = self.cluster
        if cluster is None:
            relevant = [name for n, name in enumerate(self.sim.names) if self._relevant(n)]
            nodes = NodeViews(self.sim, relevant)
            cluster = PlanInput(
                nodes, HoldingViews(self.sim, nodes), self.config, self.rules, self.memo
            )
            self.cluster = cluster
        demands = [self._demand(job) for job in candidates]
        plan = plan_reservations(demands, cluster, self.held, moment(now))
        before = self.promised
        self.held = {r.gang: r for r in plan.reservations}
        self._promise(plan.reservations)
        after = self.promised
        return {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}

    def _demand(self, job: Job) -> GangDemand:
        found = self.demands.get(job.id)
        if found is None:
            found = self.demands[job.id] = demand_of(job)
        return found

    def _promise(self, reservations: Iterable[Reservation]) -> None:
        index, sim = self.sim.index, self.sim
        self.promised = {index[name]: r.promise for r in reservations for name in r.nodes}
        self.watched = {sim.rack_of[n] for n in self.promised}
        self.watch_nodes = {}
        for r in reservations:
            start = -math.inf if r.start is None else seconds(r.start)
            if r.nodes and r.domain:
                nodes: Iterable[int] = sim.rack_nodes[sim.rack_of[index[r.nodes[0]]]]
            else:
                nodes = (index[name] for name in r.nodes)
            for n in nodes:
                self.watch_nodes[n] = min(start, self.watch_nodes.get(n, math.inf))

    def _refresh(self) -> None:
        """Tell the plans' memo which nodes changed since the last plan."""
        names = self.sim.names
        self.memo.changed(names[n] for n in self.sim.take_dirty())


@dataclass(slots=True)
class Tessera(Reserving):
    """``tessera`` (see the module docstring)."""

    name: ClassVar[str] = "tessera"
    notices: ClassVar[str] = "gangs"

    def _candidates(self) -> list[Job]:
        return [job for job in self.waiting.values() if job.members > 1]

    def _relevant(self, n: int) -> bool:
        return self.sim.sizes[n] == GANG_GPUS

    def _blocked(self, job: Job, now: float) -> None:
        if job.members == 1 or len(self.held) >= self.rules.max_reservations:
            return
        if gang_id(job) not in self.held:
            # its reservation before younger jobs take what freed up
            self._replan(now)


@dataclass(slots=True)
class Easy(Reserving):
    """``easy`` (see the module docstring)."""

    name: ClassVar[str] = "easy"
    notices: ClassVar[str] = "head"

    def __post_init__(self) -> None:
        self.rules = replace(self.rules, max_reservations=1)

    def _candidates(self) -> list[Job]:
        head = next(iter(self.waiting.values()), None)
        return [] if head is None else [head]

    def _blocked(self, job: Job, now: float) -> None:
        if job.id == next(iter(self.waiting), None) and not self.held:
            # the head's reservation before anyone behind it starts: none may delay it
            self._replan(now)


POLICIES: dict[str, type[Greedy]] = {"none": Greedy, "tessera": Tessera, "easy": Easy}
