"""The placement study's cluster and policies: free resources per node as plain lists,
and the policies that score a node for a pod and choose its GPUs there: Tessera (the
extender's own PURE filters, scorers and GPU choice on ``NodeState`` values built straight
from the trace rows), the published FGD re-implemented from its definition, BestFit,
Spread and Random.

Layer: PURE (no I/O, no clock: the decisions' ``now`` is the fixed ``NOW``). Must not
re-implement what the extender decides, and no policy may know which trace it runs on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

from cluster import labels
from cluster.model import GpuDevice, NodeName, NodeState, PodDemand, PodKey
from extender.config import ExtenderConfig, ScoringWeights, mix_from_demands
from extender.context import FIT, PodContext
from extender.filters import run_filters
from extender.gpus import choose_gpus
from extender.memo import DecisionCache
from extender.scores import score_node
from loadtest.inputs.asks import PodAsk
from loadtest.inputs.traces import TraceNode, TracePod
from loadtest.placement import fgd

MIB: Final = 1024 * 1024
MAX_PODS_PER_NODE: Final = 1001
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

    def fits(self, n: int, s: PodAsk) -> bool:
        """kube-scheduler's NodeResourcesFit plus the GPU model and GPU fit of the method."""
        if self.cpu[n] < s.cpu_milli or self.mem[n] < s.memory_mib or self.pods[n] < 1:
            return False
        if s.num_gpu == 0:
            return True
        if s.gpu_spec and self.models[n] not in s.gpu_spec:
            return False
        m = s.gpu_milli
        return sum(1 for f in self.gpus[n] if f >= m) >= s.num_gpu

    def take(self, n: int, s: PodAsk, indices: Sequence[int]) -> None:
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


def demand_of(s: PodAsk) -> PodDemand:
    """The extender's view of a trace pod: whole GPUs, or one share; models as products."""
    whole = s.num_gpu > 0 and s.gpu_milli >= fgd.MILLI
    return PodDemand(
        gpus=s.num_gpu if whole else 0,
        gpu_milli=s.gpu_milli if s.num_gpu and not whole else 0,
        cpu_milli=s.cpu_milli,
        memory_bytes=s.memory_mib * MIB,
        products=s.gpu_spec,
    )


def shape_of(pod: TracePod) -> PodAsk:
    return PodAsk(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)


# ---------------------------------------------------------------- policies


class Policy(Protocol):
    """Scores a node that fits (higher wins) and names the GPUs the pod takes there."""

    name: str
    select: Select
    """``best``: the method's rule (best score, then rank). ``random``: uniformly among
    the fitting nodes. ``wire``: as kube-scheduler with the extender's ``/prioritize``
    answer: scores spread over 1..10 across the fitting nodes (``decide.wire_scores``),
    the best wire score wins, ties by rank (kube-scheduler picks among them at random)."""

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None: ...

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]: ...


def baseline_choice(c: Cluster, n: int, s: PodAsk) -> list[int]:
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

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None:
        return fgd.bestfit_score(c.cpu[n], s.cpu_milli, sum(c.gpus[n]), s.gpu_demand)

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class Spread:
    """kube-scheduler's LeastAllocated over CPU, memory and GPU milli."""

    name: str = "spread"
    select: Select = "best"

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None:
        return fgd.spread_score(
            (c.cpu[n], c.mem[n], sum(c.gpus[n])),
            (s.cpu_milli, s.memory_mib, s.gpu_demand),
            (c.cpu_cap[n], c.mem_cap[n], fgd.MILLI * len(c.gpus[n])),
        )

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class RandomFit:
    name: str = "random"
    select: Select = "random"

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None:
        return 0.0

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]:
        return baseline_choice(c, n, s)


@dataclass(slots=True)
class Fgd:
    """The published FGD, re-implemented from the paper's definition (``fgd``)."""

    typical: tuple[fgd.Typical, ...]
    name: str = "fgd"
    integer: bool = True
    select: Select = "best"
    memo: dict[tuple[Any, ...], tuple[float, list[int]] | None] = field(default_factory=dict)

    def _choice(self, c: Cluster, n: int, s: PodAsk) -> tuple[float, list[int]] | None:
        key = (c.models[n], tuple(c.gpus[n]), c.cpu[n], s.cpu_milli, s.num_gpu, s.gpu_milli)
        found = self.memo.get(key, False)
        if found is False:
            found = self.memo[key] = fgd.fgd_choice(
                c.gpus[n], c.cpu[n], c.models[n], s, self.typical, integer=self.integer
            )
        return found  # type: ignore[return-value]

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None:
        found = self._choice(c, n, s)
        return None if found is None else found[0]

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]:
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
    contexts: dict[PodAsk, PodContext] = field(default_factory=dict)
    memo: dict[tuple[Any, ...], tuple[float, tuple[int, ...]] | None] = field(default_factory=dict)
    decisions: DecisionCache | None = None
    """The extender's decision cache of ``config``, made with the first context. It keeps
    nothing: every decision here is on a fresh ``NodeState``, and ``memo`` keeps them."""

    def _context(self, s: PodAsk) -> PodContext:
        ctx = self.contexts.get(s)
        if ctx is None:
            if self.decisions is None:
                self.decisions = DecisionCache(self.config, keep=False)
            ctx = self.contexts[s] = PodContext(
                pod=PodKey("trace/pod"),
                demand=demand_of(s),
                now=NOW,
                config=self.config,
                memo=self.decisions,
            )
        return ctx

    def _decide(self, c: Cluster, n: int, s: PodAsk) -> tuple[float, tuple[int, ...]] | None:
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

    def score(self, c: Cluster, n: int, s: PodAsk) -> float | None:
        found = self._decide(c, n, s)
        return None if found is None else found[0]

    def choose(self, c: Cluster, n: int, s: PodAsk) -> list[int]:
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
