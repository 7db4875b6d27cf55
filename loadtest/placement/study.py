"""Placement quality the FGD way: Tessera's scoring against baselines on the openb traces.

Layer: I/O + ROOT (reads the trace CSVs, prints tables, writes JSON; ``main`` is the
CLI). The arithmetic of the method lives in ``loadtest.placement.fgd``; Tessera's decisions are
the extender's own PURE code (``extender.filters.run_filters``,
``extender.scores.score_node``, ``extender.gpus.choose_gpus``), called on ``NodeState``
values built straight from the trace rows.
Must not change what it measures: no policy knows which trace it runs on.

    python -m loadtest.placement --quick
    python -m loadtest.placement --traces all --seeds 42-51 --json placement.json

The method (``../shared/data/README.md``): 1,213 GPU nodes; per seed the whole trace
shuffled, then draws with replacement until the next would pass 130 % of GPU capacity;
arrival only; a pod fits where CPU, memory, pod count, GPU model and GPUs fit, is
skipped where nothing fits; the best integer score 0-100 wins, ties go to a per-seed
random node order; the allocation % is averaged per rounded arrived %, then the median
over seeds is taken.

Speed: a node's fit and score for a pod shape change only when that node changes, and a
run places one pod at a time, so each shape keeps a row of (score, tie-break) keys per
node and re-scores only the nodes changed since the shape was last seen; the best node
is one ``max`` over that row. Scores of equal node states are memoized.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from cluster import jsonio, labels
from cluster.model import GpuDevice, NodeName, NodeState, PodDemand, PodKey
from extender.config import ExtenderConfig, ScoringWeights, mix_from_demands
from extender.context import FIT, PodContext
from extender.filters import run_filters
from extender.gpus import choose_gpus
from extender.memo import DecisionCache
from extender.scores import score_node
from loadtest.inputs.traces import (
    DEFAULT_DATA_DIR,
    OPENB,
    OPENB_POD_VARIANTS,
    TraceNode,
    TracePod,
    read_openb_nodes,
    read_openb_pods,
    trace_file,
)
from loadtest.placement import fgd
from loadtest.placement.fgd import Shape

MIB: Final = 1024 * 1024
MAX_PODS_PER_NODE: Final = 1001
REPORT_AT: Final = (100, 110, 120, 130)
PUBLISHED_POLICY: Final = {
    "random": "01-Random",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
DEFAULT_POLICIES: Final = ("tessera", "fgd", "bestfit", "spread", "random")
NOW: Final = datetime(2026, 1, 1, tzinfo=UTC)
"""The decisions' ``now``: only maintenance windows read it, and trace nodes have none."""

Key = tuple[float, int]
Select = Literal["best", "random", "wire"]
NO_FIT: Final[Key] = (-1.0, -1)


# ---------------------------------------------------------------- the cluster


@dataclass(slots=True)
class Cluster:
    """Free resources per node, as plain lists (the simulation's hot state)."""

    names: list[str]
    models: list[str]
    cpu_cap: list[int]
    mem_cap: list[int]
    cpu: list[int]
    mem: list[int]
    pods: list[int]
    gpus: list[list[int]]
    """Free milli per GPU of each node."""

    @classmethod
    def of(cls, nodes: Sequence[TraceNode]) -> Cluster:
        return cls(
            names=[n.name for n in nodes],
            models=[n.model for n in nodes],
            cpu_cap=[n.cpu_milli for n in nodes],
            mem_cap=[n.memory_mib for n in nodes],
            cpu=[n.cpu_milli for n in nodes],
            mem=[n.memory_mib for n in nodes],
            pods=[MAX_PODS_PER_NODE] * len(nodes),
            gpus=[[fgd.MILLI] * n.gpus for n in nodes],
        )

    def fits(self, n: int, s: Shape) -> bool:
        """kube-scheduler's NodeResourcesFit plus the GPU model and GPU fit of the method."""
        if self.cpu[n] < s.cpu_milli or self.mem[n] < s.memory_mib or self.pods[n] < 1:
            return False
        if s.num_gpu == 0:
            return True
        if s.gpu_spec and self.models[n] not in s.gpu_spec:
            return False
        m = s.gpu_milli
        return sum(1 for f in self.gpus[n] if f >= m) >= s.num_gpu

    def take(self, n: int, s: Shape, indices: Sequence[int]) -> None:
        self.cpu[n] -= s.cpu_milli
        self.mem[n] -= s.memory_mib
        self.pods[n] -= 1
        frees = self.gpus[n]
        for i in indices:
            if frees[i] < s.gpu_milli:
                raise AssertionError(f"GPU {i} of {self.names[n]} cannot hold {s}")
            frees[i] -= s.gpu_milli


def node_state(
    name: str, model: str, gpus: Sequence[int], cpu_milli: int, memory_mib: int
) -> NodeState:
    """The ``NodeState`` that ``cluster.convert.node_from_json`` makes of the trace node's
    Node object (``loadtest.inputs.traces.node_object``), with ``gpus`` free milli per GPU: one
    NVLink island, since the trace has no topology."""
    return NodeState(
        name=NodeName(name),
        gpus=tuple(GpuDevice(i, 0, True, free) for i, free in enumerate(gpus)),
        product=model,
        cpu_milli=cpu_milli,
        memory_bytes=memory_mib * MIB,
        max_pods=MAX_PODS_PER_NODE,
        labels={labels.HOSTNAME: name, labels.GFD_PRODUCT: model},
        domains={labels.HOSTNAME: name},
    )


def demand_of(s: Shape) -> PodDemand:
    """The extender's view of a trace pod: whole GPUs, or one share; models as products."""
    whole = s.num_gpu > 0 and s.gpu_milli >= fgd.MILLI
    return PodDemand(
        gpus=s.num_gpu if whole else 0,
        gpu_milli=s.gpu_milli if s.num_gpu and not whole else 0,
        cpu_milli=s.cpu_milli,
        memory_bytes=s.memory_mib * MIB,
        products=s.gpu_spec,
    )


def shape_of(pod: TracePod) -> Shape:
    return Shape(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)


# ---------------------------------------------------------------- policies


class Policy(Protocol):
    """Scores a node that fits (higher wins) and names the GPUs the pod takes there."""

    name: str
    select: Select
    """``best``: the method's rule (best score, then rank). ``random``: uniformly among
    the fitting nodes. ``wire``: as kube-scheduler with the extender's ``/prioritize``
    answer: scores spread over 1..10 across the fitting nodes (``decide.wire_scores``),
    the best wire score wins, ties by rank (kube-scheduler picks among them at random)."""

    def score(self, c: Cluster, n: int, s: Shape) -> float | None: ...

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]: ...


def baseline_choice(c: Cluster, n: int, s: Shape) -> list[int]:
    """README rule 7: the tightest GPU for a share, the lowest-index free GPUs else."""
    if s.num_gpu == 0:
        return []
    if s.gpu_milli < fgd.MILLI:
        i = fgd.tightest_gpu(c.gpus[n], s.gpu_milli)
        if i is None:
            raise AssertionError("a fitting node has a GPU for the share")
        return [i]
    chosen = fgd.lowest_free_gpus(c.gpus[n], s.num_gpu)
    if chosen is None:
        raise AssertionError("a fitting node has the free GPUs")
    return chosen


@dataclass(slots=True)
class BestFit:
    name: str = "bestfit"
    select: Select = "best"

    def score(self, c: Cluster, n: int, s: Shape) -> float | None:
        return fgd.bestfit_score(c.cpu[n], s.cpu_milli, sum(c.gpus[n]), s.gpu_demand)

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class Spread:
    """kube-scheduler's LeastAllocated over CPU, memory and GPU milli."""

    name: str = "spread"
    select: Select = "best"

    def score(self, c: Cluster, n: int, s: Shape) -> float | None:
        return fgd.spread_score(
            (c.cpu[n], c.mem[n], sum(c.gpus[n])),
            (s.cpu_milli, s.memory_mib, s.gpu_demand),
            (c.cpu_cap[n], c.mem_cap[n], fgd.MILLI * len(c.gpus[n])),
        )

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class RandomFit:
    name: str = "random"
    select: Select = "random"

    def score(self, c: Cluster, n: int, s: Shape) -> float | None:
        return 0.0

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class Fgd:
    """The published FGD, re-implemented from the paper's definition (``fgd``)."""

    typical: tuple[fgd.Typical, ...]
    name: str = "fgd"
    integer: bool = True
    select: Select = "best"
    memo: dict[tuple[Any, ...], tuple[float, list[int]] | None] = field(default_factory=dict)

    def _choice(self, c: Cluster, n: int, s: Shape) -> tuple[float, list[int]] | None:
        key = (c.models[n], tuple(c.gpus[n]), c.cpu[n], s.cpu_milli, s.num_gpu, s.gpu_milli)
        found = self.memo.get(key, False)
        if found is False:
            found = self.memo[key] = fgd.fgd_choice(
                c.gpus[n], c.cpu[n], c.models[n], s, self.typical, integer=self.integer
            )
        return found  # type: ignore[return-value]

    def score(self, c: Cluster, n: int, s: Shape) -> float | None:
        found = self._choice(c, n, s)
        return None if found is None else found[0]

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]:
        found = self._choice(c, n, s)
        if found is None:
            raise AssertionError("a fitting node has an FGD choice")
        return list(found[1])


@dataclass(slots=True)
class Tessera:
    """The extender's filters, combined score and GPU choice, on ``NodeState`` values.

    ``score_node`` is the float (0..10) that ``decide.prioritize`` turns into the wire's
    integers; here it is scaled onto the method's 0..100 and truncated (``integer``),
    or kept as is. ``free_cpu``: the node's CPU is what the pods placed so far left (what the
    server's cache counts: allocatable less the requests of every pod on the node);
    False scores with the allocatable alone, as if other pods' CPU were unknown.
    """

    config: ExtenderConfig
    name: str = "tessera"
    integer: bool = True
    free_cpu: bool = True
    scale: float = 10.0
    """Method score = floor(scale * score_node): 10 maps the extender's 0..10 onto 0..100."""
    select: Select = "best"
    contexts: dict[Shape, PodContext] = field(default_factory=dict)
    memo: dict[tuple[Any, ...], tuple[float, tuple[int, ...]] | None] = field(default_factory=dict)
    decisions: DecisionCache | None = None
    """The extender's decision cache of ``config``, made with the first context."""

    def _context(self, s: Shape) -> PodContext:
        ctx = self.contexts.get(s)
        if ctx is None:
            if self.decisions is None:
                self.decisions = DecisionCache(self.config)
            ctx = self.contexts[s] = PodContext(
                pod=PodKey("trace/pod"),
                demand=demand_of(s),
                now=NOW,
                config=self.config,
                memo=self.decisions,
            )
        return ctx

    def _decide(self, c: Cluster, n: int, s: Shape) -> tuple[float, tuple[int, ...]] | None:
        cpu = c.cpu[n] if self.free_cpu else c.cpu_cap[n]
        # everything the extender's decision reads of this node and pod: equal keys,
        # equal decisions (many nodes share a model, a size and a state)
        key = (c.models[n], tuple(c.gpus[n]), cpu, s.cpu_milli, s.num_gpu, s.gpu_milli, s.gpu_spec)
        if key in self.memo:
            return self.memo[key]
        node = node_state(c.names[n], c.models[n], c.gpus[n], cpu, c.mem[n])
        ctx = self._context(s)
        found: tuple[float, tuple[int, ...]] | None = None
        if run_filters(ctx, node) is FIT:
            choice = choose_gpus(node, ctx.demand, self.config)
            if choice is not None:
                score = score_node(ctx, node)
                found = (math.floor(self.scale * score) if self.integer else score, choice)
        self.memo[key] = found
        return found

    def score(self, c: Cluster, n: int, s: Shape) -> float | None:
        found = self._decide(c, n, s)
        return None if found is None else found[0]

    def choose(self, c: Cluster, n: int, s: Shape) -> list[int]:
        found = self._decide(c, n, s)
        if found is None:
            raise AssertionError("a node that passed the extender's filters has GPUs")
        return list(found[1])


PolicyFactory = Callable[[Sequence[TracePod]], Policy]


def _tessera(
    weights: ScoringWeights | None = None,
    cpu_stranding: float | None = None,
    **options: Any,
) -> PolicyFactory:
    def make(pods: Sequence[TracePod]) -> Policy:
        mix = mix_from_demands(demand_of(shape_of(p)) for p in pods)
        config = ExtenderConfig(weights=weights or ScoringWeights(), pod_mix=mix)
        if cpu_stranding is not None:
            config = replace(config, cpu_stranding=cpu_stranding)
        return Tessera(config, **options)

    return make


POLICIES: Final[dict[str, PolicyFactory]] = {
    # the extender as configured by default (weights, islands), with the trace's pod mix
    # (extender.config.mix_from_demands); the variants each change one thing
    "tessera": _tessera(),
    "tessera-float": _tessera(name="tessera-float", integer=False),  # no truncation
    "tessera-alloccpu": _tessera(name="tessera-alloccpu", free_cpu=False),  # CPU unknown
    "tessera-wire": _tessera(name="tessera-wire", integer=False, select="wire"),
    "tessera-coarse": _tessera(name="tessera-coarse", scale=5.0),  # half the resolution
    "tessera-nogang": _tessera(ScoringWeights(gang_locality=0.0), name="tessera-nogang"),
    # FGD's CPU rule (cpu_stranding 0): GPUs the node's CPU cannot serve cost nothing
    # until it cannot hold even one pod of a size. Seeds 52-81, means: within 0.01 of
    # `fgd` on gpushare40 and multigpu30, where the default (0.2, pods the CPU holds
    # counted as a fraction) gains +0.27 and +0.10
    "tessera-fgdcpu": _tessera(cpu_stranding=0.0, name="tessera-fgdcpu"),
    # with the island best fit at 0.2 against packing's 10 (the earlier default)
    "tessera-island": _tessera(ScoringWeights(island_fit=0.2), name="tessera-island"),
    "fgd": lambda pods: Fgd(fgd.typical_shapes(shape_of(p) for p in pods)),
    "fgd-float": lambda pods: Fgd(
        fgd.typical_shapes(shape_of(p) for p in pods), name="fgd-float", integer=False
    ),
    "bestfit": lambda pods: BestFit(),
    "spread": lambda pods: Spread(),
    "random": lambda pods: RandomFit(),
}


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class RunResult:
    trace: str
    policy: str
    seed: int
    curve: dict[int, float]
    pods: int
    skipped: int
    skipped_by_kind: dict[str, int]
    skipped_gpu_milli: int
    final_allocation: float
    free_whole_gpus: int
    free_partial_milli: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Played:
    """What one pass over an arrival sequence left behind."""

    points: list[tuple[int, int]]
    """(arrived, allocated) milli-GPUs after every pod."""
    skipped: dict[str, int]
    """Pods that fit nowhere, by kind (``cpu``, ``share``, ``1gpu``, ``8gpu``...)."""
    skipped_gpu_milli: int
    cluster: Cluster


def kind(s: Shape) -> str:
    if s.num_gpu == 0:
        return "cpu"
    return "share" if s.gpu_milli < fgd.MILLI else f"{s.num_gpu}gpu"


def play(
    cluster: Cluster,
    sequence: Sequence[Shape],
    policy: Policy,
    tie: Sequence[int],
    pick_rng: random.Random,
) -> Played:
    """Place ``sequence`` one pod at a time; ``tie[n]`` is node ``n``'s tie-break
    (higher wins), ``pick_rng`` serves randomized policies."""
    count = len(cluster.names)
    changes: list[int] = []
    rows: dict[Shape, tuple[list[Key], list[int]]] = {}
    arrived = allocated = skipped_milli = 0
    skipped: dict[str, int] = {}
    points: list[tuple[int, int]] = []
    for s in sequence:
        arrived += s.gpu_demand
        row = rows.get(s)
        if row is None or len(changes) - row[1][0] >= count:
            stale: Iterable[int] = range(count)
            keys: list[Key] = [NO_FIT] * count
            rows[s] = (keys, [len(changes)])
        else:
            keys = row[0]
            stale = set(changes[row[1][0] :])
            row[1][0] = len(changes)
        for n in stale:
            score = policy.score(cluster, n, s) if cluster.fits(n, s) else None
            keys[n] = NO_FIT if score is None else (score, tie[n])
        if policy.select == "random":
            fitting = [n for n in range(count) if keys[n] is not NO_FIT]
            best = pick_rng.choice(fitting) if fitting else -1
        elif policy.select == "wire":
            best = wire_best(keys)
        else:
            # one node fitting wins outright; else the best score, then the best rank
            top = max(keys)
            best = -1 if top is NO_FIT else keys.index(top)
        if best < 0:
            skipped[kind(s)] = skipped.get(kind(s), 0) + 1
            skipped_milli += s.gpu_demand
        else:
            cluster.take(best, s, policy.choose(cluster, best, s))
            allocated += s.gpu_demand
            changes.append(best)
        points.append((arrived, allocated))
    return Played(points, skipped, skipped_milli, cluster)


def wire_best(keys: Sequence[Key]) -> int:
    """The node kube-scheduler binds given ``decide.wire_scores``' normalized answer:
    ``1 + round(9 (s - low) / (high - low))`` is 10 exactly where s is above
    high - (high - low) / 18 (Python rounds 8.5 to 8); among those, the best rank."""
    scores = [k[0] for k in keys if k is not NO_FIT]
    if not scores:
        return -1
    low, high = min(scores), max(scores)
    floor_ = low - 1.0 if high - low < 1e-9 else high - (high - low) / 18
    return max((k[1], n) for n, k in enumerate(keys) if k is not NO_FIT and k[0] > floor_)[1]


def simulate(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: Policy,
    seed: int,
    trace: str = "",
) -> RunResult:
    """One seed of the method for one policy."""
    started = time.perf_counter()
    capacity = fgd.MILLI * sum(n.gpus for n in nodes)
    shapes = [shape_of(p) for p in pods]
    order = fgd.arrival_sequence([s.gpu_demand for s in shapes], capacity, random.Random(seed))
    ranks = fgd.node_order(len(nodes), random.Random(seed + 1_000_003))
    played = play(
        Cluster.of(nodes),
        [shapes[i] for i in order],
        policy,
        [len(nodes) - r for r in ranks],
        random.Random(seed + 2_000_003),
    )
    gpus = played.cluster.gpus
    return RunResult(
        trace=trace,
        policy=policy.name,
        seed=seed,
        curve=fgd.allocation_curve(played.points, capacity),
        pods=len(order),
        skipped=sum(played.skipped.values()),
        skipped_by_kind=played.skipped,
        skipped_gpu_milli=played.skipped_gpu_milli,
        final_allocation=100.0 * played.points[-1][1] / capacity,
        free_whole_gpus=sum(1 for frees in gpus for f in frees if f == fgd.MILLI),
        free_partial_milli=sum(f for frees in gpus for f in frees if f < fgd.MILLI),
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------- many runs


@dataclass(frozen=True, slots=True)
class Task:
    data_dir: Path
    trace: str
    policy: str
    seeds: tuple[int, ...]


def run_task(task: Task) -> list[RunResult]:
    """Every seed of one (trace, policy): one policy object, so memos carry over."""
    nodes = read_openb_nodes(task.data_dir)
    pods = read_openb_pods(task.data_dir, task.trace)
    policy = POLICIES[task.policy](pods)
    return [simulate(nodes, pods, policy, seed, task.trace) for seed in task.seeds]


def read_published(data_dir: Path) -> dict[tuple[str, str], dict[int, float]]:
    """The FGD artifact's figures: (trace, policy) → {arrived %: allocation %}."""
    path = trace_file(data_dir, OPENB, "fgd_published_allocation.csv")
    out: dict[tuple[str, str], dict[int, float]] = {}
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    for line in lines[1:]:
        cells = line.split(",")
        at = {
            int(col.removeprefix("alloc_at_")): float(v)
            for col, v in zip(header[2:], cells[2:], strict=True)
        }
        out[(cells[0], cells[1])] = at
    return out


def summarize(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    """Per trace and policy: the median over seeds at each reported arrived %."""
    grouped: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        grouped.setdefault((r.trace, r.policy), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for (trace, policy), runs in grouped.items():
        at = {
            x: fgd.median([r.curve[x] for r in runs if x in r.curve])
            for x in REPORT_AT
            if any(x in r.curve for r in runs)
        }
        out.setdefault(trace, {})[policy] = {
            "median_at": at,
            "seeds": [r.seed for r in runs],
            "skipped_median": fgd.median([r.skipped for r in runs]),
            "skipped_gpu_milli_median": fgd.median([r.skipped_gpu_milli for r in runs]),
            "free_whole_gpus_median": fgd.median([r.free_whole_gpus for r in runs]),
            "free_partial_milli_median": fgd.median([r.free_partial_milli for r in runs]),
            "seconds_total": sum(r.seconds for r in runs),
        }
    return out


def table(
    trace: str, summary: dict[str, Any], published: dict[tuple[str, str], dict[int, float]]
) -> list[str]:
    cols = "".join(f"{x:>9}%" for x in REPORT_AT)
    lines = [f"== {trace}", f"{'policy':<24}{cols}   skipped  free-GPU  frag-milli   secs"]
    for policy, s in summary.items():
        at = s["median_at"]
        cells = "".join(f"{at[x]:>10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT)
        lines.append(
            f"{policy:<24}{cells}{s['skipped_median']:>10.0f}{s['free_whole_gpus_median']:>10.0f}"
            f"{s['free_partial_milli_median']:>12.0f}{s['seconds_total']:>7.0f}"
        )
    for ours, theirs in PUBLISHED_POLICY.items():
        pub = published.get((trace, theirs))
        if pub is None:
            continue
        cells = "".join(f"{pub[x]:>10.2f}" for x in REPORT_AT)
        lines.append(f"{'published ' + theirs:<24}{cells}")
        if ours in summary and ours != "random":
            at = summary[ours]["median_at"]
            delta = "".join(
                f"{at[x] - pub[x]:>+10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT
            )
            lines.append(f"{'  ' + ours + ' - published':<24}{delta}")
    fgd_pub = published.get((trace, "06-FGD"))
    if fgd_pub is not None:
        for policy, s in summary.items():
            if policy.startswith("tessera"):
                at = s["median_at"]
                delta = "".join(
                    f"{at[x] - fgd_pub[x]:>+10.2f}" if x in at else f"{'-':>10}" for x in REPORT_AT
                )
                lines.append(f"{'  ' + policy + ' - FGD pub':<24}{delta}")
    return lines


def _str_keys(values: dict[int, float]) -> dict[str, float]:
    """JSON objects have string keys: arrived % as text."""
    return {str(k): v for k, v in values.items()}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51`` or ``42,45``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, sep, high = part.partition("-")
        seeds.extend(range(int(low), int(high) + 1) if sep else [int(low)])
    return tuple(seeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.placement",
        description="Placement quality on the Alibaba openb traces, the FGD artifact's way.",
        epilog=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("TESSERA_DATA", DEFAULT_DATA_DIR)),
        help="folder with the shared traces (default: $TESSERA_DATA or ../shared/data)",
    )
    parser.add_argument("--traces", default="all", help="all, or names like default,cpu050")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 (the artifact's)")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, of: {', '.join(POLICIES)}",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="one seed (42), default trace")
    args = parser.parse_args(argv)

    traces = list(OPENB_POD_VARIANTS) if args.traces == "all" else args.traces.split(",")
    seeds = parse_seeds(args.seeds)
    if args.quick:
        traces, seeds = ["default"], (42,)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in [*policies] if p not in POLICIES] + [
        t for t in traces if t not in OPENB_POD_VARIANTS
    ]
    if unknown:
        parser.error(f"unknown policy or trace: {', '.join(unknown)}")
    published = read_published(args.data)

    # one task per (trace, policy, seed): even load on both processes
    tasks = [Task(args.data, t, p, (seed,)) for t in traces for p in policies for seed in seeds]
    started = time.perf_counter()
    results: list[RunResult] = []
    with get_context("fork").Pool(max(1, args.processes)) as pool:
        for done, batch in enumerate(pool.imap_unordered(run_task, tasks), start=1):
            results.extend(batch)
            r = batch[0]
            print(
                f"[{done}/{len(tasks)}] {r.trace} {r.policy} seed {r.seed}: "
                f"{r.curve.get(130, float('nan')):.2f} % at 130 %, {r.seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - started
    summary = summarize(results)
    for trace in traces:
        ordered = {p: summary[trace][p] for p in policies if p in summary.get(trace, {})}
        print("\n".join(table(trace, ordered, published)))
        print()
    print(f"{len(tasks)} runs in {elapsed:.0f} s on {args.processes} processes")
    if args.json is not None:
        args.json.write_bytes(
            jsonio.dumps(
                {
                    "method": "FGD artifact (../shared/data/README.md)",
                    "seeds": list(seeds),
                    "elapsed_s": elapsed,
                    "summary": {
                        t: {
                            p: {**v, "median_at": _str_keys(v["median_at"])} for p, v in per.items()
                        }
                        for t, per in summary.items()
                    },
                    "published": {f"{t}/{p}": _str_keys(v) for (t, p), v in published.items()},
                    "runs": [
                        {
                            "trace": r.trace,
                            "policy": r.policy,
                            "seed": r.seed,
                            "curve": _str_keys(r.curve),
                            "pods": r.pods,
                            "skipped": r.skipped,
                            "skipped_by_kind": r.skipped_by_kind,
                            "skipped_gpu_milli": r.skipped_gpu_milli,
                            "final_allocation": r.final_allocation,
                            "free_whole_gpus": r.free_whole_gpus,
                            "free_partial_milli": r.free_partial_milli,
                            "seconds": r.seconds,
                        }
                        for r in results
                    ],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
