"""What a simulated run records: each job and pod as it moves through the cluster,
denials, samples of the cluster over time, and the run's result (``SimResult``) that the
reports read.

Layer: PURE (plain records; ``ClusterSim`` fills them). Must not decide anything, and
must not import the simulator or the reports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loadtest.inputs.fleet import JobSpec
from loadtest.sim import objects

VERBS = ("mutate", "update", "filter", "prioritize", "bind", "schedule")
"""``mutate``: CREATE reviews; ``update``: the UPDATE reviews of Kueue's unsuspends;
``schedule``: one pod's whole scheduling cycle, filter to bind answered."""


@dataclass(slots=True)
class JobRun:
    spec: JobSpec
    created_s: float = 0.0
    stored: dict[str, Any] | None = None
    cluster_queue: str = ""
    local_queue: str = ""
    demand: objects.JobDemand | None = None
    admitted_s: float | None = None
    flavor: str = ""
    borrowed: bool = False
    pods: list[str] = field(default_factory=list)
    ended_pods: int = 0
    finished_s: float | None = None


@dataclass(slots=True)
class PodRun:
    key: str
    job: str
    obj: dict[str, Any]
    needs: objects.PodNeeds
    gpus: int
    milli: int
    run_s: float
    created_s: float
    attempts: int = 0
    last_attempt_s: float = 0.0
    node: str = ""
    rack: str = ""
    indices: str = ""
    bound_s: float | None = None
    ended: bool = False


@dataclass(frozen=True, slots=True)
class Denial:
    job: str
    kind: str
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at one moment of the run."""

    at_s: float
    gpus_allocated: float
    """Whole GPUs plus shares (milli / 1000) held by bound pods."""
    pods_running: int
    pods_pending: int
    jobs_waiting: dict[str, int]
    """LocalQueue → jobs waiting for quota."""
    reviews: int
    binds: int


@dataclass(slots=True)
class SimResult:
    gpus_total: int = 0
    nodes: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VERBS})
    errors: Counter[str] = field(default_factory=Counter)
    """``verb:kind`` → count (transport errors, bad answers, bind errors)."""
    denials: list[Denial] = field(default_factory=list)
    unexpected_denials: int = 0
    jobs: dict[str, JobRun] = field(default_factory=dict)
    pods: dict[str, PodRun] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    filter_reasons: Counter[str] = field(default_factory=Counter)
    bind_refusals: Counter[str] = field(default_factory=Counter)
    """``Error`` answers of ``/bind`` (HTTP 200): the pod is retried."""
    over_allocations: list[str] = field(default_factory=list)
    unhealthy_used: list[str] = field(default_factory=list)
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    duration_s: float = 0.0
    arrivals_s: float = 0.0
    gpus_checked: bool = True
    """Whether GPU indices were seen (only with a local extender)."""
    open_loop: dict[str, Any] = field(default_factory=dict)
    """Verb → ``VerbRun.to_json()`` of the per-verb open-loop phase (latency mode)."""

    def queue_waits(self) -> dict[str, list[float]]:
        waits: dict[str, list[float]] = {}
        for job in self.jobs.values():
            if job.admitted_s is not None:
                waits.setdefault(job.local_queue, []).append(job.admitted_s - job.created_s)
        return waits
