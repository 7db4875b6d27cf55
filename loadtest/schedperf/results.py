"""From what a ``sched-perf`` run saw to the figures it reports, and the JSON it writes.

Layer: PURE (numbers and API objects in, dicts out; no I/O, no clock). Must not measure
anything itself: the runner hands in the times the watch saw and the CPU ``/proc`` gave.

* latency: a pod's creation (the moment its POST was sent) to the watch event that
  first shows it bound (``spec.nodeName``); percentiles are nearest-rank over the pods
  that were bound (pods left unschedulable are counted apart, by size);
* throughput: pods bound a second over the steady part, the binds between the first
  and the last ``TRIM`` of them (the ramp-up and the stragglers left out); the POSTs'
  rate the same way (``created_per_s``): a profile that keeps up binds at that rate, so
  its throughput is then a lower bound;
* CPU: each process's CPU seconds (``/proc``) from just before the first POST to the
  last bind, divided by the pods bound;
* calls: kube-apiserver's requests by verb and resource, and kube-scheduler's scheduling
  attempts by result (and its opportunistic batching), per pod bound, from their
  ``/metrics`` before the first POST and after the last bind;
* placement: pods left unbound by size, free GPUs at the end, and those stranded on
  nodes that are neither empty nor full (no 8-GPU pod can use them), GPUs given twice,
  pods of at most 4 GPUs split over NVLink islands and gangs split over racks.

With repeats, each figure is the median over the runs of its profile, and a ratio is
the median of the ratios taken within one repeat (the runs that were side by side).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cluster import labels
from loadtest.measure.stats import percentile
from loadtest.schedperf.profiles import IN_TREE, IN_TREE_DEFAULT, PROFILES, TESSERA
from loadtest.schedperf.workload import PodShape, is_gang_member
from loadtest.stack.fleet import FakeNode
from loadtest.stack.placements import Placement, gpu_conflicts

Obj = dict[str, Any]

TRIM: Final = 0.1
COMPONENTS: Final = ("scheduler", "extender", "apiserver", "etcd")
ISLAND_SIZE: Final = 4


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What one profile's run saw: seconds from the run's start of each pod's POST and
    first bound event, CPU seconds per component over the window, and the placement."""

    profile: str
    repeat: int
    created: Mapping[str, float]
    bound: Mapping[str, float]
    cpu_s: Mapping[str, float]
    placement: Mapping[str, Any]
    extender_ready_s: Mapping[str, float] | None = None
    """``tessera`` only: seconds from starting the extender to its ``/readyz`` (its cache
    listed and watching), ``start`` on the fresh cluster's nodes and ``restart`` after the
    run (killed, then started again over the nodes and every pod bound)."""
    requests: Mapping[str, float] = field(default_factory=dict)
    """kube-apiserver's requests during the run by verb and resource (``POST
    pods/binding``), from its ``apiserver_request_total``."""
    attempts: Mapping[str, float] = field(default_factory=dict)
    """kube-scheduler's scheduling attempts during the run by result (``scheduled``,
    ``unschedulable``, ``error``), from its ``scheduler_schedule_attempts_total``, and its
    opportunistic batching by result (``batch hint_used``...)."""


def latencies_ms(created: Mapping[str, float], bound: Mapping[str, float]) -> list[float]:
    """Creation → bound of every bound pod, ascending, in milliseconds."""
    return sorted(
        max(0.0, (bound[name] - created[name]) * 1000) for name in bound if name in created
    )


def steady_throughput(bound_at: Sequence[float], trim: float = TRIM) -> float:
    """Pods bound a second between the first and the last ``trim`` of the binds; over
    all of them when there are too few to trim; 0 with fewer than two."""
    times = sorted(bound_at)
    n = len(times)
    if n < 2:
        return 0.0
    first, last = int(n * trim), n - 1 - int(n * trim)
    if last - first < 2:
        first, last = 0, n - 1
    span = times[last] - times[first]
    return (last - first) / span if span > 0 else 0.0


def bound_per_second(bound_at: Sequence[float]) -> list[int]:
    """Pods bound in each whole second since the run's start."""
    if not bound_at:
        return []
    counts = Counter(int(t) for t in bound_at)
    return [counts.get(s, 0) for s in range(int(max(bound_at)) + 1)]


def _per_pod(counts: Mapping[str, float], pods: int) -> dict[str, float]:
    """Each count over the pods bound, the largest first; counts under 0.01 a pod (the
    odd lease renewal or discovery call) left out."""
    if not pods:
        return {}
    shares = {key: round(n / pods, 2) for key, n in counts.items() if n / pods >= 0.01}
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def run_figures(run: RunRecord) -> Obj:
    """One run's figures, as the JSON's ``runs`` hold them."""
    lat = latencies_ms(run.created, run.bound)
    gang = latencies_ms({n: t for n, t in run.created.items() if is_gang_member(n)}, run.bound)
    count = len(run.bound)
    return {
        "profile": run.profile,
        "repeat": run.repeat,
        "bound": count,
        "unbound": len(run.created) - count,
        "pods_per_s": round(steady_throughput(list(run.bound.values())), 2),
        # a profile that binds as fast as pods come can show no more than this rate
        "created_per_s": round(steady_throughput(list(run.created.values())), 2),
        "p50_ms": round(percentile(lat, 50), 1) if lat else None,
        "p99_ms": round(percentile(lat, 99), 1) if lat else None,
        "max_ms": round(lat[-1], 1) if lat else None,
        "gang_p99_ms": round(percentile(gang, 99), 1) if gang else None,
        "gang_members_unbound": sum(
            1 for name in run.created if is_gang_member(name) and name not in run.bound
        ),
        "cpu_ms_per_pod": {
            c: round(1000 * run.cpu_s[c] / count, 3) if count and c in run.cpu_s else None
            for c in COMPONENTS
        },
        "placement": dict(run.placement),
        "extender_ready_s": dict(run.extender_ready_s) if run.extender_ready_s else None,
        "requests_per_pod": _per_pod(run.requests, count),
        "attempts_per_pod": _per_pod(run.attempts, count),
        "bound_per_s": bound_per_second(list(run.bound.values())),
        "latencies_ms": [round(v, 1) for v in lat],
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _median_leaves(items: Sequence[Mapping[str, Any]]) -> Obj:
    """Per key, the median of the numbers (a dict of numbers: per key again)."""
    out: Obj = {}
    keys = list(dict.fromkeys(k for item in items for k in item))
    for key in keys:
        values = [item.get(key) for item in items]
        if all(v is None for v in values):
            out[key] = None
        elif all(isinstance(v, Mapping) or v is None for v in values):
            out[key] = _median_leaves([v for v in values if isinstance(v, Mapping)])
        elif all(isinstance(v, (int, float)) or v is None for v in values):
            out[key] = _median([v for v in values if not isinstance(v, bool)])
    return out


def profile_summary(runs: Sequence[Obj]) -> Obj:
    """A profile's figures over its runs: the median of each."""
    summary = _median_leaves(
        [
            {
                k: r[k]
                for k in (
                    "pods_per_s",
                    "created_per_s",
                    "p50_ms",
                    "p99_ms",
                    "gang_p99_ms",
                    "gang_members_unbound",
                    "bound",
                    "unbound",
                )
            }
            | {
                "cpu_ms_per_pod": r["cpu_ms_per_pod"],
                "placement": r["placement"],
                "extender_ready_s": r.get("extender_ready_s"),
                "requests_per_pod": r.get("requests_per_pod") or {},
                "attempts_per_pod": r.get("attempts_per_pod") or {},
            }
            for r in runs
        ]
    )
    summary["runs"] = len(runs)
    return summary


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(runs: Sequence[Obj], baseline: str = IN_TREE) -> Obj:
    """``tessera`` over ``baseline`` within each repeat, and their medians."""
    by_repeat: dict[int, dict[str, Obj]] = defaultdict(dict)
    for r in runs:
        by_repeat[r["repeat"]][r["profile"]] = r
    per_repeat = []
    for repeat, found in sorted(by_repeat.items()):
        if TESSERA in found and baseline in found:
            ours, theirs = found[TESSERA], found[baseline]
            per_repeat.append(
                {
                    "repeat": repeat,
                    "throughput": _ratio(ours["pods_per_s"], theirs["pods_per_s"]),
                    "p99": _ratio(ours["p99_ms"], theirs["p99_ms"]),
                    "p50": _ratio(ours["p50_ms"], theirs["p50_ms"]),
                }
            )
    return {
        "throughput": _median([r["throughput"] for r in per_repeat]),
        "p99": _median([r["p99"] for r in per_repeat]),
        "p50": _median([r["p50"] for r in per_repeat]),
        "per_repeat": per_repeat,
    }


def extender_over_scheduler(runs: Sequence[Obj]) -> float | None:
    """The extender's CPU per pod over kube-scheduler's, median over the tessera runs
    (the issue's target: at most 1)."""
    values = [
        _ratio(r["cpu_ms_per_pod"]["extender"], r["cpu_ms_per_pod"]["scheduler"])
        for r in runs
        if r["profile"] == TESSERA
    ]
    return _median(values)


def report(runs: Sequence[RunRecord], *, nodes: int, pods: int, settings: Mapping[str, Any]) -> Obj:
    """The JSON of a whole invocation."""
    figures = [run_figures(r) for r in runs]
    out: Obj = {"nodes": nodes, "pods": pods, "settings": dict(settings)}
    for profile in PROFILES:
        mine = [f for f in figures if f["profile"] == profile]
        if mine:
            out[profile] = profile_summary(mine)
    out["ratio"] = ratios(figures, IN_TREE)
    out["ratio_vs_default"] = ratios(figures, IN_TREE_DEFAULT)
    out["extender_cpu_over_scheduler"] = extender_over_scheduler(figures)
    out["runs"] = figures
    return out


# ---------------------------------------------------------------------- placement


def placement(
    shapes: Sequence[PodShape], pods: Sequence[Mapping[str, Any]], nodes: Sequence[FakeNode]
) -> Obj:
    """Where the pods ended up (see the module docstring)."""
    placed = [Placement.of(p) for p in pods if p["spec"].get("nodeName")]
    bound = {p.name for p in placed}
    unbound = Counter(s.size for s in shapes if s.name not in bound)
    used = _gpus_used(placed)
    free = stranded = overbooked = empty = 0
    for node in nodes:
        taken = used.get(node.name, 0)
        overbooked += max(0, taken - node.gpus)
        left = max(0, node.gpus - taken)
        free += left
        if taken == 0:
            empty += 1
        elif left:
            stranded += left
    fleet = {n.name: n for n in nodes}
    recorded = [p for p in placed if p.indices]
    return {
        "unschedulable_by_size": {k: unbound[k] for k in sorted(unbound, key=_size_key)},
        "free_gpus": free,
        "stranded_free_gpus": stranded,
        "empty_nodes": empty,
        "overbooked_gpus": overbooked,
        "gpu_conflicts": len(gpu_conflicts(recorded, fleet)),
        "bound_without_indices": len(placed) - len(recorded),
        "split_islands": sum(1 for p in recorded if _split(p)),
        "gangs_split_over_racks": _split_gangs(pods, fleet),
    }


def _size_key(size: str) -> int:
    return 0 if size == "share" else int(size)


def _gpus_used(placed: Sequence[Placement]) -> dict[str, int]:
    """GPUs in use per node: the indices recorded where the extender bound (a share takes
    its one GPU), else whole GPUs plus the shares' milli rounded up to GPUs (in-tree
    counts shares as a resource of their own, not as parts of GPUs)."""
    indices: dict[str, set[int]] = defaultdict(set)
    whole: Counter[str] = Counter()
    milli: Counter[str] = Counter()
    for p in placed:
        if p.indices:
            indices[p.node].update(p.indices)
        elif p.gpus:
            whole[p.node] += p.gpus
        else:
            milli[p.node] += p.gpu_milli
    names = set(indices) | set(whole) | set(milli)
    return {n: len(indices.get(n, ())) + whole[n] + math.ceil(milli[n] / 1000) for n in names}


def _split(p: Placement) -> bool:
    return 1 < p.gpus <= ISLAND_SIZE and len({i // ISLAND_SIZE for i in p.indices}) > 1


def _split_gangs(pods: Sequence[Mapping[str, Any]], fleet: Mapping[str, FakeNode]) -> int:
    racks: dict[str, set[str]] = defaultdict(set)
    for pod in pods:
        gang = (pod["metadata"].get("labels") or {}).get(labels.GANG)
        node = fleet.get(pod["spec"].get("nodeName") or "")
        if gang and node is not None:
            racks[gang].add(node.rack)
    return sum(1 for r in racks.values() if len(r) > 1)
